#pragma once
// Stage 3's gather schedule: when each gather unit's parameters are all-gathered, prefetched
// and released, and a guard that makes divergent control flow across ranks an error instead
// of a hang.
//
// Events come from thin module hooks: before_forward / after_forward / before_backward per
// unit, and end_backward once per backward. At each event every rank first exchanges a tiny
// fingerprint (phase, unit, step) with one all-gather; if any rank disagrees, every rank
// raises an error naming each rank's module and the step. All other collectives follow from
// the events deterministically, so agreeing on events means agreeing on collectives.
//
// Prefetch: the unit order of the first step's forward and backward is recorded; later steps
// start the all-gathers of the next units in that order while the current one computes,
// bounded by `prefetch_numel` (elements in flight ahead) and `max_live_numel` (all gathered
// elements). When a step departs from the record, prefetching stops for that step, a notice
// is given once, and the new order is recorded.
#include <cstdint>
#include <string>
#include <vector>

#include "adapter/collectives.h"
#include "adapter/stage3_group.h"

namespace zero::adapter {

struct ScheduleOptions {
  std::int64_t prefetch_numel = 0;  // 0 disables prefetch
  std::int64_t max_live_numel = INT64_MAX;
  c10::Device device = c10::Device(c10::kCPU);  // where the fingerprint exchange runs
};

class GatherSchedule {
 public:
  GatherSchedule(Communicator& communicator, std::vector<std::string> unit_names,
                 ScheduleOptions options);

  // Model unit `unit` holds group-local unit `local` of `group` (a unit may span groups).
  void place(std::size_t unit, Stage3Group* group, std::size_t local);

  void before_forward(std::size_t unit, std::int64_t step);
  void after_forward(std::size_t unit);
  void before_backward(std::size_t unit, std::int64_t step);
  void end_backward(std::int64_t step);

  std::int64_t prefetches() const { return prefetches_; }
  std::int64_t gathered_numel() const;
  const std::string& notice() const { return notice_; }  // the order-change notice, if any

 private:
  enum Phase : std::int64_t { kForward = 0, kBackward = 1, kEnd = 2 };
  struct Order {
    std::vector<std::size_t> recorded;
    std::vector<std::size_t> current;
    bool following = false;  // this step has matched the record so far
  };

  void verify(Phase phase, std::size_t unit, std::int64_t step);
  std::string describe(std::int64_t phase, std::int64_t unit) const;
  void advance(Order& order, std::size_t unit, std::int64_t step, const char* phase_name);
  static void restart(Order& order);
  void prefetch(const Order& order);
  void gather(std::size_t unit);
  void fetch(std::size_t unit);
  void release(std::size_t unit);
  bool is_live(std::size_t unit) const;
  std::int64_t unit_numel(std::size_t unit) const;
  void check_live_bound(std::size_t unit) const;

  Communicator& communicator_;
  std::vector<std::string> names_;
  ScheduleOptions options_;
  std::vector<std::vector<std::pair<Stage3Group*, std::size_t>>> placement_;
  Order forward_;
  Order backward_;
  std::int64_t prefetches_ = 0;
  std::string notice_;
};

}  // namespace zero::adapter
