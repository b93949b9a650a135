#include "adapter/build_info.h"

#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#else
#include <torch/version.h>
#endif

#include "core/cpu_features.h"
#include "core/io_backend.h"

namespace zero::adapter {
namespace {

std::string compiler_name() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("g++ ") + __VERSION__;
#else
  return "unknown";
#endif
}

}  // namespace

BuildInfo build_info() {
  BuildInfo info;
#ifdef ZERO_WITH_CUDA
  info.cuda = true;
#endif
  info.torch_version = TORCH_VERSION;
  info.compiler = compiler_name();
  info.cxx11_abi = _GLIBCXX_USE_CXX11_ABI != 0;
  info.io_uring = core::io_uring_compiled();
  info.cpu_isa = core::isa_name(core::best_isa());
  info.cpu_isa_detected = core::isa_name(core::detected_isa());
  return info;
}

}  // namespace zero::adapter
