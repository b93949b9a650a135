#include "adapter/host_store.h"

#include <algorithm>

#include <c10/util/Exception.h>

namespace zero::adapter {

HostStore::HostStore(core::MemoryRegistry& registry, ChunkGrid grid,
                     std::vector<std::string> names, bool pin_memory)
    : OffloadStore(grid, std::move(names)) {
  for (const std::string& name : this->names()) {
    const auto category = name == "master" ? core::MemoryCategory::kMaster
                                           : core::MemoryCategory::kOptimizerState;
    arrays_.emplace_back(registry, category, grid.shard_numel, at::kFloat, pin_memory);
  }
}

at::Tensor HostStore::view(const std::string& name, std::int64_t chunk, int /*slot*/) const {
  const auto& all = names();
  const auto it = std::find(all.begin(), all.end(), name);
  TORCH_CHECK(it != all.end(), "zero: the offloaded state has no array '", name, "'");
  const std::int64_t begin = chunk * grid().chunk;
  return arrays_[static_cast<std::size_t>(it - all.begin())].tensor().narrow(
      0, begin, grid().numel(chunk));
}

bool HostStore::pinned() const {
  return std::all_of(arrays_.begin(), arrays_.end(),
                     [](const HostTensor& array) { return array.pinned(); });
}

std::string HostStore::why_not_pinned() const {
  for (const HostTensor& array : arrays_) {
    if (!array.pinned()) return array.why_not_pinned();
  }
  return "";
}

}  // namespace zero::adapter
