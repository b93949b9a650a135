#include "core/io_backend.h"

#include <sstream>
#include <utility>

#include "core/aligned_buffer.h"
#include "core/io_thread_pool.h"
#ifdef ZERO_HAVE_LIBURING
#include "core/io_uring_backend.h"
#endif

namespace zero::core {
namespace {

void require_aligned(std::uint64_t value, const char* what, const IoRequest& request) {
  if (value % kIoAlignment == 0) return;
  std::ostringstream message;
  message << "O_DIRECT " << op_name(request.op) << " of '" << request.path << "': " << what
          << " " << value << " is not a multiple of " << kIoAlignment
          << " (the logical block size O_DIRECT requires); allocate buffers with AlignedBuffer "
             "and keep offsets and lengths block-aligned";
  throw std::invalid_argument(message.str());
}

}  // namespace

const char* op_name(IoOp op) { return op == IoOp::kRead ? "read" : "write"; }

void check_request(const IoRequest& request) {
  if (request.fd < 0) {
    throw std::invalid_argument(std::string(op_name(request.op)) + " of '" + request.path +
                                "': the file is not open (fd " + std::to_string(request.fd) +
                                ")");
  }
  if (request.buffer == nullptr && request.length > 0) {
    throw std::invalid_argument(std::string(op_name(request.op)) + " of '" + request.path +
                                "': null buffer for " + std::to_string(request.length) +
                                " bytes");
  }
  if (!request.direct) return;
  require_aligned(reinterpret_cast<std::uintptr_t>(request.buffer), "buffer address", request);
  require_aligned(request.offset, "file offset", request);
  require_aligned(request.length, "length", request);
}

void AioConfig::validate() const {
  if (block_size == 0 || block_size % kIoAlignment != 0) {
    throw std::invalid_argument("aio.block_size must be a positive multiple of " +
                                std::to_string(kIoAlignment) +
                                " (so every piece of a transfer stays O_DIRECT-aligned), got " +
                                std::to_string(block_size));
  }
  if (queue_depth == 0 || queue_depth > 4096) {
    throw std::invalid_argument(
        "aio.queue_depth must be in [1, 4096] (io_uring's ring limit), got " +
        std::to_string(queue_depth));
  }
  if (intra_op_parallelism == 0 || intra_op_parallelism > 256) {
    throw std::invalid_argument("aio.intra_op_parallelism must be in [1, 256] threads, got " +
                                std::to_string(intra_op_parallelism));
  }
}

const char* backend_kind_name(IoBackendKind kind) {
  switch (kind) {
    case IoBackendKind::kAuto: return "auto";
    case IoBackendKind::kThreadPool: return "thread_pool";
    case IoBackendKind::kIoUring: return "io_uring";
  }
  return "?";
}

IoBackendKind parse_backend_kind(const std::string& name) {
  for (IoBackendKind kind :
       {IoBackendKind::kAuto, IoBackendKind::kThreadPool, IoBackendKind::kIoUring}) {
    if (name == backend_kind_name(kind)) return kind;
  }
  throw std::invalid_argument("unknown I/O backend '" + name +
                              "': expected one of auto, thread_pool, io_uring");
}

bool io_uring_compiled() {
#ifdef ZERO_HAVE_LIBURING
  return true;
#else
  return false;
#endif
}

IoBackendChoice make_io_backend(const AioConfig& config, IoBackendKind kind,
                                FaultInjector* faults) {
  config.validate();
  IoBackendChoice choice;
  if (kind == IoBackendKind::kThreadPool) {
    choice.backend = std::make_unique<IoThreadPool>(config, faults);
    return choice;
  }
#ifdef ZERO_HAVE_LIBURING
  try {
    choice.backend = std::make_unique<IoUringBackend>(config, faults);
    return choice;
  } catch (const IoError& error) {
    // Containers commonly refuse io_uring (seccomp: EPERM, io_uring_disabled sysctl, old
    // kernels: ENOSYS); that is a reason to use threads, unless io_uring was asked for by name.
    if (kind == IoBackendKind::kIoUring) throw;
    choice.fallback_reason = std::string("io_uring unavailable: ") + error.what();
  }
#else
  if (kind == IoBackendKind::kIoUring) {
    throw std::invalid_argument(
        "I/O backend 'io_uring' requested, but this build has no io_uring backend (liburing "
        "headers were not found at build time: install liburing-dev and rebuild, or use "
        "'auto' / 'thread_pool')");
  }
  choice.fallback_reason = "io_uring not compiled in (liburing not found at build time)";
#endif
  choice.backend = std::make_unique<IoThreadPool>(config, faults);
  return choice;
}

}  // namespace zero::core
