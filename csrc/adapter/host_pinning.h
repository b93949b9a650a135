#pragma once
// Host memory for offloaded state: page-locking (CUDA builds register the slab with the CUDA
// runtime; CPU builds cannot pin and say so) and a single engine buffer in host memory.
#include <memory>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "adapter/tracked_tensor.h"
#include "core/host_pool.h"

namespace zero::adapter {

core::HostPinning host_pinning();

// One zero-filled engine buffer in host memory, pinned when asked and possible, counted in
// the registry under `category` at kHostPinned or kHostPageable for as long as it lives.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(core::MemoryRegistry& registry, core::MemoryCategory category, std::int64_t numel,
             at::ScalarType dtype, bool pin);

  const at::Tensor& tensor() const { return tensor_; }
  bool defined() const { return tensor_.defined(); }
  bool pinned() const { return pool_ && pool_->pinned(); }
  std::string why_not_pinned() const { return pool_ ? pool_->why_not_pinned() : ""; }

 private:
  std::unique_ptr<core::HostPool> pool_;
  at::Tensor tensor_;  // views the pool's memory
};

// Why the first of `buffers` that is pageable is so; "" when every one is pinned.
std::string first_why_not_pinned(const std::vector<HostTensor>& buffers);

// A zero-filled engine buffer of `options`' dtype that lives on the compute device, or, when
// offloaded, in host memory (a HostTensor): a shard that offload may move off the device.
class PlacedBuffer {
 public:
  PlacedBuffer() = default;
  PlacedBuffer(core::MemoryRegistry& registry, core::MemoryCategory category, std::int64_t numel,
               const c10::TensorOptions& options, bool on_host, bool pin);

  const at::Tensor& tensor() const { return tensor_; }
  bool on_host() const { return on_host_; }
  bool pinned() const { return host_.pinned(); }
  // Why a host buffer is pageable ("" when pinned, empty or on the device).
  std::string why_not_pinned() const;
  // Zeroes the buffer. On the device its memory is given back until restore_memory()
  // takes it again, zero-filled (TrackedTensor); a host buffer (pinned, or pooled with
  // others) keeps its memory and is zeroed in place.
  void clear();
  void restore_memory() {
    if (!on_host_) device_.restore_memory();
  }
  // The buffer when it lives on the device (offload_states parks it), else null.
  TrackedTensor* on_device() { return on_host_ ? nullptr : &device_; }

 private:
  TrackedTensor device_;
  HostTensor host_;
  at::Tensor tensor_;
  bool on_host_ = false;
};

}  // namespace zero::adapter
