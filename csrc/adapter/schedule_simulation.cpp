#include "adapter/schedule_simulation.h"

#include <algorithm>
#include <string>

#include <c10/util/Exception.h>

namespace zero::adapter {
namespace {

// Units that are sizes: an all-gather completes when waited for, and every move is counted.
class SizedUnits : public UnitStore {
 public:
  explicit SizedUnits(std::vector<std::int64_t> numel)
      : numel_(std::move(numel)), resident_(numel_.size()), flying_(numel_.size()) {}

  std::size_t unit_count() const override { return numel_.size(); }
  bool placed(std::size_t unit) const override { return numel_[unit] > 0; }
  std::int64_t numel(std::size_t unit) const override { return placed(unit) ? numel_[unit] : 0; }
  bool is_gathered(std::size_t unit) const override { return resident_[unit]; }
  bool is_in_flight(std::size_t unit) const override { return flying_[unit]; }
  void read_ahead(std::size_t) override {}

  void fetch(std::size_t unit) override {
    if (!placed(unit)) return;
    if (!resident_[unit]) {
      gathered_ += numel_[unit];
      resident_[unit] = flying_[unit] = true;
      live_ += numel_[unit];
      flying_numel_ += numel_[unit];
      if (flying_numel_ > peak_flying_) {
        peak_flying_ = flying_numel_;
        flying_at_peak_ = marked(flying_);
      }
    }
    if (live_ > peak_) {
      peak_ = live_;
      live_at_peak_ = marked(resident_);
    }
  }
  void gather(std::size_t unit) override {
    if (flying_[unit]) {
      flying_[unit] = false;
      flying_numel_ -= numel_[unit];
    }
  }
  void release(std::size_t unit) override {
    if (resident_[unit]) live_ -= numel_[unit];
    if (flying_[unit]) flying_numel_ -= numel_[unit];
    resident_[unit] = flying_[unit] = false;
  }

  std::int64_t gathered() const { return gathered_; }
  std::int64_t peak() const { return peak_; }
  std::int64_t live() const { return live_; }
  void report(ScheduleSimulation& out) const {
    out.peak_numel = peak_;
    out.live_at_peak = live_at_peak_;
    out.peak_inflight_numel = peak_flying_;
    out.inflight_at_peak = flying_at_peak_;
  }

 private:
  static std::vector<std::size_t> marked(const std::vector<bool>& flags) {
    std::vector<std::size_t> units;
    for (std::size_t u = 0; u < flags.size(); ++u) {
      if (flags[u]) units.push_back(u);
    }
    return units;
  }

  std::vector<std::int64_t> numel_;
  std::vector<bool> resident_;
  std::vector<bool> flying_;
  std::int64_t live_ = 0;
  std::int64_t gathered_ = 0;
  std::int64_t peak_ = 0;
  std::vector<std::size_t> live_at_peak_;
  std::int64_t flying_numel_ = 0;
  std::int64_t peak_flying_ = 0;
  std::vector<std::size_t> flying_at_peak_;
};

// The units directly inside each unit (parents[u]: u's enclosing unit; none given: every
// unit is directly inside the root), in index order.
std::vector<std::vector<std::size_t>> children_of(std::size_t count,
                                                  const std::vector<std::size_t>& parents) {
  TORCH_CHECK(parents.empty() || parents.size() == count, "zero: ", parents.size(),
              " unit parents for ", count, " units");
  std::vector<std::vector<std::size_t>> children(count);
  for (std::size_t u = 1; u < count; ++u) {
    const std::size_t parent = parents.empty() ? 0 : parents[u];
    TORCH_CHECK(parent < u, "zero: unit ", u, "'s parent ", parent, " does not come before it");
    children[parent].push_back(u);
  }
  return children;
}

// A unit's forward and the units inside it, as the hooks report them: a unit with nothing
// partitioned has no hooks, the units inside it still run.
void forward(GatherSchedule& schedule, const UnitStore& units,
             const std::vector<std::vector<std::size_t>>& children, std::size_t unit,
             std::int64_t step) {
  const bool hooked = unit == 0 || units.placed(unit);
  if (hooked) schedule.before_forward(unit, step, /*expects_backward=*/true);
  for (const std::size_t child : children[unit]) forward(schedule, units, children, child, step);
  if (hooked) schedule.after_forward(unit);
}

void backward(GatherSchedule& schedule, const UnitStore& units,
              const std::vector<std::vector<std::size_t>>& children, std::size_t unit) {
  const bool hooked = units.placed(unit);
  if (hooked) schedule.before_backward(unit);
  for (auto child = children[unit].rbegin(); child != children[unit].rend(); ++child) {
    backward(schedule, units, children, *child);
  }
  if (hooked) schedule.after_backward(unit);
}

// One training micro-step (see the header). The root's backward opens with the loss.
void micro_step(GatherSchedule& schedule, const UnitStore& units,
                const std::vector<std::vector<std::size_t>>& children, std::int64_t step) {
  forward(schedule, units, children, 0, step);
  schedule.before_backward(0);
  for (auto child = children[0].rbegin(); child != children[0].rend(); ++child) {
    backward(schedule, units, children, *child);
  }
  if (units.placed(0)) schedule.after_backward(0);  // the root's last gradient is reduced
  schedule.end_backward();
}

}  // namespace

ScheduleSimulation simulate_schedule(const std::vector<std::int64_t>& unit_numel,
                                     const ScheduleOptions& options,
                                     const std::vector<std::pair<std::size_t, std::size_t>>&
                                         externals,
                                     const std::vector<std::size_t>& parents) {
  SizedUnits units(unit_numel.empty() ? std::vector<std::int64_t>{0} : unit_numel);
  const auto children = children_of(units.unit_count(), parents);
  GatherSchedule schedule(units, std::vector<std::string>(units.unit_count()), options,
                          /*places=*/nullptr);
  for (const auto& [user, owner] : externals) schedule.add_external(user, owner);
  ScheduleSimulation out;
  micro_step(schedule, units, children, 0);
  out.first_peak_numel = units.peak();
  const std::int64_t gathers = schedule.gathers();
  const std::int64_t gathered = units.gathered();
  const std::int64_t prefetches = schedule.prefetches();
  const std::int64_t reuses = schedule.reuses();
  micro_step(schedule, units, children, 1);
  out.gathers = schedule.gathers() - gathers;
  out.gathered_numel = units.gathered() - gathered;
  out.prefetches = schedule.prefetches() - prefetches;
  out.reuses = schedule.reuses() - reuses;
  units.report(out);
  return out;
}

}  // namespace zero::adapter
