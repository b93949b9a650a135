#pragma once
// Fused CPU Adam / AdamW step over flat fp32 master shards (the ZeRO-Offload optimizer step).
//
// One pass per element reads the gradient (fp32, bf16 or fp16), updates the fp32 master weight and
// both moments in place, and optionally writes a 16-bit copy of the new weight, so the step costs
// one trip through memory instead of the five or six that separate tensor ops would.
//
// Numerics follow torch.optim.Adam/AdamW(fused=True) on CPU, operation for operation:
//   g  = grad * grad_scale
//   g += wd * p                       (Adam, L2 mode: adamw_mode == false)
//   p  = p * (1 - lr * wd)            (AdamW, decoupled: adamw_mode == true)
//   m  = lerp(m, g, 1 - beta1)
//   v  = beta2 * v + (1 - beta2) * g * g
//   p  = p - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)     bc_i = 1 - beta_i^step
// with the per-step constants computed in double and rounded to float once, as torch does.
// Every ISA (and every thread count) produces bit-identical results, which also match torch's
// vectorized kernel bit for bit: each product is pinned to be fused or rounded on its own, so
// compiler contraction cannot make paths differ. Differences from torch: docs/CPU_ADAM.md.
#include <cstdint>

#include "core/cpu_features.h"

namespace zero::core {

enum class ElemType { kF32, kBF16, kF16 };

struct AdamParams {
  // Hyperparameters are double, like the Python floats torch receives, so that constants such as
  // 1 - beta1 round to the same float torch uses (1 - 0.9f is not float(1 - 0.9)).
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool adamw_mode = true;        // true: decoupled decay (AdamW); false: L2 into the grad (Adam)
  bool bias_correction = true;
  std::int64_t step = 1;         // 1-based, already incremented for this step
  float grad_scale = 1.0f;       // grads are multiplied by this: clip_coef / loss_scale
};

// Updates params, exp_avg, exp_avg_sq (all fp32, n elements, in place) from grads (n elements of
// grad_type). If out16 is non-null, also writes the updated params as out16_type (kBF16 or kF16,
// round-to-nearest-even). Buffers must not overlap, except that out16 may not alias anything.
// Throws std::invalid_argument if isa is not supported by this CPU, on a bad type, n < 0, or
// step < 1 with bias correction on. num_threads > 1 splits the range into contiguous chunks
// (small n uses fewer threads); the result does not depend on num_threads.
void adam_step(const AdamParams& hp, float* params, const void* grads, ElemType grad_type,
               float* exp_avg, float* exp_avg_sq, std::int64_t n, void* out16,
               ElemType out16_type, Isa isa = best_isa(), int num_threads = 1);

const char* elem_type_name(ElemType type);  // "float32", "bfloat16", "float16"

}  // namespace zero::core
