#include "adapter/nvme_store.h"

namespace zero::adapter {

NvmeStore::NvmeStore(core::MemoryRegistry& registry, ChunkGrid grid,
                     std::vector<std::string> names, ShardPrecision precision,
                     const OffloadOptions& options)
    : OffloadStore(grid, std::move(names), precision), on_swap_write_(options.on_swap_write) {
  std::vector<core::TileSpec> tiles;
  for (std::size_t a = 0; a < this->names().size(); ++a) {
    const std::string& name = this->names()[a];
    const std::size_t element = element_bytes(a);
    const auto slot_numel = static_cast<std::int64_t>(padded_chunk_bytes(a) / element);
    for (int slot = 0; slot < 2; ++slot) {
      slots_[slot].emplace_back(registry, core::MemoryCategory::kStaging, slot_numel,
                                dtype(name), options.pin_memory);
    }
    for (std::int64_t c = 0; c < grid.count(); ++c) {
      tiles.push_back({tile_name(a, c), static_cast<std::size_t>(grid.numel(c)) * element});
    }
    nvme_bytes_.emplace_back(&registry, state_category(name), core::MemoryLocation::kNvme,
                             static_cast<std::int64_t>(element) * grid.shard_numel);
  }
  core::SwapStoreOptions swap_options;
  swap_options.aio = options.aio;
  swap_ = std::make_unique<core::SwapStore>(options.nvme_path, tiles, swap_options);
}

std::string NvmeStore::tile_name(std::size_t array, std::int64_t chunk) const {
  return names()[array] + "." + std::to_string(chunk);
}

std::size_t NvmeStore::element_bytes(std::size_t array) const {
  return c10::elementSize(dtype(names()[array]));
}

std::size_t NvmeStore::padded_chunk_bytes(std::size_t array) const {
  return core::round_up(static_cast<std::size_t>(grid().chunk) * element_bytes(array));
}

at::Tensor NvmeStore::view(const std::string& name, std::int64_t chunk, int slot) const {
  return slots_[slot][index_of(name)].tensor().narrow(0, 0, grid().numel(chunk));
}

std::vector<core::IoHandle> NvmeStore::fetch(std::int64_t chunk, int slot) {
  std::vector<core::IoHandle> handles;
  for (std::size_t a = 0; a < names().size(); ++a) {
    auto* data = static_cast<std::byte*>(slots_[slot][a].tensor().data_ptr());
    handles.push_back(swap_->read_async(tile_name(a, chunk), data, padded_chunk_bytes(a)));
  }
  return handles;
}

std::vector<core::IoHandle> NvmeStore::flush(std::int64_t chunk, int slot) {
  std::vector<core::IoHandle> handles;
  for (std::size_t a = 0; a < names().size(); ++a) {
    const auto* data = static_cast<const std::byte*>(slots_[slot][a].tensor().data_ptr());
    handles.push_back(swap_->write_async(tile_name(a, chunk), data, padded_chunk_bytes(a)));
  }
  return handles;
}

void NvmeStore::commit(std::int64_t chunk) {
  auto writes = flush(chunk, 0);
  wait_all(writes);
  if (on_swap_write_) {
    std::size_t bytes = 0;
    for (std::size_t a = 0; a < names().size(); ++a) bytes += padded_chunk_bytes(a);
    on_swap_write_(static_cast<std::int64_t>(bytes));
  }
}

std::string NvmeStore::why_not_pinned() const {
  const std::string why = first_why_not_pinned(slots_[0]);
  return why.empty() ? first_why_not_pinned(slots_[1]) : why;
}

std::string NvmeStore::description() const {
  return swap_->file().path() + " (" + swap_->backend_name() + ")";
}

}  // namespace zero::adapter
