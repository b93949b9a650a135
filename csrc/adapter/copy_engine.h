#pragma once
// The copy engine of offloaded steps: moves tiles between device and host memory off the
// engine thread, in submission order, so the copies of one tile overlap the optimizer's work
// on another (offloaded_state.h double-buffers two tiles).
//
//   CUDA device: each batch of copies runs on the engine's own copy stream (not the compute
//                stream). It first waits, through an event, for the work the caller had
//                queued on its current stream when it submitted (e.g. the reduce-scatter that
//                produced the gradients), enqueues its copies asynchronously, and the batch
//                completes when the copy stream has finished them, so the host may read or
//                reuse the staging memory as soon as the future is ready.
//   CPU device:  the same interface runs the copies on a worker thread (memcpy speed).
//
// Copies inside a batch use copy(): non-blocking on the copy stream, plain on the CPU.
#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include "core/task_worker.h"

namespace zero::adapter {

class CopyEngine {
 public:
  explicit CopyEngine(c10::Device device);
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Runs `copies` after the caller's queued device work, and after `first` when given: run
  // on the engine's thread with the copy stream current (a collective's wait there makes the
  // copy stream wait for it), and not counted in busy_seconds. Rethrows at get().
  std::shared_future<void> submit(std::function<void()> copies,
                                  std::function<void()> first = {});
  // dst.copy_(src) inside a batch: asynchronous on the copy stream where that is possible.
  static void copy(const at::Tensor& dst, const at::Tensor& src);
  bool uses_copy_stream() const { return stream_ != nullptr; }
  // Seconds the batches that completed took, summed: on the copy stream the GPU's time for
  // their copies (from after the work they waited for), on the CPU the worker's.
  double busy_seconds() const { return static_cast<double>(busy_ns_.load()) * 1e-9; }

 private:
  struct Stream;  // the CUDA copy stream (CUDA builds, CUDA device only)
  c10::Device device_;
  std::unique_ptr<Stream> stream_;
  std::atomic<std::int64_t> busy_ns_{0};
  core::TaskWorker worker_;  // last: joins first, while the stream still exists
};

}  // namespace zero::adapter
