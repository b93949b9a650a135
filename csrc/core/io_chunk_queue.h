#pragma once
// Internal to the backends: a request cut into block_size pieces, and the queue the workers take
// pieces from. Cutting is what lets intra_op_parallelism workers share one large tile.
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/io_backend.h"
#include "core/io_handle.h"

namespace zero::core {

// A request and its completion, kept alive by the pieces still queued or running.
struct IoJob {
  IoJob(IoRequest request, std::size_t parts)
      : request(std::move(request)), completion(parts) {}
  IoRequest request;
  IoCompletion completion;
};

struct IoChunk {
  std::shared_ptr<IoJob> job;
  std::size_t begin = 0;   // offset inside the request
  std::size_t length = 0;

  std::uint64_t file_offset() const { return job->request.offset + begin; }
  std::byte* data() const { return job->request.buffer + begin; }
  void succeed() const { job->completion.part_succeeded(); }
  void fail(IoFailure failure) const {
    job->completion.part_failed(std::move(failure), file_offset());
  }
};

// Checks the request, cuts it into pieces of at most block_size bytes and returns the job's
// completion together with the pieces (none for a zero-length request, which is done at once).
struct SplitRequest {
  std::shared_ptr<IoCompletion> completion;
  std::vector<IoChunk> chunks;
};
SplitRequest split_request(IoRequest request, std::size_t block_size);

class IoChunkQueue {
 public:
  void push(std::vector<IoChunk> chunks);
  // Blocks until a piece is available; false once closed and empty (workers drain what was
  // submitted before they exit, so no caller is left waiting on a dropped request).
  bool pop(IoChunk& out);
  bool try_pop(IoChunk& out);
  void close();

 private:
  std::mutex mutex_;
  std::condition_variable available_;
  std::deque<IoChunk> chunks_;
  bool closed_ = false;
};

}  // namespace zero::core
