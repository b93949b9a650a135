#include "adapter/offloaded_state.h"

#include <algorithm>
#include <chrono>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <c10/util/Exception.h>

#include "adapter/host_pinning.h"
#include "core/cpu_adam.h"

namespace zero::adapter {
namespace {

core::ElemType elem_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return core::ElemType::kF32;
    case at::kBFloat16: return core::ElemType::kBF16;
    case at::kHalf: return core::ElemType::kF16;
    default: TORCH_CHECK(false, "zero: offload supports fp32, bf16 and fp16 models, not ", type);
  }
}

const at::TensorOptions kFp32 = at::TensorOptions().dtype(at::kFloat);

void wait_all(std::vector<core::IoHandle>& handles) {
  for (core::IoHandle& handle : handles) {
    if (handle.pending()) handle.wait();
  }
  handles.clear();
}

}  // namespace

void store_params(const ShardPiece& piece, std::int64_t begin, const at::Tensor& values,
                  void (*copy)(const at::Tensor& dst, const at::Tensor& src)) {
  if (piece.store) {
    piece.store(piece.store_base + begin, values);
  } else if (copy != nullptr) {
    copy(piece.param.narrow(0, begin, values.numel()), values);
  } else {
    piece.param.narrow(0, begin, values.numel()).copy_(values);
  }
}

ShardPiece sub_piece(const ShardPiece& piece, std::int64_t begin, std::int64_t numel,
                     std::int64_t offset) {
  ShardPiece part{piece.grad.narrow(0, begin, numel), at::Tensor(), offset, piece.store,
                  piece.store_base + begin};
  if (piece.param.defined()) part.param = piece.param.narrow(0, begin, numel);
  return part;
}

OffloadedState::OffloadedState(core::MemoryRegistry& registry, std::int64_t shard_numel,
                               const c10::TensorOptions& device_options, OptimizerKind kind,
                               bool sgd_momentum, const OffloadOptions& offload)
    : kind_(kind), offload_(offload), shard_numel_(shard_numel), sgd_momentum_(sgd_momentum) {
  TORCH_CHECK_VALUE(offload_.num_threads >= 1, "zero: offload threads must be >= 1, got ",
                    offload_.num_threads);
  TORCH_CHECK(offload_.tile_numel > 0, "zero: offload chunk size (sub_group_size) must be > 0, "
              "got ", offload_.tile_numel);
  const bool on_nvme = !offload_.nvme_path.empty();
  const at::ScalarType model_type = device_options.dtype().toScalarType();
  const std::int64_t model_bytes = static_cast<std::int64_t>(c10::elementSize(model_type));
  chunk_ = std::min(offload_.tile_numel, std::max<std::int64_t>(shard_numel, 1));
  const bool sixteen_bit = model_type != at::kFloat;
  const std::vector<std::string> names = state_names();
  auto category = [](const std::string& name) {
    return name == "master" ? core::MemoryCategory::kMaster
                            : core::MemoryCategory::kOptimizerState;
  };
  // Page-multiple chunk regions first, so each starts page-aligned for O_DIRECT.
  const std::int64_t chunk_bytes =
      static_cast<std::int64_t>(core::round_up(static_cast<std::size_t>(4 * chunk_)));
  std::vector<core::HostRegion> regions;
  for (const std::string& name : names) {
    if (on_nvme) {  // two chunks of the state in flight: staging, the state itself is on NVMe
      for (int slot = 0; slot < 2; ++slot) {
        regions.push_back({core::MemoryCategory::kStaging, chunk_bytes});
      }
    } else {
      regions.push_back({category(name), 4 * shard_numel});
    }
  }
  const std::size_t staging = regions.size();
  for (int slot = 0; slot < 2; ++slot) {
    regions.push_back({core::MemoryCategory::kStaging, chunk_ * model_bytes});
    if (sixteen_bit) regions.push_back({core::MemoryCategory::kStaging, chunk_ * model_bytes});
  }
  const std::size_t delayed = regions.size();
  if (offload_.delayed_update) {
    TORCH_CHECK(!on_nvme, "zero: the delayed parameter update works with offload_optimizer "
                "device \"cpu\", not \"nvme\"; turn delayed_update off or use the CPU");
    regions.push_back({core::MemoryCategory::kStaging, shard_numel * model_bytes});  // grads
    regions.push_back({core::MemoryCategory::kStaging, shard_numel * model_bytes});  // params
  }
  const core::HostPinning pinning = host_pinning();
  host_pool_ = std::make_unique<core::HostPool>(regions, registry,
                                                offload_.pin_memory ? &pinning : nullptr);
  // A refused pin is not an error: the engine warns once with why_not_pinned().
  auto view = [&](std::size_t region, std::int64_t numel, const at::TensorOptions& options) {
    return at::from_blob(host_pool_->region(region), {numel}, options);
  };
  std::size_t next = 0;
  for (const std::string& name : names) {
    if (on_nvme) {
      for (int slot = 0; slot < 2; ++slot) slots_[slot].emplace_back(name, view(next++, chunk_, kFp32));
      continue;
    }
    at::Tensor array = view(next++, shard_numel, kFp32);
    if (name == "master") master_ = array;
    if (name == "exp_avg") exp_avg_ = array;
    if (name == "exp_avg_sq") exp_avg_sq_ = array;
    if (name == "momentum_buffer") momentum_ = array;
  }
  next = staging;
  const auto model = at::TensorOptions().dtype(model_type);
  for (int slot = 0; slot < 2; ++slot) {
    staged_grads_[slot] = view(next++, chunk_, model);
    if (sixteen_bit) staged_params_[slot] = view(next++, chunk_, model);
  }
  if (offload_.delayed_update) {
    delayed_grads_ = view(delayed, shard_numel, model);
    delayed_params_ = view(delayed + 1, shard_numel, model);
    updater_ = std::make_unique<core::TaskWorker>();
  }
  if (on_nvme) {
    std::vector<core::TileSpec> tiles;
    for (const std::string& name : names) {
      for (std::int64_t c = 0; c < chunk_count(); ++c) {
        tiles.push_back({tile_name(name, c), static_cast<std::size_t>(4 * chunk_numel(c))});
      }
      nvme_bytes_.emplace_back(&registry, category(name), core::MemoryLocation::kNvme,
                               4 * shard_numel);
    }
    core::SwapStoreOptions options;
    options.aio = offload_.aio;
    swap_ = std::make_unique<core::SwapStore>(offload_.nvme_path, tiles, options);
  }
  copier_ = std::make_unique<CopyEngine>(device_options.device());
}

