#pragma once
// Page-locking host memory that was allocated elsewhere (the offload host pools), so device
// copies from and to it run asynchronously at full bandwidth. Torch-free; only compiled with
// nvcc, called by the adapter (host_pinning.cpp) in CUDA builds.
#include <cstddef>
#include <string>

namespace zero::cuda {

// Returns true when [address, address + bytes) is now pinned; false with the reason in `why`
// (e.g. the locked-memory limit), leaving no CUDA error behind.
bool host_register(void* address, std::size_t bytes, std::string& why);
void host_unregister(void* address);

}  // namespace zero::cuda
