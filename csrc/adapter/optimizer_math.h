#pragma once
// Optimizer updates on flat tensors (a rank's shard). The updates are written with ATen ops so
// the same code runs on CPU and CUDA; host_adam.h runs the fused CPU Adam kernel (core/cpu_adam.h:
// one pass through memory instead of six) on host tensors. The formulas
// follow torch.optim.AdamW / Adam / SGD / Adagrad op for op, and Lion the paper's (as
// DeepSpeed's FusedLion), so a sharded run matches the single-process reference to float
// rounding.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "core/dtype.h"

namespace zero::adapter {

// kExternal: any other optimizer, run outside the engine on the whole shard (a torch optimizer
// in Python: zero/external_optimizer.py) through OptimizerHyper::external. kLamb needs
// whole-parameter norms, so it is stepped by lamb.h, not optimizer_update. kMuon's gradients
// are replaced by their orthogonalized updates before the step (muon.h); optimizer_update
// then applies them.
enum class OptimizerKind { kAdam, kSgd, kAdagrad, kLion, kLamb, kMuon, kExternal };

// Muon's Newton-Schulz iteration (DeepSpeed's ns_method): "gram" iterates on the small Gram
// matrix in fp16, "standard" on the matrix itself in bf16; the same map up to rounding.
enum class NsMethod { kGram, kStandard };

// An external update of one shard: `master` (fp32, updated in place), its fp32 `grads`
// (unscaled and clipped), and the group's per-element arrays in its state-name order.
using ExternalUpdate = std::function<void(const at::Tensor& master, const at::Tensor& grads,
                                          const std::vector<at::Tensor>& states)>;

const char* optimizer_name(OptimizerKind kind);  // "Adam", "SGD", ...

struct OptimizerHyper {
  OptimizerKind kind = OptimizerKind::kAdam;
  double lr = 1e-3;
  double weight_decay = 0.0;
  // Adam
  double beta1 = 0.9;  // Lion's too
  double beta2 = 0.999;
  double eps = 1e-8;  // Adagrad's too
  bool decoupled_weight_decay = true;  // AdamW; false = L2 added to the gradient (Adam)
  bool bias_correction = true;
  // SGD
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  // Adagrad (its initial_accumulator_value is the sum's starting value: zero/optimizer.py)
  double lr_decay = 0.0;
  // LAMB (with beta1, beta2, eps, weight_decay, bias_correction above): the trust ratio's
  // bounds, and eps added under the square root instead of after it
  double max_coeff = 10.0;
  double min_coeff = 0.01;
  bool eps_inside_sqrt = false;
  // Muon (with momentum, nesterov and weight_decay above)
  NsMethod ns_method = NsMethod::kGram;
  std::int64_t ns_steps = 5;
  core::DType ns_dtype = core::DType::kFloat16;  // the iteration's (zero/boundary.py picks it)
  ExternalUpdate external;  // kExternal
};

// The arrays a kind keeps per element, laid out like the shard, under torch.optim's state
// names, in the order optimizer_update takes them: Adam (and LAMB) exp_avg and exp_avg_sq, SGD
// momentum_buffer (only with momentum), Adagrad sum, Lion exp_avg, Muon momentum_buffer; an
// external optimizer's
// are its own (`external`).
std::vector<std::string> optimizer_state_names(OptimizerKind kind, bool sgd_momentum,
                                               const std::vector<std::string>& external = {});

// One update of `param` (the master: fp32, or 16-bit, shard_precision.h) from fp32 `grad`
// with the kind's arrays (in optimizer_state_names order, fp32 or 16-bit). 16-bit tensors are
// updated in fp32 copies and rounded back once. step is 1-based and already counts this
// update.
void optimizer_update(at::Tensor& param, const at::Tensor& grad, std::vector<at::Tensor>& states,
                      const OptimizerHyper& hyper, std::int64_t step);

// step is 1-based and already counts this update.
void adam_update(at::Tensor& param, at::Tensor grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                 const OptimizerHyper& hyper, std::int64_t step);


// momentum_buffer is used only when hyper.momentum != 0; first_step seeds it with the grad.
void sgd_update(at::Tensor& param, at::Tensor grad, at::Tensor& momentum_buffer, bool first_step,
                const OptimizerHyper& hyper);

// torch.optim.Adagrad.
void adagrad_update(at::Tensor& param, at::Tensor grad, at::Tensor& sum,
                    const OptimizerHyper& hyper, std::int64_t step);

// Muon's step from its update (muon.h left it in `update`, scaled): decoupled weight decay,
// then param -= lr * update.
void muon_apply(at::Tensor& param, const at::Tensor& update, const OptimizerHyper& hyper);

// Lion (Chen et al. 2023): param -= lr * (sign(beta1 m + (1 - beta1) g) + weight_decay param),
// then m = beta2 m + (1 - beta2) g. sign(0) is 0, as in the paper.
void lion_update(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                 const OptimizerHyper& hyper);

}  // namespace zero::adapter
