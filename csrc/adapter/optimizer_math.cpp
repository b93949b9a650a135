#include "adapter/optimizer_math.h"

#include <algorithm>
#include <cmath>

#include <c10/util/Exception.h>

namespace zero::adapter {

const char* optimizer_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdam: return "Adam";
    case OptimizerKind::kSgd: return "SGD";
    case OptimizerKind::kAdagrad: return "Adagrad";
    case OptimizerKind::kLion: return "Lion";
    case OptimizerKind::kLamb: return "LAMB";
    case OptimizerKind::kMuon: return "Muon";
    case OptimizerKind::kExternal: return "an external optimizer";
  }
  return "?";
}

std::vector<std::string> optimizer_state_names(OptimizerKind kind, bool sgd_momentum,
                                               const std::vector<std::string>& external) {
  switch (kind) {
    case OptimizerKind::kAdam:
    case OptimizerKind::kLamb: return {"exp_avg", "exp_avg_sq"};
    case OptimizerKind::kSgd: return sgd_momentum ? std::vector<std::string>{"momentum_buffer"}
                                                  : std::vector<std::string>{};
    case OptimizerKind::kAdagrad: return {"sum"};
    case OptimizerKind::kLion: return {"exp_avg"};
    case OptimizerKind::kMuon: return {"momentum_buffer"};
    case OptimizerKind::kExternal: return external;
  }
  return {};
}

namespace {

void update_fp32(at::Tensor& param, const at::Tensor& grad, std::vector<at::Tensor>& states,
                 const OptimizerHyper& hyper, std::int64_t step) {
  switch (hyper.kind) {
    case OptimizerKind::kAdam: return adam_update(param, grad, states.at(0), states.at(1), hyper, step);
    case OptimizerKind::kSgd: {
      at::Tensor none;
      return sgd_update(param, grad, states.empty() ? none : states.front(), step == 1, hyper);
    }
    case OptimizerKind::kAdagrad: return adagrad_update(param, grad, states.at(0), hyper, step);
    case OptimizerKind::kLion: return lion_update(param, grad, states.at(0), hyper);
    case OptimizerKind::kLamb:
      TORCH_CHECK(false, "zero: LAMB needs whole-parameter norms; it is stepped by lamb_step");
    case OptimizerKind::kMuon: return muon_apply(param, grad, hyper);
    case OptimizerKind::kExternal:
      TORCH_CHECK(hyper.external, "zero: an external optimizer's group stepped without its update");
      return hyper.external(param, grad, states);
  }
}

}  // namespace

void optimizer_update(at::Tensor& param, const at::Tensor& grad, std::vector<at::Tensor>& states,
                      const OptimizerHyper& hyper, std::int64_t step) {
  const auto fp32 = [](const at::Tensor& t) { return t.scalar_type() == at::kFloat; };
  if (fp32(param) && std::all_of(states.begin(), states.end(), fp32)) {
    return update_fp32(param, grad, states, hyper, step);
  }
  // A 16-bit master or 16-bit arrays: updated in fp32 copies, each rounded back once (as the
  // fused CPU step, host_adam.h, and DeepSpeed's fused optimizers do: an op-by-op update in
  // bf16 rounds every intermediate, in fp16 eps and small squares vanish).
  at::Tensor wide_param = param.to(at::kFloat);
  std::vector<at::Tensor> wide_states;
  for (const at::Tensor& state : states) wide_states.push_back(state.to(at::kFloat));
  update_fp32(wide_param, grad, wide_states, hyper, step);
  if (!fp32(param)) param.copy_(wide_param);
  for (std::size_t i = 0; i < states.size(); ++i) {
    if (!fp32(states[i])) states[i].copy_(wide_states[i]);
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

void muon_apply(at::Tensor& param, const at::Tensor& update, const OptimizerHyper& hyper) {
  if (hyper.weight_decay != 0.0) param.mul_(1.0 - hyper.lr * hyper.weight_decay);
  param.add_(update, -hyper.lr);
}

}  // namespace zero::adapter
