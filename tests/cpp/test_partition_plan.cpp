#include <catch2/catch.hpp>

#include <numeric>
#include <set>
#include <stdexcept>

#include "core/partition_plan.h"

using zero::core::DType;
using zero::core::FlatBufferPlan;
using zero::core::OwnedSlice;
using zero::core::TensorSpec;
using zero::core::plan_flat_buffer;
using zero::core::plan_partition;

namespace {

std::vector<TensorSpec> specs(std::initializer_list<std::vector<std::int64_t>> shapes,
                              DType dtype = DType::kFloat32) {
  std::vector<TensorSpec> out;
  for (const auto& shape : shapes) out.push_back({shape, dtype});
  return out;
}

// Every element of every parameter is owned by exactly one rank, at the right place.
void check_ownership_is_a_partition(const FlatBufferPlan& plan) {
  for (std::size_t p = 0; p < plan.params().size(); ++p) {
    const auto& slot = plan.params()[p];
    std::int64_t covered = 0;
    for (const OwnedSlice& slice : plan.owned_slices(p)) {
      REQUIRE(slice.param_begin == covered);
      REQUIRE(slice.param_end > slice.param_begin);
      const auto range = plan.shard_range(slice.rank);
      REQUIRE(range.begin + slice.shard_offset == slot.offset + slice.param_begin);
      REQUIRE(slice.shard_offset + (slice.param_end - slice.param_begin) <= plan.shard_numel());
      covered = slice.param_end;
    }
    REQUIRE(covered == slot.numel);
  }
}

}  // namespace

TEST_CASE("parameters are laid out in order at aligned offsets", "[planner]") {
  const auto plan = plan_flat_buffer(specs({{3, 5}, {7}, {2, 2}}), 1, 4);
  REQUIRE(plan.params().size() == 3);
  CHECK(plan.params()[0].offset == 0);
  CHECK(plan.params()[0].numel == 15);
  CHECK(plan.params()[1].offset == 16);
  CHECK(plan.params()[2].offset == 24);
  CHECK(plan.params()[2].shape == std::vector<std::int64_t>{2, 2});
  CHECK(plan.used_numel() == 26);
  CHECK(plan.numel() == 28);
}

TEST_CASE("the buffer is padded to a multiple of world_size * alignment", "[planner]") {
  for (int world : {1, 2, 3, 4, 8}) {
    const auto plan = plan_flat_buffer(specs({{13}, {5}}), world, 2);
    CHECK(plan.numel() % (world * 2) == 0);
    CHECK(plan.numel() >= plan.used_numel());
    CHECK(plan.numel() - plan.params().back().offset - plan.params().back().numel <
          world * 2);
    CHECK(plan.shard_numel() * world == plan.numel());
  }
}

TEST_CASE("shard ranges tile the buffer without overlap", "[planner]") {
  const auto plan = plan_flat_buffer(specs({{101}, {3, 3}}), 4, 1);
  std::int64_t expected_begin = 0;
  for (int rank = 0; rank < 4; ++rank) {
    const auto range = plan.shard_range(rank);
    CHECK(range.begin == expected_begin);
    CHECK(range.end - range.begin == plan.shard_numel());
    expected_begin = range.end;
  }
  CHECK(expected_begin == plan.numel());
}

TEST_CASE("a parameter spanning several shards is split at shard boundaries", "[planner]") {
  const auto plan = plan_flat_buffer(specs({{10}}), 4, 1);  // 12 elements, shards of 3
  const auto slices = plan.owned_slices(0);
  REQUIRE(slices.size() == 4);
  CHECK(slices[0].param_begin == 0);
  CHECK(slices[0].param_end == 3);
  CHECK(slices[3].rank == 3);
  CHECK(slices[3].param_begin == 9);
  CHECK(slices[3].param_end == 10);
  CHECK(slices[3].shard_offset == 0);
}

TEST_CASE("sizes not divisible by the world size still partition exactly", "[planner]") {
  for (int world : {1, 2, 3, 4, 7}) {
    check_ownership_is_a_partition(plan_flat_buffer(specs({{17}, {1}, {31, 3}, {2}}), world, 1));
    check_ownership_is_a_partition(plan_flat_buffer(specs({{17}, {1}, {31, 3}, {2}}), world, 8));
  }
}

TEST_CASE("a world size larger than the element count leaves ranks with only padding",
          "[planner]") {
  const auto plan = plan_flat_buffer(specs({{2}, {1}}), 8, 1);
  CHECK(plan.numel() == 8);
  CHECK(plan.shard_numel() == 1);
  check_ownership_is_a_partition(plan);
  CHECK(plan.slices_owned_by(7).empty());
  CHECK(plan.slices_owned_by(0).size() == 1);
}

