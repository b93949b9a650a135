#include "adapter/parked_states.h"

namespace zero::adapter {

at::Tensor ParkedStates::park(StateKind kind, TrackedTensor& buffer,
                              core::MemoryRegistry& registry, bool pin) {
  if (!buffer.holds_memory()) return {};
  const at::Tensor& device = buffer.tensor();
  HostTensor host(registry, buffer.category(), device.numel(), device.scalar_type(), pin);
  host.tensor().copy_(device);  // waits for the copy: the device memory is freed next
  buffer.release_memory();
  entries_[index(kind)].push_back({&buffer, std::move(host)});
  return entries_[index(kind)].back().host.tensor();
}

void ParkedStates::restore(StateKind kind) {
  for (Entry& entry : entries_[index(kind)]) {
    entry.buffer->restore_memory();
    entry.buffer->tensor().copy_(entry.host.tensor());
  }
  entries_[index(kind)].clear();  // the host copies go
  parked_[index(kind)] = false;
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
    for (const Entry& entry : entries) bytes += entry.host.tensor().nbytes();
  }
  return bytes;
}

}  // namespace zero::adapter
