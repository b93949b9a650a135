#pragma once
// What the stage-3 gather schedule (gather_schedule.h) needs of the units it manages: their
// sizes and residency, and the four moves. The engine's units are pieces of Stage3Groups
// (group_units.h); the estimator's are sizes alone (schedule_simulation.h), so both run the
// one schedule.
#include <cstddef>
#include <cstdint>

namespace zero::adapter {

class UnitStore {
 public:
  virtual ~UnitStore() = default;
  virtual std::size_t unit_count() const = 0;
  // The unit holds partitioned parameters (a unit with none is never gathered).
  virtual bool placed(std::size_t unit) const = 0;
  virtual std::int64_t numel(std::size_t unit) const = 0;
  // Whole on this rank, or its all-gather in flight (its memory is taken either way).
  virtual bool is_gathered(std::size_t unit) const = 0;
  virtual bool is_in_flight(std::size_t unit) const = 0;
  virtual void fetch(std::size_t unit) = 0;       // starts the all-gather
  virtual void gather(std::size_t unit) = 0;      // ... and waits for it
  virtual void release(std::size_t unit) = 0;     // back to this rank's shard only
  // release, when a hold (GatheredParameters) ends: a gathered buffer that something outside
  // the engine still references (a tensor a script kept from inside the block, as DeepSpeed
  // allows) is left to it, not emptied in place, and the next gather makes a new one.
  virtual void release_after_hold(std::size_t unit) { release(unit); }
  // The unit's parts of trainable parameters back to the shard, a frozen part kept (the
  // schedule still counts the unit as gathered; the next fetch or gather brings them back).
  // Sizes alone: nothing to do.
  virtual void release_trained(std::size_t /*unit*/) {}
  virtual void read_ahead(std::size_t unit) = 0;  // parameters on NVMe: start reading
};

}  // namespace zero::adapter
