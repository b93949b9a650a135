#pragma once
// The fused CPU Adam kernel (core/cpu_adam.h) on host tensors: a shard's master and moments
// stepped in one pass through memory. The kernel works on fp32 arrays; a 16-bit master or
// 16-bit moments (bf16_master_weights_and_grads, bf16_optimizer_states; shard_precision.h) are
// widened into fp32 scratch a tile at a time, stepped by the same kernel and rounded back, so
// every element is loaded, updated in fp32 and stored once, as torch's fused Adam on 16-bit
// tensors and DeepSpeedCPUAdam(fp32_optimizer_states=False) do.
#include <cstdint>

#include <ATen/Tensor.h>

#include "adapter/optimizer_math.h"
#include "core/range_pool.h"

namespace zero::adapter {

// Whether host_adam_update takes `t` as it is: on the host, dense, contiguous, and fp32,
// bf16 or fp16.
bool host_adam_takes(const at::Tensor& t);

// Steps contiguous host tensors of one length: master, exp_avg, exp_avg_sq (fp32 or 16-bit,
// updated in place), grads (fp32, bf16 or fp16, multiplied by grad_scale); out16 (undefined,
// or bf16/fp16) also receives the new parameters. step is 1-based and already counts this
// update. The pool's threads split the range (any split gives the same bits).
void host_adam_update(const at::Tensor& master, const at::Tensor& grads, const at::Tensor& exp_avg,
                      const at::Tensor& exp_avg_sq, const OptimizerHyper& hyper,
                      double grad_scale, std::int64_t step, const at::Tensor& out16,
                      core::RangePool& threads);

}  // namespace zero::adapter
