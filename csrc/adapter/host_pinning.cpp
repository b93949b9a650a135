#include "adapter/host_pinning.h"

#ifdef ZERO_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace zero::adapter {

core::HostPinning host_pinning() {
  core::HostPinning pinning;
#ifdef ZERO_WITH_CUDA
  pinning.pin = [](void* address, std::size_t bytes, std::string& why) {
    const cudaError_t status = cudaHostRegister(address, bytes, cudaHostRegisterDefault);
    if (status == cudaSuccess) return true;
    cudaGetLastError();  // clear the sticky error so later CUDA calls do not see it
    why = std::string("cudaHostRegister failed: ") + cudaGetErrorString(status) +
          " (check `ulimit -l`, the locked-memory limit)";
    return false;
  };
  pinning.unpin = [](void* address) { cudaHostUnregister(address); };
#else
  pinning.pin = [](void*, std::size_t, std::string& why) {
    why = "this torch is a CPU build: pinned (page-locked) memory needs CUDA";
    return false;
  };
  pinning.unpin = [](void*) {};
#endif
  return pinning;
}

}  // namespace zero::adapter
