#include "core/fault_injector.h"

#include <cerrno>

namespace zero::core {

void FaultInjector::shorten_transfers(std::size_t max_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  max_transfer_ = max_bytes;
}

void FaultInjector::interrupt_next(std::size_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  interrupts_left_ = count;
}

void FaultInjector::fail_at(IoOp op, std::uint64_t offset, int error) {
  std::lock_guard<std::mutex> lock(mutex_);
  failures_.push_back({op, offset, error});
}

void FaultInjector::refuse_direct_io(int error) {
  std::lock_guard<std::mutex> lock(mutex_);
  direct_error_ = error;
}

void FaultInjector::fail_preallocation(int error) {
  std::lock_guard<std::mutex> lock(mutex_);
  preallocate_error_ = error;
}

TransferPlan FaultInjector::before_transfer(IoOp op, std::uint64_t offset, std::size_t length) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (interrupts_left_ > 0) {
    --interrupts_left_;
    ++counts_.interrupts;
    return {0, EINTR};
  }
  for (const Failure& failure : failures_) {
    if (failure.op == op && failure.offset >= offset && failure.offset - offset < length) {
      ++counts_.failures;
      return {0, failure.error};
    }
  }
  if (max_transfer_ != 0 && length > max_transfer_) {
    ++counts_.shortened;
    return {max_transfer_, 0};
  }
  return {length, 0};
}

int FaultInjector::before_enable_direct() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (direct_error_ != 0) ++counts_.refusals;
  return direct_error_;
}

int FaultInjector::before_preallocate() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (preallocate_error_ != 0) ++counts_.refusals;
  return preallocate_error_;
}

FaultCounts FaultInjector::counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

}  // namespace zero::core
