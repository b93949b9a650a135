#include "adapter/host_pinning.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#ifdef ZERO_WITH_CUDA
#include "cuda/host_register.h"
#endif

namespace zero::adapter {

core::HostPinning host_pinning() {
  core::HostPinning pinning;
#ifdef ZERO_WITH_CUDA
  pinning.pin = cuda::host_register;
  pinning.unpin = cuda::host_unregister;
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

namespace zero::adapter {

HostTensor::HostTensor(core::MemoryRegistry& registry, core::MemoryCategory category,
                       std::int64_t numel, at::ScalarType dtype, bool pin) {
  const std::int64_t bytes = numel * static_cast<std::int64_t>(c10::elementSize(dtype));
  const core::HostPinning pinning = host_pinning();
  pool_ = std::make_unique<core::HostPool>(std::vector<core::HostRegion>{{category, bytes}},
                                           registry, pin ? &pinning : nullptr);
  tensor_ = at::from_blob(pool_->region(0), {numel}, at::TensorOptions().dtype(dtype));
}

std::string first_why_not_pinned(const std::vector<HostTensor>& buffers) {
  for (const HostTensor& buffer : buffers) {
    if (!buffer.pinned()) return buffer.why_not_pinned();
  }
  return "";
}

PlacedBuffer::PlacedBuffer(core::MemoryRegistry& registry, core::MemoryCategory category,
                           std::int64_t numel, const c10::TensorOptions& options, bool on_host,
                           bool pin)
    : on_host_(on_host) {
  if (!on_host) {
    device_ = device_buffer(registry, category, numel, options);
    tensor_ = device_.tensor();
  } else if (numel > 0) {
    host_ = HostTensor(registry, category, numel, options.dtype().toScalarType(), pin);
    tensor_ = host_.tensor();
  } else {  // nothing to hold (e.g. every parameter unit on NVMe)
    tensor_ = at::empty({0}, options.device(at::kCPU));
  }
}

void PlacedBuffer::clear() {
  if (on_host_) {
    tensor_.zero_();
  } else {
    device_.release_memory();
  }
}

std::string PlacedBuffer::why_not_pinned() const {
  return host_.defined() && !host_.pinned() ? host_.why_not_pinned() : "";
}

}  // namespace zero::adapter
