#include "adapter/param_group.h"

#include <ATen/ops/isfinite.h>

#include <c10/util/Exception.h>

#include "adapter/dtype_map.h"

namespace zero::adapter {
namespace {

core::FlatBufferPlan plan_for(const std::vector<at::Tensor>& params, const GroupOptions& options,
                              int world_size) {
  TORCH_CHECK(!params.empty(), "zero: a parameter group has no parameters");
  TORCH_CHECK(options.stage >= 0 && options.stage <= 2, "zero: stage ", options.stage,
              " is not handled by ParamGroup (stages 0, 1, 2)");
  std::vector<core::TensorSpec> specs;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    TORCH_CHECK(p.scalar_type() == params.front().scalar_type(), "zero: parameter ", i,
                " of a group is ", p.scalar_type(), " but parameter 0 is ",
                params.front().scalar_type(), "; the engine groups parameters by dtype");
    TORCH_CHECK(p.device() == params.front().device(), "zero: parameter ", i, " is on ",
                p.device(), " but parameter 0 is on ", params.front().device());
    specs.push_back({p.sizes().vec(), to_core_dtype(p.scalar_type())});
  }
  // Stage 0 shards nothing: plan for one rank, so "this rank's range" is everything.
  return core::plan_flat_buffer(specs, options.stage == 0 ? 1 : world_size, options.alignment);
}

TrackedTensor fp32_state(core::MemoryRegistry& registry, core::MemoryCategory category,
                         std::int64_t numel, const at::Tensor& like) {
  return TrackedTensor(registry, category, core::MemoryLocation::kDevice, numel,
                       like.options().dtype(at::kFloat));
}

}  // namespace

ParamGroup::ParamGroup(std::vector<at::Tensor> params, const GroupOptions& options,
                       core::MemoryRegistry& registry, Communicator& communicator)
    : params_(std::move(params)),
      options_(options),
      communicator_(communicator),
      rank_(options.stage == 0 ? 0 : communicator.rank()),
      plan_(plan_for(params_, options, communicator.world_size())),
      param_buffer_(plan_, registry, core::MemoryCategory::kParam, core::MemoryLocation::kDevice,
                    params_.front().device()) {
  param_buffer_.pack(params_);
  for (std::size_t i = 0; i < params_.size(); ++i) params_[i].set_data(param_buffer_.param_view(i));

  const std::int64_t owned = plan_.shard_numel();
  if (mixed_precision()) {
    master_ = fp32_state(registry, core::MemoryCategory::kMaster, owned, params_.front());
    master_.tensor().copy_(param_buffer_.shard(rank_));
    master_view_ = master_.tensor();
  } else {
    master_view_ = param_buffer_.shard(rank_);
  }
  if (options_.optimizer == OptimizerKind::kAdam) {
    exp_avg_ = fp32_state(registry, core::MemoryCategory::kOptimizerState, owned, params_.front());
    exp_avg_sq_ =
        fp32_state(registry, core::MemoryCategory::kOptimizerState, owned, params_.front());
  } else if (options_.sgd_momentum) {
    momentum_ = fp32_state(registry, core::MemoryCategory::kOptimizerState, owned, params_.front());
  }

  at::Tensor reduce_target;
  ReduceMode mode = ReduceMode::kAllReduce;
  if (options_.stage == 2) {
    grad_shard_ = TrackedTensor(registry, core::MemoryCategory::kGradient,
                                core::MemoryLocation::kDevice, owned, params_.front().options());
    reduce_target = grad_shard_.tensor();
    mode = ReduceMode::kReduceScatter;
  } else {
    grad_buffer_ = std::make_unique<FlatBuffer>(plan_, registry, core::MemoryCategory::kGradient,
                                                core::MemoryLocation::kDevice,
                                                params_.front().device());
    reduce_target = grad_buffer_->data();
    prepare_backward();
  }
  reducer_ = std::make_unique<GradReducer>(mode, plan_, options_.bucket_numel,
                                           options_.overlap_comm, reduce_target, registry,
                                           communicator_);
}

