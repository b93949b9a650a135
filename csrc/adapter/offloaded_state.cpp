#include "adapter/offloaded_state.h"

#include <algorithm>
#include <chrono>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "adapter/host_adam.h"

namespace zero::adapter {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

}  // namespace

OffloadedState::OffloadedState(core::MemoryRegistry& registry, core::RangePool& host_threads,
                               std::int64_t shard_numel,
                               const c10::TensorOptions& device_options, OptimizerKind kind,
                               std::vector<std::string> state_names,
                               ShardPrecision precision, const OffloadOptions& offload)
    : kind_(kind),
      state_names_(std::move(state_names)),
      host_threads_(host_threads),
      model_type_(device_options.dtype().toScalarType()) {
  TORCH_CHECK_VALUE(kind != OptimizerKind::kExternal, "zero: an optimizer zero does not build "
                    "itself steps on the device only; remove offload_optimizer, or use Adam, "
                    "AdamW, Adagrad, Lion or SGD");
  TORCH_CHECK(offload.tile_numel > 0, "zero: offload chunk size (sub_group_size) must be > 0, "
              "got ", offload.tile_numel);
  TORCH_CHECK(!offload.delayed_update || offload.nvme_path.empty(), "zero: the delayed "
              "parameter update works with offload_optimizer device \"cpu\", not \"nvme\"; turn "
              "delayed_update off or use the CPU");
  grid_ = {shard_numel, std::min(offload.tile_numel, std::max<std::int64_t>(shard_numel, 1))};
  store_ = make_offload_store(registry, grid_, state_array_names(state_names_), precision,
                              offload);
  const at::ScalarType model_type = model_type_;
  const bool sixteen_bit = model_type != at::kFloat;
  if (offload.delayed_update) {  // every step through it: its own buffers and copy engine
    delayed_ = std::make_unique<DelayedUpdate>(registry, grid_, device_options.device(),
                                               model_type, precision.grads, offload.pin_memory);
    return;
  }
  if (device_options.device().is_cpu()) return;  // in place: nothing to stage
  for (int slot = 0; slot < 2; ++slot) {
    staged_grads_[slot] = HostTensor(registry, core::MemoryCategory::kStaging, grid_.chunk,
                                     precision.grads, offload.pin_memory);
    if (sixteen_bit) {
      staged_params_[slot] = HostTensor(registry, core::MemoryCategory::kStaging, grid_.chunk,
                                        model_type, offload.pin_memory);
    }
  }
  copier_ = std::make_unique<CopyEngine>(device_options.device());
}

std::string OffloadedState::why_not_pinned() const {
  std::string why = store_->why_not_pinned();
  for (int slot = 0; slot < 2 && why.empty(); ++slot) {
    why = staged_grads_[slot].why_not_pinned();
    if (why.empty()) why = staged_params_[slot].why_not_pinned();
  }
  if (why.empty() && delayed_) why = delayed_->why_not_pinned();
  return why;
}

void OffloadedState::wait_delayed() const {
  if (delayed_) delayed_->wait();
}

at::Tensor OffloadedState::read(const std::string& name, std::int64_t offset,
                                std::int64_t numel) const {
  wait_delayed();
  TORCH_CHECK(store_->has(name), "zero: the optimizer state has no '", name, "'");
  return store_->read(name, offset, numel);
}

void OffloadedState::write(const std::string& name, std::int64_t offset,
                           const at::Tensor& values) {
  wait_delayed();
  TORCH_CHECK(store_->has(name), "zero: the optimizer state has no '", name, "'");
  store_->write(name, offset, values);
}

std::vector<std::pair<std::string, at::Tensor>> OffloadedState::optimizer_state() const {
  wait_delayed();
  std::vector<std::pair<std::string, at::Tensor>> state;
  if (delayed_) state = delayed_->state();
  for (const std::string& name : store_->names()) {
    if (name != "master") state.emplace_back(name, store_->read(name, 0, grid_.shard_numel));
  }
  return state;
}

