#pragma once
// The engine's stage-3 units for the gather schedule: model unit u is group-local unit l of
// each Stage3Group it spans (a unit may span parameter groups).
#include <cstddef>
#include <utility>
#include <vector>

#include "adapter/unit_store.h"

namespace zero::adapter {

class Stage3Group;

class GroupUnits : public UnitStore {
 public:
  explicit GroupUnits(std::size_t unit_count) : parts_(unit_count) {}

  // Model unit `unit` holds group-local unit `local` of `group`.
  void place(std::size_t unit, Stage3Group* group, std::size_t local);
  // The units that (group, local) belongs to and whose trainable parts now have all their
  // gradients, each with whether it has a frozen part (whose weights may still serve the
  // inputs' gradients: GatherSchedule::grads_done).
  std::vector<std::pair<std::size_t, bool>> completed_by(const Stage3Group* group,
                                                         std::size_t local) const;

  // The Stage3Group pieces (group, group-local unit) model unit `unit` is made of.
  const std::vector<std::pair<Stage3Group*, std::size_t>>& parts(std::size_t unit) const {
    return parts_.at(unit);
  }
  std::size_t unit_count() const override { return parts_.size(); }
  bool placed(std::size_t unit) const override { return !parts_[unit].empty(); }
  std::int64_t numel(std::size_t unit) const override;
  bool is_gathered(std::size_t unit) const override;
  bool is_in_flight(std::size_t unit) const override;
  void fetch(std::size_t unit) override;
  void gather(std::size_t unit) override;
  void release(std::size_t unit) override;
  void release_after_hold(std::size_t unit) override;
  void read_ahead(std::size_t unit) override;
  void release_trained(std::size_t unit) override;

 private:
  std::vector<std::vector<std::pair<Stage3Group*, std::size_t>>> parts_;
};

}  // namespace zero::adapter
