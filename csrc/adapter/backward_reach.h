#pragma once
// Stage 3: which gradient units a backward reaches on some ranks and not on others.
//
// A rank-dependent branch (a head or an expert only some ranks' batches use) gives its
// parameters gradients on those ranks only. At stages 0-2 that only delays their unit's
// reduction to the end of backward on the other ranks, in the same launch order everywhere.
// At stage 3 the reductions share the communicator with the units' all-gathers and the
// schedule's fingerprint exchanges, so a unit ready mid-backward on one rank and only at the
// end on another puts the ranks' collectives in different orders: a hang.
//
// So at the first unit event of each autograd pass (after its fingerprint exchange) each rank
// counts, per gradient unit, the parameters the pass's graph will accumulate into (autograd's
// current graph task: every node reachable from the loss) and compares the counts with one
// all-reduce. A unit whose counts differ is split: every rank launches it only at the end of
// backward, and stage 3 releases its gathered parameters at its backward's end (not at its
// last gradient), so the schedule stays the same on every rank. So is a unit some rank's
// graph does not show whole: a reentrant activation checkpoint (use_reentrant=True) hides
// what it holds until its recomputation, a pass of its own, which may reach the rest on
// some ranks only; it waits until the check at a pass's first unit event sees it whole on
// every rank (a whole block checkpointed: its own recomputation shows it, before its
// gradients come), or the end of backward. A backward that reaches the same parameters
// everywhere, all of them, changes nothing.

#include <memory>
#include <vector>

#include <c10/core/Device.h>

#include "adapter/collectives.h"

namespace zero::adapter {

class Group;

// What the running pass's graph shows of one gradient unit, over every rank.
struct UnitReach {
  bool split = false;  // the ranks reach different numbers of its parameters
  bool whole = false;  // every rank reaches every parameter of it that takes a gradient
};

// Per group, per gradient unit. Called inside a backward; collective over `communicator`
// (tensors on `device`), which has more than one rank (one has nothing to disagree with).
std::vector<std::vector<UnitReach>> compare_reach(const std::vector<std::unique_ptr<Group>>& groups,
                                                  Communicator& communicator, c10::Device device);

}  // namespace zero::adapter
