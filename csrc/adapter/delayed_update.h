#pragma once
// ZeRO-Offload's delayed parameter update (offload_optimizer.delayed_update, host only): the
// whole host update of step i runs on a worker thread during step i+1's forward and
// backward; its new parameters become the model's at the start of step i+1's optimizer step.
// The model trains on parameters one update old. Holds the step's gradients and the
// parameters the update produces (shard-sized, staging; the gradients in their own dtype, the
// parameters in the model's). At each start the step's gradients are copied in by a copy
// engine (copy_engine.h) while the last update's parameters go to the model on the engine
// thread: with gradients on a GPU (stage 1, grads_on_device) the two cross the bus in
// opposite directions at once; a host gradient shard is a memcpy beside the upload.
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "adapter/copy_engine.h"
#include "adapter/host_pinning.h"
#include "adapter/offload_store.h"
#include "adapter/shard_piece.h"
#include "core/task_worker.h"

namespace zero::adapter {

class DelayedUpdate {
 public:
  // Updates chunk `chunk` of the state from `grads`, writing the new parameters to `out`.
  using ChunkUpdate =
      std::function<void(const at::Tensor& grads, const at::Tensor& out, std::int64_t chunk)>;

  // The kept gradients are `grads_type` (ShardPrecision::grads), the new parameters
  // `model_type`; `device` is the model's.
  DelayedUpdate(core::MemoryRegistry& registry, ChunkGrid grid, c10::Device device,
                at::ScalarType model_type, at::ScalarType grads_type, bool pin_memory);
  DelayedUpdate(const DelayedUpdate&) = delete;
  DelayedUpdate& operator=(const DelayedUpdate&) = delete;

  bool pending() const { return pending_; }
  bool pinned() const { return grads_.pinned() && params_.pinned(); }
  std::string why_not_pinned() const;

  // Applies the previous update's parameters to `pieces`, keeps their gradients and starts
  // this step's update (every chunk through `update`) on the worker.
  void start(const std::vector<ShardPiece>& pieces, ChunkUpdate update);
  // Waits for the running update and, if one is pending, writes its parameters to `pieces`.
  void apply(const std::vector<ShardPiece>& pieces);
  void wait() const;  // rethrows a failed update

  // For checkpoints: the pending parameters and whether they are pending
  // ("delayed_params", "delayed_pending"); load() returns false for a name not its own.
  std::vector<std::pair<std::string, at::Tensor>> state() const;
  bool load(const std::string& name, const at::Tensor& values);

 private:
  ChunkGrid grid_;
  HostTensor grads_;
  HostTensor params_;
  bool pending_ = false;
  mutable std::shared_future<void> job_;
  CopyEngine copier_;  // the gradients' copy (start waits for it)
  std::unique_ptr<core::TaskWorker> worker_;  // last: it stops before the buffers go
};

}  // namespace zero::adapter
