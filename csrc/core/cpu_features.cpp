#include "core/cpu_features.h"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define ZERO_X86 1
#else
#define ZERO_X86 0
#endif

namespace zero::core {
namespace {

#if ZERO_X86
// XCR0 says which register files the OS saves on context switch. _xgetbv() would need the
// "xsave" target, so use the instruction directly.
unsigned long long read_xcr0() {
  unsigned int eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<unsigned long long>(edx) << 32) | eax;
}

Isa probe_hardware() {
  unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return Isa::kScalar;
  const bool fma = ecx & (1u << 12);
  const bool osxsave = ecx & (1u << 27);
  const bool avx = ecx & (1u << 28);
  const bool f16c = ecx & (1u << 29);
  if (!(osxsave && avx && fma && f16c)) return Isa::kScalar;

  const unsigned long long xcr0 = read_xcr0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6;     // SSE + AVX state
  const bool os_zmm = (xcr0 & 0xE6) == 0xE6;   // + opmask, ZMM0-15 upper halves, ZMM16-31
  if (!os_ymm) return Isa::kScalar;

  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return Isa::kScalar;
  const bool avx2 = ebx & (1u << 5);
  const bool avx512f = ebx & (1u << 16);
  if (!avx2) return Isa::kScalar;
  if (avx512f && os_zmm) return Isa::kAvx512;
  return Isa::kAvx2;
}
#else
Isa probe_hardware() { return Isa::kScalar; }
#endif

Isa resolve_best() {
  const Isa hw = detected_isa();
  const char* env = std::getenv("ZERO_CPU_ISA");
  // "auto" must be handled here: parse_isa("auto") calls best_isa(), which is being initialised.
  if (env == nullptr || *env == '\0' || std::string(env) == "auto") return hw;
  Isa wanted;
  try {
    wanted = parse_isa(env);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "[zero] ignoring ZERO_CPU_ISA: %s\n", e.what());
    return hw;
  }
  if (static_cast<int>(wanted) > static_cast<int>(hw)) {
    std::fprintf(stderr, "[zero] ZERO_CPU_ISA=%s but this CPU only supports %s; using %s\n", env,
                 isa_name(hw), isa_name(hw));
    return hw;
  }
  return wanted;
}

}  // namespace

Isa detected_isa() {
  static const Isa isa = probe_hardware();
  return isa;
}

bool isa_supported(Isa isa) {
  return static_cast<int>(isa) <= static_cast<int>(detected_isa());
}

Isa best_isa() {
  static const Isa isa = resolve_best();
  return isa;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "unknown";
}

Isa parse_isa(const std::string& name) {
  if (name.empty() || name == "auto") return best_isa();
  if (name == "scalar") return Isa::kScalar;
  if (name == "avx2") return Isa::kAvx2;
  if (name == "avx512") return Isa::kAvx512;
  throw std::invalid_argument("unknown CPU ISA '" + name +
                              "': expected one of auto, scalar, avx2, avx512");
}

}  // namespace zero::core
