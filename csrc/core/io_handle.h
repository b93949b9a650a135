#pragma once
// Completion of an asynchronous swap transfer, and the handle the engine waits on.
//
// A backend may cut one request into pieces that finish on different threads; IoCompletion
// counts them down and keeps the failure at the lowest file offset, so the error a caller sees
// does not depend on thread timing. Failures are kept as data (IoFailure) and thrown afresh by
// the waiting thread. IoHandle is the caller's side: waited exactly once, and its
// destructor waits for an unwaited request (the buffer must not be freed under the kernel) and
// reports a failure nobody looked at on stderr rather than dropping it.
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "core/io_error.h"

namespace zero::core {

class IoCompletion {
 public:
  explicit IoCompletion(std::size_t parts);  // 0 parts: done at once
  IoCompletion(const IoCompletion&) = delete;
  IoCompletion& operator=(const IoCompletion&) = delete;

  // Called once per part by the backend: succeeded() or failed(). `offset` orders failures.
  void part_succeeded();
  void part_failed(IoFailure failure, std::uint64_t offset);
  void wait() const;  // blocks until every part finished
  bool done() const;
  bool failed() const;
  // Whether a failure below file offset `offset` is already recorded. A part starting there
  // cannot change the error reported, so workers skip it; parts below the failure still run, so
  // the error reported is always the lowest-offset one whatever the thread timing.
  bool failed_below(std::uint64_t offset) const;
  std::optional<IoFailure> failure() const;  // empty while running or on success

 private:
  void count_down();  // with mutex_ held

  mutable std::mutex mutex_;
  mutable std::condition_variable finished_;
  std::size_t remaining_;
  std::optional<IoFailure> failure_;
  std::uint64_t failure_offset_ = 0;
};

class IoHandle {
 public:
  IoHandle() = default;  // empty: nothing to wait for
  IoHandle(std::shared_ptr<IoCompletion> completion, std::string description);
  IoHandle(IoHandle&& other) noexcept;
  IoHandle& operator=(IoHandle&& other) noexcept;  // settles the handle it replaces first
  IoHandle(const IoHandle&) = delete;
  IoHandle& operator=(const IoHandle&) = delete;
  ~IoHandle();

  // Blocks until the transfer finished; throws its IoError. A second call, or a call on an
  // empty handle, is a std::logic_error (the error was already delivered once).
  void wait();
  bool pending() const { return completion_ != nullptr; }  // not yet waited
  bool ready() const;  // the transfer finished: wait() will not block
  const std::string& description() const { return description_; }

 private:
  void settle() noexcept;

  std::shared_ptr<IoCompletion> completion_;
  std::string description_;
};

}  // namespace zero::core
