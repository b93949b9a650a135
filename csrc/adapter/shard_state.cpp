#include "adapter/shard_state.h"

#include <algorithm>

#include <ATen/ops/from_blob.h>
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

}  // namespace

ShardState::ShardState(core::MemoryRegistry& registry, std::int64_t shard_numel,
                       const c10::TensorOptions& device_options, OptimizerKind kind,
                       bool sgd_momentum, bool keep_master, const OffloadOptions& offload)
    : kind_(kind), offload_(offload) {
  if (offload_.enabled) {
    allocate_on_host(registry, shard_numel, device_options, sgd_momentum);
    return;
  }
  auto fp32_buffer = [&](core::MemoryCategory category) {
    device_owned_.push_back(
        device_buffer(registry, category, shard_numel, device_options.dtype(at::kFloat)));
    return device_owned_.back().tensor();
  };
  if (keep_master) master_ = fp32_buffer(core::MemoryCategory::kMaster);
  if (kind == OptimizerKind::kAdam) {
    exp_avg_ = fp32_buffer(core::MemoryCategory::kOptimizerState);
    exp_avg_sq_ = fp32_buffer(core::MemoryCategory::kOptimizerState);
  } else if (sgd_momentum) {
    momentum_ = fp32_buffer(core::MemoryCategory::kOptimizerState);
  }
}

ShardState::~ShardState() { copier_.reset(); }  // no copy may outlive the pool it uses

void ShardState::allocate_on_host(core::MemoryRegistry& registry, std::int64_t shard_numel,
                                  const c10::TensorOptions& device_options, bool sgd_momentum) {
  TORCH_CHECK(offload_.tile_numel > 0, "zero: offload tile size must be > 0, got ",
              offload_.tile_numel);
  const at::ScalarType model_type = device_options.dtype().toScalarType();
  const std::int64_t model_bytes = static_cast<std::int64_t>(c10::elementSize(model_type));
  const std::int64_t tile = std::min(offload_.tile_numel, std::max<std::int64_t>(shard_numel, 1));
  const bool sixteen_bit = model_type != at::kFloat;
  std::vector<core::HostRegion> regions{{core::MemoryCategory::kMaster, 4 * shard_numel}};
  if (kind_ == OptimizerKind::kAdam) {
    regions.push_back({core::MemoryCategory::kOptimizerState, 4 * shard_numel});
    regions.push_back({core::MemoryCategory::kOptimizerState, 4 * shard_numel});
  } else if (sgd_momentum) {
    regions.push_back({core::MemoryCategory::kOptimizerState, 4 * shard_numel});
  }
  const std::size_t staging = regions.size();
  for (int slot = 0; slot < 2; ++slot) {
    regions.push_back({core::MemoryCategory::kStaging, tile * model_bytes});
    if (sixteen_bit) regions.push_back({core::MemoryCategory::kStaging, tile * model_bytes});
  }
  const core::HostPinning pinning = host_pinning();
  host_pool_ = std::make_unique<core::HostPool>(regions, registry,
                                                offload_.pin_memory ? &pinning : nullptr);
  // A refused pin is not an error: the engine warns once with why_not_pinned().
  const auto fp32 = at::TensorOptions().dtype(at::kFloat);
  auto view = [&](std::size_t region, std::int64_t numel, const at::TensorOptions& options) {
    return at::from_blob(host_pool_->region(region), {numel}, options);
  };
  std::size_t next = 0;
  master_ = view(next++, shard_numel, fp32);
  if (kind_ == OptimizerKind::kAdam) {
    exp_avg_ = view(next++, shard_numel, fp32);
    exp_avg_sq_ = view(next++, shard_numel, fp32);
  } else if (sgd_momentum) {
    momentum_ = view(next++, shard_numel, fp32);
  }
  next = staging;
  const auto model = at::TensorOptions().dtype(model_type);
  for (int slot = 0; slot < 2; ++slot) {
    staged_grads_[slot] = view(next++, tile, model);
    if (sixteen_bit) staged_params_[slot] = view(next++, tile, model);
  }
  copier_ = std::make_unique<core::TaskWorker>();
}

at::Tensor ShardState::master_piece(std::int64_t offset, std::int64_t numel) const {
  TORCH_CHECK(master_.defined(), "zero: this shard keeps no separate master (fp32 training)");
  return master_.narrow(0, offset, numel);
}

void ShardState::check_kind(const OptimizerHyper& hyper) const {
  TORCH_CHECK(hyper.kind == kind_, "zero: the group was built for ",
              kind_ == OptimizerKind::kAdam ? "Adam" : "SGD",
              " but stepped with the other optimizer");
  TORCH_CHECK(kind_ == OptimizerKind::kAdam || hyper.momentum == 0.0 || momentum_.defined(),
              "zero: SGD momentum was enabled after the engine was built without it");
}

void ShardState::update(at::Tensor master, const at::Tensor& grads, std::int64_t offset,
                        const OptimizerHyper& hyper, std::int64_t step) {
  const std::int64_t numel = master.numel();
  if (kind_ == OptimizerKind::kAdam) {
    at::Tensor m = exp_avg_.narrow(0, offset, numel);
    at::Tensor v = exp_avg_sq_.narrow(0, offset, numel);
    adam_update(master, grads, m, v, hyper, step);
    return;
  }
  at::Tensor buffer = momentum_.defined() ? momentum_.narrow(0, offset, numel) : at::Tensor();
  sgd_update(master, grads, buffer, /*first_step=*/step == 1, hyper);
}

