#pragma once
// Host memory for offloaded optimizer state and its copy staging: one page-aligned slab of
// exactly the bytes the regions need (each region starts 64-byte aligned for vector loads;
// nothing is rounded to a power of two, unlike a caching host allocator), carved into
// regions. The slab is pinned (page-locked, so device copies run at full speed and
// asynchronously) when a pinning function is given and succeeds; otherwise it stays
// pageable and `why_not_pinned()` says why. Every region's bytes are in the registry under
// its category, at kHostPinned or kHostPageable, for as long as the pool lives.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/memory_registry.h"

namespace zero::core {

struct HostRegion {
  MemoryCategory category = MemoryCategory::kOther;
  std::int64_t bytes = 0;
};

// pin(address, bytes, why) returns true when the memory is now page-locked, else false with
// the reason in `why`; unpin(address) undoes a successful pin.
struct HostPinning {
  std::function<bool(void*, std::size_t, std::string&)> pin;
  std::function<void(void*)> unpin;
};

inline constexpr std::size_t kHostRegionAlignment = 64;

class HostPool {
 public:
  // pinning == nullptr: pageable memory (why_not_pinned says pinning was not asked for).
  HostPool(const std::vector<HostRegion>& regions, MemoryRegistry& registry,
           const HostPinning* pinning);
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;
  ~HostPool();

  std::size_t region_count() const { return offsets_.size(); }
  void* region(std::size_t index);
  std::int64_t region_bytes(std::size_t index) const;
  bool pinned() const { return pinned_; }
  const std::string& why_not_pinned() const { return why_not_pinned_; }
  std::size_t slab_bytes() const { return slab_.size(); }

 private:
  std::vector<std::size_t> offsets_;
  std::vector<std::int64_t> bytes_;
  AlignedBuffer slab_;
  bool pinned_ = false;
  std::string why_not_pinned_;
  std::function<void(void*)> unpin_;
  std::vector<TrackedBytes> tracking_;
};

}  // namespace zero::core
