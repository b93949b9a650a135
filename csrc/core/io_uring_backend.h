#pragma once
// Backend 2: io_uring (liburing). Compiled only when CMake finds liburing (ZERO_HAVE_LIBURING);
// make_io_backend() is the way in, and falls back to the thread pool when the kernel refuses.
//
// Each of intra_op_parallelism workers owns a ring of queue_depth entries and keeps up to
// queue_depth pieces in flight, so one thread drives many outstanding transfers. liburing stays
// out of this header (the ring lives in the .cpp) so including it costs nothing.
#include <memory>
#include <thread>
#include <vector>

#include "core/io_backend.h"
#include "core/io_chunk_queue.h"

namespace zero::core {

class IoUringBackend final : public IoBackend {
 public:
  // Creates every ring up front and throws IoError (with io_uring_queue_init's errno: EPERM
  // under seccomp or io_uring_disabled, ENOSYS on old kernels, EINVAL when the kernel lacks the
  // read/write opcodes) when the kernel will not give us one. `faults` may be null.
  explicit IoUringBackend(const AioConfig& config, FaultInjector* faults = nullptr);
  ~IoUringBackend() override;  // finishes every submitted request, then joins the workers
  IoUringBackend(const IoUringBackend&) = delete;
  IoUringBackend& operator=(const IoUringBackend&) = delete;

  std::shared_ptr<IoCompletion> submit(IoRequest request) override;
  const char* name() const override { return "io_uring"; }

  class Ring;  // one worker's ring and its in-flight pieces (io_uring_backend.cpp)

 private:
  void shut_down() noexcept;

  AioConfig config_;
  IoChunkQueue queue_;
  std::vector<std::unique_ptr<Ring>> rings_;
  std::vector<std::thread> workers_;
};

}  // namespace zero::core
