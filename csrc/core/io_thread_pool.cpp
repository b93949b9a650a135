#include "core/io_thread_pool.h"

#include <unistd.h>

#include <cerrno>
#include <optional>
#include <utility>

#include "core/aligned_buffer.h"
#include "core/fault_injector.h"

namespace zero::core {
namespace {

// One pread/pwrite, or the failure the injector asks for; returns bytes moved or -1 with errno.
ssize_t transfer_once(const IoRequest& request, std::byte* data, std::size_t length,
                      std::uint64_t offset, FaultInjector* faults) {
  const TransferPlan plan = plan_transfer(faults, request.op, offset, length);
  if (plan.error != 0) {
    errno = plan.error;
    return -1;
  }
  const auto file_offset = static_cast<off_t>(offset);
  return request.op == IoOp::kRead ? ::pread(request.fd, data, plan.length, file_offset)
                                   : ::pwrite(request.fd, data, plan.length, file_offset);
}

}  // namespace

void transfer_chunk_blocking(const IoChunk& chunk, FaultInjector* faults) {
  const IoRequest& request = chunk.job->request;
  std::size_t done = 0;
  while (done < chunk.length) {
    const std::uint64_t offset = chunk.file_offset() + done;
    const std::size_t left = chunk.length - done;
    const ssize_t moved = transfer_once(request, chunk.data() + done, left, offset, faults);
    if (moved < 0) {
      const int error = errno;
      if (error == EINTR) continue;  // a signal arrived before any byte moved: just retry
      throw IoError::system(request.op == IoOp::kRead ? "pread" : "pwrite", request.path, offset,
                            left, error);
    }
    if (moved == 0) {
      if (request.op == IoOp::kRead) {
        throw IoError::short_read(request.path, chunk.file_offset(), chunk.length, done);
      }
      throw IoError::short_write(request.path, chunk.file_offset(), chunk.length, done);
    }
    done += static_cast<std::size_t>(moved);
    // An O_DIRECT read only stops off a block boundary at end of file; asking again from that
    // unaligned offset would fail with EINVAL and hide the real cause.
    if (request.op == IoOp::kRead && request.direct && done < chunk.length &&
        done % kIoAlignment != 0) {
      throw IoError::short_read(request.path, chunk.file_offset(), chunk.length, done);
    }
  }
}

IoThreadPool::IoThreadPool(const AioConfig& config, FaultInjector* faults)
    : config_(config), faults_(faults) {
  config_.validate();
  try {
    workers_.reserve(config_.intra_op_parallelism);
    for (std::size_t i = 0; i < config_.intra_op_parallelism; ++i) {
      workers_.emplace_back([this] { work(); });
    }
  } catch (...) {
    shut_down();  // joins the workers that did start before reporting the failure
    throw;
  }
}

IoThreadPool::~IoThreadPool() { shut_down(); }

void IoThreadPool::shut_down() noexcept {
  queue_.close();
  for (std::thread& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
}

std::shared_ptr<IoCompletion> IoThreadPool::submit(IoRequest request) {
  SplitRequest split = split_request(std::move(request), config_.block_size);
  queue_.push(std::move(split.chunks));
  return split.completion;
}

void IoThreadPool::work() {
  IoChunk chunk;
  while (queue_.pop(chunk)) {
    run(chunk);
    chunk = IoChunk{};  // drop the job reference before sleeping in pop()
  }
}

void IoThreadPool::run(const IoChunk& chunk) {
  // The request already failed below this piece: running it cannot change the error reported.
  if (chunk.job->completion.failed_below(chunk.file_offset())) return chunk.succeed();
  std::optional<IoFailure> failure;
  try {
    transfer_chunk_blocking(chunk, faults_);
  } catch (...) {
    failure = IoFailure::of_current_exception();
  }
  if (failure) {
    chunk.fail(std::move(*failure));
  } else {
    chunk.succeed();
  }
}

}  // namespace zero::core
