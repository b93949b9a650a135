#pragma once
// How the swap I/O layer reports failure. DeepSpeed's aio asserts; we throw IoError, whose message
// names the file, offset, length and strerror, and whose fields let callers act on them.
//
// IoFailure is the same information as plain data: a request can fail on a worker thread and be
// waited on another, and handing over a copy rather than a shared exception object keeps the
// exception's lifetime on one thread.
#include <cstdint>
#include <stdexcept>
#include <string>

namespace zero::core {

// "<strerror> (errno N)", the way every message of this layer spells a system error.
std::string errno_text(int error_number);

class IoError : public std::runtime_error {
 public:
  IoError(const std::string& message, std::string path, std::uint64_t offset,
          std::uint64_t length, int error_number);

  // "<what> of '<path>' failed at offset O, length L: <strerror> (errno N)<context>".
  static IoError system(const std::string& what, const std::string& path, std::uint64_t offset,
                        std::uint64_t length, int error_number, const std::string& context = "");
  // End of file before `length` bytes: the file is shorter than the layout says (truncated
  // behind our back). error_number() is 0: no system call failed.
  static IoError short_read(const std::string& path, std::uint64_t offset, std::uint64_t length,
                            std::uint64_t transferred);
  // A write that made no progress (the kernel returned 0 for a non-zero length); error_number()
  // is 0.
  static IoError short_write(const std::string& path, std::uint64_t offset, std::uint64_t length,
                             std::uint64_t transferred);

  const std::string& path() const { return path_; }
  std::uint64_t offset() const { return offset_; }
  std::uint64_t length() const { return length_; }
  int error_number() const { return error_number_; }  // errno; 0 for short transfers

 private:
  std::string path_;
  std::uint64_t offset_;
  std::uint64_t length_;
  int error_number_;
};

struct IoFailure {
  std::string message;
  std::string path;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  int error_number = 0;
  // false: another exception (a bug, bad_alloc), raised again as std::runtime_error
  bool is_io_error = true;

  static IoFailure of(const IoError& error);
  // Inside a catch block: the exception being handled, as data.
  static IoFailure of_current_exception();
  // Throws a fresh IoError (or std::runtime_error) on the calling thread.
  [[noreturn]] void raise() const;
};

}  // namespace zero::core
