#include "cuda/host_register.h"

#include <cuda_runtime_api.h>

namespace zero::cuda {

bool host_register(void* address, std::size_t bytes, std::string& why) {
  const cudaError_t status = cudaHostRegister(address, bytes, cudaHostRegisterDefault);
  if (status == cudaSuccess) return true;
  cudaGetLastError();  // clear the error so later CUDA calls do not report it
  why = std::string("cudaHostRegister failed: ") + cudaGetErrorString(status) +
        " (check `ulimit -l`, the locked-memory limit)";
  return false;
}

void host_unregister(void* address) { cudaHostUnregister(address); }

}  // namespace zero::cuda
