#include "adapter/engine_core.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/graph_task.h>

#include "adapter/process_group.h"
#include "adapter/stage3_group.h"

namespace zero::adapter {

EngineCore::EngineCore(const std::string& group_name)
    : registry_(std::make_shared<core::MemoryRegistry>()),
      host_threads_(at::get_num_threads()),  // torch's intra-op count (the launcher sets it)
      communicator_(resolve_group(group_name)) {}

std::size_t EngineCore::add_group(std::vector<at::Tensor> params, const GroupOptions& options) {
  at::NoGradGuard no_grad;
  Communicator* communicator = &communicator_;
  if (!options.data_group.empty()) {
    data_groups_.push_back(
        std::make_unique<Communicator>(resolve_group(options.data_group), options.average_over));
    communicator = data_groups_.back().get();
  }
  return adopt_group(
      std::make_unique<ParamGroup>(std::move(params), options, *registry_, host_threads_,
                                   *communicator),
      options.stage);
}

std::size_t EngineCore::adopt_group(std::unique_ptr<Group> group, int stage) {
  // Stage 0 replicates everything; any other group shards its gradients or optimizer state,
  // so the norm needs a sum over ranks. Mixing the two would double-count stage-0 grads.
  TORCH_CHECK(stage_ == -1 || (stage_ == 0) == (stage == 0), "zero: stage ", stage,
              " groups cannot be mixed with stage ", stage_, " groups in one engine");
  stage_ = std::max(stage_, stage);
  groups_.push_back(std::move(group));
  const std::size_t index = groups_.size() - 1;
  const std::size_t units = groups_.back()->reducer().unit_count();
  for (std::size_t u = units; u-- > 0;) sequence_.emplace_back(index, u);
  return index;
}

std::size_t EngineCore::adopt_frozen_group(std::unique_ptr<Stage3Group> group) {
  TORCH_CHECK(!group->reduces(false), "zero: adopt_frozen_group takes a frozen stage-3 group");
  frozen_.push_back(std::move(group));
  return frozen_.size() - 1;
}

Stage3Group& EngineCore::frozen_group(std::size_t index) {
  TORCH_CHECK(index < frozen_.size(), "zero: frozen group ", index, " does not exist (",
              frozen_.size(), " frozen groups)");
  return *frozen_[index];
}

std::vector<Group*> EngineCore::every_group() {
  std::vector<Group*> all;
  for (auto& group : groups_) all.push_back(group.get());
  for (auto& group : frozen_) all.push_back(group.get());
  return all;
}

GatherSchedule& EngineCore::configure_schedule(std::vector<std::string> unit_names,
                                               const ScheduleOptions& options) {
  schedule_.reset();
  units_ = std::make_unique<GroupUnits>(unit_names.size());
  places_.name_units(unit_names);
  schedule_ = std::make_unique<GatherSchedule>(*units_, std::move(unit_names), options,
                                               &places_);
  return *schedule_;
}

GroupUnits& EngineCore::units() {
  TORCH_CHECK(units_, "zero: no stage-3 units; this engine is not at stage 3");
  return *units_;
}

GatherSchedule& EngineCore::schedule() {
  TORCH_CHECK(schedule_, "zero: no stage-3 schedule; this engine is not at stage 3");
  return *schedule_;
}

Group& EngineCore::group(std::size_t index) {
  TORCH_CHECK(index < groups_.size(), "zero: group ", index, " does not exist (", groups_.size(),
              " groups)");
  return *groups_[index];
}

void EngineCore::prepare_backward(bool boundary) {
  at::NoGradGuard no_grad;  // engine buffers are not part of any autograd graph
  TORCH_CHECK(!backward_pending_, "zero: a backward is still open (an earlier backward raised "
              "before the engine finished it); the engine cannot start another one");
  for (const auto& group : groups_) {
    // Its unreduced sums could not join the average the boundary made in place.
    TORCH_CHECK(boundary || !group->reduced_in_place(), "zero: a backward outside the "
                "accumulation boundary (engine.no_sync(), set_gradient_accumulation_boundary"
                "(False)) after the boundary's backward and before engine.step(): the "
                "boundary's gradients were reduced already. Call engine.step() first (or "
                "engine.zero_grad() to drop them)");
  }
  bool reducing = false;
  for (const auto& group : groups_) reducing = reducing || group->reduces(boundary);
  if (reducing) {  // (before anything changes: a rank that diverged leaves this engine usable)
    agree_place(Place::kReduce);
    ++reductions_;
  }
  reload_states({StateKind::kParams, StateKind::kGrads});
  backward_pending_ = true;
  grads_arrived_ = false;
  finishing_ = false;
  flush_queued_ = false;
  deferred_.clear();
  split_.clear();
  checked_passes_.clear();
  boundary_ = boundary;
  for (auto& group : groups_) group->prepare_backward();
}

bool EngineCore::unit_backward_begins(std::size_t unit) {
  at::NoGradGuard no_grad;
  TORCH_CHECK(backward_pending_, "zero: a backward reached the model's ZeRO-3 units without "
              "the engine: compute the loss from the engine's forward (engine(...), not "
              "engine.module(...)) and call loss.backward() or engine.backward(loss); the engine "
              "gathers each unit's parameters and reduces its gradients around autograd");
  schedule().before_backward(unit);
  const bool first = !flush_queued_;
  flush_queued_ = true;
  defer_divergent_units();  // (after the fingerprint exchange: every rank is at this unit)
  return first;
}

void EngineCore::defer_divergent_units() {
  // The first unit event of each autograd pass compares what the pass reaches: the backward,
  // and each recomputation of a reentrant activation checkpoint inside it (a pass of its own,
  // whose parameters the backward's graph does not show).
  // (one rank has nothing to disagree with)
  if (groups_.empty() || communicator_.world_size() == 1) return;
  const int pass = torch::autograd::get_current_graph_task_id();
  if (std::find(checked_passes_.begin(), checked_passes_.end(), pass) != checked_passes_.end()) {
    return;
  }
  checked_passes_.push_back(pass);
  RECORD_FUNCTION("zero::backward_reach", {});
  const auto reach = compare_reach(groups_, communicator_, groups_.front()->device());
  const bool first = deferred_.empty();
  if (first) {
    for (const auto& units : reach) {
      deferred_.emplace_back(units.size(), false);
      split_.emplace_back(units.size(), false);
    }
  }
  // A split unit waits for the end of backward. One not shown whole waits too, until a later
  // pass's check shows it whole on every rank (its recomputation, before its gradients).
  for (std::size_t g = 0; g < reach.size(); ++g) {
    for (std::size_t u = 0; u < reach[g].size(); ++u) {
      if (reach[g][u].split) split_[g][u] = true;
      if (split_[g][u]) {
        deferred_[g][u] = true;
      } else if (first || reach[g][u].whole) {
        deferred_[g][u] = !reach[g][u].whole;
      }
    }
  }
}

bool EngineCore::unit_deferred(std::size_t unit) const {
  for (const auto& [group, local] : units_->parts(unit)) {
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      if (groups_[g].get() == group && deferred(g, local)) return true;
    }
  }
  return false;
}

