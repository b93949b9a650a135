#pragma once
// Partition planning: lay parameters out in flat buffers that split evenly over the
// data-parallel ranks, and say which rank owns which elements of which parameter.
//
// Layout rules (the same for every buffer):
//   * parameters are placed in the given order, each at an offset that is a multiple of
//     `alignment` elements (so vectorised kernels and NCCL see aligned views);
//   * the buffer is padded to a multiple of world_size * alignment, so each rank's shard has
//     the same size and starts aligned;
//   * rank r owns the contiguous range [r * shard_numel, (r + 1) * shard_numel).
// Padding is zero-filled by the adapter and never belongs to a parameter.
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace zero::core {

struct TensorSpec {
  std::vector<std::int64_t> shape;
  DType dtype = DType::kFloat32;
};

// Where one parameter lives inside its flat buffer.
struct ParamSlot {
  std::int64_t offset = 0;  // first element in the flat buffer
  std::int64_t numel = 0;
  std::vector<std::int64_t> shape;
};

// The part of one parameter that one rank owns.
struct OwnedSlice {
  int rank = 0;
  std::int64_t param_begin = 0;   // element range inside the parameter ...
  std::int64_t param_end = 0;     // ... [param_begin, param_end)
  std::int64_t shard_offset = 0;  // where param_begin lands inside that rank's shard
};

struct ShardRange {
  std::int64_t begin = 0;  // element range inside the flat buffer
  std::int64_t end = 0;
};

class FlatBufferPlan {
 public:
  FlatBufferPlan(DType dtype, int world_size, std::int64_t alignment,
                 std::vector<ParamSlot> params, std::int64_t numel);

  DType dtype() const { return dtype_; }
  int world_size() const { return world_size_; }
  std::int64_t alignment() const { return alignment_; }
  std::int64_t numel() const { return numel_; }  // padded total
  std::int64_t used_numel() const;                // sum of parameter numels
  std::int64_t shard_numel() const { return numel_ / world_size_; }
  std::int64_t bytes() const { return numel_ * element_size(dtype_); }
  const std::vector<ParamSlot>& params() const { return params_; }

  ShardRange shard_range(int rank) const;
  // Every rank's piece of parameter `param_index`, in rank order; empty for numel 0.
  std::vector<OwnedSlice> owned_slices(std::size_t param_index) const;
  // The pieces of every parameter that `rank` owns, as (param_index, slice) pairs.
  std::vector<std::pair<std::size_t, OwnedSlice>> slices_owned_by(int rank) const;

 private:
  void check_rank(int rank) const;

  DType dtype_;
  int world_size_;
  std::int64_t alignment_;
  std::vector<ParamSlot> params_;
  std::int64_t numel_;
};

// Plans one flat buffer for `params` (all of one dtype). Throws std::invalid_argument for
// world_size < 1, alignment < 1, a negative dimension, or mixed dtypes.
FlatBufferPlan plan_flat_buffer(const std::vector<TensorSpec>& params, int world_size,
                                std::int64_t alignment);

struct ParamLocation {
  std::size_t buffer = 0;  // which flat buffer
  std::size_t index = 0;   // which slot inside it
};

// Several flat buffers at once: parameter i goes to buffer buffer_of_param[i].
struct PartitionPlan {
  std::vector<FlatBufferPlan> buffers;
  std::vector<ParamLocation> locations;  // one per input parameter
};

PartitionPlan plan_partition(const std::vector<TensorSpec>& params,
                             const std::vector<std::size_t>& buffer_of_param, int world_size,
                             std::int64_t alignment);

}  // namespace zero::core
