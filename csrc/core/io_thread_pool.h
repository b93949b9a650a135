#pragma once
// Backend 1: worker threads doing blocking pread/pwrite. Works everywhere (no liburing, no
// io_uring permission needed); each worker has one system call in flight, so the effective
// queue depth is intra_op_parallelism.
#include <thread>
#include <vector>

#include "core/io_backend.h"
#include "core/io_chunk_queue.h"

namespace zero::core {

class IoThreadPool final : public IoBackend {
 public:
  // `faults` (may be null) must outlive the pool.
  explicit IoThreadPool(const AioConfig& config, FaultInjector* faults = nullptr);
  ~IoThreadPool() override;  // finishes every submitted request, then joins the workers
  IoThreadPool(const IoThreadPool&) = delete;
  IoThreadPool& operator=(const IoThreadPool&) = delete;

  std::shared_ptr<IoCompletion> submit(IoRequest request) override;
  const char* name() const override { return "thread_pool"; }
  std::size_t threads() const { return workers_.size(); }

 private:
  void work();
  void run(const IoChunk& chunk);
  void shut_down() noexcept;

  AioConfig config_;
  FaultInjector* faults_;
  IoChunkQueue queue_;
  std::vector<std::thread> workers_;
};

// Moves the whole chunk with as many pread/pwrite calls as it takes: partial transfers continue
// where they stopped, EINTR is retried, anything else (including end of file) throws IoError.
void transfer_chunk_blocking(const IoChunk& chunk, FaultInjector* faults);

}  // namespace zero::core
