#pragma once
// ATen adapter for the torch-free fused CPU Adam kernel (core/cpu_adam.h), exposed to Python as
// zero._C.cpu_adam_step. It validates tensors (device, dtype, contiguity, sizes, aliasing) with
// messages that say what to change, then hands raw pointers to the core.
#include <ATen/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

namespace zero::adapter {

// One Adam/AdamW step, in place on params / exp_avg / exp_avg_sq (CPU, float32, contiguous, same
// numel). grads: CPU, contiguous, float32 / bfloat16 / float16, same numel. out16 (optional):
// CPU, contiguous, bfloat16 or float16, same numel; receives the updated params rounded to
// nearest even. step is 1-based and already incremented. grads are multiplied by grad_scale.
// isa: "auto" | "scalar" | "avx2" | "avx512". num_threads >= 1 (pass torch.get_num_threads() to
// follow torch's intra-op setting).
void cpu_adam_step(const at::Tensor& params, const at::Tensor& grads, const at::Tensor& exp_avg,
                   const at::Tensor& exp_avg_sq, double lr, double beta1, double beta2, double eps,
                   double weight_decay, bool adamw_mode, bool bias_correction, std::int64_t step,
                   double grad_scale, const std::optional<at::Tensor>& out16,
                   const std::string& isa, std::int64_t num_threads);

}  // namespace zero::adapter
