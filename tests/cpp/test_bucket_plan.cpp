#include <catch2/catch.hpp>

#include <map>
#include <vector>

#include "core/bucket_plan.h"

using zero::core::Bucket;
using zero::core::DType;
using zero::core::FlatBufferPlan;
using zero::core::TensorSpec;
using zero::core::plan_buckets;
using zero::core::plan_flat_buffer;

namespace {

FlatBufferPlan plan_of(std::vector<std::int64_t> sizes, int world, std::int64_t alignment = 1) {
  std::vector<TensorSpec> specs;
  for (auto n : sizes) specs.push_back({{n}, DType::kFloat32});
  return plan_flat_buffer(specs, world, alignment);
}

// Simulates a reduce-scatter of the chunked layout: element e of the flat buffer must land
// in its owner's shard at e - owner * S, exactly once.
void check_scatter_reaches_every_owner(const FlatBufferPlan& plan, const std::vector<Bucket>& buckets) {
  std::map<std::int64_t, int> delivered;  // flat position -> times delivered
  for (const Bucket& bucket : buckets) {
    std::map<std::int64_t, std::int64_t> chunk_to_flat;  // bucket offset -> flat position
    for (const auto& piece : bucket.pieces) {
      const auto& slot = plan.params()[piece.param];
      for (auto i = piece.param_begin; i < piece.param_end; ++i) {
        const std::int64_t offset = piece.bucket_offset + (i - piece.param_begin);
        REQUIRE(offset < bucket.scatter_numel(plan.world_size()));
        REQUIRE(chunk_to_flat.count(offset) == 0);
        chunk_to_flat[offset] = slot.offset + i;
      }
    }
    for (const auto& shard : bucket.shards) {
      REQUIRE(shard.length <= bucket.chunk_numel);
      for (std::int64_t j = 0; j < shard.length; ++j) {
        const auto it = chunk_to_flat.find(shard.rank * bucket.chunk_numel + j);
        if (it == chunk_to_flat.end()) continue;  // alignment gap between parameters
        REQUIRE(it->second == shard.rank * plan.shard_numel() + shard.shard_offset + j);
        ++delivered[it->second];
      }
    }
  }
  std::int64_t expected = 0;
  for (const auto& slot : plan.params()) expected += slot.numel;
  REQUIRE(static_cast<std::int64_t>(delivered.size()) == expected);
  for (const auto& [position, times] : delivered) REQUIRE(times == 1);
}

}  // namespace

TEST_CASE("buckets are filled from the last parameter backwards", "[buckets]") {
  const auto plan = plan_of({4, 4, 4, 4, 4}, 1);
  const auto buckets = plan_buckets(plan, 8);
  REQUIRE(buckets.size() == 3);
  CHECK(buckets[0].params == std::vector<std::size_t>{3, 4});
  CHECK(buckets[1].params == std::vector<std::size_t>{1, 2});
  CHECK(buckets[2].params == std::vector<std::size_t>{0});
  CHECK(buckets[0].flat_begin == 12);
  CHECK(buckets[0].flat_end == 20);
}

TEST_CASE("a parameter larger than the limit gets a bucket of its own", "[buckets]") {
  const auto buckets = plan_buckets(plan_of({3, 100, 3}, 2), 10);
  REQUIRE(buckets.size() == 3);
  CHECK(buckets[0].params == std::vector<std::size_t>{2});
  CHECK(buckets[1].params == std::vector<std::size_t>{1});
}

TEST_CASE("every element reaches its owner exactly once", "[buckets]") {
  for (int world : {1, 2, 3, 4}) {
    for (std::int64_t limit : {1, 5, 17, 1000}) {
      const auto plan = plan_of({7, 1, 0, 13, 5, 30, 2}, world);
      check_scatter_reaches_every_owner(plan, plan_buckets(plan, limit));
      const auto aligned = plan_of({7, 1, 0, 13, 5, 30, 2}, world, 4);
      check_scatter_reaches_every_owner(aligned, plan_buckets(aligned, limit));
    }
  }
}

TEST_CASE("chunks are as long as the largest owned piece", "[buckets]") {
  const auto plan = plan_of({10}, 4);  // 12 elements, shards of 3
  const auto buckets = plan_buckets(plan, 100);
  REQUIRE(buckets.size() == 1);
  CHECK(buckets[0].chunk_numel == 3);
  CHECK(buckets[0].shards[3].length == 1);
  CHECK(buckets[0].shards[3].shard_offset == 0);
}

TEST_CASE("ranks that own nothing of a bucket get an empty piece", "[buckets]") {
  const auto plan = plan_of({2, 2, 2, 2}, 4);  // shards of 2: one parameter per rank
  const auto buckets = plan_buckets(plan, 2);
  REQUIRE(buckets.size() == 4);
  CHECK(buckets[0].params == std::vector<std::size_t>{3});
  CHECK(buckets[0].shards[3].length == 2);
  CHECK(buckets[0].shards[0].length == 0);
}

TEST_CASE("a non-positive bucket size is rejected naming the config key", "[buckets][errors]") {
  CHECK_THROWS_WITH(plan_buckets(plan_of({4}, 1), 0),
                    Catch::Contains("zero_optimization.reduce_bucket_size"));
}
