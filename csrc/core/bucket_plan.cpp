#include "core/bucket_plan.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace zero::core {
namespace {

Bucket make_bucket(const FlatBufferPlan& plan, std::size_t first, std::size_t last) {
  Bucket bucket;
  for (std::size_t p = first; p <= last; ++p) bucket.params.push_back(p);
  const ParamSlot& low = plan.params()[first];
  const ParamSlot& high = plan.params()[last];
  bucket.flat_begin = low.offset;
  bucket.flat_end = std::max(low.offset, high.offset + high.numel);

  // Rank r's share of the bucket is [max(begin, rS), min(end, (r+1)S)).
  const std::int64_t shard = plan.shard_numel();
  std::vector<std::int64_t> piece_start(plan.world_size(), 0);
  for (int rank = 0; rank < plan.world_size(); ++rank) {
    const std::int64_t begin = std::max(bucket.flat_begin, rank * shard);
    const std::int64_t end = std::min(bucket.flat_end, (rank + 1) * shard);
    const std::int64_t length = std::max<std::int64_t>(0, end - begin);
    piece_start[rank] = begin;
    bucket.shards.push_back({rank, length, length > 0 ? begin - rank * shard : 0});
    bucket.chunk_numel = std::max(bucket.chunk_numel, length);
  }
  for (const std::size_t p : bucket.params) {
    const ParamSlot& slot = plan.params()[p];
    for (const OwnedSlice& slice : plan.owned_slices(p)) {
      const std::int64_t flat_position = slot.offset + slice.param_begin;
      bucket.pieces.push_back({p, slice.param_begin, slice.param_end,
                               slice.rank * bucket.chunk_numel +
                                   (flat_position - piece_start[slice.rank])});
    }
  }
  return bucket;
}

}  // namespace

std::vector<Bucket> plan_buckets(const FlatBufferPlan& plan, std::int64_t bucket_numel) {
  if (bucket_numel < 1) {
    throw std::invalid_argument("bucket size must be >= 1 element, got " +
                                std::to_string(bucket_numel) +
                                "; set zero_optimization.reduce_bucket_size to a positive number");
  }
  std::vector<Bucket> buckets;
  const std::size_t count = plan.params().size();
  std::size_t last = count;  // exclusive upper end of the next bucket
  while (last > 0) {
    std::size_t first = last - 1;
    std::int64_t filled = plan.params()[first].numel;
    while (first > 0 && filled + plan.params()[first - 1].numel <= bucket_numel) {
      --first;
      filled += plan.params()[first].numel;
    }
    buckets.push_back(make_bucket(plan, first, last - 1));
    last = first;
  }
  return buckets;
}

}  // namespace zero::core
