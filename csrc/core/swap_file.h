#pragma once
// One preallocated swap file in the NVMe directory.
//
// Created as zero-swap-<pid>-<n>.bin (n: the process's next number not taken in the directory,
// claimed with O_EXCL, so threads and processes never share a file, and never reused by the
// process, so a path names one file), preallocated with posix_fallocate
// so a full disk fails here and not in the middle of a training step, opened O_DIRECT when asked
// and the filesystem allows it, then unlinked: the open descriptor is the file from then on, so
// nothing is left on disk however the process ends (a crash, SIGKILL, the OOM killer). path()
// still names it in errors. With `keep` the name stays (debugging) and the file outlives the
// process; cleanup_stale_swap_files() removes such files of processes that no longer exist.
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace zero::core {

class FaultInjector;

struct SwapFileOptions {
  // Ask for O_DIRECT (bypass the page cache). A filesystem that refuses it (tmpfs before Linux
  // 6.6, ramfs, some FUSE and network filesystems) gives buffered I/O instead, with the reason in
  // direct_fallback_reason().
  bool direct = true;
  bool keep = false;                // keep the name and the file after destruction (debugging)
  FaultInjector* faults = nullptr;  // test hook; must outlive the file
};

class SwapFile {
 public:
  // Creates and preallocates round_up(bytes) bytes in `directory` (which must exist). Throws
  // IoError naming the directory when the file cannot be created there, and naming the file when
  // it cannot be preallocated (ENOSPC: the disk is full); nothing is left behind on failure.
  SwapFile(const std::string& directory, std::uint64_t bytes, SwapFileOptions options = {});
  ~SwapFile();  // closes (the blocks are freed then, unless keep)
  SwapFile(SwapFile&& other) noexcept;
  SwapFile& operator=(SwapFile&& other) noexcept;
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }  // the name it was created under
  bool linked() const { return linked_; }  // the name still exists (keep, or unlink failed)
  // A path that opens this file while it is open, named or not: /proc/self/fd/<fd>.
  std::string open_path() const { return "/proc/self/fd/" + std::to_string(fd_); }
  const std::string& directory() const { return directory_; }
  std::uint64_t size() const { return size_; }
  bool direct() const { return direct_; }  // O_DIRECT is in effect
  // Why O_DIRECT was asked for but is not in effect; empty otherwise.
  const std::string& direct_fallback_reason() const { return direct_fallback_reason_; }

 private:
  void create();
  void preallocate(FaultInjector* faults);
  void enable_direct(FaultInjector* faults);
  void close_and_remove() noexcept;

  std::string directory_;
  std::string path_;
  std::uint64_t size_ = 0;
  int fd_ = -1;
  bool direct_ = false;
  bool keep_ = false;
  bool linked_ = true;
  std::string direct_fallback_reason_;
};

// "zero-swap-<pid>-<n>.bin".
std::string swap_file_name(pid_t pid, std::uint64_t n);

// Removes the swap files in `directory` whose creating process no longer exists (kill(pid, 0)
// says ESRCH) and returns their paths. Files of live processes, including this one, are kept.
// pids are only meaningful inside one pid namespace on one host: do not run this on a directory
// that other hosts or containers with their own pid namespace also swap into. Throws IoError when
// the directory cannot be listed or a stale file cannot be removed.
std::vector<std::string> cleanup_stale_swap_files(const std::string& directory);

}  // namespace zero::core
