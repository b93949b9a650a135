#pragma once
// The sum of squares of a gradient tensor (a rank's shard or one unit's piece of it), in
// double: the piece of the global gradient norm that EngineCore all-reduces.
//
// Neither path copies the tensor. A CPU tensor (an offloaded shard) goes through the core's
// one-pass kernel (core/square_sum.h) on torch's intra-op thread count; a device tensor through
// a norm reduction that accumulates in fp32 without materializing an fp32 copy.
#include <ATen/Tensor.h>

namespace zero::adapter {

double square_sum(const at::Tensor& grad);

// True when any element is NaN or +-Inf: a finite float squared never overflows a double,
// so the sum of squares is finite exactly when every element is.
bool has_nonfinite(const at::Tensor& grad);

}  // namespace zero::adapter
