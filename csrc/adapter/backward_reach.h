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
// So at the first unit event of a backward (after its fingerprint exchange) each rank counts,
// per gradient unit, the parameters this backward's graph will accumulate into (autograd's
// current graph task: every node reachable from the loss) and compares the counts with one
// all-reduce; so does the first unit event of each reentrant activation checkpoint's
// recomputation (use_reentrant=True: a pass of its own, whose parameters the backward's
// graph does not show). Units whose counts differ are divergent: every rank launches them only at the
// end of backward, and stage 3 releases their gathered parameters at their backward's end
// (not at their last gradient), so the schedule stays the same on every rank. A backward
// that reaches the same parameters everywhere changes nothing. (Ranks reaching as many of a
// unit's parameters reach all of them, or all miss some: the unit completes on every rank or
// on none.)
#include <memory>
#include <vector>

#include <c10/core/Device.h>

#include "adapter/collectives.h"

namespace zero::adapter {

class Group;

// Per group, per gradient unit: whether the ranks' backwards reach different numbers of its
// parameters. Called inside a backward; collective over `communicator` (tensors on `device`).
std::vector<std::vector<bool>> divergent_units(const std::vector<std::unique_ptr<Group>>& groups,
                                               Communicator& communicator, c10::Device device);

}  // namespace zero::adapter
