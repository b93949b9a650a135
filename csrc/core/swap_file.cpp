#include "core/swap_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <utility>

#include "core/aligned_buffer.h"
#include "core/fault_injector.h"
#include "core/io_backend.h"

namespace zero::core {
namespace {

constexpr const char* kPrefix = "zero-swap-";
constexpr const char* kSuffix = ".bin";
// More swap files than this from one process in one directory means something is leaking them.
constexpr std::uint64_t kMaxFilesPerProcess = 1u << 20;

// The number this process's next swap file tries first. Numbers are never reused while the
// process lives, so a path in an error message names one file, even after the file has lost
// its name on disk (the directory can no longer tell which numbers are in use).
std::atomic<std::uint64_t>& next_number() {
  static std::atomic<std::uint64_t> next{0};
  return next;
}

std::string join(const std::string& directory, const std::string& name) {
  return directory.back() == '/' ? directory + name : directory + "/" + name;
}

// Reads a run of decimal digits starting at `pos`; false when there is none.
bool parse_digits(const std::string& text, std::size_t& pos, std::uint64_t& value) {
  const std::size_t start = pos;
  value = 0;
  while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9' && pos - start < 19) {
    value = value * 10 + static_cast<std::uint64_t>(text[pos] - '0');
    ++pos;
  }
  return pos > start;
}

// The pid in "zero-swap-<pid>-<n>.bin", or 0 when `name` is not a swap file name.
pid_t swap_file_pid(const std::string& name) {
  const std::string prefix = kPrefix;
  const std::string suffix = kSuffix;
  if (name.compare(0, prefix.size(), prefix) != 0) return 0;
  std::size_t pos = prefix.size();
  std::uint64_t pid = 0;
  std::uint64_t n = 0;
  if (!parse_digits(name, pos, pid) || pos >= name.size() || name[pos] != '-') return 0;
  ++pos;
  if (!parse_digits(name, pos, n) || name.compare(pos, std::string::npos, suffix) != 0) return 0;
  if (pid == 0 || pid > static_cast<std::uint64_t>(INT32_MAX)) return 0;
  return static_cast<pid_t>(pid);
}

bool process_exists(pid_t pid) {
  if (::kill(pid, 0) == 0) return true;
  return errno != ESRCH;  // EPERM: it exists, it just belongs to someone else
}

struct DirCloser {
  void operator()(DIR* dir) const { ::closedir(dir); }
};

}  // namespace

std::string swap_file_name(pid_t pid, std::uint64_t n) {
  return kPrefix + std::to_string(pid) + "-" + std::to_string(n) + kSuffix;
}

SwapFile::SwapFile(const std::string& directory, std::uint64_t bytes, SwapFileOptions options)
    : directory_(directory), size_(round_up(bytes)), keep_(options.keep) {
  if (directory_.empty()) {
    throw std::invalid_argument("SwapFile: the swap directory (nvme_path) is empty");
  }
  create();
  try {
    // Preallocate before O_DIRECT: glibc emulates posix_fallocate with small buffered writes on
    // filesystems without fallocate, and those writes would fail on an O_DIRECT descriptor.
    preallocate(options.faults);
    if (options.direct) enable_direct(options.faults);
  } catch (...) {
    keep_ = false;  // a file we could not set up is never worth keeping
    close_and_remove();
    throw;
  }
  // The name goes now: the descriptor keeps the file, and the kernel frees its blocks when the
  // descriptor closes, whichever way the process ends (SIGKILL, a crash, the OOM killer).
  if (!keep_ && ::unlink(path_.c_str()) == 0) linked_ = false;
}

SwapFile::SwapFile(SwapFile&& other) noexcept
    : directory_(std::move(other.directory_)),
      path_(std::exchange(other.path_, std::string())),
      size_(other.size_),
      fd_(std::exchange(other.fd_, -1)),
      direct_(other.direct_),
      keep_(other.keep_),
      linked_(other.linked_),
      direct_fallback_reason_(std::move(other.direct_fallback_reason_)) {}

SwapFile& SwapFile::operator=(SwapFile&& other) noexcept {
  if (this != &other) {
    close_and_remove();
    directory_ = std::move(other.directory_);
    path_ = std::exchange(other.path_, std::string());
    size_ = other.size_;
    fd_ = std::exchange(other.fd_, -1);
    direct_ = other.direct_;
    keep_ = other.keep_;
    linked_ = other.linked_;
    direct_fallback_reason_ = std::move(other.direct_fallback_reason_);
  }
  return *this;
}

SwapFile::~SwapFile() { close_and_remove(); }

void SwapFile::create() {
  const pid_t pid = ::getpid();
  for (std::uint64_t n = next_number().fetch_add(1); n < kMaxFilesPerProcess;
       n = next_number().fetch_add(1)) {
    const std::string path = join(directory_, swap_file_name(pid, n));
    // O_EXCL claims the name atomically: a name taken by another thread, or left by an earlier
    // process that had our pid, is skipped rather than shared or overwritten.
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
      fd_ = fd;
      path_ = path;
      return;
    }
    const int error = errno;
    if (error == EEXIST) continue;
    throw IoError("cannot create a swap file in directory '" + directory_ +
                      "': " + errno_text(error) +
                      "; the NVMe swap directory (nvme_path) must be an existing directory this "
                      "process can write to",
                  directory_, 0, size_, error);
  }
  throw IoError("cannot create a swap file in directory '" + directory_ + "': all " +
                    std::to_string(kMaxFilesPerProcess) + " names " +
                    swap_file_name(pid, 0) + "... are taken; remove stale swap files",
                directory_, 0, size_, EEXIST);
}

