#pragma once
// Where an offloaded shard's state lives (its master, and Adam's m and v or SGD's
// momentum), seen chunk by chunk. Two kinds:
//
//   HostStore (host_store.h)  offload_optimizer device "cpu": whole arrays in host memory;
//                             fetch and flush have nothing to do.
//   NvmeStore (nvme_store.h)  device "nvme": the arrays live in a swap file; two slots of one
//                             chunk each per array are in host memory, filled by fetch and
//                             written back by flush.
//
// The streamed step (offloaded_state.h) and the delayed update (delayed_update.h) use only
// this interface, so neither knows where the state lives.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "adapter/offload_options.h"
#include "adapter/optimizer_math.h"
#include "adapter/shard_precision.h"
#include "core/io_handle.h"
#include "core/memory_registry.h"

namespace zero::adapter {

// A shard cut into chunks of `chunk` elements (the last may be shorter).
struct ChunkGrid {
  std::int64_t shard_numel = 0;
  std::int64_t chunk = 0;

  std::int64_t count() const { return chunk == 0 ? 0 : (shard_numel + chunk - 1) / chunk; }
  std::int64_t numel(std::int64_t c) const { return std::min(chunk, shard_numel - c * chunk); }
};

// The state arrays an offload store keeps: "master", then the optimizer's
// (optimizer_state_names).
std::vector<std::string> state_array_names(const std::vector<std::string>& optimizer_states);
// The registry category of a state array: kMaster for "master", else kOptimizerState.
core::MemoryCategory state_category(const std::string& name);

// Waits for every pending handle (rethrowing the first failure) and clears the list.
void wait_all(std::vector<core::IoHandle>& handles);

class OffloadStore {
 public:
  OffloadStore(ChunkGrid grid, std::vector<std::string> names, ShardPrecision precision)
      : grid_(grid), names_(std::move(names)), precision_(precision) {}
  virtual ~OffloadStore() = default;
  OffloadStore(const OffloadStore&) = delete;
  OffloadStore& operator=(const OffloadStore&) = delete;

  const ChunkGrid& grid() const { return grid_; }
  const std::vector<std::string>& names() const { return names_; }
  bool has(const std::string& name) const;
  c10::ScalarType dtype(const std::string& name) const { return precision_.of(name); }
  // Position of array `name` in names(); an error naming it when there is none.
  std::size_t index_of(const std::string& name) const;

  // Chunk `chunk` of array `name` in host memory, in `slot` (0 or 1: the step works on two
  // chunks at once). With NVMe it holds the chunk once fetch(chunk, slot) has completed.
  virtual at::Tensor view(const std::string& name, std::int64_t chunk, int slot) const = 0;
  // Starts bringing every array's chunk into `slot`.
  virtual std::vector<core::IoHandle> fetch(std::int64_t chunk, int slot) = 0;
  // Starts writing every array's `slot` back as chunk `chunk`.
  virtual std::vector<core::IoHandle> flush(std::int64_t chunk, int slot) = 0;
  // Outside the step: writes slot 0 back as `chunk` and waits (told to on_swap_write).
  virtual void commit(std::int64_t chunk) = 0;
  // Whether fetch overwrites what a slot held (NVMe): a slot's previous chunk must be
  // written back and copied out before the slot is fetched into again.
  virtual bool slots_reused() const = 0;

  virtual std::string why_not_pinned() const = 0;  // "" when pinned
  virtual std::string description() const = 0;     // the swap file and its backend; "" on host

  // Whole-array access for checkpoints (through slot 0): a copy of [offset, offset + numel)
  // of `name`, and a store of `values` at `offset`.
  at::Tensor read(const std::string& name, std::int64_t offset, std::int64_t numel);
  void write(const std::string& name, std::int64_t offset, const at::Tensor& values);

 private:
  ChunkGrid grid_;
  std::vector<std::string> names_;
  ShardPrecision precision_;
};

// A HostStore for options.nvme_path empty, else an NvmeStore.
std::unique_ptr<OffloadStore> make_offload_store(core::MemoryRegistry& registry, ChunkGrid grid,
                                                 std::vector<std::string> names,
                                                 ShardPrecision precision,
                                                 const OffloadOptions& options);

}  // namespace zero::adapter