std::vector<std::string> OffloadedState::state_names() const {
  std::vector<std::string> names;
  for (const std::string& name : store_->names()) {
    if (name != "master") names.push_back(name);
  }
  return names;
}

void OffloadedState::load_optimizer_state(const std::string& name, const at::Tensor& values) {
  if (delayed_ && delayed_->load(name, values)) return;
  wait_delayed();
  TORCH_CHECK(name != "master" && store_->has(name), "zero: the optimizer state has no '", name,
              "'");
  TORCH_CHECK(values.numel() == grid_.shard_numel, "zero: saved ", name, " has ",
              values.numel(), " elements but this rank's shard has ", grid_.shard_numel);
  store_->write(name, 0, values);
}

void OffloadedState::step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper,
                          double grad_scale, std::int64_t step) {
  if (!delayed_) {
    if (copier_) {
      streamed_step(pieces, hyper, grad_scale, step);
    } else {
      in_place_step(pieces, hyper, grad_scale, step);
    }
    return;
  }
  delayed_->start(pieces, [this, hyper, grad_scale, step](const at::Tensor& grads,
                                                           const at::Tensor& out,
                                                           std::int64_t chunk) {
    update(grads, out, chunk, /*at=*/0, hyper, grad_scale, step);
  });
}

void OffloadedState::apply_delayed(const std::vector<ShardPiece>& pieces) {
  if (delayed_) delayed_->apply(pieces);
}

// The pieces tile the shard; cut them at chunk boundaries.
std::vector<std::vector<OffloadedState::Segment>> OffloadedState::segments(
    const std::vector<ShardPiece>& pieces) const {
  std::vector<std::vector<Segment>> chunks(static_cast<std::size_t>(grid_.count()));
  for (const ShardPiece& piece : pieces) {
    const std::int64_t numel = piece.grad.numel();
    for (std::int64_t begin = 0; begin < numel;) {
      const std::int64_t at = piece.offset + begin;
      const std::int64_t chunk = at / grid_.chunk;
      const std::int64_t length = std::min(numel - begin, (chunk + 1) * grid_.chunk - at);
      chunks[chunk].push_back({&piece, begin, length, at - chunk * grid_.chunk});
      begin += length;
    }
  }
  return chunks;
}

// The chunk's gradients where they lie, when its segments are one contiguous host range in
// the staging precision (a gradient shard kept in host memory); undefined otherwise.
at::Tensor OffloadedState::host_grads(const std::vector<Segment>& chunk,
                                      std::int64_t numel) const {
  if (chunk.empty()) return {};
  const Segment& head = chunk.front();
  const at::ScalarType staged = staged_grads_[0].tensor().scalar_type();
  const char* next = nullptr;
  std::int64_t covered = 0;
  for (const Segment& s : chunk) {
    const at::Tensor& grad = s.piece->grad;
    if (s.at != covered || !grad.is_cpu() || grad.scalar_type() != staged ||
        !grad.is_contiguous() ||
        !grad.storage().is_alias_of(head.piece->grad.storage())) {
      return {};
    }
    const char* start = static_cast<const char*>(grad.const_data_ptr()) +
                        s.begin * static_cast<std::int64_t>(grad.element_size());
    if (next != nullptr && start != next) return {};
    next = start + s.numel * static_cast<std::int64_t>(grad.element_size());
    covered += s.numel;
  }
  if (covered != numel) return {};
  const at::Tensor& grad = head.piece->grad;  // its storage holds the whole range
  return grad.as_strided({numel}, {1}, grad.storage_offset() + head.begin);
}

