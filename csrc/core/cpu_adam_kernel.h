#pragma once
// Internal to the cpu_adam*.cpp files: the per-step constants, the scalar reference of one element
// update (used by the scalar ISA and for every vector kernel's tail), 16-bit conversions (also
// read by square_sum.cpp), and the per-ISA range entry points that cpu_adam.cpp dispatches to.
//
// Everything here is `static inline` on purpose: each ISA file inlines it into functions compiled
// with a different target attribute, and a shared out-of-line copy would be an ODR hazard.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/cpu_adam.h"

namespace zero::core::adam_detail {

// Per-step scalars, rounded to float once from double (as torch's fused kernel does).
struct Consts {
  float grad_scale;
  float l2_wd;          // weight_decay in Adam (L2) mode, else 0
  bool l2;
  float decay;          // 1 - lr * wd in AdamW mode
  bool decoupled;
  // lerp(m, g, w) is evaluated like at::lerp: w < 0.5 ? m + w*(g - m) : g - (1 - w)*(g - m), which
  // is fma(coeff, g - m, base) with coeff = w or w - 1 and base = m or g.
  float lerp_coeff;
  bool lerp_from_m;     // base is m (w < 0.5) or g
  float beta2;
  float one_minus_beta2;
  float bc2_sqrt;
  float eps;
  float neg_step_size;  // -lr / bc1
};

static inline Consts make_consts(const AdamParams& hp) {
  Consts c{};
  const double step = static_cast<double>(hp.step);
  const double bc1 = hp.bias_correction ? 1.0 - std::pow(hp.beta1, step) : 1.0;
  const double bc2 = hp.bias_correction ? 1.0 - std::pow(hp.beta2, step) : 1.0;
  const bool has_wd = hp.weight_decay != 0.0;
  c.grad_scale = hp.grad_scale;
  c.l2 = has_wd && !hp.adamw_mode;
  c.l2_wd = c.l2 ? static_cast<float>(hp.weight_decay) : 0.0f;
  c.decoupled = has_wd && hp.adamw_mode;
  c.decay = static_cast<float>(1.0 - hp.lr * hp.weight_decay);
  const double w = 1.0 - hp.beta1;
  c.lerp_from_m = std::abs(static_cast<float>(w)) < 0.5f;
  c.lerp_coeff = c.lerp_from_m ? static_cast<float>(w) : static_cast<float>(w) - 1.0f;
  c.beta2 = static_cast<float>(hp.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - hp.beta2);
  c.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  c.eps = static_cast<float>(hp.eps);
  c.neg_step_size = static_cast<float>(-(hp.lr / bc1));
  return c;
}

// Hides a value from the optimizer so that the product that produced it is rounded on its own and
// never fused into a later addition (see update_element). Emits no instructions.
static inline float opaque(float x) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __asm__("" : "+x"(x));
  return x;
#else
  volatile float keep = x;
  return keep;
#endif
}

// The whole update of one element. The vector kernels perform exactly these operations in exactly
// this order, so all ISAs agree bit for bit. Rounding is pinned down so that compiler FP
// contraction (-ffp-contract=fast, GCC's default in GNU modes) cannot change it: every product that
// feeds a separate addition is either an explicit fma or passed through opaque(). Which is which
// reproduces torch 2.13's vectorized fused CPU Adam/AdamW bit for bit (checked when written; the
// tests hold it to 1e-6). Returns the new parameter value (also stored through p).
static inline float update_element(const Consts& c, float& p, float g, float& m, float& v) {
  g = opaque(g * c.grad_scale);
  if (c.l2) g = std::fma(p, c.l2_wd, g);                             // g + p * wd
  m = std::fma(c.lerp_coeff, g - m, c.lerp_from_m ? m : g);          // at::lerp
  v = std::fma(c.one_minus_beta2 * g, g, v * c.beta2);               // v*b2 + (1-b2)*g*g
  const float denom = std::sqrt(v) / c.bc2_sqrt + c.eps;
  const float delta = (c.neg_step_size * m) / denom;
  p = (c.decoupled ? opaque(p * c.decay) : p) + delta;               // p*(1-lr*wd) rounded first
  return p;
}

// ---- 16-bit conversions (scalar; the vector kernels implement the same bit recipes) ----

static inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

static inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

static inline float bf16_to_float(std::uint16_t h) { return bits_float(std::uint32_t{h} << 16); }

