#include "core/memory_registry.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace zero::core {
namespace {

constexpr std::array<const char*, kMemoryCategoryCount> kCategoryNames = {
    "param", "fp32_master", "optimizer_state", "gradient",
    "gathered_param", "bucket", "staging", "other"};
constexpr std::array<const char*, kMemoryLocationCount> kLocationNames = {
    "device", "host_pinned", "host_pageable", "nvme"};

template <std::size_t N>
std::string joined(const std::array<const char*, N>& names) {
  std::string out;
  for (std::size_t i = 0; i < N; ++i) out += (i ? ", " : "") + std::string(names[i]);
  return out;
}

void grow(MemoryUsage& usage, std::int64_t bytes) {
  usage.current += bytes;
  usage.peak = std::max(usage.peak, usage.current);
}

}  // namespace

const char* category_name(MemoryCategory category) {
  return kCategoryNames.at(static_cast<std::size_t>(category));
}

const char* location_name(MemoryLocation location) {
  return kLocationNames.at(static_cast<std::size_t>(location));
}

MemoryCategory parse_category(const std::string& name) {
  for (std::size_t i = 0; i < kCategoryNames.size(); ++i) {
    if (name == kCategoryNames[i]) return static_cast<MemoryCategory>(i);
  }
  throw std::invalid_argument("unknown memory category '" + name + "': expected one of " +
                              joined(kCategoryNames));
}

MemoryLocation parse_location(const std::string& name) {
  for (std::size_t i = 0; i < kLocationNames.size(); ++i) {
    if (name == kLocationNames[i]) return static_cast<MemoryLocation>(i);
  }
  throw std::invalid_argument("unknown memory location '" + name + "': expected one of " +
                              joined(kLocationNames));
}

std::size_t MemoryRegistry::slot(MemoryCategory category, MemoryLocation location) {
  return static_cast<std::size_t>(category) * kMemoryLocationCount +
         static_cast<std::size_t>(location);
}

void MemoryRegistry::add(MemoryCategory category, MemoryLocation location, std::int64_t bytes) {
  if (bytes < 0) {
    throw std::invalid_argument("MemoryRegistry::add: bytes must be >= 0, got " +
                                std::to_string(bytes));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  Counter& counter = counters_[slot(category, location)];
  counter.touched = true;
  grow(counter.usage, bytes);
  grow(by_category_[static_cast<std::size_t>(category)], bytes);
  grow(by_location_[static_cast<std::size_t>(location)], bytes);
  grow(total_, bytes);
}

void MemoryRegistry::remove(MemoryCategory category, MemoryLocation location, std::int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  Counter& counter = counters_[slot(category, location)];
  if (bytes < 0 || bytes > counter.usage.current) {
    throw std::logic_error(std::string("MemoryRegistry::remove: cannot remove ") +
                           std::to_string(bytes) + " bytes from " + category_name(category) +
                           "/" + location_name(location) + " which holds " +
                           std::to_string(counter.usage.current));
  }
  counter.usage.current -= bytes;
  by_category_[static_cast<std::size_t>(category)].current -= bytes;
  by_location_[static_cast<std::size_t>(location)].current -= bytes;
  total_.current -= bytes;
}

MemoryUsage MemoryRegistry::usage(MemoryCategory category, MemoryLocation location) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_[slot(category, location)].usage;
}

MemoryUsage MemoryRegistry::category_usage(MemoryCategory category) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return by_category_[static_cast<std::size_t>(category)];
}

MemoryUsage MemoryRegistry::location_usage(MemoryLocation location) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return by_location_[static_cast<std::size_t>(location)];
}

MemoryUsage MemoryRegistry::total() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return total_;
}

std::vector<MemoryRecord> MemoryRegistry::records() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<MemoryRecord> out;
  for (std::size_t c = 0; c < kMemoryCategoryCount; ++c) {
    for (std::size_t l = 0; l < kMemoryLocationCount; ++l) {
      const auto category = static_cast<MemoryCategory>(c);
      const auto location = static_cast<MemoryLocation>(l);
      const Counter& counter = counters_[slot(category, location)];
      if (counter.touched) out.push_back({category, location, counter.usage});
    }
  }
  return out;
}

void MemoryRegistry::reset_peaks() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Counter& counter : counters_) counter.usage.peak = counter.usage.current;
  for (MemoryUsage& usage : by_category_) usage.peak = usage.current;
  for (MemoryUsage& usage : by_location_) usage.peak = usage.current;
  total_.peak = total_.current;
}

TrackedBytes::TrackedBytes(MemoryRegistry* registry, MemoryCategory category,
                           MemoryLocation location, std::int64_t bytes)
    : registry_(registry), category_(category), location_(location), bytes_(bytes) {
  if (registry_ == nullptr) throw std::invalid_argument("TrackedBytes needs a registry");
  registry_->add(category_, location_, bytes_);
}

TrackedBytes::TrackedBytes(TrackedBytes&& other) noexcept
    : registry_(std::exchange(other.registry_, nullptr)),
      category_(other.category_),
      location_(other.location_),
      bytes_(std::exchange(other.bytes_, 0)) {}

TrackedBytes& TrackedBytes::operator=(TrackedBytes&& other) noexcept {
  if (this != &other) {
    release();
    registry_ = std::exchange(other.registry_, nullptr);
    category_ = other.category_;
    location_ = other.location_;
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

TrackedBytes::~TrackedBytes() { release(); }

void TrackedBytes::release() {
  if (registry_ != nullptr) registry_->remove(category_, location_, bytes_);
  registry_ = nullptr;
  bytes_ = 0;
}

}  // namespace zero::core
