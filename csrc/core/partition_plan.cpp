#include "core/partition_plan.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <string>

namespace zero::core {
namespace {

std::int64_t round_up(std::int64_t value, std::int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

std::int64_t checked_numel(const TensorSpec& spec, std::size_t index) {
  std::int64_t numel = 1;
  for (const std::int64_t dim : spec.shape) {
    if (dim < 0) {
      throw std::invalid_argument("parameter " + std::to_string(index) + " has shape " +
                                  shape_string(spec.shape) +
                                  " with a negative dimension; every dimension must be >= 0");
    }
    numel *= dim;
  }
  return numel;
}

void check_layout_arguments(int world_size, std::int64_t alignment) {
  if (world_size < 1) {
    throw std::invalid_argument("world_size must be >= 1, got " + std::to_string(world_size));
  }
  if (alignment < 1) {
    throw std::invalid_argument("alignment must be >= 1 element, got " +
                                std::to_string(alignment));
  }
}

}  // namespace

FlatBufferPlan::FlatBufferPlan(DType dtype, int world_size, std::int64_t alignment,
                               std::vector<ParamSlot> params, std::int64_t numel)
    : dtype_(dtype),
      world_size_(world_size),
      alignment_(alignment),
      params_(std::move(params)),
      numel_(numel) {}

std::int64_t FlatBufferPlan::used_numel() const {
  std::int64_t used = 0;
  for (const ParamSlot& slot : params_) used += slot.numel;
  return used;
}

void FlatBufferPlan::check_rank(int rank) const {
  if (rank < 0 || rank >= world_size_) {
    throw std::out_of_range("rank " + std::to_string(rank) + " is outside [0, " +
                            std::to_string(world_size_) + ")");
  }
}

ShardRange FlatBufferPlan::shard_range(int rank) const {
  check_rank(rank);
  return {rank * shard_numel(), (rank + 1) * shard_numel()};
}

std::vector<OwnedSlice> FlatBufferPlan::owned_slices(std::size_t param_index) const {
  if (param_index >= params_.size()) {
    throw std::out_of_range("parameter index " + std::to_string(param_index) +
                            " is outside [0, " + std::to_string(params_.size()) + ")");
  }
  const ParamSlot& slot = params_[param_index];
  std::vector<OwnedSlice> slices;
  if (slot.numel == 0) return slices;
  const std::int64_t shard = shard_numel();
  const std::int64_t first = slot.offset;
  const std::int64_t last = slot.offset + slot.numel;  // exclusive
  for (int rank = static_cast<int>(first / shard); rank < world_size_; ++rank) {
    const std::int64_t rank_begin = rank * shard;
    if (rank_begin >= last) break;
    const std::int64_t begin = std::max(first, rank_begin);
    const std::int64_t end = std::min(last, rank_begin + shard);
    slices.push_back({rank, begin - first, end - first, begin - rank_begin});
  }
  return slices;
}

std::vector<std::pair<std::size_t, OwnedSlice>> FlatBufferPlan::slices_owned_by(int rank) const {
  check_rank(rank);
  std::vector<std::pair<std::size_t, OwnedSlice>> owned;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    for (const OwnedSlice& slice : owned_slices(i)) {
      if (slice.rank == rank) owned.emplace_back(i, slice);
    }
  }
  return owned;
}

FlatBufferPlan plan_flat_buffer(const std::vector<TensorSpec>& params, int world_size,
                                std::int64_t alignment) {
  check_layout_arguments(world_size, alignment);
  const DType dtype = params.empty() ? DType::kFloat32 : params.front().dtype;
  std::vector<ParamSlot> slots;
  slots.reserve(params.size());
  std::int64_t cursor = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const TensorSpec& spec = params[i];
    if (spec.dtype != dtype) {
      throw std::invalid_argument(std::string("one flat buffer holds one dtype: parameter 0 is ") +
                                  dtype_name(dtype) + " but parameter " + std::to_string(i) +
                                  " is " + dtype_name(spec.dtype) +
                                  "; put parameters of different dtypes in different buffers");
    }
    const std::int64_t numel = checked_numel(spec, i);
    cursor = round_up(cursor, alignment);
    slots.push_back({cursor, numel, spec.shape});
    cursor += numel;
  }
  const std::int64_t padded = round_up(cursor, static_cast<std::int64_t>(world_size) * alignment);
  return FlatBufferPlan(dtype, world_size, alignment, std::move(slots), padded);
}

PartitionPlan plan_partition(const std::vector<TensorSpec>& params,
                             const std::vector<std::size_t>& buffer_of_param, int world_size,
                             std::int64_t alignment) {
  if (buffer_of_param.size() != params.size()) {
    throw std::invalid_argument("buffer_of_param has " + std::to_string(buffer_of_param.size()) +
                                " entries but there are " + std::to_string(params.size()) +
                                " parameters; give one buffer id per parameter");
  }
  std::size_t buffer_count = 0;
  for (const std::size_t id : buffer_of_param) buffer_count = std::max(buffer_count, id + 1);

  std::vector<std::vector<TensorSpec>> grouped(buffer_count);
  PartitionPlan plan;
  plan.locations.reserve(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::size_t buffer = buffer_of_param[i];
    plan.locations.push_back({buffer, grouped[buffer].size()});
    grouped[buffer].push_back(params[i]);
  }
  plan.buffers.reserve(buffer_count);
  for (std::size_t b = 0; b < buffer_count; ++b) {
    try {
      plan.buffers.push_back(plan_flat_buffer(grouped[b], world_size, alignment));
    } catch (const std::invalid_argument& error) {
      throw std::invalid_argument("buffer " + std::to_string(b) + ": " + error.what());
    }
  }
  return plan;
}

}  // namespace zero::core
