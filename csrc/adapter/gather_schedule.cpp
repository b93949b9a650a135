#include "adapter/gather_schedule.h"

#include <algorithm>
#include <sstream>

#include <c10/util/Exception.h>

namespace zero::adapter {

GatherSchedule::GatherSchedule(UnitStore& units, std::vector<std::string> unit_names,
                               ScheduleOptions options, const RankPlaces* places)
    : units_(units),
      places_(places),
      names_(std::move(unit_names)),
      options_(options),
      state_(names_.size()) {
  TORCH_CHECK(options_.max_inflight >= 1, "zero: stage3_max_inflight_gathers must be >= 1, got ",
              options_.max_inflight);
  TORCH_CHECK(units_.unit_count() == names_.size(), "zero: ", names_.size(),
              " unit names for ", units_.unit_count(), " units");
}

void GatherSchedule::add_external(std::size_t user, std::size_t owner) {
  TORCH_CHECK(user < state_.size() && owner < state_.size(), "zero: external parameter link ",
              user, " -> ", owner, " outside the schedule's ", state_.size(), " units");
  auto& externals = state_[user].externals;
  if (owner == user || std::find(externals.begin(), externals.end(), owner) != externals.end()) {
    return;
  }
  externals.push_back(owner);
  // Linked while the user is in use (a module of `owner` called inside the user's forward):
  // the owner is gathered now, as the user's acquire would have, once per use its drops will
  // release. Every rank links at the same call: checked like the forward it is part of.
  const int uses = state_[user].uses;
  if (uses == 0) return;
  verify(Place::kUnitForward, owner, step_);
  state_[owner].uses += uses;
  state_[owner].kept = false;
  gather(owner);
}

const std::string& GatherSchedule::name(std::size_t unit) const {
  static const std::string root = "<root module>";
  return unit < names_.size() && !names_[unit].empty() ? names_[unit] : root;
}

void GatherSchedule::verify(Place place, std::size_t unit, std::int64_t step) {
  if (places_ == nullptr) return;
  places_->verify(
      {place, static_cast<std::int64_t>(unit), step}, options_.device,
      "zero: ranks diverged at stage 3 (step " + std::to_string(step) + ")",
      "Every rank must run the same gather units in the same order. A branch inside a unit (a "
      "submodule or an expert only some ranks use) is fine; a unit some ranks skip, or run "
      "more often, is not: run it on every rank. Hugging Face models do so under ZeRO-3: "
      "LayerDrop runs every layer, and generate(synced_gpus=True) keeps every rank stepping "
      "until the longest sequence ends");
}

void GatherSchedule::advance(Order& order, std::size_t unit, const char* phase_name) {
  // A forward that never opens at the root (a model's parts called on their own, as a
  // reward model's forward_value) never restarts its order: it is kept bounded.
  if (order.current.size() >= kMaxOrder) restart(order);
  const std::size_t position = order.current.size();
  order.current.push_back(unit);
  if (!order.following) return;
  if (position < order.recorded.size() && order.recorded[position] == unit) return;
  order.following = false;
  if (notice_.empty() && !order.recorded.empty()) {
    std::ostringstream message;
    message << "zero: the stage-3 " << phase_name << " order changed at step " << step_
            << " (position " << position << ": expected '"
            << (position < order.recorded.size() ? name(order.recorded[position]) : "<end>")
            << "', got '" << name(unit)
            << "'); prefetching and reuse stop for this step and the new order is recorded";
    notice_ = message.str();
  }
}

void GatherSchedule::restart(Order& order) {
  if (!order.following || order.recorded.empty()) order.recorded = order.current;
  order.current.clear();
  order.following = true;
}

// ---- residency ------------------------------------------------------------------------------

bool GatherSchedule::is_live(std::size_t unit) const {
  // (a unit whose trainable parts trained_parts_done let go is still held by its frozen part)
  return units_.placed(unit) && (units_.is_gathered(unit) || state_[unit].trained_released);
}

std::int64_t GatherSchedule::inflight() const {
  std::int64_t count = 0;
  for (std::size_t u = 0; u < state_.size(); ++u) count += units_.is_in_flight(u) ? 1 : 0;
  return count;
}

std::int64_t GatherSchedule::unit_numel(std::size_t unit) const { return units_.numel(unit); }

std::int64_t GatherSchedule::gathered_numel() const {
  std::int64_t numel = 0;
  for (std::size_t u = 0; u < state_.size(); ++u) {
    if (is_live(u)) numel += unit_numel(u);
  }
  return numel;
}

void GatherSchedule::note_live_bound(std::size_t unit) {
  const std::int64_t live = gathered_numel();
  if (live <= options_.max_live_numel || !notice_.empty()) return;
  std::ostringstream message;
  message << "zero: gathering unit '" << name(unit) << "' brought the gathered parameters to "
          << live << " elements, above zero_optimization.stage3_max_live_parameters = "
          << options_.max_live_numel
          << ": the units in use are gathered whatever the bound (as in DeepSpeed, which "
             "bounds prefetching and the units kept for reuse with it)";
  notice_ = message.str();
}

void GatherSchedule::fetch(std::size_t unit) {
  // (trainable parts let go by trained_parts_done are all-gathered again: a gather too)
  if ((!is_live(unit) || state_[unit].trained_released) && units_.placed(unit)) ++gathers_;
  state_[unit].trained_released = false;
  units_.fetch(unit);
  peak_gathered_numel_ = std::max(peak_gathered_numel_, gathered_numel());
}

void GatherSchedule::gather(std::size_t unit, bool bounded) {
  if (!is_live(unit)) make_room(unit_numel(unit));
  fetch(unit);
  units_.gather(unit);
  if (bounded) note_live_bound(unit);
}

void GatherSchedule::release(std::size_t unit, bool hand_over) {
  state_[unit].kept = false;
  state_[unit].trained_released = false;
  if (hand_over) {
    units_.release_after_hold(unit);
  } else {
    units_.release(unit);
  }
}

void GatherSchedule::make_room(std::int64_t numel) {
  for (std::size_t u = 0; u < state_.size(); ++u) {
    if (gathered_numel() + numel <= options_.max_live_numel) return;
    if (state_[u].kept && state_[u].uses == 0 && !state_[u].backward_open) release(u);
  }
}

void GatherSchedule::prefetch(const Order& order) {
  if (!order.following) return;
  std::size_t position = order.current.size();
  std::int64_t ahead = 0;
  for (; options_.prefetch_numel > 0 && position < order.recorded.size(); ++position) {
    const std::size_t next = order.recorded[position];
    if (is_live(next)) continue;
    const std::int64_t numel = unit_numel(next);
    if (inflight() >= options_.max_inflight || ahead + numel > options_.prefetch_numel ||
        gathered_numel() + numel > options_.max_live_numel) {
      break;
    }
    fetch(next);
    max_inflight_seen_ = std::max(max_inflight_seen_, inflight());
    ahead += numel;
    ++prefetches_;
  }
  // Units beyond the all-gathers: parameters on NVMe start their reads now (rank-local, no
  // collective), so the gather finds them in host memory. The swap only uses free buffers.
  for (std::size_t hinted = 0; position < order.recorded.size() && hinted < kReadAhead;
       ++position) {
    const std::size_t next = order.recorded[position];
    if (is_live(next)) continue;
    units_.read_ahead(next);
    ++hinted;
  }
}

// ---- uses -----------------------------------------------------------------------------------

void GatherSchedule::acquire(std::size_t unit) {
  std::vector<std::size_t> units{unit};
  units.insert(units.end(), state_[unit].externals.begin(), state_[unit].externals.end());
  for (const std::size_t u : units) {
    ++state_[u].uses;
    state_[u].kept = false;
  }
  for (const std::size_t u : units) gather(u);
}

void GatherSchedule::drop(std::size_t unit) {
  std::vector<std::size_t> units{unit};
  units.insert(units.end(), state_[unit].externals.begin(), state_[unit].externals.end());
  for (const std::size_t u : units) {
    TORCH_CHECK(state_[u].uses > 0, "zero: unit '", name(u), "' released more often than gathered");
    if (--state_[u].uses == 0 && !state_[u].backward_open) retire(u);
  }
}

void GatherSchedule::retire(std::size_t unit) {
  const std::optional<std::int64_t> distance = reuse_distance(unit);
  // (a unit whose trainable parts went is not kept: its reuse would gather them again)
  if (distance && *distance < options_.max_reuse_distance && !state_[unit].trained_released) {
    state_[unit].kept = true;
    ++reuses_;
    return;
  }
  release(unit);
}

std::optional<std::int64_t> GatherSchedule::reuse_distance(std::size_t unit) const {
  // The rest of this step in recorded order: forward (then backward, if one follows), or the
  // rest of backward. Nothing is known about a step that left its record.
  std::vector<std::size_t> ahead;
  const Order& order = in_backward_ ? backward_ : forward_;
  if (!order.following || order.recorded.empty()) return std::nullopt;
  ahead.assign(order.recorded.begin() + static_cast<std::ptrdiff_t>(
                                            std::min(order.current.size(), order.recorded.size())),
               order.recorded.end());
  if (!in_backward_ && expects_backward_) {
    ahead.insert(ahead.end(), backward_.recorded.begin(), backward_.recorded.end());
  }
  std::int64_t distance = 0;
  std::vector<bool> counted(state_.size(), false);
  for (const std::size_t next : ahead) {
    if (next == unit) return distance;
    if (!counted[next]) {
      counted[next] = true;
      distance += unit_numel(next);
    }
  }
  return std::nullopt;
}

// ---- events ---------------------------------------------------------------------------------

void GatherSchedule::before_forward(std::size_t unit, std::int64_t step, bool expects_backward) {
  verify(Place::kUnitForward, unit, step);
  if (unit == 0) {  // the root opens every forward
    if (!forward_.current.empty()) restart(forward_);
    expects_backward_ = expects_backward;
    in_backward_ = false;
  }
  step_ = step;
  advance(forward_, unit, "forward");
  acquire(unit);
  prefetch(forward_);
}

void GatherSchedule::after_forward(std::size_t unit) { drop(unit); }

void GatherSchedule::before_backward(std::size_t unit) {
  verify(Place::kUnitBackward, unit, step_);
  in_backward_ = true;
  advance(backward_, unit, "backward");
  UnitState& state = state_[unit];
  if (!state.backward_open) {
    state.backward_open = true;
    acquire(unit);
  } else {
    gather(unit);
  }
  prefetch(backward_);
}

void GatherSchedule::after_backward(std::size_t unit) {
  UnitState& state = state_[unit];
  if (!state.backward_open) return;
  state.backward_open = false;
  drop(unit);
}

void GatherSchedule::trained_parts_done(std::size_t unit) {
  const UnitState& state = state_[unit];
  if (!state.backward_open || state.uses != 1) return;  // a forward, hold or user has it too
  const std::optional<std::int64_t> distance = reuse_distance(unit);
  if (distance && *distance < options_.max_reuse_distance) return;  // kept whole for that
  units_.release_trained(unit);
  state_[unit].trained_released = true;
}

void GatherSchedule::grads_done(std::size_t unit, bool frozen_part) {
  if (frozen_part) {
    trained_parts_done(unit);
  } else if (state_[unit].externals.empty()) {
    after_backward(unit);
  }
}

void GatherSchedule::end_backward() {
  verify(Place::kBackwardEnd, 0, step_);
  restart(forward_);
  restart(backward_);
  in_backward_ = false;
  for (std::size_t u = 0; u < state_.size(); ++u) {
    state_[u].uses = 0;
    state_[u].backward_open = false;
    release(u);
  }
}

void GatherSchedule::hold(std::size_t unit) {
  TORCH_CHECK(unit < state_.size(), "zero: unit ", unit, " outside the schedule's ",
              state_.size());
  verify(Place::kUnitHold, unit, step_);
  ++state_[unit].uses;
  state_[unit].kept = false;
  try {
    gather(unit, /*bounded=*/false);  // a hold asks for the unit whatever else is gathered
  } catch (...) {
    --state_[unit].uses;  // (out of memory, say: the caller's unhold will not come)
    throw;
  }
}

void GatherSchedule::unhold(std::size_t unit, bool hand_over) {
  TORCH_CHECK(unit < state_.size() && state_[unit].uses > 0, "zero: unit ", unit,
              " is not held");
  if (--state_[unit].uses == 0 && !state_[unit].backward_open) release(unit, hand_over);
}

void GatherSchedule::release_unused() {
  for (std::size_t u = 0; u < state_.size(); ++u) {
    if (state_[u].uses == 0 && !state_[u].backward_open) release(u);
  }
}

}  // namespace zero::adapter
