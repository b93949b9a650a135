#pragma once
// Page-locking host memory for offload pools (core/host_pool.h). CUDA builds register the
// slab with the CUDA runtime; CPU builds cannot pin and say so, and the pool stays pageable.
#include "core/host_pool.h"

namespace zero::adapter {

core::HostPinning host_pinning();

}  // namespace zero::adapter
