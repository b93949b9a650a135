#pragma once
// Memory accounting: every buffer the engine allocates is tagged with a category and a
// location, and the registry knows current and peak bytes for each, exactly. The registry
// is owned by an engine (no global state); allocations hold a TrackedBytes token that gives
// the bytes back when the buffer dies, so accounting cannot drift from ownership.
#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace zero::core {

enum class MemoryCategory : std::uint8_t {
  kParam,           // the model's working-precision parameters (16-bit or fp32) the engine owns
  kMaster,          // fp32 master weights
  kOptimizerState,  // Adam m and v, momentum buffers, ...
  kGradient,        // gradient storage owned by the engine (full or sharded)
  kGatheredParam,   // stage-3 parameters gathered for compute
  kBucket,          // communication buckets
  kStaging,         // copy staging (offload, casts)
  kOther,
};
inline constexpr std::size_t kMemoryCategoryCount = 8;

enum class MemoryLocation : std::uint8_t {
  kDevice,        // the compute device (the CPU itself in CPU training)
  kHostPinned,
  kHostPageable,
  kNvme,
};
inline constexpr std::size_t kMemoryLocationCount = 4;

const char* category_name(MemoryCategory category);
const char* location_name(MemoryLocation location);
MemoryCategory parse_category(const std::string& name);  // throws naming the valid names
MemoryLocation parse_location(const std::string& name);

struct MemoryUsage {
  std::int64_t current = 0;
  std::int64_t peak = 0;
};

struct MemoryRecord {
  MemoryCategory category;
  MemoryLocation location;
  MemoryUsage usage;
};

class MemoryRegistry {
 public:
  MemoryRegistry() = default;
  MemoryRegistry(const MemoryRegistry&) = delete;
  MemoryRegistry& operator=(const MemoryRegistry&) = delete;

  void add(MemoryCategory category, MemoryLocation location, std::int64_t bytes);
  void remove(MemoryCategory category, MemoryLocation location, std::int64_t bytes);

  MemoryUsage usage(MemoryCategory category, MemoryLocation location) const;
  MemoryUsage category_usage(MemoryCategory category) const;  // over all locations
  MemoryUsage location_usage(MemoryLocation location) const;  // over all categories
  MemoryUsage total() const;
  // Every (category, location) pair that has ever held bytes.
  std::vector<MemoryRecord> records() const;
  // Peaks restart from the current values (for per-step peaks).
  void reset_peaks();

 private:
  struct Counter {
    MemoryUsage usage;
    bool touched = false;
  };
  static std::size_t slot(MemoryCategory category, MemoryLocation location);

  mutable std::mutex mutex_;
  std::array<Counter, kMemoryCategoryCount * kMemoryLocationCount> counters_{};
  // Aggregates keep their own peak: the peak of a sum is not the sum of the peaks.
  std::array<MemoryUsage, kMemoryCategoryCount> by_category_{};
  std::array<MemoryUsage, kMemoryLocationCount> by_location_{};
  MemoryUsage total_{};
};

// RAII token for bytes counted in a registry. Move-only; gives its bytes back on destruction.
// The registry must outlive every token (the engine owns both, registry declared first).
class TrackedBytes {
 public:
  TrackedBytes() = default;
  TrackedBytes(MemoryRegistry* registry, MemoryCategory category, MemoryLocation location,
               std::int64_t bytes);
  TrackedBytes(TrackedBytes&& other) noexcept;
  TrackedBytes& operator=(TrackedBytes&& other) noexcept;
  TrackedBytes(const TrackedBytes&) = delete;
  TrackedBytes& operator=(const TrackedBytes&) = delete;
  ~TrackedBytes();

  std::int64_t bytes() const { return bytes_; }
  MemoryCategory category() const { return category_; }
  MemoryLocation location() const { return location_; }
  void release();  // gives the bytes back now

 private:
  MemoryRegistry* registry_ = nullptr;
  MemoryCategory category_ = MemoryCategory::kOther;
  MemoryLocation location_ = MemoryLocation::kDevice;
  std::int64_t bytes_ = 0;
};

}  // namespace zero::core