void EngineCore::unit_backward_ends(std::size_t unit) {
  at::NoGradGuard no_grad;
  schedule().after_backward(unit);
}

void EngineCore::grad_ready(std::size_t group_index, std::size_t index, bool boundary) {
  at::NoGradGuard no_grad;  // engine buffers are not part of any autograd graph
  RECORD_FUNCTION("zero::grad_ready", {});
  grads_arrived_ = true;
  Group& target = group(group_index);
  const auto completed = target.grad_ready(index, boundary);
  if (schedule_) {
    const auto* partitioned = dynamic_cast<const Stage3Group*>(&target);
    const std::size_t local = target.layout().location(index).buffer;
    // Only a gradient that completes its unit's part can complete the unit. A unit with a
    // deferred part may complete so on some ranks only: it is released at its backward's end
    // everywhere.
    if (partitioned != nullptr && partitioned->pending_grads(local) == 0) {
      for (const auto& [unit, frozen_part] : units_->completed_by(partitioned, local)) {
        if (!unit_deferred(unit)) schedule_->grads_done(unit, frozen_part);
      }
    }
  }
  if (!completed) return;
  if (learning_order_) observed_.emplace_back(group_index, *completed);
  launch_in_order(boundary);
}

void EngineCore::launch_in_order(bool boundary) {
  // cursor_: the first unit not yet launched (or passed: e.g. stage 3's persistent group
  // mid-accumulation). A deferred unit is passed over, not passed: the cursor stays at it, so
  // a later look launches it once it is no longer deferred, or the end of backward does.
  for (std::size_t i = cursor_; i < sequence_.size(); ++i) {
    const auto [g, u] = sequence_[i];
    GradReducer& reducer = groups_[g]->reducer();
    if (groups_[g]->reduces(boundary) && !reducer.launched(u)) {
      if (deferred(g, u)) continue;
      if (!reducer.complete(u)) return;
      reducer.launch(u);
    }
    if (i == cursor_) ++cursor_;
  }
}

