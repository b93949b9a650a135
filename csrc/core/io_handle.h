#pragma once
// Completion of an asynchronous swap transfer, and the handle the engine waits on.
//
// A backend may cut one request into pieces that finish on different threads; IoCompletion
// counts them down and keeps the failure at the lowest file offset, so the error a caller sees
// does not depend on thread timing. IoHandle is the caller's side: waited exactly once, and its
// destructor waits for an unwaited request (the buffer must not be freed under the kernel) and
// reports a failure nobody looked at on stderr rather than dropping it.
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

namespace zero::core {

class IoCompletion {
 public:
  explicit IoCompletion(std::size_t parts);  // 0 parts: done at once
  IoCompletion(const IoCompletion&) = delete;
  IoCompletion& operator=(const IoCompletion&) = delete;

  // Called once per part by the backend; `error` is null on success. `offset` is the file offset
  // where the failure happened.
  void finish_part(std::exception_ptr error, std::uint64_t offset);
  void wait() const;  // blocks until every part finished
  bool done() const;
  // True as soon as one part failed: workers skip the request's remaining parts.
  bool failed() const;
  std::exception_ptr error() const;  // null while running or on success

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable finished_;
  std::size_t remaining_;
  std::exception_ptr error_;
  std::uint64_t error_offset_ = 0;
  bool failed_ = false;
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

  // Blocks until the transfer finished; rethrows its IoError. A second call, or a call on an
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
