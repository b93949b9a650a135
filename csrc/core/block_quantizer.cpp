#include "core/block_quantizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace zero::core {
namespace {

std::int64_t block_count(std::int64_t n, std::int64_t block) { return (n + block - 1) / block; }

void check(std::int64_t n, std::int64_t block, const void* a, const void* b, const char* what) {
  if (n < 0) throw std::invalid_argument(std::string(what) + ": negative count");
  if (block < 1) throw std::invalid_argument(std::string(what) + ": block size must be >= 1");
  if (n > 0 && (a == nullptr || b == nullptr)) {
    throw std::invalid_argument(std::string(what) + ": null buffer");
  }
}

// The largest |x| of a block, as its bit pattern: for non-negative floats the integer order is
// the float order, and inf and NaN (exponent all ones) come above every finite value. An
// integer max reduction, which the compiler vectorizes (a float one it would not, without
// -ffast-math).
std::uint32_t largest_magnitude_bits(const float* x, std::int64_t len) {
  std::uint32_t top = 0;
  for (std::int64_t i = 0; i < len; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    bits &= 0x7fffffffu;  // |x|
    top = bits > top ? bits : top;
  }
  return top;
}

constexpr std::uint32_t kInfinityBits = 0x7f800000u;

// One block: its scale, and its values as int8 (a branch-free loop the compiler vectorizes).
float quantize_block(const float* x, std::int64_t len, std::int8_t* q) {
  const std::uint32_t top = largest_magnitude_bits(x, len);
  if (top >= kInfinityBits) {  // an inf or a NaN: the whole block decodes to NaN
    std::memset(q, 0, static_cast<std::size_t>(len));
    return std::numeric_limits<float>::quiet_NaN();
  }
  float largest;
  std::memcpy(&largest, &top, sizeof largest);
  const float scale = largest / 127.0f;
  const float inverse = largest > 0.0f ? 127.0f / largest : 0.0f;
  for (std::int64_t i = 0; i < len; ++i) {
    const float r = x[i] * inverse;  // |r| <= 127 (up to rounding)
    q[i] = static_cast<std::int8_t>(static_cast<int>(r + std::copysign(0.5f, r)));
  }
  return scale;
}

template <bool kAdd>
void decode(const std::uint8_t* packed, std::int64_t n, float* out, std::int64_t block) {
  const std::int64_t blocks = block_count(n, block);
  const auto* q = reinterpret_cast<const std::int8_t*>(packed + 4 * blocks);
  for (std::int64_t b = 0; b < blocks; ++b) {
    float scale;
    std::memcpy(&scale, packed + 4 * b, sizeof scale);
    const std::int64_t begin = b * block;
    const std::int64_t len = std::min(block, n - begin);
    for (std::int64_t i = begin; i < begin + len; ++i) {
      const float value = static_cast<float>(q[i]) * scale;
      if constexpr (kAdd) {
        out[i] += value;
      } else {
        out[i] = value;
      }
    }
  }
}

}  // namespace

std::int64_t quantized_bytes(std::int64_t n, std::int64_t block) {
  if (n < 0 || block < 1) throw std::invalid_argument("quantized_bytes: bad count or block");
  return 4 * block_count(n, block) + (n + 3) / 4 * 4;
}

void quantize_int8(const float* values, std::int64_t n, std::uint8_t* packed, std::int64_t block) {
  check(n, block, values, packed, "quantize_int8");
  const std::int64_t blocks = block_count(n, block);
  auto* q = reinterpret_cast<std::int8_t*>(packed + 4 * blocks);
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t begin = b * block;
    const float scale = quantize_block(values + begin, std::min(block, n - begin), q + begin);
    std::memcpy(packed + 4 * b, &scale, sizeof scale);
  }
  const std::int64_t padded = quantized_bytes(n, block) - 4 * blocks;
  std::memset(q + n, 0, static_cast<std::size_t>(padded - n));
}

void dequantize_int8(const std::uint8_t* packed, std::int64_t n, float* out, std::int64_t block) {
  check(n, block, packed, out, "dequantize_int8");
  decode<false>(packed, n, out, block);
}

void dequantize_add_int8(const std::uint8_t* packed, std::int64_t n, float* sum,
                         std::int64_t block) {
  check(n, block, packed, sum, "dequantize_add_int8");
  decode<true>(packed, n, sum, block);
}

}  // namespace zero::core
