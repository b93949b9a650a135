#pragma once
// Stage 3's gather schedule: when each gather unit's parameters are all-gathered, prefetched,
// kept for reuse and released, and a guard that makes divergent control flow across ranks an
// error instead of a hang.
//
// Events come from thin module hooks and two C++ autograd functions (backward_hooks.h):
// before_forward / after_forward per unit call, before_backward (the unit's outputs got their
// gradients) and after_backward (its inputs got theirs) per unit call in backward, grads_done
// (its last parameter gradient is in the bucket) and end_backward once per backward; hold
// gathers a unit outside them (state dicts, saves, GatheredParameters). At before_forward,
// before_backward, end_backward and hold every rank first exchanges a tiny
// fingerprint (phase, unit, step) with one all-gather; if any rank disagrees, every rank raises
// an error naming each rank's module and the step. All other collectives follow from the
// events deterministically, so agreeing on events means agreeing on collectives.
//
// A unit is in use while one of its forward calls runs, while its backward runs, while a unit
// that registered one of its parameters as external is in use, and while it is held
// (GatheredParameters, state dicts). When the last use ends it is released, unless its next
// use in the recorded order comes within `max_reuse_distance` elements of other gathers: then
// it is kept (evicted first if a gather needs room under `max_live_numel`).
//
// Prefetch: the unit order of the first step's forward and backward is recorded; later steps
// start the all-gathers of the next units in that order while the current one computes,
// bounded by `prefetch_numel` (elements ahead), `max_live_numel` (all gathered elements) and
// `max_inflight` (all-gathers in flight); parameters offloaded to NVMe are read ahead for a
// few units past those. When a step departs from the record, prefetching
// and reuse stop for that step, a notice is given once, and the new order is recorded.
//
// The units are a UnitStore: the engine's Stage3Group pieces (group_units.h), or sizes alone
// for the estimator (schedule_simulation.h), which runs this same schedule without tensors.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "adapter/collectives.h"
#include "adapter/rank_places.h"
#include "adapter/unit_store.h"

namespace zero::adapter {

struct ScheduleOptions {
  // Defaults: the schema's (stage3_prefetch_bucket_size, stage3_max_live_parameters, ...).
  std::int64_t prefetch_numel = 50'000'000;  // 0 disables prefetch
  std::int64_t max_live_numel = 1'000'000'000;
  std::int64_t max_reuse_distance = 1'000'000'000;  // keep a unit reused within fewer elements; 0: never
  std::int64_t max_inflight = 2;        // all-gathers in flight at once
  c10::Device device = c10::Device(c10::kCPU);  // where the ranks compare places (rank_places.h)
};

// What the schedule has done so far, as EngineCore.schedule_stats reads it back.
struct ScheduleStats {
  std::int64_t prefetches = 0;
  std::int64_t gathers = 0;
  std::int64_t reuses = 0;
  std::int64_t max_inflight_seen = 0;
  std::int64_t gathered_numel = 0;  // live now
  std::int64_t peak_gathered_numel = 0;
  std::string notice;  // the first notice, if any: the order changed, or the live bound was passed
};

class GatherSchedule {
 public:
  // `places`: where the ranks compare every event (they must report the same sequence);
  // null checks nothing (one process replaying the schedule, as the estimator does).
  GatherSchedule(UnitStore& units, std::vector<std::string> unit_names, ScheduleOptions options,
                 const RankPlaces* places);
  // The modules of unit `user` use parameters of unit `owner` (register_external_parameter,
  // or a module of `owner` called inside `user`'s forward): whenever `user` is gathered,
  // `owner` is too; linked while `user` is in use, `owner` is gathered at once.
  void add_external(std::size_t user, std::size_t owner);

