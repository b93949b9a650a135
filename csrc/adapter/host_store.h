#pragma once
// offload_optimizer device "cpu": the shard's state arrays (each in its dtype,
// shard_precision.h) whole in host memory (pinned when asked and possible), counted under
// their category (master, optimizer state). A chunk is a view into its array in either slot,
// so fetch, flush and commit have nothing to do.
#include <vector>

#include "adapter/host_pinning.h"
#include "adapter/offload_store.h"

namespace zero::adapter {

class HostStore final : public OffloadStore {
 public:
  HostStore(core::MemoryRegistry& registry, ChunkGrid grid, std::vector<std::string> names,
            ShardPrecision precision, bool pin_memory);

  at::Tensor view(const std::string& name, std::int64_t chunk, int slot) const override;
  std::vector<core::IoHandle> fetch(std::int64_t, int) override { return {}; }
  std::vector<core::IoHandle> flush(std::int64_t, int) override { return {}; }
  void commit(std::int64_t) override {}
  bool slots_reused() const override { return false; }

  std::string why_not_pinned() const override { return first_why_not_pinned(arrays_); }
  std::string description() const override { return ""; }

 private:
  std::vector<HostTensor> arrays_;  // in names() order
};

}  // namespace zero::adapter
