#pragma once
// The optimizer side of a rank's shard: the master (mixed precision, or offload) and the
// optimizer's arrays (Adam's m and v, SGD's momentum, ...: optimizer_state_names), all laid
// out like the shard, in the dtypes of shard_precision.h, and the step over its pieces. On the
// device (the default) the update runs with ATen ops, or, for Adam on a CPU device, with the
// fused CPU Adam kernel (host_adam.h); with offload the state and the step
// move to the host or NVMe (offloaded_state.h): all of the shard, or with a ratio < 1 its
// tail, [device_numel, shard_numel), while the head stays on the device.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "adapter/offloaded_state.h"
#include "adapter/optimizer_math.h"
#include "adapter/parked_states.h"
#include "adapter/shard_precision.h"
#include "adapter/tracked_tensor.h"
#include "core/range_pool.h"

namespace zero::adapter {

class ShardState {
 public:
  // state_names: the optimizer's arrays (optimizer_state_names). precision: their dtypes and
  // whether a separate master is kept (mixed precision); offload and an external optimizer
  // always keep one.
  // host_threads: the engine's threads for the host Adam (core/range_pool.h).
  ShardState(core::MemoryRegistry& registry, core::RangePool& host_threads,
             std::int64_t shard_numel, const c10::TensorOptions& device_options,
             OptimizerKind kind, std::vector<std::string> state_names, ShardPrecision precision,
             const OffloadOptions& offload);

  bool has_master() const { return master_.defined() || offloaded_ != nullptr; }
  bool offloaded() const { return offloaded_ != nullptr; }
  bool pinned() const { return offloaded_ && offloaded_->pinned(); }
  // Why offloaded state is pageable ("" when pinned or not offloaded).
  std::string why_not_pinned() const { return offloaded_ ? offloaded_->why_not_pinned() : ""; }
  std::string swap_description() const {
    return offloaded_ ? offloaded_->swap_description() : "";
  }
  bool delayed_pending() const { return offloaded_ && offloaded_->delayed_pending(); }
  OffloadTimings offload_timings() const { return offloaded_ ? offloaded_->timings() : OffloadTimings{}; }
  std::int64_t offloaded_numel() const { return shard_numel_ - device_numel_; }
  // Where the step's own temporaries are counted (Muon's gathered blends).
  core::MemoryRegistry& registry() const { return registry_; }

  // The separate master of shard [offset, offset + numel): read returns a copy, write stores.
  at::Tensor read_master(std::int64_t offset, std::int64_t numel) const {
    return read_array("master", offset, numel);
  }
  void write_master(std::int64_t offset, const at::Tensor& values) {
    write_array("master", offset, values);
  }
  // Updates the pieces (grads multiplied by grad_scale) and leaves the new parameters in each
  // piece's `param` (with a delayed update: the previous step's). step is 1-based. `stepped`
  // is called with each piece's index once its parameters are in place: piece by piece on
  // the device, all at the end when some of the shard is offloaded.
  void step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper, double grad_scale,
            std::int64_t step, const std::function<void(std::size_t)>& stepped = {});
  // For an update stepped outside step() (LAMB, lamb.h), on the device: what piece `piece`
  // updates (the separate master's range, or the piece's parameters themselves) and its
  // optimizer arrays' ranges (views). keeps_master(): the new parameters are then stored into
  // the piece (store_params).
  at::Tensor master_of(const ShardPiece& piece) const;
  std::vector<at::Tensor> states_of(const ShardPiece& piece) const;
  bool keeps_master() const { return master_.defined(); }
  // Delayed update: writes the finished update's parameters into the pieces.
  void apply_delayed(const std::vector<ShardPiece>& pieces);
  // Copies of the optimizer state tensors (state_names(); with a delayed update also its
  // pending parameters, so a checkpoint resumes exactly).
  std::vector<std::pair<std::string, at::Tensor>> optimizer_state() const;
  void load_optimizer_state(const std::string& name, const at::Tensor& values);
  // The optimizer-state arrays laid out like the shard (not a delayed update's own state),
  // copying nothing.
  std::vector<std::string> state_names() const;
  // One array ("master", or an optimizer state such as "exp_avg") of shard
  // [offset, offset + numel): read returns a copy on the device of the shard's head (the
  // offloaded tail's part moved there), write stores.
  at::Tensor read_array(const std::string& name, std::int64_t offset, std::int64_t numel) const;
  void write_array(const std::string& name, std::int64_t offset, const at::Tensor& values);
  // The device buffers of the fp32 master (kMaster) or the optimizer state
  // (kOptimizerStates), for offload_states; none of another kind, nor of an offloaded tail
  // (in host memory already).
  std::vector<TrackedTensor*> device_buffers(StateKind kind);

 private:
  // Cuts pieces at device_numel_: the head's pieces, and the tail's re-based to the tail.
  std::pair<std::vector<ShardPiece>, std::vector<ShardPiece>> split(
      const std::vector<ShardPiece>& pieces) const;
  void check_kind(const OptimizerHyper& hyper) const;
  // Steps the piece with the fused CPU Adam kernel when its state is on the host (a CPU
  // model); false leaves it to the ATen ops.
  bool host_adam(const ShardPiece& piece, const OptimizerHyper& hyper, double grad_scale,
                 std::int64_t step);
  void step_on_device(const ShardPiece& piece, const OptimizerHyper& hyper, double grad_scale,
                      std::int64_t step);
  // kExternal: hyper.external updates the whole shard at once, then the pieces get their
  // parameters.
  void external_step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper,
                     double grad_scale, const std::function<void(std::size_t)>& stepped);
  void update(at::Tensor master, const at::Tensor& grads, std::int64_t offset,
              const OptimizerHyper& hyper, std::int64_t step);
  at::Tensor state(const std::string& name) const;  // "master" too; undefined when absent
  // The arrays live whole here when the shard is empty or kept on the device.
  bool on_device_only() const { return device_numel_ > 0 || !offloaded_; }

  core::MemoryRegistry& registry_;
  core::RangePool& host_threads_;  // the host Adam's
  OptimizerKind kind_;
  ShardPrecision precision_;
  std::int64_t shard_numel_;
  std::int64_t device_numel_;  // [0, device_numel_) of the shard keeps its state here
  std::vector<TrackedTensor> device_owned_;
  at::Tensor master_;
  std::vector<std::string> state_names_;
  std::vector<at::Tensor> states_;        // the head's arrays, in state_names_ order
  std::unique_ptr<OffloadedState> offloaded_;
};

}  // namespace zero::adapter
