#pragma once
// The per-rank engine for ZeRO stages 0-3: owns the memory registry, the communicator and
// the parameter groups, and runs the optimizer step across them (overflow agreement, global
// gradient norm, clipping, update, parameter all-gather).
#include <memory>
#include <string>
#include <vector>

#include "adapter/backward_reach.h"
#include "adapter/collectives.h"
#include "adapter/gather_schedule.h"
#include "adapter/group_units.h"
#include "adapter/group.h"
#include "adapter/param_group.h"
#include "adapter/rank_places.h"
#include "adapter/stage3_group.h"
#include "core/memory_registry.h"
#include "core/range_pool.h"

namespace zero::adapter {

struct StepResult {
  bool overflow = false;   // non-finite gradients (or norm) on any rank: skipped everywhere
  double grad_norm = 0.0;  // global L2 norm of the unscaled gradients
  double clip_coef = 1.0;
  // A backward failed on some rank since the last step (EngineCore::fail_backward): its
  // gradients are partial, so the step is skipped everywhere (overflow is set too).
  bool failed_backward = false;
};

class EngineCore : public std::enable_shared_from_this<EngineCore> {
 public:
  explicit EngineCore(const std::string& group_name);

  // Stages 0-2. options.data_group names another group to shard and reduce over (MoE's
  // expert data-parallel group): the engine keeps a Communicator of its own for it.
  std::size_t add_group(std::vector<at::Tensor> params, const GroupOptions& options);
  // Takes a group built elsewhere (stage 3's partitioned groups).
  std::size_t adopt_group(std::unique_ptr<Group> group, int stage);
  Group& group(std::size_t index);
  std::size_t group_count() const { return groups_.size(); }
  // Stage 3's frozen parameters (GroupOptions::frozen): partitioned and gathered like the
  // rest, outside the optimizer's groups (numbered apart: no gradients, norm or step).
  std::size_t adopt_frozen_group(std::unique_ptr<Stage3Group> group);
  Stage3Group& frozen_group(std::size_t index);
  std::size_t frozen_group_count() const { return frozen_.size(); }

  void prepare_backward(bool boundary);
  void grad_ready(std::size_t group, std::size_t index, bool boundary);
  // Launches what is left, waits, resets the groups. Once per backward: called by stage 3's
  // end-of-backward callback and again by the engine after autograd returns (a no-op then).
  void finish_backward(bool boundary);
  // A backward that autograd raised in (a graph freed by an earlier backward, an error in a
  // custom backward): finished as every rank's must be, its remaining units reduced (the
  // other ranks may be waiting in them), and, if it reduced or took gradients, the next step
  // is skipped on every rank (StepResult::failed_backward, agreed with the norm). Nothing
  // when it is not open, or when its own finishing raised (its reductions' state unknown).
  void fail_backward();
  // Before a checkpoint's collectives: every rank is saving (or loading) at the same point of
  // training (rank_places.h); a rank saving alone is named instead of waiting.
  void agree_on_checkpoint(bool save);
  bool backward_boundary() const { return boundary_; }
  bool backward_pending() const { return backward_pending_; }

  // Stage 3's autograd triggers (backward_hooks.h). unit_backward_begins returns true the
  // first time in a backward: the caller queues the end-of-backward flush.
  bool unit_backward_begins(std::size_t unit);
  void unit_backward_ends(std::size_t unit);
  // The launch sequence of gradient units over all groups, as (group, unit) pairs.
  const std::vector<std::pair<std::size_t, std::size_t>>& launch_order() const {
    return sequence_;
  }

  // hypers: one per group. loss_scale divides the gradients; max_norm <= 0 disables clipping;
  // step is the 1-based count of applied steps including this one. muon: the optimizer is
  // Muon (on every rank alike, whether or not this rank's part of the model has Muon groups:
  // under ZeRO the norm is then taken again, over every rank of the span).
  StepResult step(const std::vector<OptimizerHyper>& hypers, double loss_scale, double max_norm,
                  std::int64_t step, bool muon = false);
  // Model parallelism (pipeline stages, tensor slices): this engine holds one part of the
  // model. Group g's squared gradients count weights[g] times in the global norm (a parameter
  // replicated on t tensor ranks 1/t, a weight tied over k stages 1/k), and the norm and the
  // overflow flag are also summed / maxed over the registered group `span_group` (every rank
  // of one model replica), so every part clips by one norm and skips a step together.
  void span_norm(std::vector<double> weights, const std::string& span_group);
  void zero_grads();
  // Delayed parameter update: applies every pending update now and gathers the parameters.
  void apply_delayed_update();
  // Lets go of every group (buffers, host pools, swap files, worker threads) after waiting
  // for their collectives; nothing may be called afterwards. Bound without the GIL, so that
  // nothing dropped here waits on a thread that needs it (a gloo worker dropping a tensor).
  void close();

  // Stage 3: the schedule that gathers, prefetches and releases units (see gather_schedule.h).
  GatherSchedule& configure_schedule(std::vector<std::string> unit_names,
                                     const ScheduleOptions& options);
  GatherSchedule& schedule();
  GroupUnits& units();  // which Stage3Group pieces make each model unit
  // Stage 3: releases every gathered unit nobody holds (kept for a reuse, prefetched, left by
  // a forward without backward), giving their memory back; nothing below stage 3.
  void release_gathered();