// The workers and the swap store may still use pool memory: they go first.
OffloadedState::~OffloadedState() {
  updater_.reset();
  copier_.reset();
  swap_.reset();
}

void OffloadedState::step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper,
                          double grad_scale, std::int64_t step) {
  if (offload_.delayed_update) {
    delayed_step(pieces, hyper, grad_scale, step);
  } else {
    offloaded_step(pieces, hyper, grad_scale, step);
  }
}

std::vector<std::string> OffloadedState::state_names() const {
  std::vector<std::string> names{"master"};
  if (kind_ == OptimizerKind::kAdam) {
    names.insert(names.end(), {"exp_avg", "exp_avg_sq"});
  } else if (sgd_momentum_) {
    names.push_back("momentum_buffer");
  }
  return names;
}

std::int64_t OffloadedState::chunk_count() const {
  return chunk_ == 0 ? 0 : (shard_numel_ + chunk_ - 1) / chunk_;
}

std::int64_t OffloadedState::chunk_numel(std::int64_t chunk) const {
  return std::min(chunk_, shard_numel_ - chunk * chunk_);
}

std::string OffloadedState::tile_name(const std::string& name, std::int64_t chunk) const {
  return name + "." + std::to_string(chunk);
}

std::string OffloadedState::swap_description() const {
  if (!swap_) return "";
  return swap_->file().path() + " (" + swap_->backend_name() + ")";
}

at::Tensor OffloadedState::host_state(const std::string& name) const {
  if (name == "master") return master_;
  if (name == "exp_avg") return exp_avg_;
  if (name == "exp_avg_sq") return exp_avg_sq_;
  return momentum_;
}

at::Tensor OffloadedState::chunk_view(const std::string& name, std::int64_t chunk, int slot) const {
  if (!nvme()) return host_state(name).narrow(0, chunk * chunk_, chunk_numel(chunk));
  for (const auto& [slot_name, buffer] : slots_[slot]) {
    if (slot_name == name) return buffer.narrow(0, 0, chunk_numel(chunk));
  }
  TORCH_CHECK(false, "zero: no state array '", name, "'");
}

