#pragma once
// The stage-3 gather schedule run on unit sizes alone: the estimator's working set (zero-mem
// estimate) comes from the engine's own GatherSchedule, not a copy of it.
//
// Training micro-steps as a sequential model runs them: the root's forward opens, every other
// placed unit runs once in index (definition) order, each inside its enclosing unit (nested
// units: a marked module inside a block), the root closes; backward starts in the root (the
// loss) and visits the units in reverse, each inside its enclosing unit's backward, the
// root's gradients come last. The first
// micro-step records the order (no prefetch, no reuse); the second follows it, and every
// later one repeats the second.
#include <cstdint>
#include <utility>
#include <vector>

#include "adapter/gather_schedule.h"

namespace zero::adapter {

struct ScheduleSimulation {
  std::int64_t peak_numel = 0;                // most elements gathered at once
  std::vector<std::size_t> live_at_peak;      // the units gathered at that moment
  std::int64_t first_peak_numel = 0;          // the first micro-step's peak (no order yet)
  // One micro-step once the order is recorded:
  std::int64_t gathers = 0;
  std::int64_t gathered_numel = 0;
  std::int64_t prefetches = 0;
  std::int64_t reuses = 0;
  // The most elements whose all-gather was in flight at once, and those units.
  std::int64_t peak_inflight_numel = 0;
  std::vector<std::size_t> inflight_at_peak;
};

// unit_numel[u]: unit u's partitioned elements (unit 0 is the root; 0: nothing partitioned).
// externals: (user, owner) pairs, as register_external_parameter records them.
// parents[u]: the unit enclosing unit u (a smaller index; 0, the root, at the top); empty:
// every unit at the top.
ScheduleSimulation simulate_schedule(const std::vector<std::int64_t>& unit_numel,
                                     const ScheduleOptions& options,
                                     const std::vector<std::pair<std::size_t, std::size_t>>&
                                         externals,
                                     const std::vector<std::size_t>& parents = {});

}  // namespace zero::adapter