bool ParamGroup::mixed_precision() const { return plan_.dtype() != core::DType::kFloat32; }

core::ShardRange ParamGroup::owned_range() const { return plan_.shard_range(rank_); }

void ParamGroup::prepare_backward() {
  if (!grad_buffer_) return;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& grad = params_[i].mutable_grad();
    const at::Tensor view = grad_buffer_->param_view(i);
    if (!grad.defined() || !grad.is_same(view)) {
      if (grad.defined()) view.copy_(grad);  // keep what the user accumulated
      grad = view;
    }
  }
}

void ParamGroup::grad_ready(std::size_t index, bool boundary) {
  TORCH_CHECK(index < params_.size(), "zero: parameter index ", index, " outside the group's ",
              params_.size());
  if (options_.stage == 2) {
    at::Tensor& grad = params_[index].mutable_grad();
    reducer_->grad_ready(index, grad);
    grad = at::Tensor();  // the bucket has it; release autograd's full-size gradient
  } else if (boundary) {
    reducer_->grad_ready(index, params_[index].grad());
  }
}

void ParamGroup::finish_backward(bool boundary) {
  if (options_.stage == 2 || boundary) reducer_->finish();
}

at::Tensor ParamGroup::owned_grads() const {
  if (options_.stage == 2) return grad_shard_.tensor();
  const core::ShardRange range = owned_range();
  return grad_buffer_->data().narrow(0, range.begin, range.end - range.begin);
}

bool ParamGroup::has_nonfinite_grads() const {
  return !at::isfinite(owned_grads()).all().item<bool>();
}

double ParamGroup::grad_square_sum() const {
  return owned_grads().to(at::kFloat).square().sum().item<double>();
}

void ParamGroup::optimizer_step(const OptimizerHyper& hyper, double grad_scale,
                                std::int64_t step) {
  at::Tensor grads = owned_grads().to(at::kFloat);  // a copy for 16-bit grads, else the buffer
  if (grad_scale != 1.0) grads.mul_(grad_scale);
  if (hyper.kind == OptimizerKind::kAdam) {
    TORCH_CHECK(exp_avg_.defined(), "zero: the group was built for SGD but stepped with Adam");
    at::Tensor m = exp_avg_.tensor();
    at::Tensor v = exp_avg_sq_.tensor();
    adam_update(master_view_, grads, m, v, hyper, step);
  } else {
    at::Tensor buffer = momentum_.defined() ? momentum_.tensor() : at::Tensor();
    TORCH_CHECK(hyper.momentum == 0.0 || buffer.defined(),
                "zero: SGD momentum was enabled after the engine was built without it");
    sgd_update(master_view_, grads, buffer, /*first_step=*/step == 1, hyper);
  }
}

void ParamGroup::gather_params() {
  if (mixed_precision()) param_buffer_.shard(rank_).copy_(master_view_);
  if (options_.stage == 0) return;
  at::Tensor full = param_buffer_.data();
  communicator_.all_gather(full, param_buffer_.shard(rank_))->wait();
}

void ParamGroup::zero_grads() {
  if (grad_buffer_) grad_buffer_->data().zero_();
  if (grad_shard_.defined()) grad_shard_.tensor().zero_();
}

std::vector<std::pair<std::string, at::Tensor>> ParamGroup::optimizer_state() const {
  std::vector<std::pair<std::string, at::Tensor>> state;
  if (exp_avg_.defined()) {
    state.emplace_back("exp_avg", exp_avg_.tensor());
    state.emplace_back("exp_avg_sq", exp_avg_sq_.tensor());
  }
  if (momentum_.defined()) state.emplace_back("momentum_buffer", momentum_.tensor());
  return state;
}

}  // namespace zero::adapter
