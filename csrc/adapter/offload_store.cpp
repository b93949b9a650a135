#include "adapter/offload_store.h"

#include <algorithm>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "adapter/host_store.h"
#include "adapter/nvme_store.h"

namespace zero::adapter {

std::vector<std::string> state_array_names(const std::vector<std::string>& optimizer_states) {
  std::vector<std::string> names{"master"};
  names.insert(names.end(), optimizer_states.begin(), optimizer_states.end());
  return names;
}

core::MemoryCategory state_category(const std::string& name) {
  return name == "master" ? core::MemoryCategory::kMaster : core::MemoryCategory::kOptimizerState;
}

void wait_all(std::vector<core::IoHandle>& handles) {
  for (core::IoHandle& handle : handles) {
    if (handle.pending()) handle.wait();
  }
  handles.clear();
}

bool OffloadStore::has(const std::string& name) const {
  return std::find(names_.begin(), names_.end(), name) != names_.end();
}

std::size_t OffloadStore::index_of(const std::string& name) const {
  const auto it = std::find(names_.begin(), names_.end(), name);
  TORCH_CHECK(it != names_.end(), "zero: the offloaded state has no array '", name, "'");
  return static_cast<std::size_t>(it - names_.begin());
}

at::Tensor OffloadStore::read(const std::string& name, std::int64_t offset, std::int64_t numel) {
  std::vector<at::Tensor> parts;
  for (std::int64_t c = offset / grid_.chunk; c * grid_.chunk < offset + numel; ++c) {
    auto reads = fetch(c, 0);
    wait_all(reads);
    const std::int64_t begin = std::max(offset, c * grid_.chunk);
    const std::int64_t end = std::min(offset + numel, c * grid_.chunk + grid_.numel(c));
    parts.push_back(view(name, c, 0).narrow(0, begin - c * grid_.chunk, end - begin).clone());
  }
  if (parts.empty()) return at::empty({0}, at::TensorOptions().dtype(dtype(name)));
  return parts.size() == 1 ? parts.front() : at::cat(parts);
}

void OffloadStore::write(const std::string& name, std::int64_t offset, const at::Tensor& values) {
  const at::Tensor source = values.reshape({-1});
  const std::int64_t numel = source.numel();
  for (std::int64_t c = offset / grid_.chunk; c * grid_.chunk < offset + numel; ++c) {
    auto reads = fetch(c, 0);  // read-modify-write: the chunk of every array goes back
    wait_all(reads);
    const std::int64_t begin = std::max(offset, c * grid_.chunk);
    const std::int64_t end = std::min(offset + numel, c * grid_.chunk + grid_.numel(c));
    view(name, c, 0).narrow(0, begin - c * grid_.chunk, end - begin)
        .copy_(source.narrow(0, begin - offset, end - begin));
    commit(c);
  }
}

std::unique_ptr<OffloadStore> make_offload_store(core::MemoryRegistry& registry, ChunkGrid grid,
                                                 std::vector<std::string> names,
                                                 ShardPrecision precision,
                                                 const OffloadOptions& options) {
  if (options.nvme_path.empty()) {
    return std::make_unique<HostStore>(registry, grid, std::move(names), precision,
                                       options.pin_memory);
  }
  return std::make_unique<NvmeStore>(registry, grid, std::move(names), precision, options);
}

}  // namespace zero::adapter
