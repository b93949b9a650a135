#pragma once
// What EngineCore needs from a parameter group, whatever its stage: ParamGroup (stages
// 0-2, and stage 3's persistent small parameters) and Stage3Group (partitioned parameters).
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "adapter/grad_reducer.h"
#include "adapter/lamb.h"
#include "adapter/muon.h"
#include "adapter/offload_info.h"
#include "adapter/optimizer_math.h"
#include "adapter/parked_states.h"
#include "adapter/shard_state.h"
#include "core/sharded_layout.h"

namespace zero::adapter {

// A group's reduce buckets and units, as EngineCore.group_bucket_info reads them back.
struct BucketInfo {
  std::size_t buckets = 0;
  std::int64_t bucket_bytes = 0;
  std::int64_t max_unit_numel = 0;
  std::size_t units = 0;
};

class Group {
 public:
  virtual ~Group() = default;

  // --- backward ---
  virtual void prepare_backward() = 0;
  // Whether this backward reduces gradients (stages 2/3 always, 0/1 at the boundary).
  virtual bool reduces(bool boundary) const = 0;
  // Returns the unit that became complete, if any (EngineCore decides when it launches).
  virtual std::optional<std::size_t> grad_ready(std::size_t index, bool boundary) = 0;
  virtual GradReducer& reducer() = 0;
  // Stages 0-1: parameter `index`'s gradient accumulated so far, in the full buffer (what
  // param.grad views, or with grads_in_fp32 the fp32 place it is added to), for a sum made
  // outside the engine (a pipeline's tied weights). Undefined where gradients are sharded.
  virtual at::Tensor accumulated_grad(std::size_t /*index*/) const { return {}; }
  // After EngineCore has launched and waited for every unit of this backward.
  virtual void finish_backward(bool boundary) = 0;
  // Whether the gradients were reduced in place at a boundary and not stepped since: only a
  // boundary's backward may come next (its reduction can take the earlier average in).
  virtual bool reduced_in_place() const { return false; }

  // --- step ---
  // Gradients present (zero-filled if no backward ran since they were given back) before
  // the step reads them.
  virtual void hold_grads() {}
  virtual double grad_square_sum() const = 0;  // over the gradients this rank owns, in fp32
  // Muon: the gradients (multiplied by grad_scale, 1 / the loss scale) become Muon's unscaled
  // updates (muon.h), before the norm is taken; returns false for every other kind.
  bool orthogonalize_grads(const OptimizerHyper& hyper, double grad_scale) {
    if (hyper.kind != OptimizerKind::kMuon) return false;
    muon_updates(shard_state(), shard_pieces(), param_slices(), hyper, grad_scale, device());
    return true;
  }
  // step: 1-based count of applied optimizer steps, including this one. The new parameters
  // land in this rank's pieces (shard_pieces).
  void optimizer_step(const OptimizerHyper& hyper, double grad_scale, std::int64_t step) {
    const auto stepped = [this](std::size_t piece) { piece_stepped(piece); };
    if (hyper.kind == OptimizerKind::kLamb) {  // per-parameter norms over the sharing ranks
      trust_ratios_ = lamb_step(shard_state(), shard_pieces(), param_slices(), hyper, grad_scale,
                                step, stepped);
      return;
    }
    shard_state().step(shard_pieces(), hyper, grad_scale, step, stepped);
  }
  // Which parameter each stretch of this rank's shard belongs to, and the ranks sharing them.
  virtual ParamSlices param_slices() = 0;
  // LAMB: each parameter's trust ratio at the last step (none before the first).
  const std::vector<double>& trust_ratios() const { return trust_ratios_; }

 protected:
  // The layout's slices owned by `rank`, worked out on the first call (LAMB and Muon ask).
  const std::vector<core::ShardSlice>& owned_slices(int rank) {
    if (!slices_known_) owned_slices_ = layout().slices_owned_by(rank);
    slices_known_ = true;
    return owned_slices_;
  }

 public:
  // make the updated parameters visible after a step (waits for what piece_stepped started)
  virtual void gather_params() = 0;
  // Delayed parameter update: applies a finished update's parameters to this rank's shard
  // (the caller then gathers); a no-op when none is pending.
  void apply_delayed_update() { shard_state().apply_delayed(shard_pieces()); }
  virtual void zero_grads() = 0;

