#pragma once
// Where each rank of a group is, compared before the collectives of a phase. Ranks whose
// programs diverged (one skipped engine.step(), ran an extra reducing backward, saved a
// checkpoint alone, gathered a stage-3 unit the others did not) would otherwise wait in
// mismatched collectives until the process group's timeout, or pair the wrong collectives
// and train apart. One all-gather of three integers per check; on a mismatch every rank
// raises the same error naming each rank's place. Every kind of check uses this one format,
// so that a rank at one kind of place can name another rank at any other.
#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "adapter/collectives.h"

namespace zero::adapter {

enum class Place : std::int64_t {
  // stage 3's gather schedule (detail: the unit; count: the schedule's step)
  kUnitForward = 0,
  kUnitBackward = 1,
  kBackwardEnd = 2,
  kUnitHold = 3,  // a gather outside forward and backward (a state dict, a save)
  // the engine (detail: reducing backwards before this one; count: optimizer steps taken)
  kReduce = 4,  // a backward that reduces gradients
  kStep = 5,
  kSave = 6,
  kLoad = 7,
};

struct RankPlace {
  Place place = Place::kStep;
  std::int64_t detail = 0;
  std::int64_t count = 0;
};

class RankPlaces {
 public:
  // A null communicator (or one rank) checks nothing: one process replaying a schedule.
  explicit RankPlaces(Communicator* communicator) : communicator_(communicator) {}
  // Stage 3: the units' names, for the places that name a unit.
  void name_units(std::vector<std::string> names) { unit_names_ = std::move(names); }
  // Returns when every rank is at `mine`; otherwise raises "<header>: rank 0 is at ...; rank 1
  // is at .... <advice>" on every rank. The exchange runs on `device` (the group's backend's).
  void verify(const RankPlace& mine, c10::Device device, const std::string& header,
              const std::string& advice) const;
  std::string describe(const RankPlace& place) const;

 private:
  std::string unit_name(std::int64_t unit) const;

  Communicator* communicator_;
  std::vector<std::string> unit_names_;
};

}  // namespace zero::adapter
