#include <catch2/catch.hpp>

#include <thread>
#include <vector>

#include "core/memory_registry.h"

using zero::core::MemoryCategory;
using zero::core::MemoryLocation;
using zero::core::MemoryRegistry;
using zero::core::TrackedBytes;

TEST_CASE("current and peak bytes are tracked per category", "[memory]") {
  MemoryRegistry registry;
  registry.add(MemoryCategory::kMaster, MemoryLocation::kDevice, 400);
  registry.add(MemoryCategory::kGradient, MemoryLocation::kDevice, 100);
  registry.remove(MemoryCategory::kGradient, MemoryLocation::kDevice, 100);
  registry.add(MemoryCategory::kGradient, MemoryLocation::kDevice, 60);
  CHECK(registry.category_usage(MemoryCategory::kMaster).current == 400);
  CHECK(registry.category_usage(MemoryCategory::kGradient).current == 60);
  CHECK(registry.category_usage(MemoryCategory::kGradient).peak == 100);
  CHECK(registry.category_usage(MemoryCategory::kBucket).current == 0);
}

TEST_CASE("the total peak is the peak of the sum, not the sum of peaks", "[memory]") {
  MemoryRegistry registry;
  registry.add(MemoryCategory::kBucket, MemoryLocation::kDevice, 100);
  registry.remove(MemoryCategory::kBucket, MemoryLocation::kDevice, 100);
  registry.add(MemoryCategory::kStaging, MemoryLocation::kDevice, 100);
  CHECK(registry.total().current == 100);
  CHECK(registry.total().peak == 100);
  CHECK(registry.category_usage(MemoryCategory::kBucket).peak == 100);
  CHECK(registry.category_usage(MemoryCategory::kStaging).peak == 100);
}

TEST_CASE("locations are tracked separately", "[memory]") {
  MemoryRegistry registry;
  registry.add(MemoryCategory::kOptimizerState, MemoryLocation::kHostPinned, 800);
  registry.add(MemoryCategory::kOptimizerState, MemoryLocation::kDevice, 8);
  CHECK(registry.usage(MemoryCategory::kOptimizerState, MemoryLocation::kHostPinned).current ==
        800);
  CHECK(registry.location_usage(MemoryLocation::kDevice).current == 8);
  CHECK(registry.category_usage(MemoryCategory::kOptimizerState).current == 808);
  CHECK(registry.records().size() == 2);
}

TEST_CASE("reset_peaks restarts peaks from current values", "[memory]") {
  MemoryRegistry registry;
  registry.add(MemoryCategory::kBucket, MemoryLocation::kDevice, 50);
  registry.remove(MemoryCategory::kBucket, MemoryLocation::kDevice, 30);
  registry.reset_peaks();
  CHECK(registry.category_usage(MemoryCategory::kBucket).peak == 20);
  CHECK(registry.total().peak == 20);
}

TEST_CASE("removing more than is held is a logic error", "[memory][errors]") {
  MemoryRegistry registry;
  registry.add(MemoryCategory::kParam, MemoryLocation::kDevice, 10);
  CHECK_THROWS_WITH(registry.remove(MemoryCategory::kParam, MemoryLocation::kDevice, 11),
                    Catch::Contains("cannot remove 11 bytes from param/device which holds 10"));
  CHECK_THROWS(registry.add(MemoryCategory::kParam, MemoryLocation::kDevice, -1));
}

TEST_CASE("TrackedBytes gives its bytes back when it dies", "[memory]") {
  MemoryRegistry registry;
  {
    TrackedBytes a(&registry, MemoryCategory::kGatheredParam, MemoryLocation::kDevice, 64);
    TrackedBytes b = std::move(a);
    CHECK(a.bytes() == 0);
    CHECK(registry.category_usage(MemoryCategory::kGatheredParam).current == 64);
  }
  CHECK(registry.category_usage(MemoryCategory::kGatheredParam).current == 0);
  CHECK(registry.category_usage(MemoryCategory::kGatheredParam).peak == 64);
}

TEST_CASE("move-assigning a TrackedBytes releases the old bytes", "[memory]") {
  MemoryRegistry registry;
  TrackedBytes a(&registry, MemoryCategory::kBucket, MemoryLocation::kDevice, 10);
  a = TrackedBytes(&registry, MemoryCategory::kBucket, MemoryLocation::kDevice, 3);
  CHECK(registry.category_usage(MemoryCategory::kBucket).current == 3);
}

TEST_CASE("concurrent allocations are counted exactly", "[memory]") {
  MemoryRegistry registry;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&registry] {
      for (int i = 0; i < 10000; ++i) {
        TrackedBytes bytes(&registry, MemoryCategory::kStaging, MemoryLocation::kDevice, 8);
      }
      registry.add(MemoryCategory::kStaging, MemoryLocation::kDevice, 1);
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(registry.category_usage(MemoryCategory::kStaging).current == 4);
  CHECK(registry.category_usage(MemoryCategory::kStaging).peak <= 4 * 8 + 4);
}

TEST_CASE("category and location names round-trip", "[memory]") {
  for (std::size_t c = 0; c < zero::core::kMemoryCategoryCount; ++c) {
    const auto category = static_cast<MemoryCategory>(c);
    CHECK(zero::core::parse_category(zero::core::category_name(category)) == category);
  }
  CHECK_THROWS_WITH(zero::core::parse_category("grads"),
                    Catch::Contains("unknown memory category 'grads'"));
  CHECK(zero::core::parse_location("host_pinned") == MemoryLocation::kHostPinned);
}
