#include "adapter/parked_states.h"

#include <ATen/ops/empty.h>

namespace zero::adapter {

at::Tensor ParkedStates::park(StateKind kind, TrackedTensor& buffer,
                              core::MemoryRegistry& registry, bool pin) {
  if (!buffer.holds_memory()) return {};
  const at::Tensor& device = buffer.tensor();
  // Page-locked memory speeds a GPU's copies (torch's pinned allocator caches it across
  // sleeps); for a CPU model's buffers it would only cost.
  const bool pinned = pin && device.is_cuda();
  at::Tensor host = at::empty({device.numel()},
                              device.options().device(at::kCPU).pinned_memory(pinned));
  host.copy_(device);  // waits for the copy: the device memory is freed next
  core::TrackedBytes tracking(&registry, buffer.category(),
                              pinned ? core::MemoryLocation::kHostPinned
                                     : core::MemoryLocation::kHostPageable,
                              static_cast<std::int64_t>(host.nbytes()));
  buffer.release_memory();
  entries_[index(kind)].push_back({&buffer, host, std::move(tracking)});
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

bool ParkedStates::any() const {
  for (const bool parked : parked_) {
    if (parked) return true;
  }
  return false;
}

std::int64_t ParkedStates::host_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& entries : entries_) {
    for (const Entry& entry : entries) bytes += static_cast<std::int64_t>(entry.host.nbytes());
  }
  return bytes;
}

}  // namespace zero::adapter
