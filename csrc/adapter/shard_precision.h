#pragma once
// The dtypes of a shard's optimizer side. By default the master weights and the optimizer's
// arrays are fp32. DeepSpeed's bf16_master_weights_and_grads (fp16_master_weights_and_grads)
// keeps the master in the parameters' 16-bit dtype: the 16-bit parameter shard is then the
// master itself, and only offload, parameter offload or an external optimizer keep a separate
// copy (in that dtype). bf16_optimizer_states keeps the optimizer's arrays in it too.
// The gradients the step reads have the parameters' dtype, or fp32 where DeepSpeed's
// data_types.grad_accum_dtype asks a 16-bit model to accumulate them in fp32.
#include <string>

#include <c10/core/ScalarType.h>

namespace zero::adapter {

struct ShardPrecision {
  bool keep_master = false;              // a separate master beside the parameters
  c10::ScalarType master = c10::kFloat;  // the master's dtype, separate or the parameters'
  c10::ScalarType states = c10::kFloat;  // the optimizer arrays'
  c10::ScalarType grads = c10::kFloat;   // the gradients' (what an offloaded step stages)

  // The dtype of one state array: "master", or an optimizer array such as "exp_avg".
  c10::ScalarType of(const std::string& array) const {
    return array == "master" ? master : states;
  }
  // Whether the fused host Adam (fp32 master and moments) can step this shard.
  bool all_fp32() const { return master == c10::kFloat && states == c10::kFloat; }
};

}  // namespace zero::adapter