void EngineCore::finish_backward(bool boundary) {
  at::NoGradGuard no_grad;  // engine buffers are not part of any autograd graph
  if (!backward_pending_) return;
  finishing_ = true;
  if (schedule_) schedule_->end_backward();
  bool reducing = false;
  for (const auto& group : groups_) reducing = reducing || group->reduces(boundary);
  if (reducing) {
    // A group that saw no gradient in this backward (a branch this rank did not take) still
    // reduces its units: its gradient shard must hold memory (zero-filled) for them.
    for (auto& group : groups_) {
      if (group->reduces(boundary)) group->hold_grads();
    }
    // Units still waiting (unused parameters, blocked behind one, or divergent) go now, in
    // order.
    for (const auto& [g, u] : sequence_) {
      GradReducer& reducer = groups_[g]->reducer();
      if (groups_[g]->reduces(boundary) && !reducer.launched(u)) reducer.launch(u);
    }
    {
      RECORD_FUNCTION("zero::reduce_wait", {});
      for (auto& group : groups_) group->reducer().wait_all();
    }
    if (learning_order_) adopt_observed_order();
  }
  cursor_ = 0;
  deferred_.clear();
  split_.clear();
  checked_passes_.clear();
  for (Group* group : every_group()) group->finish_backward(boundary);
  // Closed only now: a backward that failed while finishing (a rank disagreeing at its end,
  // no memory for the gradient shard, a failed reduction) counts as one that raised.
  backward_pending_ = false;
}

void EngineCore::fail_backward() {
  if (!backward_pending_ || finishing_) return;
  bool reducing = false;
  for (const auto& group : groups_) reducing = reducing || group->reduces(boundary_);
  poisoned_ = poisoned_ || grads_arrived_ || reducing;
  finish_backward(boundary_);
}

void EngineCore::agree_place(Place place) {
  if (groups_.empty()) return;  // nothing this engine reduces or steps
  places_.verify({place, reductions_, steps_}, groups_.front()->device(), "zero: ranks diverged",
                 "Every rank must run its backwards, engine.step() and save/load_checkpoint "
                 "alike: a rank that skips engine.step(), runs an extra backward (stages 2 and 3 "
                 "reduce every backward, stages 0 and 1 the accumulation boundary's) or calls "
                 "save_checkpoint alone (it is collective: call it on every rank, as DeepSpeed "
                 "requires) would wait for the others forever");
}

void EngineCore::agree_on_checkpoint(bool save) {
  TORCH_CHECK(!backward_pending_, "zero: ", save ? "save" : "load", "_checkpoint while a backward "
              "is open (it raised while its gradients were being reduced): the other ranks may "
              "be waiting in that reduction. Build a new engine and load the last checkpoint");
  agree_place(save ? Place::kSave : Place::kLoad);
}

void EngineCore::adopt_observed_order() {
  // Rank 0's completion order becomes everyone's launch order (ranks may have observed
  // different orders); units it never saw complete keep their default places at the end.
  std::vector<std::int64_t> flat;
  for (const auto& [g, u] : observed_) {
    flat.push_back(static_cast<std::int64_t>(g));
    flat.push_back(static_cast<std::int64_t>(u));
  }
  const auto options = at::TensorOptions().dtype(at::kLong).device(groups_.front()->device());
  at::Tensor count = at::tensor({static_cast<std::int64_t>(flat.size())}, at::kLong).to(options.device());
  communicator_.broadcast(count, 0, /*control=*/true)->wait();
  at::Tensor pairs = at::zeros({count.item<std::int64_t>()}, options);
  if (communicator_.rank() == 0 && !flat.empty()) {
    pairs.copy_(at::tensor(flat, at::kLong));
  }
  communicator_.broadcast(pairs, 0, /*control=*/true)->wait();
  const at::Tensor agreed = pairs.cpu();
  std::vector<std::pair<std::size_t, std::size_t>> order;
  std::vector<std::vector<bool>> placed;
  for (const auto& group : groups_) placed.emplace_back(group->reducer().unit_count(), false);
  for (std::int64_t i = 0; i + 1 < agreed.numel(); i += 2) {
    const auto g = static_cast<std::size_t>(agreed[i].item<std::int64_t>());
    const auto u = static_cast<std::size_t>(agreed[i + 1].item<std::int64_t>());
    if (g < placed.size() && u < placed[g].size() && !placed[g][u]) {
      placed[g][u] = true;
      order.emplace_back(g, u);
    }
  }
  for (const auto& [g, u] : sequence_) {
    if (!placed[g][u]) order.emplace_back(g, u);
  }
  sequence_ = std::move(order);
  observed_.clear();
  learning_order_ = false;
}

