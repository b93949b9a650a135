#include "adapter/shard_state.h"

#include <c10/util/Exception.h>

namespace zero::adapter {

ShardState::ShardState(core::MemoryRegistry& registry, std::int64_t shard_numel,
                       const c10::TensorOptions& device_options, OptimizerKind kind,
                       bool sgd_momentum, bool keep_master, const OffloadOptions& offload)
    : kind_(kind), sgd_momentum_(sgd_momentum) {
  if (offload.enabled) {
    offloaded_ = std::make_unique<OffloadedState>(registry, shard_numel, device_options, kind,
                                                  sgd_momentum, offload);
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

at::Tensor ShardState::read_master(std::int64_t offset, std::int64_t numel) const {
  if (offloaded_) return offloaded_->read_master(offset, numel);
  TORCH_CHECK(master_.defined(), "zero: this shard keeps no separate master (fp32 training)");
  return master_.narrow(0, offset, numel).clone();
}

void ShardState::write_master(std::int64_t offset, const at::Tensor& values) {
  if (offloaded_) return offloaded_->write_master(offset, values);
  TORCH_CHECK(master_.defined(), "zero: this shard keeps no separate master (fp32 training)");
  master_.narrow(0, offset, values.numel()).copy_(values.reshape({-1}));
}

at::Tensor ShardState::state(const std::string& name) const {
  if (name == "exp_avg") return exp_avg_;
  if (name == "exp_avg_sq") return exp_avg_sq_;
  if (name == "momentum_buffer") return momentum_;
  return at::Tensor();
}

std::vector<std::pair<std::string, at::Tensor>> ShardState::optimizer_state() const {
  if (offloaded_) return offloaded_->optimizer_state();
  std::vector<std::pair<std::string, at::Tensor>> copies;
  for (const char* name : {"exp_avg", "exp_avg_sq", "momentum_buffer"}) {
    if (state(name).defined()) copies.emplace_back(name, state(name).clone());
  }
  return copies;
}

void ShardState::load_optimizer_state(const std::string& name, const at::Tensor& values) {
  if (offloaded_) return offloaded_->load_optimizer_state(name, values);
  const at::Tensor target = state(name);
  TORCH_CHECK(target.defined(), "zero: the optimizer state has no '", name, "'");
  TORCH_CHECK(values.numel() == target.numel(), "zero: saved ", name, " has ", values.numel(),
              " elements but this rank's shard has ", target.numel());
  target.copy_(values.reshape({-1}));
}

void ShardState::check_kind(const OptimizerHyper& hyper) const {
  TORCH_CHECK(hyper.kind == kind_, "zero: the group was built for ",
              kind_ == OptimizerKind::kAdam ? "Adam" : "SGD",
              " but stepped with the other optimizer");
  TORCH_CHECK(kind_ == OptimizerKind::kAdam || hyper.momentum == 0.0 || sgd_momentum_,
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
  if (offloaded_) return offloaded_->step(pieces, hyper, grad_scale, step);
  for (const ShardPiece& piece : pieces) {
    at::Tensor grads = piece.grad.to(at::kFloat);  // a copy of 16-bit grads
    if (grad_scale != 1.0) grads.mul_(grad_scale);
    if (!master_.defined()) {  // fp32: the parameters are the master
      update(piece.param, grads, piece.offset, hyper, step);
      continue;
    }
    at::Tensor master = master_.narrow(0, piece.offset, piece.param.numel());
    update(master, grads, piece.offset, hyper, step);
    piece.param.copy_(master);
  }
}

void ShardState::apply_delayed(const std::vector<ShardPiece>& pieces) {
  if (offloaded_) offloaded_->apply_delayed(pieces);
}

}  // namespace zero::adapter
