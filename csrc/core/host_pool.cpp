#include "core/host_pool.h"

#include <stdexcept>

namespace zero::core {
namespace {

std::vector<std::size_t> plan_offsets(const std::vector<HostRegion>& regions, std::size_t& total) {
  std::vector<std::size_t> offsets;
  total = 0;
  for (const HostRegion& region : regions) {
    if (region.bytes < 0) throw std::invalid_argument("HostPool: a region has negative size");
    offsets.push_back(total);
    total += round_up(static_cast<std::size_t>(region.bytes), kHostRegionAlignment);
  }
  return offsets;
}

}  // namespace

HostPool::HostPool(const std::vector<HostRegion>& regions, MemoryRegistry& registry,
                   const HostPinning* pinning) {
  std::size_t total = 0;
  offsets_ = plan_offsets(regions, total);
  for (const HostRegion& region : regions) bytes_.push_back(region.bytes);
  if (total > 0) slab_ = AlignedBuffer(total, kIoAlignment);
  if (pinning == nullptr || !pinning->pin) {
    why_not_pinned_ = "pinned memory was not asked for (pin_memory is false)";
  } else if (total > 0) {
    pinned_ = pinning->pin(slab_.data(), slab_.size(), why_not_pinned_);
    if (pinned_) unpin_ = pinning->unpin;
  }
  const MemoryLocation location =
      pinned_ ? MemoryLocation::kHostPinned : MemoryLocation::kHostPageable;
  for (const HostRegion& region : regions) {
    tracking_.emplace_back(&registry, region.category, location, region.bytes);
  }
}

HostPool::~HostPool() {
  if (pinned_ && unpin_) unpin_(slab_.data());
}

void* HostPool::region(std::size_t index) {
  if (index >= offsets_.size()) throw std::out_of_range("HostPool: no such region");
  return slab_.data() + offsets_[index];
}

std::int64_t HostPool::region_bytes(std::size_t index) const {
  if (index >= bytes_.size()) throw std::out_of_range("HostPool: no such region");
  return bytes_[index];
}

}  // namespace zero::core
