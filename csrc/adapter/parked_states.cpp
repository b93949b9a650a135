#include "adapter/parked_states.h"

#include <ATen/ops/from_blob.h>

#include "adapter/host_pinning.h"
#include "core/host_pool.h"

namespace zero::adapter {

namespace {

// A host copy's memory: the pool and, declared first so it goes last, the registry the pool
// counts its bytes in (a view may outlive the engine).
struct HostCopy {
  std::shared_ptr<core::MemoryRegistry> registry;
  std::unique_ptr<core::HostPool> pool;
};

at::Tensor host_copy_of(const TrackedTensor& buffer,
                        const std::shared_ptr<core::MemoryRegistry>& registry, bool pin) {
  const at::Tensor& device = buffer.tensor();
  const core::HostPinning pinning = host_pinning();
  auto copy = std::make_shared<HostCopy>();
  copy->registry = registry;
  // Page-locked memory speeds a GPU's copies; for a CPU model's buffers it would only cost.
  const core::HostRegion region{buffer.category(), static_cast<std::int64_t>(device.nbytes())};
  copy->pool = std::make_unique<core::HostPool>(std::vector<core::HostRegion>{region}, *registry,
                                                pin && device.is_cuda() ? &pinning : nullptr);
  void* data = copy->pool->region(0);
  return at::from_blob(data, {device.numel()}, [copy](void*) {},
                       at::TensorOptions().dtype(device.scalar_type()));
}

}  // namespace

at::Tensor ParkedStates::park(StateKind kind, TrackedTensor& buffer,
                              const std::shared_ptr<core::MemoryRegistry>& registry, bool pin) {
  if (!buffer.holds_memory()) return {};
  at::Tensor host = host_copy_of(buffer, registry, pin);
  host.copy_(buffer.tensor());  // waits for the copy: the device memory is freed next
  entries_[index(kind)].push_back({&buffer, host});  // recorded before anything is lost
  buffer.release_memory();
  return host;
}

void ParkedStates::restore(StateKind kind) {
  for (Entry& entry : entries_[index(kind)]) {
    entry.buffer->restore_memory();
    entry.buffer->tensor().copy_(entry.host);
  }
  entries_[index(kind)].clear();  // the host copies go, but for views someone still holds
  parked_[index(kind)] = false;
}

void ParkedStates::zero(StateKind kind) {
  for (Entry& entry : entries_[index(kind)]) entry.host.zero_();
}

std::vector<StateKind> ParkedStates::parked_kinds() const {
  std::vector<StateKind> kinds;
  for (std::size_t i = 0; i < kStateKindCount; ++i) {
    if (parked_[i]) kinds.push_back(static_cast<StateKind>(i));
  }
  return kinds;
}

std::int64_t ParkedStates::host_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& entries : entries_) {
    for (const Entry& entry : entries) bytes += static_cast<std::int64_t>(entry.host.nbytes());
  }
  return bytes;
}

}  // namespace zero::adapter
