#pragma once
// The sum of squares of a flat gradient shard: the piece of the global gradient norm a rank
// contributes (norm = sqrt(sum over ranks)).
//
// One read of the data and no temporary: an offloaded shard of a 1.3B-parameter model is 2.6 GB
// of bf16, and converting it to fp32 and squaring it with tensor ops allocates and writes two
// 5.2 GB temporaries on every step. Squares are accumulated in double, so finite gradients never
// overflow the sum (fp32 overflows above about 1.8e19), and the result is the same for every
// thread count: the range is cut into fixed blocks whose sums are added in order.
#include <cstdint>

#include "core/cpu_adam.h"  // ElemType

namespace zero::core {

// data holds n elements of type; num_threads >= 1 (small n uses fewer). Throws
// std::invalid_argument on a null data with n > 0 or n < 0.
double square_sum(const void* data, ElemType type, std::int64_t n, int num_threads = 1);

}  // namespace zero::core
