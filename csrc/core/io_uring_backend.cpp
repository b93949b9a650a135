#include "core/io_uring_backend.h"

#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <deque>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/aligned_buffer.h"
#include "core/fault_injector.h"

namespace zero::core {
namespace {

// io_uring read/write lengths are 32-bit; larger pieces go in several submissions, which the
// partial-transfer loop handles like any short transfer.
constexpr std::size_t kMaxSubmission = std::size_t{1} << 30;

// Bounded retries of io_uring_submit's "try again" answers when nothing is in flight to reap,
// so a kernel that keeps saying EAGAIN fails the requests instead of spinning forever.
constexpr int kMaxIdleSubmitRetries = 10000;

}  // namespace

class IoUringBackend::Ring {
 public:
  Ring(std::size_t depth, FaultInjector* faults, IoChunkQueue& queue)
      : slots_(depth), faults_(faults), queue_(queue) {
    const int result = io_uring_queue_init(static_cast<unsigned>(depth), &ring_, 0);
    if (result < 0) {
      throw IoError("io_uring_queue_init(" + std::to_string(depth) + " entries) failed: " +
                        errno_text(-result),
                    "", 0, 0, -result);
    }
    try {
      require_opcodes();
    } catch (...) {
      io_uring_queue_exit(&ring_);
      throw;
    }
    for (std::size_t i = depth; i > 0; --i) free_.push_back(i - 1);
  }
  ~Ring() { io_uring_queue_exit(&ring_); }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  // The worker: take pieces while there is room in the ring, submit, reap, repeat. Exits once
  // the queue is closed and drained and nothing is in flight.
  void run() {
    for (;;) {
      if (busy() == 0) {
        IoChunk chunk;
        if (!queue_.pop(chunk)) return;
        start(std::move(chunk));
      }
      IoChunk more;
      while (!free_.empty() && queue_.try_pop(more)) start(std::move(more));
      submit();
      if (in_kernel_ > 0) reap();
    }
  }

 private:
  enum class State : std::uint8_t { kFree, kPrepared, kInKernel };
  struct Slot {
    IoChunk chunk;
    std::size_t done = 0;
    State state = State::kFree;
  };

  void require_opcodes() {
    io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
    if (probe == nullptr) {
      throw IoError("io_uring opcode probe unavailable (the kernel predates Linux 5.6)", "", 0,
                    0, ENOSYS);
    }
    const bool supported = io_uring_opcode_supported(probe, IORING_OP_READ) &&
                           io_uring_opcode_supported(probe, IORING_OP_WRITE);
    io_uring_free_probe(probe);
    if (!supported) {
      throw IoError("the kernel's io_uring lacks IORING_OP_READ/WRITE", "", 0, 0, EINVAL);
    }
  }

  std::size_t busy() const { return slots_.size() - free_.size(); }

  void start(IoChunk chunk) {
    if (chunk.job->completion.failed_below(chunk.file_offset())) {
      chunk.succeed();  // cannot change the error reported: skip it
      return;
    }
    if (!broken_.empty()) {
      chunk.fail(IoFailure::of(broken_error(chunk, 0)));
      return;
    }
    const std::size_t slot = free_.back();
    free_.pop_back();
    slots_[slot].chunk = std::move(chunk);
    slots_[slot].done = 0;
    issue(slot);
  }

  // Prepares a submission for what is left of the slot's piece.
  void issue(std::size_t slot) {
    Slot& s = slots_[slot];
    const IoRequest& request = s.chunk.job->request;
    if (!broken_.empty()) return finish(slot, IoFailure::of(broken_error(s.chunk, s.done)));
    for (;;) {
      const std::uint64_t offset = s.chunk.file_offset() + s.done;
      const std::size_t left = s.chunk.length - s.done;
      const TransferPlan plan = plan_transfer(faults_, request.op, offset, left);
      if (plan.error == EINTR) continue;  // an injected interruption: retry, as for -EINTR
      if (plan.error != 0) {
        return finish(slot, IoFailure::of(IoError::system(what(request), request.path, offset,
                                                          left, plan.error)));
      }
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) {
        // Cannot happen: at most `depth` slots are busy and the ring has `depth` entries.
        return finish(slot, IoFailure{"IoUringBackend: no free submission entry with " +
                                          std::to_string(busy()) + " pieces busy",
                                      request.path, offset, left, 0, false});
      }
      const auto length = static_cast<unsigned>(std::min(plan.length, kMaxSubmission));
      std::byte* data = s.chunk.data() + s.done;
      if (request.op == IoOp::kRead) {
        io_uring_prep_read(sqe, request.fd, data, length, offset);
      } else {
        io_uring_prep_write(sqe, request.fd, data, length, offset);
      }
      sqe->user_data = slot;
      s.state = State::kPrepared;
      prepared_.push_back(slot);
      return;
    }
  }

  void finish(std::size_t slot, std::optional<IoFailure> failure) {
    Slot& s = slots_[slot];
    if (failure) {
      s.chunk.fail(std::move(*failure));
    } else {
      s.chunk.succeed();
    }
    s.chunk = IoChunk{};
    s.state = State::kFree;
    free_.push_back(slot);
  }