void OffloadedState::streamed_step(const std::vector<ShardPiece>& pieces,
                                   const OptimizerHyper& hyper, double grad_scale,
                                   std::int64_t step) {
  const std::vector<std::vector<Segment>> chunks = segments(pieces);
  std::vector<at::Tensor> in_host(chunks.size());  // gradients read where they are
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    in_host[c] = host_grads(chunks[c], grid_.numel(static_cast<std::int64_t>(c)));
  }
  auto stage_in = [this, &chunks, &in_host](std::int64_t chunk) {
    if (in_host[chunk].defined()) return std::shared_future<void>();
    return copier_->submit([this, segments = chunks[chunk], slot = chunk % 2] {
      for (const Segment& s : segments) {
        CopyEngine::copy(staged_grads_[slot].tensor().narrow(0, s.at, s.numel),
                         s.piece->grad.narrow(0, s.begin, s.numel));
      }
    });
  };
  auto stage_out = [this, &chunks](std::int64_t chunk) {
    const int slot = static_cast<int>(chunk % 2);
    const at::Tensor updated = staged_params_[slot].defined() ? staged_params_[slot].tensor()
                                                              : store_->view("master", chunk, slot);
    return copier_->submit([segments = chunks[chunk], updated] {
      for (const Segment& s : segments) {
        store_params(*s.piece, s.begin, updated.narrow(0, s.at, s.numel), CopyEngine::copy);
      }
    });
  };
  // One worker runs copies in order, so chunk c+2's staging-in is queued behind chunk c's
  // staging-out; a reused (NVMe) slot is fetched into only after its write-back and its
  // staging-out (which may read the master slot) are done; the 16-bit staging slot is
  // written only after its last staging-out (below, for gradients read in place).
  std::shared_future<void> grads_in[2];
  std::shared_future<void> params_out[2];
  std::vector<core::IoHandle> reads[2];
  std::vector<core::IoHandle> writes[2];
  const Clock::time_point step_start = Clock::now();
  auto begin_chunk = [&](std::int64_t chunk) {
    const int slot = static_cast<int>(chunk % 2);
    if (store_->slots_reused()) {
      wait_all(writes[slot]);
      if (params_out[slot].valid()) params_out[slot].get();
    }
    reads[slot] = store_->fetch(chunk, slot);
    grads_in[slot] = stage_in(chunk);
  };
  try {
    if (grid_.count() > 0) begin_chunk(0);
    for (std::int64_t c = 0; c < grid_.count(); ++c) {
      const int slot = static_cast<int>(c % 2);
      Clock::time_point start = Clock::now();
      if (grads_in[slot].valid()) grads_in[slot].get();  // rethrows a failed copy
      wait_all(reads[slot]);
      timings_.grads_in_wait_s += seconds_since(start);
      if (c + 1 < grid_.count()) begin_chunk(c + 1);
      start = Clock::now();
      // The 16-bit staging slot is chunk c-2's until its staging-out has read it. A staged
      // copy-in, queued behind that, said so already; gradients read in place did not.
      if (staged_params_[slot].defined() && params_out[slot].valid()) params_out[slot].get();
      timings_.params_out_wait_s += seconds_since(start);
      start = Clock::now();
      const std::int64_t numel = grid_.numel(c);
      update(in_host[c].defined() ? in_host[c] : staged_grads_[slot].tensor().narrow(0, 0, numel),
             staged_params_[slot].defined() ? staged_params_[slot].tensor().narrow(0, 0, numel)
                                            : at::Tensor(),
             c, /*at=*/0, hyper, grad_scale, step);
      timings_.cpu_optimizer_s += seconds_since(start);
      writes[slot] = store_->flush(c, slot);
      start = Clock::now();
      if (params_out[slot].valid()) params_out[slot].get();  // chunk c-2's: done, rethrows
      timings_.params_out_wait_s += seconds_since(start);
      params_out[slot] = stage_out(c);
    }
    const Clock::time_point start = Clock::now();
    for (int slot = 0; slot < 2; ++slot) {
      if (params_out[slot].valid()) params_out[slot].get();
      wait_all(writes[slot]);
    }
    timings_.params_out_wait_s += seconds_since(start);
    timings_.step_s += seconds_since(step_start);
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

// A model on the host: each chunk's segments are updated straight from the pieces' gradients
// into their parameters; with NVMe, chunk c+1 is read while chunk c is updated and written.
void OffloadedState::in_place_step(const std::vector<ShardPiece>& pieces,
                                   const OptimizerHyper& hyper, double grad_scale,
                                   std::int64_t step) {
  const std::vector<std::vector<Segment>> chunks = segments(pieces);
  std::vector<core::IoHandle> reads[2];
  std::vector<core::IoHandle> writes[2];
  const Clock::time_point step_start = Clock::now();
  if (grid_.count() > 0) reads[0] = store_->fetch(0, 0);
  for (std::int64_t c = 0; c < grid_.count(); ++c) {
    const int slot = static_cast<int>(c % 2);
    Clock::time_point start = Clock::now();
    wait_all(reads[slot]);
    timings_.grads_in_wait_s += seconds_since(start);
    if (c + 1 < grid_.count()) {
      if (store_->slots_reused()) wait_all(writes[1 - slot]);
      reads[1 - slot] = store_->fetch(c + 1, 1 - slot);
    }
    start = Clock::now();
    for (const Segment& s : chunks[c]) update_in_place(s, c, hyper, grad_scale, step);
    timings_.cpu_optimizer_s += seconds_since(start);
    writes[slot] = store_->flush(c, slot);
  }
  // On a throw, the IoHandles still pending wait in their destructors.
  for (int slot = 0; slot < 2; ++slot) wait_all(writes[slot]);
  timings_.step_s += seconds_since(step_start);
  ++timings_.steps;
}

// One segment of a host model's step: the new parameters (model dtype) are written straight
// into the piece, or into a temporary that store_params hands on when they go to NVMe.
void OffloadedState::update_in_place(const Segment& s, std::int64_t chunk,
                                     const OptimizerHyper& hyper, double grad_scale,
                                     std::int64_t step) {
  const ShardPiece& piece = *s.piece;
  const at::Tensor grads = piece.grad.narrow(0, s.begin, s.numel);
  at::Tensor out = piece.param.defined() ? piece.param.narrow(0, s.begin, s.numel) : at::Tensor();
  const bool direct = out.defined() && host_adam_takes(out);
  if (!direct) out = at::empty({s.numel}, grads.options().dtype(model_type_));
  update(grads, out, chunk, s.at, hyper, grad_scale, step);
  if (!direct) store_params(piece, s.begin, out);
}

// Updates elements [at, at + grads.numel()) of one chunk of the state from `grads`
// (ShardPrecision::grads); `out`, when defined, receives the new parameters in the model dtype.
void OffloadedState::update(const at::Tensor& grads, const at::Tensor& out, std::int64_t chunk,
                            std::int64_t at, const OptimizerHyper& hyper, double grad_scale,
                            std::int64_t step) {
  const int slot = static_cast<int>(chunk % 2);
  const std::int64_t numel = grads.numel();
  auto state = [&](const char* name) {
    return store_->view(name, chunk, slot).narrow(0, at, numel);
  };
  at::Tensor master = state("master");
  if (kind_ != OptimizerKind::kAdam) {
    at::Tensor fp32 = grads.to(at::kFloat);
    if (grad_scale != 1.0) fp32.mul_(grad_scale);
    std::vector<at::Tensor> states;
    for (const std::string& name : state_names_) {
      states.push_back(state(name.c_str()));
    }
    optimizer_update(master, fp32, states, hyper, step);
    if (out.defined()) out.copy_(master);
    return;
  }
  const bool sixteen_bit_out = out.defined() && out.scalar_type() != at::kFloat;
  host_adam_update(master, grads, state("exp_avg"), state("exp_avg_sq"), hyper, grad_scale, step,
                   sixteen_bit_out ? out : at::Tensor(), host_threads_);
  if (out.defined() && !sixteen_bit_out) out.copy_(master);  // an fp32 model's parameters
}

}  // namespace zero::adapter
