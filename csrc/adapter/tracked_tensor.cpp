#include "adapter/tracked_tensor.h"

#include <ATen/ops/zeros.h>

namespace zero::adapter {

TrackedTensor::TrackedTensor(core::MemoryRegistry& registry, core::MemoryCategory category,
                             core::MemoryLocation location, std::int64_t numel,
                             const c10::TensorOptions& options)
    : tensor_(at::zeros({numel}, options)),
      tracking_(&registry, category, location,
                numel * static_cast<std::int64_t>(tensor_.element_size())) {}

void TrackedTensor::reset() {
  tensor_ = at::Tensor();
  tracking_.release();
}

}  // namespace zero::adapter
