#include "adapter/host_store.h"

namespace zero::adapter {

HostStore::HostStore(core::MemoryRegistry& registry, ChunkGrid grid,
                     std::vector<std::string> names, ShardPrecision precision,
                     bool pin_memory)
    : OffloadStore(grid, std::move(names), precision) {
  for (const std::string& name : this->names()) {
    arrays_.emplace_back(registry, state_category(name), grid.shard_numel, dtype(name),
                         pin_memory);
  }
}

at::Tensor HostStore::view(const std::string& name, std::int64_t chunk, int /*slot*/) const {
  return arrays_[index_of(name)].tensor().narrow(0, chunk * grid().chunk, grid().numel(chunk));
}

}  // namespace zero::adapter
