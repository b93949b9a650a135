#pragma once
// DeepSpeed's offload_states / reload_states. While the engine sleeps (an RLHF trainer
// generating with another engine on the same GPU), the chosen states' device buffers are
// copied to host memory (pinned for a GPU's buffers when asked) and their device memory is
// given back; a reload takes device memory again on the same storages and copies the values
// back. The buffers keep their storages throughout (storage_in_place.h), so every view stays
// attached but must not be read in between: EngineCore reloads what a call needs first.
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/Tensor.h>

#include "adapter/tracked_tensor.h"
#include "core/memory_registry.h"

namespace zero::adapter {

// DeepSpeed's OffloadStateTypeEnum; its contiguous_grad_buffer has no counterpart: zero's
// reduce buckets hold memory only while a reduction runs.
enum class StateKind : std::uint8_t {
  kOptimizerStates,  // optim_states: Adam's m and v, SGD's momentum
  kMaster,           // hp_params: the fp32 master (mixed precision)
  kParams,           // lp_params: the model's parameters (stage 3: this rank's shard)
  kGrads,            // lp_grads: the gradients (stages 0-1) or this rank's gradient shard
};
inline constexpr std::size_t kStateKindCount = 4;

class ParkedStates {
 public:
  // Copies `buffer` to host memory under `kind` and gives its device memory back. Returns the
  // host copy: exactly its bytes (a HostPool, pinned for a GPU's buffer when `pin` and the
  // build can), counted in `registry` and freed with the last view of it, so a view taken
  // while parked outlives the reload. Undefined when the buffer held no memory.
  at::Tensor park(StateKind kind, TrackedTensor& buffer,
                  const std::shared_ptr<core::MemoryRegistry>& registry, bool pin);
  // Every buffer parked under `kind` takes device memory again and gets its values back.
  void restore(StateKind kind);
  // Zeroes the host copies of `kind` (zero_grad while the gradients are away).
  void zero(StateKind kind);
  bool parked(StateKind kind) const { return parked_[index(kind)]; }
  void mark_parked(StateKind kind) { parked_[index(kind)] = true; }
  std::vector<StateKind> parked_kinds() const;  // in StateKind's order
  std::int64_t host_bytes() const;

 private:
  struct Entry {
    // A group's member: EngineCore drops its ParkedStates before its groups.
    TrackedTensor* buffer;
    at::Tensor host;
  };
  static std::size_t index(StateKind kind) { return static_cast<std::size_t>(kind); }

  std::array<std::vector<Entry>, kStateKindCount> entries_;
  std::array<bool, kStateKindCount> parked_{};
};

}  // namespace zero::adapter
