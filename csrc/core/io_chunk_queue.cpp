#include "core/io_chunk_queue.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace zero::core {

SplitRequest split_request(IoRequest request, std::size_t block_size) {
  check_request(request);
  if (block_size == 0) throw std::invalid_argument("split_request: block_size must be > 0");
  const std::size_t length = request.length;
  const std::size_t parts = (length + block_size - 1) / block_size;
  auto job = std::make_shared<IoJob>(std::move(request), parts);
  SplitRequest split;
  split.completion = std::shared_ptr<IoCompletion>(job, &job->completion);
  split.chunks.reserve(parts);
  for (std::size_t begin = 0; begin < length; begin += block_size) {
    split.chunks.push_back({job, begin, std::min(block_size, length - begin)});
  }
  return split;
}

void IoChunkQueue::push(std::vector<IoChunk> chunks) {
  if (chunks.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) throw std::logic_error("IoChunkQueue::push: the backend is shutting down");
    for (IoChunk& chunk : chunks) chunks_.push_back(std::move(chunk));
  }
  available_.notify_all();
}

bool IoChunkQueue::pop(IoChunk& out) {
  std::unique_lock<std::mutex> lock(mutex_);
  available_.wait(lock, [this] { return closed_ || !chunks_.empty(); });
  if (chunks_.empty()) return false;
  out = std::move(chunks_.front());
  chunks_.pop_front();
  return true;
}

bool IoChunkQueue::try_pop(IoChunk& out) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (chunks_.empty()) return false;
  out = std::move(chunks_.front());
  chunks_.pop_front();
  return true;
}

void IoChunkQueue::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  available_.notify_all();
}

}  // namespace zero::core
