#include "core/io_handle.h"

#include <iostream>
#include <stdexcept>
#include <utility>

namespace zero::core {

IoCompletion::IoCompletion(std::size_t parts) : remaining_(parts) {}

void IoCompletion::part_succeeded() {
  std::lock_guard<std::mutex> lock(mutex_);
  count_down();
}

void IoCompletion::part_failed(IoFailure failure, std::uint64_t offset) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_ || offset < failure_offset_) {
    failure_ = std::move(failure);
    failure_offset_ = offset;
  }
  count_down();
}

void IoCompletion::count_down() {
  if (remaining_ == 0) throw std::logic_error("IoCompletion: more parts finished than started");
  if (--remaining_ == 0) finished_.notify_all();
}

void IoCompletion::wait() const {
  std::unique_lock<std::mutex> lock(mutex_);
  finished_.wait(lock, [this] { return remaining_ == 0; });
}

bool IoCompletion::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return remaining_ == 0;
}

bool IoCompletion::failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_.has_value();
}

bool IoCompletion::failed_below(std::uint64_t offset) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_.has_value() && failure_offset_ < offset;
}

std::optional<IoFailure> IoCompletion::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

IoHandle::IoHandle(std::shared_ptr<IoCompletion> completion, std::string description)
    : completion_(std::move(completion)), description_(std::move(description)) {}

IoHandle::IoHandle(IoHandle&& other) noexcept
    : completion_(std::move(other.completion_)), description_(std::move(other.description_)) {}

IoHandle& IoHandle::operator=(IoHandle&& other) noexcept {
  if (this != &other) {
    settle();
    completion_ = std::move(other.completion_);
    description_ = std::move(other.description_);
  }
  return *this;
}

IoHandle::~IoHandle() { settle(); }

void IoHandle::wait() {
  if (!completion_) {
    throw std::logic_error("IoHandle::wait: " +
                           (description_.empty() ? std::string("empty handle")
                                                 : "'" + description_ + "' was already waited") +
                           "; wait each handle exactly once");
  }
  // Taken out first: whether the transfer succeeded or threw, it has been delivered.
  const std::shared_ptr<IoCompletion> completion = std::move(completion_);
  completion->wait();
  if (const std::optional<IoFailure> failure = completion->failure()) failure->raise();
}

bool IoHandle::ready() const { return !completion_ || completion_->done(); }

void IoHandle::settle() noexcept {
  if (!completion_) return;
  // The kernel or a worker may still be writing into the caller's buffer: never return before
  // the transfer finished.
  completion_->wait();
  if (const std::optional<IoFailure> failure = completion_->failure()) {
    std::cerr << "zero: swap I/O '" << description_
              << "' failed and its handle was dropped without wait(): " << failure->message
              << std::endl;
  }
  completion_.reset();
}

}  // namespace zero::core