void ShardState::step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper,
                      double grad_scale, std::int64_t step) {
  check_kind(hyper);
  if (offload_.enabled) {
    offloaded_step(pieces, hyper, grad_scale, step);
  } else {
    device_step(pieces, hyper, grad_scale, step);
  }
}

void ShardState::device_step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper,
                             double grad_scale, std::int64_t step) {
  for (const ShardPiece& piece : pieces) {
    at::Tensor grads = piece.grad.to(at::kFloat);  // a copy of 16-bit grads
    if (grad_scale != 1.0) grads.mul_(grad_scale);
    if (!has_master()) {  // fp32: the parameters are the master
      update(piece.param, grads, piece.offset, hyper, step);
      continue;
    }
    update(master_piece(piece.offset, piece.param.numel()), grads, piece.offset, hyper, step);
    piece.param.copy_(master_piece(piece.offset, piece.param.numel()));
  }
}

void ShardState::offloaded_step(const std::vector<ShardPiece>& pieces,
                                const OptimizerHyper& hyper, double grad_scale,
                                std::int64_t step) {
  std::vector<Tile> tiles;
  for (const ShardPiece& piece : pieces) {
    for (std::int64_t begin = 0; begin < piece.grad.numel(); begin += offload_.tile_numel) {
      tiles.push_back({&piece, begin, std::min(offload_.tile_numel, piece.grad.numel() - begin)});
    }
  }
  auto stage_in = [this, &tiles](std::size_t t) {
    const Tile& tile = tiles[t];
    return copier_->submit([this, tile, slot = t % 2] {
      staged_grads_[slot].narrow(0, 0, tile.numel)
          .copy_(tile.piece->grad.narrow(0, tile.begin, tile.numel));
    });
  };
  auto stage_out = [this, &tiles](std::size_t t) {
    const Tile& tile = tiles[t];
    return copier_->submit([this, tile, slot = t % 2] {
      const at::Tensor updated =
          staged_params_[slot].defined()
              ? staged_params_[slot].narrow(0, 0, tile.numel)
              : master_.narrow(0, tile.piece->offset + tile.begin, tile.numel);
      tile.piece->param.narrow(0, tile.begin, tile.numel).copy_(updated);
    });
  };
  // One worker runs copies in order, so tile t+1's staging-in is queued behind tile t-1's
  // staging-out: both staging slots are free again by the time they are reused.
  std::vector<std::shared_future<void>> queued;  // every copy submitted
  std::shared_future<void> gradients_in;
  try {
    if (!tiles.empty()) queued.push_back(gradients_in = stage_in(0));
    for (std::size_t t = 0; t < tiles.size(); ++t) {
      gradients_in.get();  // tile t's gradients are on the host (rethrows a failed copy)
      if (t + 1 < tiles.size()) queued.push_back(gradients_in = stage_in(t + 1));
      update_tile(tiles[t], static_cast<int>(t % 2), hyper, grad_scale, step);
      queued.push_back(stage_out(t));
    }
    for (auto& done : queued) done.get();
  } catch (...) {
    for (auto& done : queued) done.wait();  // queued copies use `tiles` and the pieces
    throw;
  }
}

void ShardState::update_tile(const Tile& tile, int slot, const OptimizerHyper& hyper,
                             double grad_scale, std::int64_t step) {
  const std::int64_t offset = tile.piece->offset + tile.begin;
  at::Tensor master = master_.narrow(0, offset, tile.numel);
  at::Tensor grads = staged_grads_[slot].narrow(0, 0, tile.numel);
  if (kind_ != OptimizerKind::kAdam) {
    at::Tensor fp32 = grads.to(at::kFloat);
    if (grad_scale != 1.0) fp32.mul_(grad_scale);
    update(master, fp32, offset, hyper, step);
    if (staged_params_[slot].defined()) staged_params_[slot].narrow(0, 0, tile.numel).copy_(master);
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
  void* out16 = staged_params_[slot].defined() ? staged_params_[slot].data_ptr() : nullptr;
  const core::ElemType out_type =
      out16 ? elem_type(staged_params_[slot].scalar_type()) : core::ElemType::kBF16;
  core::adam_step(params, master.data_ptr<float>(), grads.data_ptr(),
                  elem_type(grads.scalar_type()), exp_avg_.data_ptr<float>() + offset,
                  exp_avg_sq_.data_ptr<float>() + offset, tile.numel, out16, out_type,
                  core::best_isa(), offload_.num_threads);
}

std::vector<std::pair<std::string, at::Tensor>> ShardState::optimizer_state() const {
  std::vector<std::pair<std::string, at::Tensor>> state;
  if (exp_avg_.defined()) {
    state.emplace_back("exp_avg", exp_avg_);
    state.emplace_back("exp_avg_sq", exp_avg_sq_);
  }
  if (momentum_.defined()) state.emplace_back("momentum_buffer", momentum_);
  return state;
}

}  // namespace zero::adapter
