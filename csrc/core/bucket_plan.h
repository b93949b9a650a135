#pragma once
// Gradient buckets over a flat buffer. Buckets hold whole parameters, contiguous in the flat
// layout, filled from the last parameter to the first (the order backward produces grads).
//
// For a reduce-scatter straight into the owners' shards, a bucket is laid out as world_size
// equal chunks: chunk r holds the bucket's elements that rank r owns (a contiguous piece of
// r's shard, since shards are contiguous), zero-padded to the longest piece. After the
// reduce-scatter rank r adds the first `length` elements of its chunk into its shard at
// `shard_offset`.
#include <cstdint>
#include <vector>

#include "core/partition_plan.h"

namespace zero::core {

// A run of one parameter's elements and where it goes in the chunked bucket layout.
struct BucketPiece {
  std::size_t param = 0;
  std::int64_t param_begin = 0;
  std::int64_t param_end = 0;
  std::int64_t bucket_offset = 0;
};

// What rank `rank` receives from the bucket's reduce-scatter.
struct BucketShard {
  int rank = 0;
  std::int64_t length = 0;        // valid elements at the start of the chunk
  std::int64_t shard_offset = 0;  // where they go in the rank's shard
};

struct Bucket {
  std::vector<std::size_t> params;  // ascending parameter indices
  std::int64_t flat_begin = 0;      // contiguous range in the flat buffer
  std::int64_t flat_end = 0;
  std::int64_t chunk_numel = 0;     // per-rank chunk of the reduce-scatter layout
  std::vector<BucketPiece> pieces;
  std::vector<BucketShard> shards;  // one per rank, in rank order

  std::int64_t scatter_numel(int world_size) const { return chunk_numel * world_size; }
};

// Cuts the plan's parameters into buckets of at most `bucket_numel` elements (a parameter
// larger than the limit gets a bucket of its own). Empty
// parameters join a bucket but contribute no pieces. Buckets come back in launch order:
// bucket 0 holds the last parameters.
std::vector<Bucket> plan_buckets(const FlatBufferPlan& plan, std::int64_t bucket_numel);

}  // namespace zero::core
