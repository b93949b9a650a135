#include "core/io_error.h"

#include <cstring>
#include <exception>
#include <sstream>
#include <utility>

namespace zero::core {

std::string errno_text(int error_number) {
  return std::string(std::strerror(error_number)) + " (errno " + std::to_string(error_number) +
         ")";
}

IoError::IoError(const std::string& message, std::string path, std::uint64_t offset,
                 std::uint64_t length, int error_number)
    : std::runtime_error(message),
      path_(std::move(path)),
      offset_(offset),
      length_(length),
      error_number_(error_number) {}

IoError IoError::system(const std::string& what, const std::string& path, std::uint64_t offset,
                        std::uint64_t length, int error_number, const std::string& context) {
  std::ostringstream message;
  message << what << " of '" << path << "' failed at offset " << offset << ", length " << length
          << ": " << errno_text(error_number) << context;
  return IoError(message.str(), path, offset, length, error_number);
}

IoError IoError::short_read(const std::string& path, std::uint64_t offset, std::uint64_t length,
                            std::uint64_t transferred) {
  std::ostringstream message;
  message << "short read of '" << path << "' at offset " << offset << ", length " << length
          << ": end of file after " << transferred
          << " bytes (the swap file is shorter than its tiles: truncated or replaced behind the "
             "store's back)";
  return IoError(message.str(), path, offset, length, 0);
}

IoError IoError::short_write(const std::string& path, std::uint64_t offset, std::uint64_t length,
                             std::uint64_t transferred) {
  std::ostringstream message;
  message << "short write of '" << path << "' at offset " << offset << ", length " << length
          << ": the kernel accepted no bytes after " << transferred << " bytes";
  return IoError(message.str(), path, offset, length, 0);
}

IoFailure IoFailure::of(const IoError& error) {
  return {error.what(), error.path(), error.offset(), error.length(), error.error_number(), true};
}

IoFailure IoFailure::of_current_exception() {
  try {
    throw;
  } catch (const IoError& error) {
    return of(error);
  } catch (const std::exception& error) {
    return {error.what(), "", 0, 0, 0, false};
  } catch (...) {
    return {"unknown exception in the swap I/O layer", "", 0, 0, 0, false};
  }
}

void IoFailure::raise() const {
  if (is_io_error) throw IoError(message, path, offset, length, error_number);
  throw std::runtime_error(message);
}

}  // namespace zero::core
