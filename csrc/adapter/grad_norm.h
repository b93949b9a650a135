#pragma once
// The sum of squares of a gradient tensor (a rank's shard or one unit's piece of it), in
// double: the piece of the global gradient norm that EngineCore all-reduces.
//
// Neither path copies the tensor. A CPU tensor (an offloaded shard) goes through the core's
// one-pass kernel (core/square_sum.h) on torch's intra-op thread count; a device tensor through
// a norm reduction that accumulates in fp32 without materializing an fp32 copy.
#include <ATen/Tensor.h>

namespace zero::adapter {

// Not finite exactly when an element is NaN or +-Inf (EngineCore skips the step on that): a
// finite 16-bit or fp32 gradient's square never overflows the sum.
double square_sum(const at::Tensor& grad);

}  // namespace zero::adapter