void EngineCore::span_norm(std::vector<double> weights, const std::string& span_group) {
  TORCH_CHECK(weights.size() == groups_.size(), "zero: span_norm got ", weights.size(),
              " weights for ", groups_.size(), " groups");
  norm_weights_ = std::move(weights);
  span_ = std::make_unique<Communicator>(resolve_group(span_group));
}

double EngineCore::global_grad_norm(const std::vector<double>& unscale, bool* failed) {
  double square_sum = 0.0;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const double weight = norm_weights_.empty() ? 1.0 : norm_weights_[g];
    square_sum += weight * unscale[g] * unscale[g] * groups_[g]->grad_square_sum();
  }
  // Beside the sum: whether a backward failed on this rank since the last step
  // (fail_backward), told to every rank with it.
  double failures = failed != nullptr && poisoned_ ? 1.0 : 0.0;
  if (communicator_.world_size() > 1 || span_) {
    at::Tensor total = at::tensor({square_sum, failures}, at::TensorOptions().dtype(
                                                              at::kDouble).device(
                                                              groups_.front()->device()));
    if (stage_ >= 1) {  // each rank holds a different shard of the gradients
      communicator_.all_reduce(total, Reduction::kSum)->wait();
    } else if (!span_) {  // stage 0: the same gradients everywhere, so the same sum: the max
      communicator_.all_reduce(total, Reduction::kMax, /*control=*/true)->wait();
    } else {  // stage 0 over a split model (an MoE's experts differ by rank): the flag alone
      at::Tensor flag = total.narrow(0, 1, 1).clone();
      communicator_.all_reduce(flag, Reduction::kMax, /*control=*/true)->wait();
      total.narrow(0, 1, 1).copy_(flag);
    }
    if (span_) span_->all_reduce(total, Reduction::kSum)->wait();  // the other parts'
    total = total.cpu();
    square_sum = total[0].item<double>();
    failures = total[1].item<double>();
  }
  if (failed != nullptr) *failed = failures > 0.0;
  return std::sqrt(square_sum);
}

StepResult EngineCore::step(const std::vector<OptimizerHyper>& hypers, double loss_scale,
                            double max_norm, std::int64_t step, bool muon) {
  at::NoGradGuard no_grad;  // engine buffers are not part of any autograd graph
  TORCH_CHECK(hypers.size() == groups_.size(), "zero: step got ", hypers.size(),
              " hyperparameter sets for ", groups_.size(), " groups");
  TORCH_CHECK(loss_scale > 0.0, "zero: loss scale must be > 0, got ", loss_scale);
  TORCH_CHECK(!backward_pending_, "zero: engine.step() after a backward that raised before it "
              "finished: its gradients are only partly reduced (some reductions may never "
              "complete), so no step can use them. This engine takes no further backward or "
              "step; restart the job, or build a new engine, and load the last checkpoint");
  agree_place(Place::kStep);
  ++steps_;
  StepResult result;
  reload_states();
  release_gathered();  // a unit kept gathered (an eval forward, a reuse) would go stale
  for (auto& group : groups_) {
    group->hold_grads();
    group->reducer().zero_unreduced();  // a discarded host shard: what no backward reached
  }
  std::vector<double> unscale(groups_.size(), 1.0 / loss_scale);
  {
    RECORD_FUNCTION("zero::grad_norm", {});
    result.grad_norm = global_grad_norm(unscale, &result.failed_backward);
    poisoned_ = false;
  }
  // The norm is all-reduced, so every rank sees the same non-finite value: in any dtype, a
  // NaN or Inf gradient anywhere skips the step everywhere and never reaches the weights
  // (fp16's overflow, which lowers the loss scale, is this too).
  const auto skipped = [&] {
    result.overflow = true;
    zero_grads();
    return result;
  };
  if (result.failed_backward || !std::isfinite(result.grad_norm)) return skipped();
  // Muon's gradients become its updates: under ZeRO before the norm is taken (DeepSpeed's ZeRO
  // optimizers clip the updates), without it after clipping (DeepSpeed's engine clips the
  // model's gradients, then steps).
  const bool updates_clipped = stage_ >= 1;
  if (muon && updates_clipped) {
    orthogonalize_grads(hypers, unscale);
    RECORD_FUNCTION("zero::grad_norm", {});
    result.grad_norm = global_grad_norm(unscale);
    if (!std::isfinite(result.grad_norm)) return skipped();  // (the momentum has moved)
  }
  if (max_norm > 0.0) {
    // torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), capped at 1.
    result.clip_coef = std::min(1.0, max_norm / (result.grad_norm + 1e-6));
  }
  std::vector<double> scale(groups_.size());
  for (std::size_t g = 0; g < groups_.size(); ++g) scale[g] = result.clip_coef * unscale[g];
  if (muon && !updates_clipped) orthogonalize_grads(hypers, scale);
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    RECORD_FUNCTION("zero::optimizer_step", {});
    groups_[g]->optimizer_step(hypers[g], scale[g], step);
  }
  for (auto& group : groups_) {
    RECORD_FUNCTION("zero::gather_params", {});
    group->gather_params();
  }
  RECORD_FUNCTION("zero::zero_grads", {});
  zero_grads();
  return result;
}

