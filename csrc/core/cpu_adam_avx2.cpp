// AVX2 + FMA + F16C Adam kernel, 8 floats per iteration.
//
// The library is built for baseline x86-64, so these functions carry a target attribute instead
// of relying on -mavx2; cpu_adam.cpp only calls them after isa_supported(Isa::kAvx2).
// bf16 gradients are widened with integer shifts (AVX2 has no bf16 instructions) and fp16 ones with
// F16C, so neither drops to the scalar loop. The tail (< 8 elements) uses the scalar element
// update, which performs the identical operations.
#include "core/cpu_adam_kernel.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define ZERO_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace zero::core::adam_detail {
namespace {

// Vector twin of opaque() in cpu_adam_kernel.h: the product is rounded on its own, never fused.
ZERO_TARGET_AVX2 inline __m256 opaque256(__m256 x) {
  __asm__("" : "+x"(x));
  return x;
}

template <ElemType G>
ZERO_TARGET_AVX2 inline __m256 load_grad8(const void* grads, std::int64_t i) {
  if constexpr (G == ElemType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(grads) + i);
  } else {
    const auto* src = static_cast<const std::uint16_t*>(grads) + i;
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    if constexpr (G == ElemType::kF16) {
      return _mm256_cvtph_ps(h);
    } else {  // bf16 is the top half of an fp32: widen to 32 bits and shift into place
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

// Same recipe as float_to_bf16(): add 0x7FFF + lsb, keep the top 16 bits, NaN -> 0x7FC0.
ZERO_TARGET_AVX2 inline __m128i to_bf16x8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), is_nan);
  // packus works per 128-bit lane: [r0-3 r0-3 | r4-7 r4-7]; gather qwords 0 and 2.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}

template <Out16 O>
ZERO_TARGET_AVX2 inline void store_out8(void* out, std::int64_t i, __m256 p) {
  auto* dst = reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(out) + i);
  if constexpr (O == Out16::kBF16) {
    _mm_storeu_si128(dst, to_bf16x8(p));
  } else if constexpr (O == Out16::kF16) {
    _mm_storeu_si128(dst, _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT));
  }
}

struct Avx2Kernel {
  template <ElemType G, Out16 O>
  ZERO_TARGET_AVX2 static void run(const Consts& c, const Buffers& b, std::int64_t begin,
                                   std::int64_t end) {
    const __m256 grad_scale = _mm256_set1_ps(c.grad_scale);
    const __m256 l2_wd = _mm256_set1_ps(c.l2_wd);
    const __m256 decay = _mm256_set1_ps(c.decay);
    const __m256 lerp_coeff = _mm256_set1_ps(c.lerp_coeff);
    const __m256 beta2 = _mm256_set1_ps(c.beta2);
    const __m256 one_minus_beta2 = _mm256_set1_ps(c.one_minus_beta2);
    const __m256 bc2_sqrt = _mm256_set1_ps(c.bc2_sqrt);
    const __m256 eps = _mm256_set1_ps(c.eps);
    const __m256 neg_step_size = _mm256_set1_ps(c.neg_step_size);

    std::int64_t i = begin;
    for (; i + 8 <= end; i += 8) {
      // Mirrors update_element() operation for operation; keep the two in sync.
      __m256 p = _mm256_loadu_ps(b.params + i);
      __m256 m = _mm256_loadu_ps(b.exp_avg + i);
      __m256 v = _mm256_loadu_ps(b.exp_avg_sq + i);
      __m256 g = opaque256(_mm256_mul_ps(load_grad8<G>(b.grads, i), grad_scale));
      if (c.l2) g = _mm256_fmadd_ps(p, l2_wd, g);
      m = _mm256_fmadd_ps(lerp_coeff, _mm256_sub_ps(g, m), c.lerp_from_m ? m : g);
      v = _mm256_fmadd_ps(_mm256_mul_ps(one_minus_beta2, g), g, _mm256_mul_ps(v, beta2));
      const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), bc2_sqrt), eps);
      const __m256 delta = _mm256_div_ps(_mm256_mul_ps(neg_step_size, m), denom);
      if (c.decoupled) p = opaque256(_mm256_mul_ps(p, decay));
      p = _mm256_add_ps(p, delta);
      _mm256_storeu_ps(b.params + i, p);
      _mm256_storeu_ps(b.exp_avg + i, m);
      _mm256_storeu_ps(b.exp_avg_sq + i, v);
      store_out8<O>(b.out16, i, p);
    }
    update_range_scalar(c, b, i, end);
  }
};

}  // namespace

void adam_range_avx2(const Consts& c, const Buffers& b, std::int64_t begin, std::int64_t end) {
  dispatch_types<Avx2Kernel>(c, b, begin, end);
}

}  // namespace zero::core::adam_detail

#else  // not x86: isa_supported(kAvx2) is false, so this is never called

namespace zero::core::adam_detail {
void adam_range_avx2(const Consts& c, const Buffers& b, std::int64_t begin, std::int64_t end) {
  update_range_scalar(c, b, begin, end);
}
}  // namespace zero::core::adam_detail

#endif
