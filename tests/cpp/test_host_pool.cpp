#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <string>

#include "core/host_pool.h"

using namespace zero::core;

TEST_CASE("host pool regions are 64-byte aligned, disjoint and counted exactly", "[host_pool]") {
  MemoryRegistry registry;
  HostPool pool({{MemoryCategory::kMaster, 100}, {MemoryCategory::kOptimizerState, 8000},
                 {MemoryCategory::kStaging, 1}},
                registry, nullptr);
  REQUIRE(pool.region_count() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    REQUIRE(reinterpret_cast<std::uintptr_t>(pool.region(i)) % kHostRegionAlignment == 0);
  }
  auto* first = static_cast<std::byte*>(pool.region(0));
  auto* second = static_cast<std::byte*>(pool.region(1));
  REQUIRE(second - first >= 100);
  std::memset(pool.region(1), 0xff, 8000);  // writing a whole region stays inside the slab
  REQUIRE(static_cast<unsigned char>(first[99]) == 0);
  // Exact bytes, not the rounded ones; pageable because no pinning was asked for.
  REQUIRE(registry.usage(MemoryCategory::kMaster, MemoryLocation::kHostPageable).current == 100);
  REQUIRE(registry.usage(MemoryCategory::kOptimizerState, MemoryLocation::kHostPageable).current ==
          8000);
  REQUIRE(registry.usage(MemoryCategory::kStaging, MemoryLocation::kHostPageable).current == 1);
  REQUIRE(pool.slab_bytes() == 8192);  // 128 + 8000 + 64, already a page multiple: no rounding
  REQUIRE_FALSE(pool.pinned());
}

TEST_CASE("host pool bytes leave the registry with the pool", "[host_pool]") {
  MemoryRegistry registry;
  { HostPool pool({{MemoryCategory::kMaster, 4096}}, registry, nullptr); }
  REQUIRE(registry.usage(MemoryCategory::kMaster, MemoryLocation::kHostPageable).current == 0);
  REQUIRE(registry.usage(MemoryCategory::kMaster, MemoryLocation::kHostPageable).peak == 4096);
}

TEST_CASE("a pool that cannot be pinned is pageable and says why", "[host_pool]") {
  MemoryRegistry registry;
  HostPinning refuse{[](void*, std::size_t, std::string& why) {
                       why = "memlock limit";
                       return false;
                     },
                     [](void*) { FAIL("unpin called for memory that was never pinned"); }};
  HostPool pool({{MemoryCategory::kMaster, 64}}, registry, &refuse);
  REQUIRE_FALSE(pool.pinned());
  REQUIRE(pool.why_not_pinned() == "memlock limit");
  REQUIRE(registry.usage(MemoryCategory::kMaster, MemoryLocation::kHostPageable).current == 64);
}

TEST_CASE("a pinned pool is counted as pinned and unpinned on destruction", "[host_pool]") {
  MemoryRegistry registry;
  void* pinned_at = nullptr;
  void* unpinned_at = nullptr;
  std::size_t pinned_bytes = 0;
  HostPinning fake{[&](void* address, std::size_t bytes, std::string&) {
                     pinned_at = address;
                     pinned_bytes = bytes;
                     return true;
                   },
                   [&](void* address) { unpinned_at = address; }};
  {
    HostPool pool({{MemoryCategory::kStaging, 5000}}, registry, &fake);
    REQUIRE(pool.pinned());
    REQUIRE(pinned_at == pool.region(0));
    REQUIRE(pinned_bytes == pool.slab_bytes());
    REQUIRE(registry.usage(MemoryCategory::kStaging, MemoryLocation::kHostPinned).current == 5000);
  }
  REQUIRE(unpinned_at == pinned_at);
  REQUIRE(registry.usage(MemoryCategory::kStaging, MemoryLocation::kHostPinned).current == 0);
}
