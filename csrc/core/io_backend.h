#pragma once
// The swap I/O interface: what a request is, how failures are reported (IoError, io_error.h),
// and the backends that move bytes between host buffers and a swap file (a pread/pwrite thread
// pool, or io_uring when liburing was found at build time and the kernel allows it at run time).
//
// Failures never abort and never come back as silent zeros: every system error, short read or
// full disk is an IoError naming the file, offset, length and strerror.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/io_error.h"
#include "core/io_handle.h"

namespace zero::core {

class FaultInjector;

enum class IoOp : std::uint8_t { kRead, kWrite };
const char* op_name(IoOp op);  // "read" / "write"

// One transfer between a host buffer and an open file. The buffer belongs to the caller and must
// stay valid, and untouched (reads) or unmodified (writes), until the completion is done.
struct IoRequest {
  IoOp op = IoOp::kRead;
  int fd = -1;
  std::string path;  // for error messages only
  std::byte* buffer = nullptr;
  std::uint64_t offset = 0;
  std::size_t length = 0;
  bool direct = false;  // fd has O_DIRECT: buffer, offset and length must be kIoAlignment-aligned
};

// Throws std::invalid_argument for a request no backend can run (bad fd, null buffer, and for
// O_DIRECT a misaligned buffer, offset or length), naming the offending value.
void check_request(const IoRequest& request);

// DeepSpeed's "aio" section, the keys that mean something for these backends. single_submit and
// overlap_events have no counterpart: both backends always keep several requests in flight.
struct AioConfig {
  // Each request is cut into pieces of at most this many bytes, run in parallel by the workers.
  // A positive multiple of kIoAlignment so every piece stays O_DIRECT-aligned.
  std::size_t block_size = 1u << 20;
  // io_uring: submissions in flight per worker (its ring size). The thread pool has exactly one
  // synchronous call in flight per worker, so there the depth is intra_op_parallelism.
  std::size_t queue_depth = 8;
  // Worker threads (each with its own ring for io_uring).
  std::size_t intra_op_parallelism = 1;

  void validate() const;  // std::invalid_argument naming the aio key
};

class IoBackend {
 public:
  virtual ~IoBackend() = default;  // implementations finish every submitted request first
  // Queues the transfer and returns at once; thread-safe. Throws std::invalid_argument for a
  // malformed request (check_request); I/O failures are delivered through the completion.
  virtual std::shared_ptr<IoCompletion> submit(IoRequest request) = 0;
  virtual const char* name() const = 0;
};

enum class IoBackendKind : std::uint8_t {
  kAuto,        // io_uring when built in and the kernel allows it, else the thread pool
  kThreadPool,
  kIoUring,     // io_uring or an error: an explicit choice is never silently replaced
};
const char* backend_kind_name(IoBackendKind kind);  // "auto", "thread_pool", "io_uring"
IoBackendKind parse_backend_kind(const std::string& name);

// Whether this build contains the io_uring backend (liburing found by CMake).
bool io_uring_compiled();

struct IoBackendChoice {
  std::unique_ptr<IoBackend> backend;
  std::string fallback_reason;  // why kAuto did not get io_uring; empty when it did
};

// `faults` (may be null) must outlive the backend; it is a test hook, see fault_injector.h.
IoBackendChoice make_io_backend(const AioConfig& config, IoBackendKind kind,
                                FaultInjector* faults = nullptr);

}  // namespace zero::core
