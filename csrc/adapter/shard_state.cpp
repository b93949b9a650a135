#include "adapter/shard_state.h"

#include <c10/util/Exception.h>

namespace zero::adapter {
namespace {

TrackedTensor fp32_buffer(core::MemoryRegistry& registry, core::MemoryCategory category,
                          std::int64_t numel, const c10::TensorOptions& options) {
  return device_buffer(registry, category, numel, options.dtype(at::kFloat));
}

}  // namespace

ShardState::ShardState(core::MemoryRegistry& registry, std::int64_t shard_numel,
                       const c10::TensorOptions& device_options, OptimizerKind kind,
                       bool sgd_momentum, bool keep_master)
    : kind_(kind) {
  if (keep_master) {
    master_ = fp32_buffer(registry, core::MemoryCategory::kMaster, shard_numel, device_options);
  }
  if (kind == OptimizerKind::kAdam) {
    exp_avg_ = fp32_buffer(registry, core::MemoryCategory::kOptimizerState, shard_numel,
                           device_options);
    exp_avg_sq_ = fp32_buffer(registry, core::MemoryCategory::kOptimizerState, shard_numel,
                              device_options);
  } else if (sgd_momentum) {
    momentum_ = fp32_buffer(registry, core::MemoryCategory::kOptimizerState, shard_numel,
                            device_options);
  }
}

at::Tensor ShardState::master_piece(std::int64_t offset, std::int64_t numel) const {
  TORCH_CHECK(master_.defined(), "zero: this shard keeps no separate master (fp32 training)");
  return master_.tensor().narrow(0, offset, numel);
}

void ShardState::update(at::Tensor master, const at::Tensor& grads, std::int64_t offset,
                        const OptimizerHyper& hyper, std::int64_t step) {
  TORCH_CHECK(hyper.kind == kind_, "zero: the group was built for ",
              kind_ == OptimizerKind::kAdam ? "Adam" : "SGD",
              " but stepped with the other optimizer");
  const std::int64_t numel = master.numel();
  if (kind_ == OptimizerKind::kAdam) {
    at::Tensor m = exp_avg_.tensor().narrow(0, offset, numel);
    at::Tensor v = exp_avg_sq_.tensor().narrow(0, offset, numel);
    adam_update(master, grads, m, v, hyper, step);
    return;
  }
  TORCH_CHECK(hyper.momentum == 0.0 || momentum_.defined(),
              "zero: SGD momentum was enabled after the engine was built without it");
  at::Tensor buffer =
      momentum_.defined() ? momentum_.tensor().narrow(0, offset, numel) : at::Tensor();
  sgd_update(master, grads, buffer, /*first_step=*/step == 1, hyper);
}

std::vector<std::pair<std::string, at::Tensor>> ShardState::optimizer_state() const {
  std::vector<std::pair<std::string, at::Tensor>> state;
  if (exp_avg_.defined()) {
    state.emplace_back("exp_avg", exp_avg_.tensor());
    state.emplace_back("exp_avg_sq", exp_avg_sq_.tensor());
  }
  if (momentum_.defined()) state.emplace_back("momentum_buffer", momentum_.tensor());
  return state;
}

}  // namespace zero::adapter
