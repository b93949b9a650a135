#pragma once
// Test hook for the swap I/O layer: makes the code paths that real disks rarely take (partial
// transfers, EINTR, EIO at one offset, a full disk, a filesystem that refuses O_DIRECT) happen on
// demand. It is an explicit constructor argument of the backends and of SwapFile, never a global:
// production code passes nullptr and pays one pointer test per system call.
//
// Thread-safe: the backends consult it from all their workers at once.
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "core/io_backend.h"

namespace zero::core {

// What the backend does for one read/write system call: move at most `length` bytes, or, when
// `error` is non-zero, behave as if the call had failed with that errno.
struct TransferPlan {
  std::size_t length = 0;
  int error = 0;
};

struct FaultCounts {
  std::size_t interrupts = 0;   // calls turned into EINTR
  std::size_t shortened = 0;    // calls asked to move fewer bytes than requested
  std::size_t failures = 0;     // calls failed with an injected errno
  std::size_t refusals = 0;     // O_DIRECT / preallocation refusals
};

class FaultInjector {
 public:
  // Every call moves at most `max_bytes` (0: no limit), so a request needs several calls and the
  // continuation loops run. Keep it a multiple of kIoAlignment for O_DIRECT files.
  void shorten_transfers(std::size_t max_bytes);
  // The next `count` calls fail with EINTR (the backend must retry them).
  void interrupt_next(std::size_t count);
  // Every `op` call whose range covers `offset` fails with `error` (EIO, ENOSPC, ...), like a bad
  // sector: retrying does not help.
  void fail_at(IoOp op, std::uint64_t offset, int error);
  // SwapFile: turning on O_DIRECT fails with `error` (EINVAL is what tmpfs-like filesystems say).
  void refuse_direct_io(int error);
  // SwapFile: posix_fallocate fails with `error` (ENOSPC: the disk is full).
  void fail_preallocation(int error);

  // Hooks called by the I/O code.
  TransferPlan before_transfer(IoOp op, std::uint64_t offset, std::size_t length);
  int before_enable_direct();  // errno to fail with, or 0
  int before_preallocate();    // errno to fail with, or 0

  FaultCounts counts() const;

 private:
  struct Failure {
    IoOp op;
    std::uint64_t offset;
    int error;
  };

  mutable std::mutex mutex_;
  std::size_t max_transfer_ = 0;
  std::size_t interrupts_left_ = 0;
  std::vector<Failure> failures_;
  int direct_error_ = 0;
  int preallocate_error_ = 0;
  FaultCounts counts_;
};

// The plan when no injector is installed: the whole length, no error.
inline TransferPlan plan_transfer(FaultInjector* faults, IoOp op, std::uint64_t offset,
                                  std::size_t length) {
  return faults ? faults->before_transfer(op, offset, length) : TransferPlan{length, 0};
}

}  // namespace zero::core
