#pragma once
// Runtime x86 ISA detection for the CPU optimizer kernels.
//
// The core is compiled for the baseline x86-64 target (no -march=native), so every wider kernel is
// compiled with a per-function target attribute and may only run after these checks say so.
// Detection asks cpuid *and* xgetbv: a CPU can advertise AVX-512 while the OS (or a hypervisor)
// has not enabled the ZMM register state, and executing it then faults.
#include <string>

namespace zero::core {

// Ordered from narrowest to widest; code relies on the order to clamp a request to what exists.
enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// kScalar: portable C++ (still uses correctly rounded std::fma, see cpu_adam.h).
// kAvx2:   AVX2 + FMA + F16C (Haswell / Zen1 and later).
// kAvx512: AVX-512F on top of the above (Skylake-SP / Zen4 and later).
bool isa_supported(Isa isa);

// The widest ISA this CPU supports, capped by the ZERO_CPU_ISA environment variable
// (scalar|avx2|avx512) when it is set. A request for something the CPU lacks falls back to the
// widest supported one, with a one-time note on stderr. Read once and cached.
Isa best_isa();

// The widest ISA the hardware supports, ignoring ZERO_CPU_ISA.
Isa detected_isa();

const char* isa_name(Isa isa);  // "scalar", "avx2", "avx512"

// Parses "scalar" | "avx2" | "avx512"; "auto" or "" means best_isa(). Throws std::invalid_argument
// naming the accepted spellings. Does not check support: pair with isa_supported().
Isa parse_isa(const std::string& name);

}  // namespace zero::core
