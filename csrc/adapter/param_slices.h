#pragma once
// Which parameter each stretch of a rank's shard belongs to: what an update over whole
// parameters needs (LAMB's per-parameter norms, lamb.h; Muon's matrices, muon.h) although the
// rank holds slices of them.
#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "adapter/collectives.h"
#include "adapter/shard_piece.h"
#include "core/sharded_layout.h"

namespace zero::adapter {

struct ParamSlices {
  std::size_t param_count = 0;
  std::vector<core::ShardSlice> slices;  // this rank's, in shard order
  // The ranks sharing the parameters (each holds a 1/N piece of every unit, in rank order);
  // null: every parameter is whole here (stage 0).
  Communicator* sharers = nullptr;
  const core::ShardedLayout* layout = nullptr;  // the parameters' shapes and unit offsets
};

// The slices inside `piece`, as [first, last) indices into `slices` (both in shard order).
inline std::pair<std::size_t, std::size_t> slices_of(const ShardPiece& piece,
                                                     const std::vector<core::ShardSlice>& slices) {
  const auto before = [](const core::ShardSlice& s, std::int64_t at) {
    return s.shard_offset < at;
  };
  const auto first = std::lower_bound(slices.begin(), slices.end(), piece.offset, before);
  const auto last = std::lower_bound(first, slices.end(), piece.offset + piece.grad.numel(),
                                     before);
  return {static_cast<std::size_t>(first - slices.begin()),
          static_cast<std::size_t>(last - slices.begin())};
}

}  // namespace zero::adapter
