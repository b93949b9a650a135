#pragma once
// The c10d calls zero's flat collectives use, under whichever name the installed torch gives
// them: torch 2.13 calls them all_gather_single / reduce_scatter_single / all_to_all_single and
// deprecates _allgather_base / _reduce_scatter_base / alltoall_base, the only names torch 2.11
// (the CUDA machine's) has.
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace zero::adapter {

template <typename Group, typename = void>
struct HasSingleCollectives : std::false_type {};
template <typename Group>
struct HasSingleCollectives<Group, std::void_t<decltype(std::declval<Group&>().all_gather_single(
                                       std::declval<at::Tensor&>(), std::declval<at::Tensor&>()))>>
    : std::true_type {};

// full = concat over ranks of every rank's shard.
template <typename Group = c10d::ProcessGroup>
c10::intrusive_ptr<c10d::Work> all_gather_into(Group& group, at::Tensor& full, at::Tensor& shard) {
  if constexpr (HasSingleCollectives<Group>::value) {
    return group.all_gather_single(full, shard);
  } else {
    return group._allgather_base(full, shard);
  }
}

// shard = this rank's slice of the reduction of every rank's full.
template <typename Group = c10d::ProcessGroup>
c10::intrusive_ptr<c10d::Work> reduce_scatter_into(Group& group, at::Tensor& shard,
                                                   at::Tensor& full,
                                                   const c10d::ReduceScatterOptions& options) {
  if constexpr (HasSingleCollectives<Group>::value) {
    return group.reduce_scatter_single(shard, full, options);
  } else {
    return group._reduce_scatter_base(shard, full, options);
  }
}

// out = piece r of every rank's in, in rank order, for this rank r (equal pieces).
template <typename Group = c10d::ProcessGroup>
c10::intrusive_ptr<c10d::Work> all_to_all_into(Group& group, at::Tensor& out, at::Tensor& in) {
  std::vector<int64_t> equal_pieces;
  if constexpr (HasSingleCollectives<Group>::value) {
    return group.all_to_all_single(out, in, equal_pieces, equal_pieces);
  } else {
    return group.alltoall_base(out, in, equal_pieces, equal_pieces);
  }
}

}  // namespace zero::adapter