std::vector<core::IoHandle> OffloadedState::read_chunk(std::int64_t chunk, int slot) {
  std::vector<core::IoHandle> handles;
  for (const auto& [name, buffer] : slots_[slot]) {
    handles.push_back(swap_->read_async(tile_name(name, chunk), static_cast<std::byte*>(buffer.data_ptr()),
                                        core::round_up(4 * chunk_)));
  }
  return handles;
}

std::vector<core::IoHandle> OffloadedState::write_chunk(std::int64_t chunk, int slot) {
  std::vector<core::IoHandle> handles;
  for (const auto& [name, buffer] : slots_[slot]) {
    handles.push_back(swap_->write_async(tile_name(name, chunk),
                                         static_cast<const std::byte*>(buffer.data_ptr()),
                                         core::round_up(4 * chunk_)));
  }
  return handles;
}

void OffloadedState::write_chunk_and_report(std::int64_t chunk) {
  auto writes = write_chunk(chunk, 0);
  wait_all(writes);
  if (offload_.on_swap_write) {
    const std::size_t bytes = slots_[0].size() * core::round_up(4 * chunk_);
    offload_.on_swap_write(static_cast<std::int64_t>(bytes));
  }
}

void OffloadedState::wait_delayed() const {
  if (delayed_job_.valid()) delayed_job_.get();  // rethrows a failed update
}

at::Tensor OffloadedState::read_master(std::int64_t offset, std::int64_t numel) const {
  wait_delayed();
  if (!nvme()) return master_.narrow(0, offset, numel).clone();
  std::vector<at::Tensor> parts;
  auto* self = const_cast<OffloadedState*>(this);  // reads reuse slot 0 as scratch
  for (std::int64_t c = offset / chunk_; c * chunk_ < offset + numel; ++c) {
    auto handles = self->read_chunk(c, 0);
    wait_all(handles);
    const std::int64_t begin = std::max(offset, c * chunk_);
    const std::int64_t end = std::min(offset + numel, c * chunk_ + chunk_numel(c));
    parts.push_back(chunk_view("master", c, 0).narrow(0, begin - c * chunk_, end - begin).clone());
  }
  return parts.empty() ? at::empty({0}, kFp32) : at::cat(parts);
}

void OffloadedState::write_master(std::int64_t offset, const at::Tensor& values) {
  wait_delayed();
  const at::Tensor source = values.reshape({-1});
  const std::int64_t numel = source.numel();
  if (!nvme()) {
    master_.narrow(0, offset, numel).copy_(source);
    return;
  }
  for (std::int64_t c = offset / chunk_; c * chunk_ < offset + numel; ++c) {
    auto reads = read_chunk(c, 0);  // read-modify-write the whole chunk of every array
    wait_all(reads);
    const std::int64_t begin = std::max(offset, c * chunk_);
    const std::int64_t end = std::min(offset + numel, c * chunk_ + chunk_numel(c));
    chunk_view("master", c, 0).narrow(0, begin - c * chunk_, end - begin)
        .copy_(source.narrow(0, begin - offset, end - begin));
    write_chunk_and_report(c);
  }
}

std::vector<std::pair<std::string, at::Tensor>> OffloadedState::optimizer_state() const {
  wait_delayed();
  std::vector<std::pair<std::string, at::Tensor>> state;
  if (offload_.delayed_update) {
    state.emplace_back("delayed_params", delayed_params_.clone());
    state.emplace_back("delayed_pending",
                       at::full({1}, delayed_pending_ ? 1.0 : 0.0, kFp32));
  }
  for (const std::string& name : state_names()) {
    if (name == "master") continue;
    if (!nvme()) {
      const at::Tensor array = host_state(name);
      if (array.defined()) state.emplace_back(name, array.clone());
      continue;
    }
    std::vector<at::Tensor> parts;
    auto* self = const_cast<OffloadedState*>(this);
    for (std::int64_t c = 0; c < chunk_count(); ++c) {
      auto handles = self->read_chunk(c, 0);
      wait_all(handles);
      parts.push_back(chunk_view(name, c, 0).clone());
    }
    state.emplace_back(name, at::cat(parts));
  }
  return state;
}

