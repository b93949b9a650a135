#pragma once
// A tensor the engine allocated, with its bytes counted in a MemoryRegistry for exactly as
// long as the engine holds it.
#include <ATen/Tensor.h>
#include <c10/core/TensorOptions.h>

#include "core/memory_registry.h"

namespace zero::adapter {

class TrackedTensor {
 public:
  TrackedTensor() = default;
  // Zero-filled, so padding never carries garbage into a reduction.
  TrackedTensor(core::MemoryRegistry& registry, core::MemoryCategory category,
                core::MemoryLocation location, std::int64_t numel,
                const c10::TensorOptions& options);

  const at::Tensor& tensor() const { return tensor_; }
  std::int64_t bytes() const { return tracking_.bytes(); }
  bool defined() const { return tensor_.defined(); }
  core::MemoryCategory category() const { return tracking_.category(); }
  // Defined and not released: its memory is there to read.
  bool holds_memory() const { return tensor_.defined() && !released_; }
  // Drops the engine's reference and its accounting. Views handed out earlier stay valid
  // (storage is refcounted) but no longer count as engine-owned.
  void reset();

  // While the buffer is idle: gives its memory back and stops counting it, keeping the
  // storage, so views handed out earlier stay attached (and must not be read until restore).
  void release_memory();
  // Takes memory again, zero-filled, on the same storage, and counts it. No-op when held.
  void restore_memory();

 private:
  at::Tensor tensor_;
  core::TrackedBytes tracking_;
  core::MemoryRegistry* registry_ = nullptr;
  std::int64_t nbytes_ = 0;
  bool released_ = false;
};

// A zero-filled engine buffer on the compute device (the common case).
inline TrackedTensor device_buffer(core::MemoryRegistry& registry, core::MemoryCategory category,
                                   std::int64_t numel, const c10::TensorOptions& options) {
  return TrackedTensor(registry, category, core::MemoryLocation::kDevice, numel, options);
}

}  // namespace zero::adapter
