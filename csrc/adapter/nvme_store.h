#pragma once
// offload_optimizer device "nvme" (ZeRO-Infinity): the shard's state arrays (each in its
// dtype, shard_precision.h) live in a swap file under nvme_path, one tile per array and chunk
// ("exp_avg.3"), counted at kNvme.
// Host memory holds two slots per array, each one chunk padded to whole pages for O_DIRECT
// (staging); fetch reads a chunk into a slot, flush writes a slot back.
#include <memory>
#include <vector>

#include "adapter/host_pinning.h"
#include "adapter/offload_store.h"
#include "core/swap_store.h"

namespace zero::adapter {

class NvmeStore final : public OffloadStore {
 public:
  NvmeStore(core::MemoryRegistry& registry, ChunkGrid grid, std::vector<std::string> names,
            ShardPrecision precision, const OffloadOptions& options);

  at::Tensor view(const std::string& name, std::int64_t chunk, int slot) const override;
  std::vector<core::IoHandle> fetch(std::int64_t chunk, int slot) override;
  std::vector<core::IoHandle> flush(std::int64_t chunk, int slot) override;
  void commit(std::int64_t chunk) override;
  bool slots_reused() const override { return true; }

  std::string why_not_pinned() const override;
  std::string description() const override;

 private:
  std::string tile_name(std::size_t array, std::int64_t chunk) const;
  std::size_t element_bytes(std::size_t array) const;
  std::size_t padded_chunk_bytes(std::size_t array) const;  // one chunk, whole pages

  std::function<void(std::int64_t bytes)> on_swap_write_;
  std::vector<HostTensor> slots_[2];  // per slot, one chunk of each array (names() order)
  std::vector<core::TrackedBytes> nvme_bytes_;
  std::unique_ptr<core::SwapStore> swap_;  // last: it drains before the slots go
};

}  // namespace zero::adapter
