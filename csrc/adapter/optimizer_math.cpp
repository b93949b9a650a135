#include "adapter/optimizer_math.h"

#include <cmath>
#include <optional>

#include <c10/util/Exception.h>

#include "core/cpu_adam.h"

namespace zero::adapter {
namespace {

// The kernel's element type for a tensor's dtype; none for a dtype it does not take.
std::optional<core::ElemType> elem_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return core::ElemType::kF32;
    case at::kBFloat16: return core::ElemType::kBF16;
    case at::kHalf: return core::ElemType::kF16;
    default: return std::nullopt;
  }
}

}  // namespace

const char* optimizer_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdam: return "Adam";
    case OptimizerKind::kSgd: return "SGD";
    case OptimizerKind::kAdagrad: return "Adagrad";
    case OptimizerKind::kLion: return "Lion";
    case OptimizerKind::kExternal: return "an external optimizer";
  }
  return "?";
}

std::vector<std::string> optimizer_state_names(OptimizerKind kind, bool sgd_momentum,
                                               const std::vector<std::string>& external) {
  switch (kind) {
    case OptimizerKind::kAdam: return {"exp_avg", "exp_avg_sq"};
    case OptimizerKind::kSgd: return sgd_momentum ? std::vector<std::string>{"momentum_buffer"}
                                                  : std::vector<std::string>{};
    case OptimizerKind::kAdagrad: return {"sum"};
    case OptimizerKind::kLion: return {"exp_avg"};
    case OptimizerKind::kExternal: return external;
  }
  return {};
}

void optimizer_update(at::Tensor& param, const at::Tensor& fp32_grad,
                      std::vector<at::Tensor>& states, const OptimizerHyper& hyper,
                      std::int64_t step) {
  // 16-bit state (bf16_optimizer_states) takes the gradients in its dtype, as a torch optimizer
  // over 16-bit tensors does.
  const bool cast = hyper.kind != OptimizerKind::kExternal && !states.empty() &&
                    states.front().scalar_type() != fp32_grad.scalar_type();
  const at::Tensor grad = cast ? fp32_grad.to(states.front().scalar_type()) : fp32_grad;
  switch (hyper.kind) {
    case OptimizerKind::kAdam: return adam_update(param, grad, states.at(0), states.at(1), hyper, step);
    case OptimizerKind::kSgd: {
      at::Tensor none;
      return sgd_update(param, grad, states.empty() ? none : states.front(), step == 1, hyper);
    }
    case OptimizerKind::kAdagrad: return adagrad_update(param, grad, states.at(0), hyper, step);
    case OptimizerKind::kLion: return lion_update(param, grad, states.at(0), hyper);
    case OptimizerKind::kExternal:
      TORCH_CHECK(hyper.external, "zero: an external optimizer's group stepped without its update");
      return hyper.external(param, grad, states);
  }
}

void adam_update(at::Tensor& param, at::Tensor grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                 const OptimizerHyper& hyper, std::int64_t step) {
  if (hyper.weight_decay != 0.0) {
    if (hyper.decoupled_weight_decay) {
      param.mul_(1.0 - hyper.lr * hyper.weight_decay);
    } else {
      grad = grad.add(param, hyper.weight_decay);
    }
  }
  exp_avg.lerp_(grad, 1.0 - hyper.beta1);
  exp_avg_sq.mul_(hyper.beta2).addcmul_(grad, grad, 1.0 - hyper.beta2);
  const double correction1 = hyper.bias_correction ? 1.0 - std::pow(hyper.beta1, step) : 1.0;
  const double correction2 = hyper.bias_correction ? 1.0 - std::pow(hyper.beta2, step) : 1.0;
  const at::Tensor denom = exp_avg_sq.sqrt().div_(std::sqrt(correction2)).add_(hyper.eps);
  param.addcdiv_(exp_avg, denom, -hyper.lr / correction1);
}

bool host_adam_takes(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided &&
         t.is_contiguous() && elem_type(t.scalar_type()).has_value();
}

void host_adam_update(const at::Tensor& master, const at::Tensor& grads, const at::Tensor& exp_avg,
                      const at::Tensor& exp_avg_sq, const OptimizerHyper& hyper,
                      double grad_scale, std::int64_t step, const at::Tensor& out16,
                      int num_threads) {
  for (const at::Tensor* t : {&master, &grads, &exp_avg, &exp_avg_sq}) {
    TORCH_CHECK(host_adam_takes(*t) && t->numel() == master.numel(), "zero: the host Adam "
                "step needs contiguous fp32/bf16/fp16 host tensors of ", master.numel(),
                " elements");
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
  const bool has_out = out16.defined();
  TORCH_CHECK(!has_out || (host_adam_takes(out16) && out16.numel() == master.numel()),
              "zero: the host Adam step writes 16-bit parameters into a contiguous host tensor "
              "of ", master.numel(), " elements");
  core::adam_step(params, master.data_ptr<float>(), grads.data_ptr(),
                  *elem_type(grads.scalar_type()), exp_avg.data_ptr<float>(),
                  exp_avg_sq.data_ptr<float>(), master.numel(),
                  has_out ? out16.data_ptr() : nullptr,
                  has_out ? *elem_type(out16.scalar_type()) : core::ElemType::kBF16,
                  core::best_isa(), num_threads);
  // raw writes: bump the version counters as in-place ops would (autograd's checks)
  for (const at::Tensor* t : {&master, &exp_avg, &exp_avg_sq, &out16}) {
    if (t->defined() && !t->is_inference()) t->unsafeGetTensorImpl()->bump_version();
  }
}

void sgd_update(at::Tensor& param, at::Tensor grad, at::Tensor& momentum_buffer, bool first_step,
                const OptimizerHyper& hyper) {
  if (hyper.weight_decay != 0.0) grad = grad.add(param, hyper.weight_decay);
  if (hyper.momentum != 0.0) {
    if (first_step) {
      momentum_buffer.copy_(grad);
    } else {
      momentum_buffer.mul_(hyper.momentum).add_(grad, 1.0 - hyper.dampening);
    }
    grad = hyper.nesterov ? grad.add(momentum_buffer, hyper.momentum) : momentum_buffer;
  }
  param.add_(grad, -hyper.lr);
}

void adagrad_update(at::Tensor& param, at::Tensor grad, at::Tensor& sum,
                    const OptimizerHyper& hyper, std::int64_t step) {
  if (hyper.weight_decay != 0.0) grad = grad.add(param, hyper.weight_decay);
  const double clr = hyper.lr / (1.0 + static_cast<double>(step - 1) * hyper.lr_decay);
  sum.addcmul_(grad, grad, 1.0);
  const at::Tensor std = sum.sqrt().add_(hyper.eps);
  param.addcdiv_(grad, std, -clr);
}

void lion_update(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                 const OptimizerHyper& hyper) {
  const at::Tensor direction = exp_avg.mul(hyper.beta1).add_(grad, 1.0 - hyper.beta1).sign_();
  if (hyper.weight_decay != 0.0) param.mul_(1.0 - hyper.lr * hyper.weight_decay);
  param.add_(direction, -hyper.lr);
  exp_avg.mul_(hyper.beta2).add_(grad, 1.0 - hyper.beta2);
}

}  // namespace zero::adapter
