#include "adapter/tracked_tensor.h"

#include <ATen/ops/zeros.h>

#include "adapter/storage_in_place.h"

namespace zero::adapter {

TrackedTensor::TrackedTensor(core::MemoryRegistry& registry, core::MemoryCategory category,
                             core::MemoryLocation location, std::int64_t numel,
                             const c10::TensorOptions& options)
    : tensor_(at::zeros({numel}, options)),
      tracking_(&registry, category, location,
                numel * static_cast<std::int64_t>(tensor_.element_size())),
      registry_(&registry),
      nbytes_(tracking_.bytes()) {}

void TrackedTensor::reset() {
  tensor_ = at::Tensor();
  tracking_.release();
  released_ = false;
}

void TrackedTensor::release_memory() {
  if (released_ || !tensor_.defined()) return;
  free_storage(tensor_);
  tracking_.release();
  released_ = true;
}

void TrackedTensor::restore_memory() {
  if (!released_) return;
  allocate_storage(tensor_, static_cast<std::size_t>(nbytes_));
  tensor_.zero_();
  tracking_ = core::TrackedBytes(registry_, tracking_.category(), tracking_.location(), nbytes_);
  released_ = false;
}

}  // namespace zero::adapter
