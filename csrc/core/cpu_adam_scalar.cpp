// Portable Adam kernel: the fallback on CPUs without AVX2/FMA/F16C and the reference the vector
// kernels must match bit for bit. Built for the baseline target, so std::fma is a libm call (still
// correctly rounded, which is what keeps it identical to the hardware fma of the vector paths).
#include "core/cpu_adam_kernel.h"

namespace zero::core::adam_detail {

void adam_range_scalar(const Consts& c, const Buffers& b, std::int64_t begin, std::int64_t end) {
  update_range_scalar(c, b, begin, end);
}

}  // namespace zero::core::adam_detail
