#include "adapter/optimizer_math.h"

#include <cmath>

namespace zero::adapter {

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

}  // namespace zero::adapter