// Round-to-nearest-even by adding 0x7FFF plus the lowest kept bit; NaN becomes the canonical quiet
// NaN 0x7FC0 (same as c10::BFloat16) since rounding could otherwise carry it into infinity.
static inline std::uint16_t float_to_bf16(float f) {
  const std::uint32_t u = float_bits(f);
  if (f != f) return 0x7FC0;
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static inline float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  const std::uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return bits_float(sign | 0x7F800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  // Zero or subnormal: mant * 2^-24 is exact in float.
  const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign ? -mag : mag;
}

// Round-to-nearest-even, including into the subnormal range and overflow to infinity; NaN stays a
// quiet NaN with the payload's top bits, as vcvtps2ph does.
static inline std::uint16_t float_to_fp16(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  if (abs >= 0x47800000u) return sign | 0x7C00u;  // >= 65536: rounds to inf (so does >= 65520)
  if (abs >= 0x38800000u) {                        // normal half: exponent >= -14
    const std::uint32_t rounded = abs + 0xFFFu + ((abs >> 13) & 1u);
    // Carry out of the mantissa bumps the exponent, which is correct (up to inf at 65520).
    return static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  if (abs < 0x33000000u) return sign;              // < 2^-25: rounds to zero (2^-25 ties to 0)
  // Subnormal half: value = mant * 2^-24. Shift the 24-bit significand so its units are 2^-24.
  const std::uint32_t exp = abs >> 23;             // biased float exponent, 102..112
  const std::uint32_t sig = (abs & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126u - exp;          // 14..24
  const std::uint32_t half_ulp = 1u << (shift - 1);
  const std::uint32_t kept = sig >> shift;
  const std::uint32_t rest = sig & ((1u << shift) - 1u);
  const std::uint32_t up = rest > half_ulp || (rest == half_ulp && (kept & 1u));
  return static_cast<std::uint16_t>(sign | (kept + up));
}

static inline float load_grad(const void* grads, ElemType type, std::int64_t i) {
  switch (type) {
    case ElemType::kF32: return static_cast<const float*>(grads)[i];
    case ElemType::kBF16: return bf16_to_float(static_cast<const std::uint16_t*>(grads)[i]);
    case ElemType::kF16: return fp16_to_float(static_cast<const std::uint16_t*>(grads)[i]);
  }
  return 0.0f;
}

// Pointers to the full buffers; kernels index them with absolute element offsets.
struct Buffers {
  float* params;
  const void* grads;
  ElemType grad_type;
  float* exp_avg;
  float* exp_avg_sq;
  void* out16;  // nullptr = no 16-bit copy
  ElemType out16_type;
};

// Scalar loop over [begin, end): the scalar ISA, and the tail of every vector kernel.
static inline void update_range_scalar(const Consts& c, const Buffers& b, std::int64_t begin,
                                       std::int64_t end) {
  auto* out = static_cast<std::uint16_t*>(b.out16);
  for (std::int64_t i = begin; i < end; ++i) {
    const float g = load_grad(b.grads, b.grad_type, i);
    const float p = update_element(c, b.params[i], g, b.exp_avg[i], b.exp_avg_sq[i]);
    if (out == nullptr) continue;
    out[i] = b.out16_type == ElemType::kBF16 ? float_to_bf16(p) : float_to_fp16(p);
  }
}

// What, if anything, the kernel writes as the 16-bit copy; a template parameter of the vector loops
// so that the per-element code has no type branches.
enum class Out16 { kNone, kBF16, kF16 };

// Turns the runtime (grad type, out16 type) pair into Kernel::run<G, O>(...), one instantiation
// per combination, so each ISA file writes its loop once as a template.
template <class Kernel>
static inline void dispatch_types(const Consts& c, const Buffers& b, std::int64_t begin,
                                  std::int64_t end) {
  auto with_out = [&](auto grad_tag) {
    constexpr ElemType G = decltype(grad_tag)::value;
    if (b.out16 == nullptr) {
      Kernel::template run<G, Out16::kNone>(c, b, begin, end);
    } else if (b.out16_type == ElemType::kBF16) {
      Kernel::template run<G, Out16::kBF16>(c, b, begin, end);
    } else {
      Kernel::template run<G, Out16::kF16>(c, b, begin, end);
    }
  };
  switch (b.grad_type) {
    case ElemType::kF32: with_out(std::integral_constant<ElemType, ElemType::kF32>{}); break;
    case ElemType::kBF16: with_out(std::integral_constant<ElemType, ElemType::kBF16>{}); break;
    case ElemType::kF16: with_out(std::integral_constant<ElemType, ElemType::kF16>{}); break;
  }
}

// Per-ISA kernels over [begin, end). Only call one whose ISA is supported.
void adam_range_scalar(const Consts& c, const Buffers& b, std::int64_t begin, std::int64_t end);
void adam_range_avx2(const Consts& c, const Buffers& b, std::int64_t begin, std::int64_t end);
void adam_range_avx512(const Consts& c, const Buffers& b, std::int64_t begin, std::int64_t end);

}  // namespace zero::core::adam_detail
