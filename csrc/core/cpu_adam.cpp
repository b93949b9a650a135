// adam_step(): argument checks, per-step constants, ISA choice and the thread split.
#include "core/cpu_adam.h"

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "core/cpu_adam_kernel.h"

namespace zero::core {
namespace {

using adam_detail::Buffers;
using adam_detail::Consts;
using RangeFn = void (*)(const Consts&, const Buffers&, std::int64_t, std::int64_t);

// Chunk boundaries are multiples of this, so each thread's slice starts cache-line aligned for
// both fp32 and 16-bit buffers. (Results do not depend on it: all paths are bit-identical.)
constexpr std::int64_t kChunkAlign = 64;
// Below this many elements per thread, spawning a thread costs more than the work it takes.
constexpr std::int64_t kMinPerThread = 32 * 1024;

RangeFn kernel_for(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return adam_detail::adam_range_scalar;
    case Isa::kAvx2: return adam_detail::adam_range_avx2;
    case Isa::kAvx512: return adam_detail::adam_range_avx512;
  }
  throw std::invalid_argument("adam_step: unknown Isa value");
}

void check_args(const AdamParams& hp, const void* grads, ElemType grad_type, std::int64_t n,
                void* out16, ElemType out16_type, Isa isa) {
  if (!isa_supported(isa)) {
    throw std::invalid_argument(std::string("adam_step: ISA '") + isa_name(isa) +
                                "' is not supported by this CPU (best available: " +
                                isa_name(detected_isa()) + ")");
  }
  if (n < 0) throw std::invalid_argument("adam_step: n must be >= 0, got " + std::to_string(n));
  if (hp.bias_correction && hp.step < 1) {
    throw std::invalid_argument("adam_step: step is 1-based (increment it before the call), got " +
                                std::to_string(hp.step));
  }
  if (grad_type != ElemType::kF32 && grad_type != ElemType::kBF16 && grad_type != ElemType::kF16) {
    throw std::invalid_argument("adam_step: unknown grad ElemType");
  }
  if (out16 != nullptr && out16_type != ElemType::kBF16 && out16_type != ElemType::kF16) {
    throw std::invalid_argument(std::string("adam_step: out16 must be bfloat16 or float16, got ") +
                                elem_type_name(out16_type));
  }
  if (n > 0 && grads == nullptr) throw std::invalid_argument("adam_step: grads is null");
}

}  // namespace

const char* elem_type_name(ElemType type) {
  switch (type) {
    case ElemType::kF32: return "float32";
    case ElemType::kBF16: return "bfloat16";
    case ElemType::kF16: return "float16";
  }
  return "unknown";
}

void adam_step(const AdamParams& hp, float* params, const void* grads, ElemType grad_type,
               float* exp_avg, float* exp_avg_sq, std::int64_t n, void* out16,
               ElemType out16_type, Isa isa, int num_threads) {
  check_args(hp, grads, grad_type, n, out16, out16_type, isa);
  if (n == 0) return;

  const Consts c = adam_detail::make_consts(hp);
  const Buffers b{params, grads, grad_type, exp_avg, exp_avg_sq, out16, out16_type};
  const RangeFn kernel = kernel_for(isa);

  const std::int64_t max_useful = std::max<std::int64_t>(1, n / kMinPerThread);
  const std::int64_t threads = std::clamp<std::int64_t>(num_threads, 1, max_useful);
  if (threads == 1) {
    kernel(c, b, 0, n);
    return;
  }

  std::int64_t chunk = (n + threads - 1) / threads;
  chunk = (chunk + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
  std::vector<std::thread> workers;
  workers.reserve(static_cast<std::size_t>(threads - 1));
  for (std::int64_t begin = chunk; begin < n; begin += chunk) {
    const std::int64_t end = std::min(n, begin + chunk);
    try {
      workers.emplace_back(kernel, std::cref(c), std::cref(b), begin, end);
    } catch (const std::system_error&) {
      kernel(c, b, begin, end);  // out of threads: do this chunk here rather than fail the step
    }
  }
  kernel(c, b, 0, std::min(n, chunk));  // the calling thread takes the first chunk
  for (auto& w : workers) w.join();
}

}  // namespace zero::core
