#include "adapter/group_units.h"

#include <c10/util/Exception.h>

#include "adapter/stage3_group.h"

namespace zero::adapter {

void GroupUnits::place(std::size_t unit, Stage3Group* group, std::size_t local) {
  TORCH_CHECK(unit < parts_.size(), "zero: unit ", unit, " outside the schedule's ",
              parts_.size());
  parts_[unit].emplace_back(group, local);
}

std::vector<std::pair<std::size_t, bool>> GroupUnits::completed_by(const Stage3Group* group,
                                                                   std::size_t local) const {
  std::vector<std::pair<std::size_t, bool>> done_units;
  for (std::size_t u = 0; u < parts_.size(); ++u) {
    bool mine = false;
    bool done = true;
    bool frozen = false;
    for (const auto& [g, l] : parts_[u]) {
      mine = mine || (g == group && l == local);
      done = done && g->pending_grads(l) == 0;
      frozen = frozen || g->frozen();
    }
    if (mine && done) done_units.emplace_back(u, frozen);
  }
  return done_units;
}

void GroupUnits::release_trained(std::size_t unit) {
  for (const auto& [group, local] : parts_[unit]) {
    if (!group->frozen()) group->release(local);
  }
}

std::int64_t GroupUnits::numel(std::size_t unit) const {
  std::int64_t numel = 0;
  for (const auto& [group, local] : parts_[unit]) numel += group->layout().unit(local).numel();
  return numel;
}

bool GroupUnits::is_gathered(std::size_t unit) const {
  for (const auto& [group, local] : parts_[unit]) {
    if (!group->is_gathered(local)) return false;
  }
  return placed(unit);
}

bool GroupUnits::is_in_flight(std::size_t unit) const {
  for (const auto& [group, local] : parts_[unit]) {
    if (group->is_in_flight(local)) return true;
  }
  return false;
}

void GroupUnits::fetch(std::size_t unit) {
  for (const auto& [group, local] : parts_[unit]) group->fetch(local);
}

void GroupUnits::gather(std::size_t unit) {
  for (const auto& [group, local] : parts_[unit]) group->gather(local);
}

void GroupUnits::release(std::size_t unit) {
  for (const auto& [group, local] : parts_[unit]) group->release(local);
}

void GroupUnits::release_after_hold(std::size_t unit) {
  for (const auto& [group, local] : parts_[unit]) group->release(local, /*leave_shared=*/true);
}

void GroupUnits::read_ahead(std::size_t unit) {
  for (const auto& [group, local] : parts_[unit]) group->read_ahead(local);
}

}  // namespace zero::adapter