  // --- inspection and checkpoints (shard layout: this rank's pieces of every unit) ---
  virtual const core::ShardedLayout& layout() const = 0;
  virtual const std::vector<at::Tensor>& params() const = 0;  // the parameters, in layout order
  virtual at::Device device() const = 0;
  virtual at::Tensor master_shard() const = 0;  // a copy
  virtual bool grads_on_host() const { return false; }  // the gradient shard (offload)
  virtual void load_master_shard(const at::Tensor& saved) = 0;
  // Re-derives the fp32 master from the current (e.g. just loaded) parameters.
  virtual void refresh_master() = 0;
  // Copies of the optimizer state tensors, and loading them back (checkpoints).
  std::vector<std::pair<std::string, at::Tensor>> optimizer_state() const {
    return shard_state().optimizer_state();
  }
  void load_optimizer_state(const std::string& name, const at::Tensor& values) {
    shard_state().load_optimizer_state(name, values);
  }
  // One array ("master", or an optimizer state such as "exp_avg") at this rank's shard
  // [offset, offset + numel), touching only that range: read copies it as fp32 whatever its
  // dtype (safe_get_full_*), write stores (safe_set_full_*). Where the shard keeps no separate
  // master (fp32 training, a 16-bit master) the master is the parameters' shard.
  at::Tensor read_array(const std::string& name, std::int64_t offset, std::int64_t numel) const {
    if (name != "master" || shard_state().has_master()) {
      return shard_state().read_array(name, offset, numel).to(at::kFloat);
    }
    return read_params(offset, numel);
  }
  void write_array(const std::string& name, std::int64_t offset, const at::Tensor& values) {
    if (name == "master") return write_master_range(offset, values.reshape({-1}));
    shard_state().write_array(name, offset, values);
  }
  virtual std::size_t bucket_count() const = 0;
  virtual std::int64_t bucket_bytes() const = 0;
  BucketInfo bucket_info() const {
    return {bucket_count(), bucket_bytes(), layout().max_unit_numel(), layout().unit_count()};
  }
  // The optimizer state's offload; a partitioned group adds its parameters'.
  virtual OffloadInfo offload_info() const {
    const ShardState& state = shard_state();
    OffloadInfo info;
    info.offloaded = state.offloaded();
    info.pinned = state.pinned();
    info.why_not_pinned = state.why_not_pinned();
    info.swap = state.swap_description();
    info.delayed_pending = state.delayed_pending();
    info.offloaded_numel = state.offloaded_numel();
    info.grads_on_host = grads_on_host();
    return info;
  }

  // --- offload_states (parked_states.h) ---
  // The device buffers holding `kind` now (EngineCore parks them and restores them): the
  // master's and the optimizer state's here; a group adds its parameters' and gradients'.
  virtual std::vector<TrackedTensor*> device_buffers(StateKind kind) {
    return shard_state().device_buffers(kind);
  }
  // Told that device_buffers(kind)'s values now live in `hosts` (in its order; undefined
  // where a buffer held nothing), and later that they are back: a group whose model tensors
  // view those buffers points them at the host copies meanwhile, so they stay readable.
  virtual void states_parked(StateKind /*kind*/, const std::vector<at::Tensor>& /*hosts*/) {}
  virtual void states_restored(StateKind /*kind*/) {}

  // --- what the shared step and checkpoint code above works on ---
  // The parameters' shard [offset, offset + numel) as fp32 (a copy), where the shard keeps no
  // separate master.
  virtual at::Tensor read_params(std::int64_t offset, std::int64_t numel) const = 0;
  // Master values at shard [offset, offset + numel): into the separate master (the weights
  // follow at the next step; stage 3 at once), or into the parameters where there is none.
  virtual void write_master_range(std::int64_t offset, const at::Tensor& values) = 0;
  virtual ShardState& shard_state() = 0;
  virtual const ShardState& shard_state() const = 0;
  // This rank's pieces of the shard: each unit's gradients and the parameters a step writes.
  virtual std::vector<ShardPiece> shard_pieces() const = 0;
  // Told, during optimizer_step, that shard_pieces()[piece] holds its new parameters (a group
  // may start gathering them while the step goes on).
  virtual void piece_stepped(std::size_t /*piece*/) {}

 private:
  std::vector<core::ShardSlice> owned_slices_;
  bool slices_known_ = false;
  std::vector<double> trust_ratios_;
};

}  // namespace zero::adapter
