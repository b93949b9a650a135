#pragma once
// A shard's master and optimizer state offloaded from the device (ZeRO-Offload /
// ZeRO-Infinity), and the step that streams the shard through them in chunks. Where the
// state lives is an OffloadStore (offload_store.h: HostStore for "cpu", NvmeStore for
// "nvme"); when the step runs is the streamed step below, or with delayed_update a
// DelayedUpdate (delayed_update.h) running it behind the next forward and backward.
//
// The streamed step (a model on a device): the copy engine (copy_engine.h, its own CUDA
// stream) copies chunk c+1's gradients to host staging and chunk c-1's new parameters back to
// the device while the fused CPU Adam updates chunk c; with NVMe, chunk c+1 is read into the
// other slot meanwhile and chunk c written back after its update. Gradients already in host
// memory (a stage-2/3 gradient shard offloaded with the optimizer) are read where they are.
// A model on the host needs no staging: the in-place step updates from its gradients straight
// into its parameters, chunk by chunk, with the same NVMe reads and writes.
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "adapter/copy_engine.h"
#include "adapter/delayed_update.h"
#include "adapter/host_pinning.h"
#include "adapter/offload_options.h"
#include "adapter/offload_store.h"
#include "adapter/optimizer_math.h"
#include "adapter/shard_piece.h"
#include "adapter/shard_precision.h"
#include "core/memory_registry.h"
#include "core/range_pool.h"

namespace zero::adapter {

// Where the offloaded steps' time went (summed over steps): waiting for gradient chunks to
// reach host staging, the CPU optimizer, waiting for new parameters to reach the model, and
// the whole step. Measured on the engine thread, so the waits are what the copies did not
// hide behind the CPU Adam.
struct OffloadTimings {
  std::int64_t steps = 0;
  double grads_in_wait_s = 0;
  double cpu_optimizer_s = 0;
  double params_out_wait_s = 0;
  double step_s = 0;
};

class OffloadedState {
 public:
  // host_threads: the engine's threads for the host Adam (core/range_pool.h).
  OffloadedState(core::MemoryRegistry& registry, core::RangePool& host_threads,
                 std::int64_t shard_numel, const c10::TensorOptions& device_options,
                 OptimizerKind kind, std::vector<std::string> state_names,
                 ShardPrecision precision, const OffloadOptions& offload);
  OffloadedState(const OffloadedState&) = delete;
  OffloadedState& operator=(const OffloadedState&) = delete;

  bool pinned() const { return why_not_pinned().empty(); }
  std::string why_not_pinned() const;  // "" when every host buffer is pinned
  std::string swap_description() const { return store_->description(); }
  bool delayed_pending() const { return delayed_ && delayed_->pending(); }
  const OffloadTimings& timings() const { return timings_; }

  // One array of the store ("master", or an optimizer state such as "exp_avg") at
  // [offset, offset + numel) of the offloaded part: read copies, write stores.
  at::Tensor read(const std::string& name, std::int64_t offset, std::int64_t numel) const;
  void write(const std::string& name, std::int64_t offset, const at::Tensor& values);
  void step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper, double grad_scale,
            std::int64_t step);
  void apply_delayed(const std::vector<ShardPiece>& pieces);
  std::vector<std::pair<std::string, at::Tensor>> optimizer_state() const;  // copies
  // The optimizer-state arrays of the store (not the master, nor a delayed update's own
  // state), copying nothing.
  std::vector<std::string> state_names() const;
  void load_optimizer_state(const std::string& name, const at::Tensor& values);

 private:
  struct Segment {  // the part of one piece that falls into one chunk
    const ShardPiece* piece;
    std::int64_t begin;  // within the piece
    std::int64_t numel;
    std::int64_t at;     // within the chunk
  };
  std::vector<std::vector<Segment>> segments(const std::vector<ShardPiece>& pieces) const;
  at::Tensor host_grads(const std::vector<Segment>& chunk, std::int64_t numel) const;
  void streamed_step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper,
                     double grad_scale, std::int64_t step);
  void in_place_step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper,
                     double grad_scale, std::int64_t step);
  void update_in_place(const Segment& s, std::int64_t chunk, const OptimizerHyper& hyper,
                       double grad_scale, std::int64_t step);
  void update(const at::Tensor& grads, const at::Tensor& out, std::int64_t chunk, std::int64_t at,
              const OptimizerHyper& hyper, double grad_scale, std::int64_t step);
  void wait_delayed() const;

  OptimizerKind kind_;
  std::vector<std::string> state_names_;  // the optimizer's arrays (not the master)
  core::RangePool& host_threads_;  // the host Adam's
  at::ScalarType model_type_;  // the parameters' (gradients may be fp32: ShardPrecision::grads)
  ChunkGrid grid_;
  std::unique_ptr<OffloadStore> store_;  // the state's home
  // A device model's streamed step: two chunks' gradients (ShardPrecision::grads) and,
  // 16-bit, new parameters (model dtype). A model on the host has none (in_place_step), nor
  // has a delayed update, which stages the whole shard through its own buffers.
  HostTensor staged_grads_[2];
  HostTensor staged_params_[2];
  std::unique_ptr<DelayedUpdate> delayed_;  // delayed_update only
  std::unique_ptr<CopyEngine> copier_;      // the streamed step's; last: its copies use the above
  OffloadTimings timings_;
};

}  // namespace zero::adapter
