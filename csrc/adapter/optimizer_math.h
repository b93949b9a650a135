#pragma once
// Optimizer updates on flat fp32 tensors (a rank's shard), written with ATen ops so the same
// code runs on CPU and CUDA. The formulas follow torch.optim.AdamW / Adam / SGD op for op, so
// a sharded run matches the single-process reference to float rounding.
#include <cstdint>

#include <ATen/Tensor.h>

namespace zero::adapter {

enum class OptimizerKind { kAdam, kSgd };

struct OptimizerHyper {
  OptimizerKind kind = OptimizerKind::kAdam;
  double lr = 1e-3;
  double weight_decay = 0.0;
  // Adam
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  bool decoupled_weight_decay = true;  // AdamW; false = L2 added to the gradient (Adam)
  bool bias_correction = true;
  // SGD
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
};

// step is 1-based and already counts this update.
void adam_update(at::Tensor& param, at::Tensor grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                 const OptimizerHyper& hyper, std::int64_t step);

// momentum_buffer is used only when hyper.momentum != 0; first_step seeds it with the grad.
void sgd_update(at::Tensor& param, at::Tensor grad, at::Tensor& momentum_buffer, bool first_step,
                const OptimizerHyper& hyper);

}  // namespace zero::adapter
