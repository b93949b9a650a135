#include "core/sharded_layout.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace zero::core {
namespace {

std::vector<std::int64_t> numels_of(const std::vector<TensorSpec>& params) {
  std::vector<std::int64_t> numels;
  numels.reserve(params.size());
  for (const TensorSpec& spec : params) {
    std::int64_t numel = 1;
    for (const std::int64_t dim : spec.shape) numel *= std::max<std::int64_t>(dim, 0);
    numels.push_back(numel);
  }
  return numels;
}

}  // namespace

std::vector<std::size_t> assign_units(const std::vector<std::int64_t>& numels,
                                      std::int64_t unit_numel) {
  if (unit_numel < 1) {
    throw std::invalid_argument("unit size must be >= 1 element, got " +
                                std::to_string(unit_numel) +
                                "; set zero_optimization.reduce_bucket_size to a positive number");
  }
  // Walk backwards collecting units, then number them in parameter order.
  std::vector<std::size_t> unit_from_end(numels.size(), 0);
  std::size_t units = 0;
  std::size_t end = numels.size();
  while (end > 0) {
    std::size_t first = end - 1;
    std::int64_t filled = numels[first];
    while (first > 0 && filled + numels[first - 1] <= unit_numel) {
      --first;
      filled += numels[first];
    }
    for (std::size_t p = first; p < end; ++p) unit_from_end[p] = units;
    ++units;
    end = first;
  }
  std::vector<std::size_t> unit_of(numels.size());
  for (std::size_t p = 0; p < numels.size(); ++p) unit_of[p] = units - 1 - unit_from_end[p];
  return unit_of;
}

ShardedLayout::ShardedLayout(const std::vector<TensorSpec>& params, int world_size,
                             std::int64_t alignment, std::int64_t unit_numel)
    : world_size_(world_size),
      plan_(plan_partition(params, assign_units(numels_of(params), unit_numel), world_size,
                           alignment)) {
  compute_offsets();
}

ShardedLayout::ShardedLayout(const std::vector<TensorSpec>& params, int world_size,
                             std::int64_t alignment, const std::vector<std::size_t>& unit_of_param)
    : world_size_(world_size),
      plan_(plan_partition(params, unit_of_param, world_size, alignment)) {
  for (std::size_t u = 0; u < plan_.buffers.size(); ++u) {
    if (plan_.buffers[u].params().empty()) {
      throw std::invalid_argument("unit " + std::to_string(u) +
                                  " has no parameters; number units 0..k-1 without gaps");
    }
  }
  compute_offsets();
}

std::vector<ShardSlice> ShardedLayout::slices_owned_by(int rank) const {
  std::vector<ShardSlice> slices;
  std::vector<std::vector<std::size_t>> param_of_slot(unit_count());
  for (std::size_t u = 0; u < unit_count(); ++u) param_of_slot[u].resize(unit(u).params().size());
  for (std::size_t p = 0; p < param_count(); ++p) {
    param_of_slot[location(p).buffer][location(p).index] = p;
  }
  for (std::size_t u = 0; u < unit_count(); ++u) {
    for (const auto& [slot, owned] : unit(u).slices_owned_by(rank)) {
      slices.push_back({param_of_slot[u][slot], shard_offset(u) + owned.shard_offset,
                        owned.param_end - owned.param_begin, owned.param_begin});
    }
  }
  return slices;
}

void ShardedLayout::compute_offsets() {
  for (const FlatBufferPlan& unit : plan_.buffers) {
    full_offsets_.push_back(full_numel_);
    shard_offsets_.push_back(shard_numel_);
    full_numel_ += unit.numel();
    shard_numel_ += unit.shard_numel();
  }
}

DType ShardedLayout::dtype() const {
  return plan_.buffers.empty() ? DType::kFloat32 : plan_.buffers.front().dtype();
}

std::int64_t ShardedLayout::param_offset(std::size_t param) const {
  const ParamLocation& where = location(param);
  return full_offsets_.at(where.buffer) + unit(where.buffer).params().at(where.index).offset;
}

std::int64_t ShardedLayout::max_unit_numel() const {
  std::int64_t largest = 0;
  for (const FlatBufferPlan& unit : plan_.buffers) largest = std::max(largest, unit.numel());
  return largest;
}

}  // namespace zero::core