  // DeepSpeed's offload_states (parked_states.h): `kinds` of every group to host memory
  // (pinned when `pin` and possible), their device memory given back; kinds already
  // offloaded stay as they are. Stage 3 releases its gathered units first.
  void offload_states(const std::vector<StateKind>& kinds, bool pin);
  // Back on the device: `kinds`, or with none every kind offloaded. Whatever needs a state
  // (a forward, a gather, a backward, the step, a checkpoint) reloads it first.
  void reload_states(const std::vector<StateKind>& kinds = {});
  std::vector<StateKind> offloaded_states() const { return parked_.parked_kinds(); }
  std::int64_t offloaded_bytes() const { return parked_.host_bytes(); }

  core::MemoryRegistry& registry() { return *registry_; }
  // The host Adam's threads, one pool for every group (started at its first split step).
  core::RangePool& host_threads() { return host_threads_; }
  std::shared_ptr<core::MemoryRegistry> shared_registry() const { return registry_; }
  Communicator& communicator() { return communicator_; }
  // add_group's own data groups' communicators (MoE's expert data-parallel groups).
  std::vector<Communicator*> data_group_communicators() {
    std::vector<Communicator*> found;
    for (auto& c : data_groups_) found.push_back(c.get());
    return found;
  }

 private:
  // The norm of every group's gradients, each multiplied by its `unscale` (1 / the loss scale,
  // or 1 where they are unscaled already: Muon's updates).
  // `failed`: set when a backward failed on any rank since the last step (poisoned_).
  double global_grad_norm(const std::vector<double>& unscale, bool* failed = nullptr);
  // Muon's groups: their gradients, multiplied by their `scale`, become the updates
  // (Group::orthogonalize_grads); their scale is then 1.
  void orthogonalize_grads(const std::vector<OptimizerHyper>& hypers,
                           std::vector<double>& scale);
  std::vector<Group*> every_group();  // groups_, then frozen_
  void launch_in_order(bool boundary);
  // Stage 3: units the ranks' passes reach differently, or do not show whole, wait for the
  // end of backward (backward_reach.h).
  void defer_divergent_units();
  bool unit_deferred(std::size_t unit) const;  // model unit `unit` has a deferred part
  // Group g's gradient unit u waits for the end of this backward (backward_reach.h).
  bool deferred(std::size_t g, std::size_t u) const {
    return g < deferred_.size() && deferred_[g][u];
  }
  void adopt_observed_order();
  // Every rank of the group at `place` after as many reducing backwards and steps as this
  // one, or an error on every rank naming where each is (rank_places.h).
  void agree_place(Place place);

  // Declared first so it outlives every buffer that counts bytes in it.
  std::shared_ptr<core::MemoryRegistry> registry_;
  core::RangePool host_threads_;  // before the groups, whose steps use it
  Communicator communicator_;
  RankPlaces places_{&communicator_};  // compared before each phase's collectives
  std::int64_t reductions_ = 0;        // reducing backwards begun
  std::int64_t steps_ = 0;             // optimizer steps begun
  std::unique_ptr<Communicator> span_;  // span_norm's group; null: the norm is the group's own
  // add_group's own data groups (GroupOptions::data_group), before the groups that use them
  std::vector<std::unique_ptr<Communicator>> data_groups_;
  std::vector<double> norm_weights_;    // per group; empty: every group counts once
  std::vector<std::unique_ptr<Group>> groups_;
  std::vector<std::unique_ptr<Stage3Group>> frozen_;
  std::unique_ptr<GroupUnits> units_;  // stage 3 only; refers to groups_ and frozen_
  std::unique_ptr<GatherSchedule> schedule_;  // stage 3 only; refers to units_
  // offload_states: host copies of groups_' buffers, which it points into (declared after
  // groups_, so it goes first; close() drops it before them too)
  ParkedStates parked_;
  // One launch sequence for every group's units, identical on all ranks: a default (groups in
  // order, units last to first) until the first reducing backward, then the completion order
  // rank 0 observed in it (so later steps launch units as soon as backward finishes them).
  std::vector<std::pair<std::size_t, std::size_t>> sequence_;
  std::size_t cursor_ = 0;
  bool learning_order_ = true;
  std::vector<std::pair<std::size_t, std::size_t>> observed_;
  // Stage 3, per group, per unit, in this backward (backward_reach.h; empty before its first
  // check): waiting for the end of backward, and split (the ranks reach it differently)
  std::vector<std::vector<bool>> deferred_;
  std::vector<std::vector<bool>> split_;
  std::vector<int> checked_passes_;  // the autograd passes (graph task ids) compared
  int stage_ = -1;  // the highest stage of any group
  bool backward_pending_ = false;  // between prepare_backward and finish_backward
  bool grads_arrived_ = false;     // a gradient reached this backward
  bool poisoned_ = false;          // a failed backward's partial gradients: skip the next step
  bool finishing_ = false;         // finish_backward began for this backward
  bool flush_queued_ = false;
  bool boundary_ = false;
};

}  // namespace zero::adapter