void SwapFile::preallocate(FaultInjector* faults) {
  if (size_ == 0) return;  // posix_fallocate rejects a zero length
  int error = faults ? faults->before_preallocate() : 0;
  if (error == 0) {
    // posix_fallocate returns the error instead of setting errno.
    do {
      error = ::posix_fallocate(fd_, 0, static_cast<off_t>(size_));
    } while (error == EINTR);
  }
  if (error == 0) return;
  std::string hint;
  if (error == ENOSPC || error == EDQUOT) {
    hint = "; the device holding '" + directory_ + "' is full: this swap file needs " +
           std::to_string(size_) + " bytes";
    struct statvfs device {};
    if (::statvfs(directory_.c_str(), &device) == 0) {
      hint += ", " + std::to_string(static_cast<std::uint64_t>(device.f_bavail) * device.f_frsize) +
              " are available";
    }
    hint += " (every rank on the node makes its own): free space there or point nvme_path at a "
            "larger device";
  }
  throw IoError::system("preallocation (posix_fallocate)", path_, 0, size_, error, hint);
}

void SwapFile::enable_direct(FaultInjector* faults) {
  int error = faults ? faults->before_enable_direct() : 0;
  if (error == 0) {
    // Setting O_DIRECT after open (rather than opening with it) keeps the O_EXCL create simple:
    // a filesystem that refuses O_DIRECT answers here with EINVAL and leaves a usable descriptor.
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags < 0 || ::fcntl(fd_, F_SETFL, flags | O_DIRECT) < 0) error = errno;
  }
  if (error == EINVAL || error == EOPNOTSUPP) {
    direct_fallback_reason_ = "the filesystem of '" + directory_ + "' refused O_DIRECT (" +
                              errno_text(error) + "); using buffered I/O through the page cache";
    return;
  }
  if (error != 0) {
    throw IoError::system("fcntl(F_SETFL, O_DIRECT)", path_, 0, 0, error);
  }
  direct_ = true;
#ifdef STATX_DIOALIGN
  // A device whose logical blocks are larger than our 4096-byte alignment would fail every
  // transfer with EINVAL; find out now and fall back with the reason instead.
  struct statx info {};
  if (::statx(fd_, "", AT_EMPTY_PATH, STATX_DIOALIGN, &info) == 0 &&
      (info.stx_mask & STATX_DIOALIGN) != 0 &&
      (info.stx_dio_mem_align > kIoAlignment || info.stx_dio_offset_align > kIoAlignment)) {
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) < 0) {
      throw IoError::system("fcntl(F_SETFL, ~O_DIRECT)", path_, 0, 0, errno);
    }
    direct_ = false;
    direct_fallback_reason_ =
        "O_DIRECT on '" + directory_ + "' needs " + std::to_string(info.stx_dio_offset_align) +
        "-byte aligned offsets and " + std::to_string(info.stx_dio_mem_align) +
        "-byte aligned buffers, more than the " + std::to_string(kIoAlignment) +
        " zero uses; using buffered I/O through the page cache";
  }
#endif
}

void SwapFile::close_and_remove() noexcept {
  if (fd_ >= 0 && ::close(fd_) != 0) {
    std::cerr << "zero: closing swap file '" << path_ << "' failed: " << errno_text(errno)
              << std::endl;
  }
  fd_ = -1;
  if (!keep_ && linked_ && !path_.empty() && ::unlink(path_.c_str()) != 0) {
    // Destructors cannot throw; a file we could not remove must at least be reported.
    std::cerr << "zero: removing swap file '" << path_ << "' failed: " << errno_text(errno)
              << std::endl;
  }
  path_.clear();
}

std::vector<std::string> cleanup_stale_swap_files(const std::string& directory) {
  std::unique_ptr<DIR, DirCloser> dir(::opendir(directory.c_str()));
  if (!dir) {
    const int error = errno;
    throw IoError("cannot list swap directory '" + directory + "' to remove stale swap files: " +
                      errno_text(error),
                  directory, 0, 0, error);
  }
  const pid_t self = ::getpid();
  std::vector<std::string> removed;
  for (;;) {
    errno = 0;
    const dirent* entry = ::readdir(dir.get());
    if (entry == nullptr) {
      if (errno != 0) {
        const int error = errno;
        throw IoError("reading swap directory '" + directory + "' failed: " + errno_text(error),
                      directory, 0, 0, error);
      }
      break;
    }
    const std::string name = entry->d_name;
    const pid_t pid = swap_file_pid(name);
    if (pid == 0 || pid == self || process_exists(pid)) continue;
    const std::string path = join(directory, name);
    if (::unlink(path.c_str()) != 0) {
      const int error = errno;
      if (error == ENOENT) continue;  // another process cleaned it up first
      throw IoError("cannot remove stale swap file '" + path + "' (its process " +
                        std::to_string(pid) + " is gone): " + errno_text(error),
                    path, 0, 0, error);
    }
    removed.push_back(path);
  }
  return removed;
}

}  // namespace zero::core