  // --- events (every rank must report the same sequence) ---
  void before_forward(std::size_t unit, std::int64_t step, bool expects_backward);
  void after_forward(std::size_t unit);
  void before_backward(std::size_t unit);
  void after_backward(std::size_t unit);
  // The unit's trainable parts have all their gradients while a frozen part may still serve
  // the inputs' gradients (its backward stays open until after_backward): when nothing but
  // its backward holds it and the recorded order does not reuse it soon, the trainable parts
  // are released now (UnitStore::release_trained), the frozen part when the backward ends.
  void trained_parts_done(std::size_t unit);
  // The unit's last trainable gradient is in: its backward ends (after_backward), unless a
  // frozen part may still serve it (trained_parts_done) or it links other units (externals:
  // what it calls of them may run its backward after its own gradients, e.g. a root whose
  // only parameters are a head); those wait for after_backward or end_backward.
  void grads_done(std::size_t unit, bool frozen_part);
  void end_backward();
  bool in_backward() const { return in_backward_; }

  // --- explicit gathers (GatheredParameters, state dicts): never refused by max_live_numel ---
  void hold(std::size_t unit);
  // hand_over: a gathered buffer still referenced elsewhere (a script's tensor) is left to it
  // (UnitStore::release_after_hold); false: freed in place, as after a forward (the views
  // autograd saved see it filled again when backward gathers the unit)
  void unhold(std::size_t unit, bool hand_over = true);
  // Releases every unit nobody holds (before an optimizer step changes the shards).
  void release_unused();

  std::int64_t prefetches() const { return prefetches_; }
  std::int64_t reuses() const { return reuses_; }
  std::int64_t gathers() const { return gathers_; }
  // The most all-gathers in flight right after a prefetch started one.
  std::int64_t max_inflight_seen() const { return max_inflight_seen_; }
  std::int64_t gathered_numel() const;
  std::int64_t peak_gathered_numel() const { return peak_gathered_numel_; }
  std::size_t unit_count() const { return names_.size(); }
  const std::string& notice() const { return notice_; }  // (ScheduleStats::notice)
  ScheduleStats stats() const {
    return {prefetches_, gathers_, reuses_, max_inflight_seen_, gathered_numel(),
            peak_gathered_numel_, notice_};
  }

 private:
  static constexpr std::size_t kReadAhead = 4;  // units past the prefetch whose NVMe reads start
  static constexpr std::size_t kMaxOrder = std::size_t{1} << 16;  // units in one recorded order
  struct Order {
    std::vector<std::size_t> recorded;
    std::vector<std::size_t> current;
    bool following = false;  // this step has matched the record so far
  };
  struct UnitState {
    int uses = 0;                // forward calls, holds and external users running now
    bool backward_open = false;  // between before_backward and after_backward / grads_done
    bool kept = false;           // resident for a reuse coming soon
    bool trained_released = false;  // trained_parts_done let its trainable parts go
    std::vector<std::size_t> externals;  // units gathered together with this one
  };

  void verify(Place place, std::size_t unit, std::int64_t step);
  void advance(Order& order, std::size_t unit, const char* phase_name);
  static void restart(Order& order);
  void prefetch(const Order& order);
  void acquire(std::size_t unit);
  void drop(std::size_t unit);
  void retire(std::size_t unit);
  std::optional<std::int64_t> reuse_distance(std::size_t unit) const;
  void make_room(std::int64_t numel);
  // bounded: more than max_live_numel gathered gives the notice (forward and backward; a hold,
  // as GatheredParameters over a whole model, asks for all of it)
  void gather(std::size_t unit, bool bounded = true);
  void fetch(std::size_t unit);
  void release(std::size_t unit, bool hand_over = false);  // hand_over: as unhold's
  bool is_live(std::size_t unit) const;
  std::int64_t inflight() const;
  std::int64_t unit_numel(std::size_t unit) const;
  void note_live_bound(std::size_t unit);  // above max_live_numel: the notice, once
  const std::string& name(std::size_t unit) const;

  UnitStore& units_;
  const RankPlaces* places_;
  std::vector<std::string> names_;
  ScheduleOptions options_;
  std::vector<UnitState> state_;
  Order forward_;
  Order backward_;
  std::int64_t step_ = 0;  // of the current forward/backward
  bool expects_backward_ = false;
  bool in_backward_ = false;
  std::int64_t prefetches_ = 0;
  std::int64_t reuses_ = 0;
  std::int64_t gathers_ = 0;
  std::int64_t max_inflight_seen_ = 0;
  std::int64_t peak_gathered_numel_ = 0;
  std::string notice_;
};

}  // namespace zero::adapter