TEST_CASE("empty parameters take no space and have no owner", "[planner]") {
  const auto plan = plan_flat_buffer(specs({{0}, {4}, {3, 0}}), 2, 1);
  CHECK(plan.params()[0].numel == 0);
  CHECK(plan.params()[1].offset == 0);
  CHECK(plan.params()[2].numel == 0);
  CHECK(plan.owned_slices(0).empty());
  CHECK(plan.owned_slices(2).empty());
  CHECK(plan.numel() == 4);
}

TEST_CASE("no parameters plan an empty buffer", "[planner]") {
  const auto plan = plan_flat_buffer({}, 4, 8);
  CHECK(plan.numel() == 0);
  CHECK(plan.shard_numel() == 0);
}

TEST_CASE("scalars count as one element", "[planner]") {
  const auto plan = plan_flat_buffer(specs({{}, {}}), 2, 1);
  CHECK(plan.params()[0].numel == 1);
  CHECK(plan.params()[1].offset == 1);
}

TEST_CASE("slices_owned_by lists exactly one rank's pieces", "[planner]") {
  const auto plan = plan_flat_buffer(specs({{5}, {6}, {7}}), 3, 1);  // 18 elements, shards of 6
  std::int64_t total = 0;
  for (int rank = 0; rank < 3; ++rank) {
    for (const auto& [index, slice] : plan.slices_owned_by(rank)) {
      CHECK(slice.rank == rank);
      total += slice.param_end - slice.param_begin;
      (void)index;
    }
  }
  CHECK(total == 18);
}

TEST_CASE("bytes follow the dtype", "[planner]") {
  CHECK(plan_flat_buffer(specs({{6}}, DType::kBFloat16), 2, 1).bytes() == 12);
  CHECK(plan_flat_buffer(specs({{6}}, DType::kFloat32), 2, 1).bytes() == 24);
}

TEST_CASE("impossible inputs are rejected with a message", "[planner][errors]") {
  CHECK_THROWS_WITH(plan_flat_buffer(specs({{4}}), 0, 1),
                    Catch::Contains("world_size must be >= 1, got 0"));
  CHECK_THROWS_WITH(plan_flat_buffer(specs({{4}}), 2, 0),
                    Catch::Contains("alignment must be >= 1"));
  CHECK_THROWS_WITH(plan_flat_buffer(specs({{4, -2}}), 2, 1),
                    Catch::Contains("parameter 0 has shape [4, -2] with a negative dimension"));
  auto mixed = specs({{4}});
  mixed.push_back({{3}, DType::kBFloat16});
  CHECK_THROWS_WITH(plan_flat_buffer(mixed, 2, 1),
                    Catch::Contains("parameter 0 is float32 but parameter 1 is bfloat16"));
}

TEST_CASE("out-of-range ranks and indices are rejected", "[planner][errors]") {
  const auto plan = plan_flat_buffer(specs({{4}}), 2, 1);
  CHECK_THROWS_WITH(plan.shard_range(2), Catch::Contains("rank 2 is outside [0, 2)"));
  CHECK_THROWS_WITH(plan.owned_slices(1), Catch::Contains("parameter index 1"));
}

TEST_CASE("plan_partition groups parameters into buffers and maps each back", "[planner]") {
  std::vector<TensorSpec> params = {
      {{4}, DType::kFloat32}, {{3}, DType::kBFloat16}, {{5}, DType::kFloat32}};
  const auto plan = plan_partition(params, {0, 1, 0}, 2, 1);
  REQUIRE(plan.buffers.size() == 2);
  CHECK(plan.buffers[0].params().size() == 2);
  CHECK(plan.buffers[1].dtype() == DType::kBFloat16);
  CHECK(plan.locations[2].buffer == 0);
  CHECK(plan.locations[2].index == 1);
  CHECK(plan.buffers[0].params()[1].offset == 4);
}

TEST_CASE("plan_partition names the buffer with mixed dtypes", "[planner][errors]") {
  std::vector<TensorSpec> params = {{{4}, DType::kFloat32}, {{3}, DType::kBFloat16}};
  CHECK_THROWS_WITH(plan_partition(params, {0, 0}, 2, 1), Catch::Contains("buffer 0:"));
  CHECK_THROWS_WITH(plan_partition(params, {0}, 2, 1),
                    Catch::Contains("buffer_of_param has 1 entries but there are 2"));
}