  // Hands every prepared submission to the kernel.
  void submit() {
    int idle_retries = 0;
    while (!prepared_.empty() && broken_.empty()) {
      const int result = io_uring_submit(&ring_);
      if (result > 0) {
        // The kernel consumes submissions in the order they were prepared.
        for (int i = 0; i < result && !prepared_.empty(); ++i) {
          slots_[prepared_.front()].state = State::kInKernel;
          prepared_.pop_front();
          ++in_kernel_;
        }
        continue;
      }
      if (result == -EINTR) continue;
      const bool busy_kernel = result == 0 || result == -EAGAIN || result == -EBUSY;
      if (busy_kernel && in_kernel_ > 0) {
        reap();  // completions free kernel resources; then try again
        continue;
      }
      if (busy_kernel && ++idle_retries < kMaxIdleSubmitRetries) continue;
      break_ring("io_uring_submit", result == 0 ? EAGAIN : -result, false);
    }
  }

  // Waits for at least one completion and handles every completion that is ready.
  void reap() {
    io_uring_cqe* cqe = nullptr;
    int result = 0;
    do {
      result = io_uring_wait_cqe(&ring_, &cqe);
    } while (result == -EINTR || result == -EAGAIN);
    if (result < 0) return break_ring("io_uring_wait_cqe", -result, true);
    do {
      const auto slot = static_cast<std::size_t>(cqe->user_data);
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      --in_kernel_;
      complete(slot, res);
    } while (io_uring_peek_cqe(&ring_, &cqe) == 0);
  }

  // One submission finished with `res` (bytes moved, or -errno).
  void complete(std::size_t slot, int res) {
    Slot& s = slots_[slot];
    const IoRequest& request = s.chunk.job->request;
    const std::uint64_t offset = s.chunk.file_offset() + s.done;
    const std::size_t left = s.chunk.length - s.done;
    if (res == -EINTR || res == -EAGAIN) return issue(slot);  // nothing moved: resubmit
    if (res < 0) {
      return finish(slot, IoFailure::of(IoError::system(what(request), request.path, offset,
                                                        left, -res)));
    }
    if (res == 0) {
      const IoError error =
          request.op == IoOp::kRead
              ? IoError::short_read(request.path, s.chunk.file_offset(), s.chunk.length, s.done)
              : IoError::short_write(request.path, s.chunk.file_offset(), s.chunk.length, s.done);
      return finish(slot, IoFailure::of(error));
    }
    s.done += static_cast<std::size_t>(res);
    if (s.done == s.chunk.length) return finish(slot, std::nullopt);
    // An O_DIRECT read only stops off a block boundary at end of file; resubmitting from that
    // unaligned offset would fail with EINVAL and hide the real cause.
    if (request.op == IoOp::kRead && request.direct && s.done % kIoAlignment != 0) {
      return finish(slot, IoFailure::of(IoError::short_read(request.path, s.chunk.file_offset(),
                                                            s.chunk.length, s.done)));
    }
    issue(slot);  // a partial transfer: continue where it stopped
  }

  // The ring failed in a way retrying will not fix. Prepared pieces fail now and are never
  // handed to the kernel (we stop calling io_uring_submit); every later piece fails at once, so
  // nobody waits forever. Pieces already in the kernel are still reaped normally, unless reaping
  // itself is what failed: then they fail too, the one case where a buffer may still be written
  // after its handle reported the failure (io_uring_wait_cqe fails only on kernel bugs).
  void break_ring(const char* call, int error_number, bool abandon_in_kernel) {
    broken_ = std::string(call) + " failed: " + errno_text(error_number) +
              "; the io_uring backend cannot continue (use aio backend 'thread_pool')";
    broken_errno_ = error_number;
    for (std::size_t slot = 0; slot < slots_.size(); ++slot) {
      const State state = slots_[slot].state;
      if (state == State::kPrepared || (state == State::kInKernel && abandon_in_kernel)) {
        finish(slot, IoFailure::of(broken_error(slots_[slot].chunk, slots_[slot].done)));
      }
    }
    prepared_.clear();
    if (abandon_in_kernel) in_kernel_ = 0;
  }

  IoError broken_error(const IoChunk& chunk, std::size_t done) const {
    const IoRequest& request = chunk.job->request;
    return IoError::system(what(request), request.path, chunk.file_offset() + done,
                           chunk.length - done, broken_errno_, " (" + broken_ + ")");
  }

  static const char* what(const IoRequest& request) {
    return request.op == IoOp::kRead ? "io_uring read" : "io_uring write";
  }

  io_uring ring_{};
  std::vector<Slot> slots_;
  std::vector<std::size_t> free_;
  std::deque<std::size_t> prepared_;  // prepared, not yet submitted, in preparation order
  std::size_t in_kernel_ = 0;         // submitted, completion not yet reaped
  std::string broken_;                // set once the ring is unusable
  int broken_errno_ = 0;
  FaultInjector* faults_;
  IoChunkQueue& queue_;
};

IoUringBackend::IoUringBackend(const AioConfig& config, FaultInjector* faults) : config_(config) {
  config_.validate();
  for (std::size_t i = 0; i < config_.intra_op_parallelism; ++i) {
    rings_.push_back(std::make_unique<Ring>(config_.queue_depth, faults, queue_));
  }
  try {
    for (auto& ring : rings_) workers_.emplace_back([r = ring.get()] { r->run(); });
  } catch (...) {
    shut_down();
    throw;
  }
}

IoUringBackend::~IoUringBackend() { shut_down(); }

void IoUringBackend::shut_down() noexcept {
  queue_.close();
  for (std::thread& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
}

std::shared_ptr<IoCompletion> IoUringBackend::submit(IoRequest request) {
  SplitRequest split = split_request(std::move(request), config_.block_size);
  queue_.push(std::move(split.chunks));
  return split.completion;
}

}  // namespace zero::core
