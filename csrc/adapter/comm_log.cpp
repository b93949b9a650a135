#include "adapter/comm_log.h"

#include <utility>

namespace zero::adapter {

void CommLog::set_enabled(bool enabled) { enabled_.store(enabled, std::memory_order_relaxed); }

void CommLog::set_label(std::string label) {
  std::lock_guard<std::mutex> lock(mutex_);
  label_ = std::move(label);
}

std::string CommLog::label() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return label_;
}

void CommLog::add(CollectiveRecord record) {
  std::lock_guard<std::mutex> lock(mutex_);
  records_.push_back(std::move(record));
}

std::vector<CollectiveRecord> CommLog::drain() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<CollectiveRecord> out;
  out.swap(records_);
  return out;
}

CollectiveTiming::CollectiveTiming(std::shared_ptr<CommLog> log, CollectiveRecord record)
    : log_(std::move(log)), record_(std::move(record)), start_(CommLog::Clock::now()) {}

void CollectiveTiming::complete() {
  const auto elapsed = CommLog::Clock::now() - start_;
  std::int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count();
  std::int64_t unset = 0;
  end_ns_.compare_exchange_strong(unset, ns > 0 ? ns : 1);
}

void CollectiveTiming::commit() {
  complete();  // no-op when the work's future already stamped it
  record_.latency_ms = static_cast<double>(end_ns_.load()) / 1e6;
  log_->add(std::move(record_));
}

}  // namespace zero::adapter
