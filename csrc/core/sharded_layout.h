#pragma once
// How one parameter group is sharded: parameters are cut into *units* (contiguous runs of
// whole parameters, about `unit_numel` elements each), every unit is its own flat buffer
// padded to a multiple of world_size * alignment, and rank r owns the r-th 1/N of every
// unit. A unit is the grain of communication: one all-reduce or one reduce-scatter of its
// gradients, one all-gather of its parameters. Because each unit is split evenly, a
// reduce-scatter moves exactly the unit's bytes and lands each rank's part in its shard:
// no padding chunks, no all-reduce-then-slice.
//
// Memory:
//   full buffers (params, stage 0/1 grads): units back to back, unit u at full_offset(u);
//   a rank's shard (master, optimizer state, stage 2 grads): its piece of every unit back to
//   back, unit u's piece at shard_offset(u), shard_numel(u) = unit numel / N elements.
// Units are numbered in parameter order; backward produces gradients roughly from the last
// unit to the first, which is the order the reducer launches them in.
#include <cstdint>
#include <vector>

#include "core/partition_plan.h"

namespace zero::core {

// Cuts parameters (by element count) into units of at most `unit_numel` elements, walking
// from the last parameter (a parameter larger than the limit is a unit of its own). Returns
// the unit index of every parameter; units are numbered in parameter order.
std::vector<std::size_t> assign_units(const std::vector<std::int64_t>& numels,
                                      std::int64_t unit_numel);

// The part of parameter `param` (the layout's index) that one rank owns: its elements
// [param_begin, param_begin + numel), and where they lie in that rank's shard (its pieces of
// every unit back to back).
struct ShardSlice {
  std::size_t param = 0;
  std::int64_t shard_offset = 0;
  std::int64_t numel = 0;
  std::int64_t param_begin = 0;
};

class ShardedLayout {
 public:
  ShardedLayout(const std::vector<TensorSpec>& params, int world_size, std::int64_t alignment,
                std::int64_t unit_numel);
  // Units given by the caller (stage 3 gathers by module): unit_of_param[i] is parameter i's
  // unit; every unit index below the maximum must be used.
  ShardedLayout(const std::vector<TensorSpec>& params, int world_size, std::int64_t alignment,
                const std::vector<std::size_t>& unit_of_param);

  int world_size() const { return world_size_; }
  DType dtype() const;
  std::size_t unit_count() const { return plan_.buffers.size(); }
  std::size_t param_count() const { return plan_.locations.size(); }
  const FlatBufferPlan& unit(std::size_t u) const { return plan_.buffers.at(u); }
  const ParamLocation& location(std::size_t param) const { return plan_.locations.at(param); }

  std::int64_t full_numel() const { return full_numel_; }    // all units, padded
  std::int64_t shard_numel() const { return shard_numel_; }  // this rank's part of all units
  std::int64_t full_offset(std::size_t u) const { return full_offsets_.at(u); }
  std::int64_t shard_offset(std::size_t u) const { return shard_offsets_.at(u); }
  // Element offset of parameter `param` in the full buffer.
  std::int64_t param_offset(std::size_t param) const;
  std::int64_t max_unit_numel() const;
  // Every slice of a parameter that `rank` owns, in shard order: what an update needing
  // whole-parameter sums (LAMB's norms) adds up per parameter before summing over the ranks.
  std::vector<ShardSlice> slices_owned_by(int rank) const;

 private:
  void compute_offsets();

  int world_size_;
  PartitionPlan plan_;
  std::vector<std::int64_t> full_offsets_;
  std::vector<std::int64_t> shard_offsets_;
  std::int64_t full_numel_ = 0;
  std::int64_t shard_numel_ = 0;
};

}  // namespace zero::core
