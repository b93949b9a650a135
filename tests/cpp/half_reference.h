#pragma once
// Independent decodings of 16-bit floats for the tests: bf16 is the top half of a float, fp16
// is read from its fields. Deliberately not the kernels' own bit tricks.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace zero_test {

inline double bf16_value(std::uint16_t h) {
  std::uint32_t u = std::uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline double fp16_value(std::uint16_t h) {
  const int exp = (h >> 10) & 0x1F;
  const int mant = h & 0x3FF;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exp == 0x1F) return mant ? std::numeric_limits<double>::quiet_NaN()
                               : sign * std::numeric_limits<double>::infinity();
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

}  // namespace zero_test