void EngineCore::orthogonalize_grads(const std::vector<OptimizerHyper>& hypers,
                                     std::vector<double>& scale) {
  RECORD_FUNCTION("zero::muon_updates", {});
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g]->orthogonalize_grads(hypers[g], scale[g])) scale[g] = 1.0;
  }
}

void EngineCore::release_gathered() {
  at::NoGradGuard no_grad;
  if (schedule_) schedule_->release_unused();
}

void EngineCore::apply_delayed_update() {
  at::NoGradGuard no_grad;
  reload_states();
  release_gathered();  // gathered copies would go stale
  for (auto& group : groups_) group->apply_delayed_update();
  for (auto& group : groups_) group->gather_params();
}

void EngineCore::close() {
  parked_ = ParkedStates();  // host copies of buffers about to go
  schedule_.reset();  // refers to units_, which refers to groups_
  units_.reset();
  groups_.clear();
  frozen_.clear();
  sequence_.clear();
  observed_.clear();
  communicator_.release();
  if (span_) span_->release();
  for (auto& data_group : data_groups_) data_group->release();
}

void EngineCore::zero_grads() {
  at::NoGradGuard no_grad;  // engine buffers are not part of any autograd graph
  // After a backward that raised, its reductions may still be writing the gradient buffers:
  // those stay as they are (step() refuses them; the engine's teardown waits first).
  if (backward_pending_) return;
  // Offloaded gradients are zeroed where they are; a group leaves a moved buffer alone.
  if (parked_.parked(StateKind::kGrads)) parked_.zero(StateKind::kGrads);
  for (auto& group : groups_) group->zero_grads();
}

void EngineCore::offload_states(const std::vector<StateKind>& kinds, bool pin) {
  at::NoGradGuard no_grad;
  TORCH_CHECK(!backward_pending_, "zero: offload_states during a backward; call it after the "
              "step (or before the next forward)");
  release_gathered();
  const std::vector<Group*> groups = every_group();  // the frozen parameters' shards too
  // Every group of every kind asked before anything moves (a group may refuse).
  std::vector<std::pair<StateKind, std::vector<std::vector<TrackedTensor*>>>> moves;
  for (const StateKind kind : kinds) {
    if (parked_.parked(kind)) continue;
    moves.emplace_back(kind, std::vector<std::vector<TrackedTensor*>>{});
    for (Group* group : groups) moves.back().second.push_back(group->device_buffers(kind));
  }
  for (const auto& [kind, buffers] : moves) {
    parked_.mark_parked(kind);
    try {
      for (std::size_t g = 0; g < groups.size(); ++g) {
        std::vector<at::Tensor> hosts;
        for (TrackedTensor* buffer : buffers[g]) {
          hosts.push_back(parked_.park(kind, *buffer, registry_, pin));
        }
        groups[g]->states_parked(kind, hosts);
      }
    } catch (...) {  // a failed host allocation: put back what this call had moved
      std::vector<StateKind> moved;
      for (const auto& move : moves) moved.push_back(move.first);
      reload_states(moved);
      throw;
    }
  }
}

void EngineCore::reload_states(const std::vector<StateKind>& kinds) {
  for (const StateKind kind : kinds.empty() ? parked_.parked_kinds() : kinds) {
    if (!parked_.parked(kind)) continue;
    at::NoGradGuard no_grad;
    parked_.restore(kind);
    for (Group* group : every_group()) group->states_restored(kind);
  }
}


}  // namespace zero::adapter