void OffloadedState::load_optimizer_state(const std::string& name, const at::Tensor& values) {
  wait_delayed();
  if (offload_.delayed_update && name == "delayed_pending") {
    delayed_pending_ = values.item<double>() != 0.0;
    return;
  }
  if (offload_.delayed_update && name == "delayed_params") {
    TORCH_CHECK(values.numel() == shard_numel_, "zero: saved delayed_params has ", values.numel(),
                " elements but this rank's shard has ", shard_numel_);
    delayed_params_.copy_(values.reshape({-1}));
    return;
  }
  const std::vector<std::string> names = state_names();
  TORCH_CHECK(name != "master" && std::find(names.begin(), names.end(), name) != names.end(),
              "zero: the optimizer state has no '", name, "'");
  TORCH_CHECK(values.numel() == shard_numel_, "zero: saved ", name, " has ", values.numel(),
              " elements but this rank's shard has ", shard_numel_);
  const at::Tensor source = values.reshape({-1});
  if (!nvme()) {
    host_state(name).copy_(source);
    return;
  }
  for (std::int64_t c = 0; c < chunk_count(); ++c) {
    auto reads = read_chunk(c, 0);
    wait_all(reads);
    chunk_view(name, c, 0).copy_(source.narrow(0, c * chunk_, chunk_numel(c)));
    write_chunk_and_report(c);
  }
}

void OffloadedState::offloaded_step(const std::vector<ShardPiece>& pieces,
                                const OptimizerHyper& hyper, double grad_scale,
                                std::int64_t step) {
  // The pieces tile the shard; cut them at chunk boundaries.
  std::vector<std::vector<Segment>> chunks(static_cast<std::size_t>(chunk_count()));
  for (const ShardPiece& piece : pieces) {
    const std::int64_t numel = piece.grad.numel();
    for (std::int64_t begin = 0; begin < numel;) {
      const std::int64_t at = piece.offset + begin;
      const std::int64_t chunk = at / chunk_;
      const std::int64_t length = std::min(numel - begin, (chunk + 1) * chunk_ - at);
      chunks[chunk].push_back({&piece, begin, length, at - chunk * chunk_});
      begin += length;
    }
  }
  auto stage_in = [this, &chunks](std::int64_t chunk) {
    return copier_->submit([this, segments = chunks[chunk], slot = chunk % 2] {
      for (const Segment& s : segments) {
        CopyEngine::copy(staged_grads_[slot].narrow(0, s.at, s.numel),
                         s.piece->grad.narrow(0, s.begin, s.numel));
      }
    });
  };
  auto stage_out = [this, &chunks](std::int64_t chunk) {
    const at::Tensor updated = staged_params_[chunk % 2].defined()
                                   ? staged_params_[chunk % 2]
                                   : chunk_view("master", chunk, static_cast<int>(chunk % 2));
    return copier_->submit([segments = chunks[chunk], updated] {
      for (const Segment& s : segments) {
        store_params(*s.piece, s.begin, updated.narrow(0, s.at, s.numel), CopyEngine::copy);
      }
    });
  };
  // One worker runs copies in order, so chunk c+2's staging-in is queued behind chunk c's
  // staging-out; the NVMe slot of chunk c is re-read only after its write-back and its
  // staging-out (which may read the master slot) are done.
  std::shared_future<void> grads_in[2];
  std::shared_future<void> params_out[2];
  std::vector<core::IoHandle> reads[2];
  std::vector<core::IoHandle> writes[2];
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point since) {
    return std::chrono::duration<double>(Clock::now() - since).count();
  };
  const Clock::time_point step_start = Clock::now();
  auto begin_chunk = [&](std::int64_t chunk) {
    const int slot = static_cast<int>(chunk % 2);
    if (nvme()) {
      wait_all(writes[slot]);
      if (params_out[slot].valid()) params_out[slot].get();
      reads[slot] = read_chunk(chunk, slot);
    }
    grads_in[slot] = stage_in(chunk);
  };
  try {
    if (chunk_count() > 0) begin_chunk(0);
    for (std::int64_t c = 0; c < chunk_count(); ++c) {
      const int slot = static_cast<int>(c % 2);
      Clock::time_point start = Clock::now();
      grads_in[slot].get();  // rethrows a failed copy
      wait_all(reads[slot]);
      timings_.grads_in_wait_s += seconds(start);
      if (c + 1 < chunk_count()) begin_chunk(c + 1);
      start = Clock::now();
      update_chunk(c, slot, hyper, grad_scale, step);
      timings_.cpu_optimizer_s += seconds(start);
      if (nvme()) writes[slot] = write_chunk(c, slot);
      start = Clock::now();
      if (params_out[slot].valid()) params_out[slot].get();  // chunk c-2's: done, rethrows
      timings_.params_out_wait_s += seconds(start);
      params_out[slot] = stage_out(c);
    }
    const Clock::time_point start = Clock::now();
    for (int slot = 0; slot < 2; ++slot) {
      if (params_out[slot].valid()) params_out[slot].get();
      wait_all(writes[slot]);
    }
    timings_.params_out_wait_s += seconds(start);
    timings_.step_s += seconds(step_start);
    ++timings_.steps;
  } catch (...) {
    // Nothing queued may outlive this call: the copies use `chunks` and the pieces.
    for (int slot = 0; slot < 2; ++slot) {
      if (grads_in[slot].valid()) grads_in[slot].wait();
      if (params_out[slot].valid()) params_out[slot].wait();
    }
    throw;  // IoHandles still pending wait in their destructors
  }
}

