#pragma once
// ZeRO-Infinity's parameter offload to NVMe: the stage-3 units whose parameter shards live in a
// swap file, and the few host buffers that carry them in and out.
//
// Each NVMe unit's shard (model dtype) is one tile of the swap file. The host holds only
// `buffer_count` buffers, each exactly one shard of the largest such unit rounded up to the
// I/O alignment (DeepSpeed allocates buffer_count x buffer_size elements whatever the model).
// A buffer is
//   free      holds nothing;
//   clean     holds the unit's shard as on disk (a read in flight or done, or a write that
//             finished): a later read of the unit is served from it without I/O;
//   taken     lent out by read() until finish_read();
//   filling   receiving the new shard piece by piece during an optimizer step;
//   writing   a write of the unit in flight.
// When no buffer is free, a finished write's buffer is taken, else the least recently used
// clean one, else the oldest write is waited for. Read-aheads take only free or clean buffers
// that no other read-ahead holds. A failed write marks its unit lost: reading it is an error.
// A read never races a write of the same unit: both go through the unit's buffer.
//
// Thread safety: one mutex guards the table. The optimizer step calls write_part() from the
// copy worker while the engine thread waits for the step.
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "core/host_pool.h"
#include "core/io_backend.h"
#include "core/memory_registry.h"
#include "core/swap_store.h"

namespace zero::adapter {

struct ParamSwapOptions {
  std::string nvme_path;      // directory of the swap file
  core::AioConfig aio;
  std::int64_t buffer_count = 5;
  bool pin = false;
};

class ParamSwap {
 public:
  // unit_numel[u] > 0: unit u's shard (that many elements of `dtype`) lives on NVMe; 0: it
  // lives elsewhere. The swap file starts zero-filled.
  ParamSwap(core::MemoryRegistry& registry, const std::vector<std::int64_t>& unit_numel,
            at::ScalarType dtype, const ParamSwapOptions& options);
  ~ParamSwap();
  ParamSwap(const ParamSwap&) = delete;
  ParamSwap& operator=(const ParamSwap&) = delete;

  bool holds(std::size_t unit) const {
    return unit < unit_numel_.size() && unit_numel_[unit] > 0;
  }
  // Starts reading the unit ahead of use into a free buffer, else into the least recently
  // used clean one that no other read-ahead is holding; does nothing when there is none or
  // the unit is already in a buffer.
  void prefetch(std::size_t unit);
  // The unit's shard in a host buffer (waiting for its read or write), valid until
  // finish_read(unit).
  at::Tensor read(std::size_t unit);
  void finish_read(std::size_t unit);
  // Stores the whole shard (copied; the write completes in the background).
  void write(std::size_t unit, const at::Tensor& values);
  // Stores [begin, begin + values.numel()) of the shard. Pieces arrive in order from element
  // 0 to the shard's end, where the write starts.
  void write_part(std::size_t unit, std::int64_t begin, const at::Tensor& values);
  // After a step: waits for every write in flight and throws the first failure; a unit left
  // part-way filled (a step that failed) is an error too.
  void flush();

  bool pinned() const { return pool_->pinned(); }
  std::string why_not_pinned() const { return pinned() ? "" : pool_->why_not_pinned(); }
  std::string description() const;  // the swap file and its I/O backend
  std::int64_t buffer_count() const { return static_cast<std::int64_t>(buffers_.size()); }
  std::int64_t reads() const { return reads_; }  // reads issued so far (tests, reports)
  std::int64_t read_aheads() const { return read_aheads_; }  // of those, started by prefetch()

 private:
  enum class State { kFree, kClean, kTaken, kFilling, kWriting };
  struct Buffer {
    at::Tensor memory;  // buffer_numel elements in the pool
    State state = State::kFree;
    std::size_t unit = 0;
    core::IoHandle io;
    std::int64_t filled = 0;
    std::uint64_t last_use = 0;
    bool ahead = false;  // read by prefetch() and not used yet: other hints leave it alone
  };

  static std::string tile_name(std::size_t unit);
  std::optional<std::size_t> buffer_of(std::size_t unit) const;
  std::size_t acquire(std::size_t unit);  // a free buffer, reclaiming one if needed
  void settle(Buffer& buffer);            // waits for its I/O; a failure frees the buffer
  void check_not_lost(std::size_t unit) const;
  void start_read(std::size_t index, std::size_t unit);
  void start_write(Buffer& buffer);
  at::Tensor shard_view(const Buffer& buffer) const;
  std::size_t element_bytes() const;

  std::vector<std::int64_t> unit_numel_;
  at::ScalarType dtype_;
  std::unique_ptr<core::HostPool> pool_;
  std::vector<Buffer> buffers_;
  std::unique_ptr<core::SwapStore> swap_;
  core::TrackedBytes nvme_bytes_;
  std::uint64_t clock_ = 0;
  std::int64_t reads_ = 0;
  std::int64_t read_aheads_ = 0;
  std::vector<bool> lost_;  // per unit: a write failed, the file's copy is stale
  mutable std::mutex mutex_;
};

}  // namespace zero::adapter
