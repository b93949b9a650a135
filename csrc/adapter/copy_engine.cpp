#include "adapter/copy_engine.h"

#include <chrono>

#ifdef ZERO_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace zero::adapter {

#ifdef ZERO_WITH_CUDA
struct CopyEngine::Stream {
  explicit Stream(c10::DeviceIndex device)
      : stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device)) {}
  c10::cuda::CUDAStream stream;
};

namespace {

// An event marking the work queued on a stream so far (RAII: destroyed with the batch).
class QueuedWork {
 public:
  explicit QueuedWork(const c10::cuda::CUDAStream& stream) {
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    C10_CUDA_CHECK(cudaEventRecord(event_, stream.stream()));
  }
  ~QueuedWork() { cudaEventDestroy(event_); }
  QueuedWork(const QueuedWork&) = delete;
  QueuedWork& operator=(const QueuedWork&) = delete;
  void block(const c10::cuda::CUDAStream& stream) const {
    C10_CUDA_CHECK(cudaStreamWaitEvent(stream.stream(), event_, 0));
  }

 private:
  cudaEvent_t event_ = nullptr;
};

// How long the work a stream runs between start() and stop() takes on the GPU (RAII).
class StreamSpan {
 public:
  StreamSpan() {
    C10_CUDA_CHECK(cudaEventCreate(&start_));
    C10_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~StreamSpan() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  StreamSpan(const StreamSpan&) = delete;
  StreamSpan& operator=(const StreamSpan&) = delete;
  void start(const c10::cuda::CUDAStream& stream) {
    C10_CUDA_CHECK(cudaEventRecord(start_, stream.stream()));
  }
  void stop(const c10::cuda::CUDAStream& stream) {
    C10_CUDA_CHECK(cudaEventRecord(stop_, stream.stream()));
  }
  std::int64_t nanoseconds() const {  // once the stream has passed stop()
    float ms = 0;
    C10_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return static_cast<std::int64_t>(static_cast<double>(ms) * 1e6);
  }

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

}  // namespace
#else
struct CopyEngine::Stream {};
#endif

CopyEngine::CopyEngine(c10::Device device) : device_(device) {
#ifdef ZERO_WITH_CUDA
  if (device_.is_cuda()) stream_ = std::make_unique<Stream>(device_.index());
#endif
}

CopyEngine::~CopyEngine() = default;

std::shared_future<void> CopyEngine::submit(std::function<void()> copies,
                                            std::function<void()> first) {
#ifdef ZERO_WITH_CUDA
  if (stream_) {
    // Recorded now, on the submitting thread: the batch sees what was queued before it.
    c10::cuda::CUDAGuard device(device_);
    auto queued = std::make_shared<QueuedWork>(c10::cuda::getCurrentCUDAStream(device_.index()));
    return worker_.submit([this, stream = stream_->stream, queued, copies = std::move(copies),
                           first = std::move(first)] {
      c10::cuda::CUDAStreamGuard guard(stream);
      queued->block(stream);
      StreamSpan span;  // the copies' own time on the stream, not the waits before them
      try {
        if (first) first();
        span.start(stream);
        copies();
      } catch (...) {
        stream.synchronize();  // nothing already queued may outlive the batch
        throw;
      }
      span.stop(stream);
      stream.synchronize();  // the batch is done when its bytes are
      busy_ns_ += span.nanoseconds();
    });
  }
#endif
  return worker_.submit([this, copies = std::move(copies), first = std::move(first)] {
    if (first) first();
    const auto start = std::chrono::steady_clock::now();
    copies();
    busy_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now() - start).count();
  });
}

void CopyEngine::copy(const at::Tensor& dst, const at::Tensor& src) {
  // Host memory involved in a CUDA copy is pinned by the host pools; for pageable memory
  // torch falls back to a synchronous copy, which is still correct.
  dst.copy_(src, /*non_blocking=*/dst.is_cuda() || src.is_cuda());
}

}  // namespace zero::adapter