void OffloadedState::update_chunk(std::int64_t chunk, int slot, const OptimizerHyper& hyper,
                              double grad_scale, std::int64_t step) {
  const std::int64_t numel = chunk_numel(chunk);
  update_chunk_from(staged_grads_[slot].narrow(0, 0, numel),
                    staged_params_[slot].defined() ? staged_params_[slot].narrow(0, 0, numel)
                                                   : at::Tensor(),
                    chunk, hyper, grad_scale, step);
}

void OffloadedState::delayed_step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper,
                              double grad_scale, std::int64_t step) {
  apply_delayed(pieces);  // the previous update's parameters: the model's from now on
  for (const ShardPiece& piece : pieces) {
    delayed_grads_.narrow(0, piece.offset, piece.grad.numel()).copy_(piece.grad);
  }
  delayed_pending_ = true;
  delayed_job_ = updater_->submit([this, hyper, grad_scale, step] {
    for (std::int64_t c = 0; c < chunk_count(); ++c) {
      update_chunk_from(delayed_grads_.narrow(0, c * chunk_, chunk_numel(c)),
                        delayed_params_.narrow(0, c * chunk_, chunk_numel(c)), c, hyper,
                        grad_scale, step);
    }
  });
}

void OffloadedState::apply_delayed(const std::vector<ShardPiece>& pieces) {
  wait_delayed();
  if (!delayed_pending_) return;
  for (const ShardPiece& piece : pieces) {
    store_params(piece, 0, delayed_params_.narrow(0, piece.offset, piece.grad.numel()));
  }
  delayed_pending_ = false;
}

// Updates one chunk of host state from `grads` (model dtype); `out`, when defined, receives
// the new parameters in the model dtype.
void OffloadedState::update_chunk_from(const at::Tensor& grads, const at::Tensor& out,
                                   std::int64_t chunk, const OptimizerHyper& hyper,
                                   double grad_scale, std::int64_t step) {
  const std::int64_t numel = chunk_numel(chunk);
  const int slot = static_cast<int>(chunk % 2);
  at::Tensor master = chunk_view("master", chunk, slot);
  if (kind_ != OptimizerKind::kAdam) {
    at::Tensor fp32 = grads.to(at::kFloat);
    if (grad_scale != 1.0) fp32.mul_(grad_scale);
    at::Tensor buffer = sgd_momentum_ ? chunk_view("momentum_buffer", chunk, slot) : at::Tensor();
    sgd_update(master, fp32, buffer, /*first_step=*/step == 1, hyper);
    if (out.defined()) out.copy_(master);
    return;
  }
  core::AdamParams params;
  params.lr = hyper.lr;
  params.beta1 = hyper.beta1;
  params.beta2 = hyper.beta2;
  params.eps = hyper.eps;
  params.weight_decay = hyper.weight_decay;
  params.adamw_mode = hyper.decoupled_weight_decay;
  params.bias_correction = hyper.bias_correction;
  params.step = step;
  params.grad_scale = static_cast<float>(grad_scale);
  const bool sixteen_bit_out = out.defined() && out.scalar_type() != at::kFloat;
  void* out16 = sixteen_bit_out ? out.data_ptr() : nullptr;
  const core::ElemType out_type = sixteen_bit_out ? elem_type(out.scalar_type())
                                                  : core::ElemType::kBF16;
  core::adam_step(params, master.data_ptr<float>(), grads.data_ptr(),
                  elem_type(grads.scalar_type()),
                  chunk_view("exp_avg", chunk, slot).data_ptr<float>(),
                  chunk_view("exp_avg_sq", chunk, slot).data_ptr<float>(), numel, out16,
                  out_type, core::best_isa(), offload_.num_threads);
  if (out.defined() && !sixteen_bit_out) out.copy_(master);  // fp32 model, delayed update
}

}  // namespace zero::adapter
