// AVX-512F Adam kernel, 16 floats per iteration. Structure and operation order are those of
// cpu_adam_avx2.cpp (and of update_element()); only the register width differs.
//
// Only AVX-512F instructions are used: bf16 is widened/narrowed with integer shifts and vpmovdw
// rather than AVX512_BF16 (vcvtneps2bf16 would give the same rounding, but the kernel is memory
// bound and this keeps the requirement to plain AVX-512F, i.e. Skylake-SP and later).
#include "core/cpu_adam_kernel.h"

#if defined(__x86_64__) || defined(__i386__)
// GCC 12.1/12.2 warn "__Y may be used uninitialized" inside their own AVX-512 intrinsic headers
// (GCC PR 105593, fixed in 12.3); the diagnostic points into immintrin.h, so silence it there.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#define ZERO_TARGET_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))

namespace zero::core::adam_detail {
namespace {

// Vector twin of opaque() in cpu_adam_kernel.h: the product is rounded on its own, never fused.
ZERO_TARGET_AVX512 inline __m512 opaque512(__m512 x) {
  __asm__("" : "+v"(x));
  return x;
}

template <ElemType G>
ZERO_TARGET_AVX512 inline __m512 load_grad16(const void* grads, std::int64_t i) {
  if constexpr (G == ElemType::kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(grads) + i);
  } else {
    const auto* src = static_cast<const std::uint16_t*>(grads) + i;
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    if constexpr (G == ElemType::kF16) {
      return _mm512_cvtph_ps(h);
    } else {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

// Same recipe as float_to_bf16(): add 0x7FFF + lsb, keep the top 16 bits, NaN -> 0x7FC0.
ZERO_TARGET_AVX512 inline __m256i to_bf16x16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_blend_epi32(is_nan, r, _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);  // values fit in 16 bits, so truncation is exact
}

template <Out16 O>
ZERO_TARGET_AVX512 inline void store_out16(void* out, std::int64_t i, __m512 p) {
  auto* dst = reinterpret_cast<__m256i*>(static_cast<std::uint16_t*>(out) + i);
  if constexpr (O == Out16::kBF16) {
    _mm256_storeu_si256(dst, to_bf16x16(p));
  } else if constexpr (O == Out16::kF16) {
    _mm256_storeu_si256(dst, _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT));
  }
}

struct Avx512Kernel {
  template <ElemType G, Out16 O>
  ZERO_TARGET_AVX512 static void run(const Consts& c, const Buffers& b, std::int64_t begin,
                                     std::int64_t end) {
    const __m512 grad_scale = _mm512_set1_ps(c.grad_scale);
    const __m512 l2_wd = _mm512_set1_ps(c.l2_wd);
    const __m512 decay = _mm512_set1_ps(c.decay);
    const __m512 lerp_coeff = _mm512_set1_ps(c.lerp_coeff);
    const __m512 beta2 = _mm512_set1_ps(c.beta2);
    const __m512 one_minus_beta2 = _mm512_set1_ps(c.one_minus_beta2);
    const __m512 bc2_sqrt = _mm512_set1_ps(c.bc2_sqrt);
    const __m512 eps = _mm512_set1_ps(c.eps);
    const __m512 neg_step_size = _mm512_set1_ps(c.neg_step_size);

    std::int64_t i = begin;
    for (; i + 16 <= end; i += 16) {
      // Mirrors update_element() operation for operation; keep the two in sync.
      __m512 p = _mm512_loadu_ps(b.params + i);
      __m512 m = _mm512_loadu_ps(b.exp_avg + i);
      __m512 v = _mm512_loadu_ps(b.exp_avg_sq + i);
      __m512 g = opaque512(_mm512_mul_ps(load_grad16<G>(b.grads, i), grad_scale));
      if (c.l2) g = _mm512_fmadd_ps(p, l2_wd, g);
      m = _mm512_fmadd_ps(lerp_coeff, _mm512_sub_ps(g, m), c.lerp_from_m ? m : g);
      v = _mm512_fmadd_ps(_mm512_mul_ps(one_minus_beta2, g), g, _mm512_mul_ps(v, beta2));
      const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), bc2_sqrt), eps);
      const __m512 delta = _mm512_div_ps(_mm512_mul_ps(neg_step_size, m), denom);
      if (c.decoupled) p = opaque512(_mm512_mul_ps(p, decay));
      p = _mm512_add_ps(p, delta);
      _mm512_storeu_ps(b.params + i, p);
      _mm512_storeu_ps(b.exp_avg + i, m);
      _mm512_storeu_ps(b.exp_avg_sq + i, v);
      store_out16<O>(b.out16, i, p);
    }
    update_range_scalar(c, b, i, end);
  }
};

}  // namespace

void adam_range_avx512(const Consts& c, const Buffers& b, std::int64_t begin, std::int64_t end) {
  dispatch_types<Avx512Kernel>(c, b, begin, end);
}

}  // namespace zero::core::adam_detail

#else  // not x86: isa_supported(kAvx512) is false, so this is never called

namespace zero::core::adam_detail {
void adam_range_avx512(const Consts& c, const Buffers& b, std::int64_t begin, std::int64_t end) {
  update_range_scalar(c, b, begin, end);
}
}  // namespace zero::core::adam_detail

#endif
