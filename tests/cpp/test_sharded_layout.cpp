#include <catch2/catch.hpp>

#include <vector>

#include "core/sharded_layout.h"

using zero::core::DType;
using zero::core::ShardedLayout;
using zero::core::ShardSlice;
using zero::core::TensorSpec;
using zero::core::assign_units;

namespace {

std::vector<TensorSpec> specs(std::vector<std::int64_t> sizes) {
  std::vector<TensorSpec> out;
  for (auto n : sizes) out.push_back({{n}, DType::kFloat32});
  return out;
}

}  // namespace

TEST_CASE("units are cut from the last parameter backwards", "[layout]") {
  CHECK(assign_units({4, 4, 4, 4, 4}, 8) == std::vector<std::size_t>{0, 1, 1, 2, 2});
}

TEST_CASE("a parameter larger than the unit size is a unit of its own", "[layout]") {
  CHECK(assign_units({3, 100, 3}, 10) == std::vector<std::size_t>{0, 1, 2});
}

TEST_CASE("empty parameters join their neighbours", "[layout]") {
  CHECK(assign_units({0, 5, 0}, 5) == std::vector<std::size_t>{0, 0, 0});
}

TEST_CASE("a non-positive unit size names the config key", "[layout][errors]") {
  CHECK_THROWS_WITH(assign_units({4}, 0), Catch::Contains("zero_optimization.reduce_bucket_size"));
}

TEST_CASE("every unit is padded and split evenly over the ranks", "[layout]") {
  const ShardedLayout layout(specs({7, 1, 13, 5, 30, 2}), 4, 1, 20);
  REQUIRE(layout.unit_count() == 4);  // from the end: {2}, {30}, {1, 13, 5}, {7}
  CHECK(layout.location(1).buffer == 1);
  std::int64_t full = 0, shard = 0;
  for (std::size_t u = 0; u < layout.unit_count(); ++u) {
    CHECK(layout.unit(u).numel() % 4 == 0);
    CHECK(layout.full_offset(u) == full);
    CHECK(layout.shard_offset(u) == shard);
    CHECK(layout.unit(u).shard_numel() * 4 == layout.unit(u).numel());
    full += layout.unit(u).numel();
    shard += layout.unit(u).shard_numel();
  }
  CHECK(layout.full_numel() == full);
  CHECK(layout.shard_numel() == shard);
  CHECK(layout.full_numel() == 4 * layout.shard_numel());
}

TEST_CASE("parameter offsets in the full buffer follow unit and slot", "[layout]") {
  const ShardedLayout layout(specs({3, 5, 6}), 2, 1, 6);  // units {3}, {5}, {6} -> 4, 6, 6
  CHECK(layout.param_offset(0) == 0);
  CHECK(layout.param_offset(1) == 4);
  CHECK(layout.param_offset(2) == 10);
  CHECK(layout.max_unit_numel() == 6);
  CHECK(layout.location(2).buffer == 2);
}

TEST_CASE("one world rank owns every unit whole", "[layout]") {
  const ShardedLayout layout(specs({3, 5}), 1, 4, 100);
  CHECK(layout.unit_count() == 1);
  CHECK(layout.shard_numel() == layout.full_numel());
}

TEST_CASE("units can be given explicitly, as stage 3 gathers by module", "[layout]") {
  const ShardedLayout layout(specs({3, 5, 6, 2}), 2, 1, std::vector<std::size_t>{0, 1, 1, 0});
  REQUIRE(layout.unit_count() == 2);
  CHECK(layout.unit(0).params().size() == 2);
  CHECK(layout.location(3).buffer == 0);
  CHECK(layout.location(3).index == 1);
  CHECK(layout.unit(1).numel() == 12);
  CHECK_THROWS_WITH(ShardedLayout(specs({3, 5}), 2, 1, std::vector<std::size_t>{0, 2}),
                    Catch::Contains("unit 1 has no parameters"));
}

TEST_CASE("a rank's slices of each parameter lie where its shard keeps them", "[layout]") {
  // units {3, 5} and {6} over 2 ranks: unit 0 is 8 elements (4 each), unit 1 is 6 (3 each)
  const ShardedLayout layout(specs({3, 5, 6}), 2, 1, 8);
  REQUIRE(layout.unit_count() == 2);
  const std::vector<ShardSlice> first = layout.slices_owned_by(0);
  REQUIRE(first.size() == 3);
  CHECK((first[0].param == 0 && first[0].shard_offset == 0 && first[0].numel == 3));
  CHECK((first[1].param == 1 && first[1].shard_offset == 3 && first[1].numel == 1));
  CHECK((first[2].param == 2 && first[2].shard_offset == 4 && first[2].numel == 3));
  const std::vector<ShardSlice> second = layout.slices_owned_by(1);
  REQUIRE(second.size() == 2);
  CHECK((second[0].param == 1 && second[0].shard_offset == 0 && second[0].numel == 4));
  CHECK((second[1].param == 2 && second[1].shard_offset == 4 && second[1].numel == 3));
  // where each slice starts inside its parameter: parameter 1's first element is rank 0's
  CHECK((first[1].param_begin == 0 && second[0].param_begin == 1));
  CHECK((first[2].param_begin == 0 && second[1].param_begin == 3));
  std::int64_t owned = 0;  // together the ranks own every element exactly once
  for (const auto& slices : {first, second}) {
    for (const ShardSlice& slice : slices) owned += slice.numel;
  }
  CHECK(owned == 3 + 5 + 6);
}
