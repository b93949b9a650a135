#pragma once
// How this zero._C was built and what it finds on this machine: the environment report
// (zero/env_report.py, `zero-report`, DeepSpeed's ds_report) prints it, so a user (or
// scripts/gpu_check.sh) sees at once an extension built against another torch, without
// CUDA, or without io_uring.
#include <string>

namespace zero::adapter {

struct BuildInfo {
  bool cuda = false;            // compiled with ZERO_WITH_CUDA (the CUDA kernels, copy streams)
  std::string torch_version;    // the torch headers it was compiled against
  std::string compiler;         // the C++ compiler's name and version
  bool cxx11_abi = false;       // _GLIBCXX_USE_CXX11_ABI (must match torch's)
  bool io_uring = false;        // liburing found at build time (NVMe offload's fast backend)
  std::string cpu_isa;          // the CPU Adam kernel this process runs (ZERO_CPU_ISA caps it)
  std::string cpu_isa_detected; // the widest the CPU supports
};

BuildInfo build_info();

}  // namespace zero::adapter
