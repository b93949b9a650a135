#pragma once
// Gradient reduction in buckets, overlapped with backward. Buckets are launched strictly in
// bucket order (the same on every rank, whatever order grads arrive in), so ranks always
// issue the same collective sequence.
//
//   kAllReduce     (stages 0, 1): grads live in a full flat buffer (param.grad are views of
//                  it); a ready bucket is all-reduced in place over its flat range.
//   kReduceScatter (stage 2): each ready grad is copied into a bucket buffer laid out in
//                  per-rank chunks and released; the bucket is reduce-scattered and each rank
//                  adds its chunk into its gradient shard. Bucket buffers come from a small
//                  pool (two with overlap_comm, one without) that grows only if more buckets
//                  are filling at once than the pool holds.
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/Tensor.h>

#include "adapter/collectives.h"
#include "adapter/tracked_tensor.h"
#include "core/bucket_plan.h"

namespace zero::adapter {

enum class ReduceMode { kAllReduce, kReduceScatter };

class GradReducer {
 public:
  // `grads` is the full flat gradient buffer (kAllReduce) or this rank's gradient shard
  // (kReduceScatter); the reducer writes into it and never owns it.
  GradReducer(ReduceMode mode, const core::FlatBufferPlan& plan, std::int64_t bucket_numel,
              bool overlap_comm, at::Tensor grads, core::MemoryRegistry& registry,
              Communicator& communicator);

  // `grad` of parameter `index` is final for this backward. For kReduceScatter it is copied
  // into its bucket; the caller may free it afterwards.
  void grad_ready(std::size_t index, const at::Tensor& grad);
  // Launches every bucket not launched yet (in order) and waits for all of them.
  void finish();
  std::size_t bucket_count() const { return buckets_.size(); }
  std::size_t buffer_count() const { return slots_.size(); }
  std::int64_t bucket_buffer_bytes() const;

 private:
  struct Slot {
    TrackedTensor scatter;  // world_size * max chunk
    TrackedTensor chunk;    // the reduce-scatter output
    bool filling = false;    // assigned to a bucket that is still collecting grads
    bool in_flight = false;  // its reduce-scatter has not been waited yet
  };
  struct InFlight {
    Slot* slot = nullptr;  // kReduceScatter only
    std::unique_ptr<PendingCollective> work;
    std::function<void()> then;  // runs after the wait
  };

  Slot& slot_for(std::size_t bucket);
  Slot& acquire_slot();
  Slot& add_slot();
  void launch_ready_buckets();
  void launch(std::size_t bucket);
  void wait_oldest();

  ReduceMode mode_;
  const core::FlatBufferPlan& plan_;
  std::vector<core::Bucket> buckets_;
  std::vector<std::size_t> bucket_of_param_;
  std::vector<std::size_t> missing_;      // params still to arrive, per bucket
  std::vector<Slot*> slot_of_bucket_;     // kReduceScatter: the slot a bucket fills
  std::size_t next_launch_ = 0;
  at::Tensor grads_;
  core::MemoryRegistry& registry_;
  Communicator& communicator_;
  std::int64_t max_chunk_numel_ = 0;
  std::deque<std::unique_ptr<Slot>> slots_;
  std::deque<InFlight> in_flight_;  // oldest first
};

}  // namespace zero::adapter
