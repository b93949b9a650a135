#include "adapter/param_swap.h"

#include <algorithm>

#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include "adapter/host_pinning.h"

namespace zero::adapter {

ParamSwap::ParamSwap(core::MemoryRegistry& registry, const std::vector<std::int64_t>& unit_numel,
                     at::ScalarType dtype, const ParamSwapOptions& options)
    : unit_numel_(unit_numel), dtype_(dtype) {
  TORCH_CHECK_VALUE(options.buffer_count >= 2, "zero: zero_optimization.offload_param."
                    "buffer_count must be at least 2 with device \"nvme\" (one unit is read "
                    "while another is written back), got ", options.buffer_count);
  const std::int64_t largest = *std::max_element(unit_numel_.begin(), unit_numel_.end());
  TORCH_CHECK(largest > 0, "zero: no parameter unit was placed on NVMe");
  // Page-multiple buffers in one page-aligned slab: each starts O_DIRECT-aligned.
  const auto buffer_bytes = static_cast<std::int64_t>(
      core::round_up(static_cast<std::size_t>(largest) * element_bytes()));
  lost_.assign(unit_numel_.size(), false);
  const std::vector<core::HostRegion> regions(
      static_cast<std::size_t>(options.buffer_count),
      core::HostRegion{core::MemoryCategory::kStaging, buffer_bytes});
  const core::HostPinning pinning = host_pinning();
  pool_ = std::make_unique<core::HostPool>(regions, registry, options.pin ? &pinning : nullptr);
  const auto model = at::TensorOptions().dtype(dtype_);
  buffers_.resize(regions.size());
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    buffers_[i].memory = at::from_blob(pool_->region(i), {largest}, model);
  }
  std::vector<core::TileSpec> tiles;
  std::int64_t on_disk = 0;
  for (std::size_t u = 0; u < unit_numel_.size(); ++u) {
    if (!holds(u)) continue;
    const std::size_t bytes = static_cast<std::size_t>(unit_numel_[u]) * element_bytes();
    tiles.push_back({tile_name(u), bytes});
    on_disk += static_cast<std::int64_t>(bytes);
  }
  core::SwapStoreOptions store;
  store.aio = options.aio;
  swap_ = std::make_unique<core::SwapStore>(options.nvme_path, tiles, store);
  nvme_bytes_ = core::TrackedBytes(&registry, core::MemoryCategory::kParam,
                                   core::MemoryLocation::kNvme, on_disk);
}

// Transfers in flight use pool memory: they finish (IoHandle destructors) before it goes.
ParamSwap::~ParamSwap() {
  for (Buffer& buffer : buffers_) buffer.io = core::IoHandle();
  swap_.reset();
}

std::string ParamSwap::tile_name(std::size_t unit) { return "param.u" + std::to_string(unit); }

std::size_t ParamSwap::element_bytes() const { return c10::elementSize(dtype_); }

std::string ParamSwap::description() const {
  return swap_->file().path() + " (" + swap_->backend_name() + ")";
}

at::Tensor ParamSwap::shard_view(const Buffer& buffer) const {
  return buffer.memory.narrow(0, 0, unit_numel_.at(buffer.unit));
}

std::optional<std::size_t> ParamSwap::buffer_of(std::size_t unit) const {
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    if (buffers_[i].state != State::kFree && buffers_[i].unit == unit) return i;
  }
  return std::nullopt;
}

void ParamSwap::settle(Buffer& buffer) {
  try {
    if (buffer.io.pending()) buffer.io.wait();
  } catch (...) {
    // A failed read leaves garbage in the buffer; a failed write leaves the unit's only
    // up-to-date copy unsaved: either way the buffer no longer stands for the tile.
    if (buffer.state == State::kWriting) lost_.at(buffer.unit) = true;
    buffer.state = State::kFree;
    throw;
  }
  if (buffer.state == State::kWriting) buffer.state = State::kClean;
}

void ParamSwap::check_not_lost(std::size_t unit) const {
  TORCH_CHECK(!lost_.at(unit), "zero: writing the parameters of unit ", unit, " to ",
              description(), " failed earlier, so the file holds stale values for it; restore "
              "the run from a checkpoint (and check the drive: free space, errors in dmesg)");
}

std::size_t ParamSwap::acquire(std::size_t unit) {
  auto pick = [this](State state) -> std::optional<std::size_t> {
    std::optional<std::size_t> oldest;
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      if (buffers_[i].state != state) continue;
      if (!oldest || buffers_[i].last_use < buffers_[*oldest].last_use) oldest = i;
    }
    return oldest;
  };
  // Free first; then a write that has finished (nothing to wait for); then the least
  // recently used clean buffer (a cache entry); waiting for a write in flight comes last.
  std::optional<std::size_t> index = pick(State::kFree);
  if (!index) {
    for (std::size_t i = 0; i < buffers_.size() && !index; ++i) {
      if (buffers_[i].state == State::kWriting && buffers_[i].io.ready()) index = i;
    }
  }
  if (!index) index = pick(State::kClean);
  if (!index) index = pick(State::kWriting);
  TORCH_CHECK(index.has_value(), "zero: all ", buffers_.size(), " offload_param buffers are in "
              "use while unit ", unit, " needs one; raise zero_optimization.offload_param."
              "buffer_count");
  Buffer& buffer = buffers_[*index];
  settle(buffer);
  buffer.state = State::kFree;
  buffer.unit = unit;
  buffer.filled = 0;
  buffer.ahead = false;
  buffer.last_use = ++clock_;
  return *index;
}

// The buffer's state changes only once the request is submitted: a refused submission
// leaves a free buffer (read) or a lost unit (write).
void ParamSwap::start_read(std::size_t index, std::size_t unit) {
  check_not_lost(unit);
  Buffer& buffer = buffers_[index];
  buffer.io = swap_->read_async(tile_name(unit), static_cast<std::byte*>(buffer.memory.data_ptr()),
                                pool_->region_bytes(index));
  buffer.unit = unit;
  buffer.state = State::kClean;
  buffer.last_use = ++clock_;
  ++reads_;
}

void ParamSwap::start_write(Buffer& buffer) {
  const std::size_t index = static_cast<std::size_t>(&buffer - buffers_.data());
  try {
    buffer.io = swap_->write_async(tile_name(buffer.unit),
                                   static_cast<const std::byte*>(buffer.memory.data_ptr()),
                                   pool_->region_bytes(index));
  } catch (...) {
    lost_.at(buffer.unit) = true;
    buffer.state = State::kFree;
    throw;
  }
  buffer.state = State::kWriting;
  buffer.last_use = ++clock_;
}

void ParamSwap::prefetch(std::size_t unit) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!holds(unit) || lost_[unit]) return;
  if (const std::optional<std::size_t> held = buffer_of(unit)) {
    if (buffers_[*held].state == State::kClean) {  // already here: keep it for its gather
      buffers_[*held].ahead = true;
      buffers_[*held].last_use = ++clock_;
    }
    return;
  }
  std::optional<std::size_t> pick;
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    const Buffer& buffer = buffers_[i];
    if (buffer.state == State::kFree) {
      pick = i;
      break;
    }
    const bool reclaimable = buffer.state == State::kClean && !buffer.ahead;
    if (reclaimable && (!pick || buffer.last_use < buffers_[*pick].last_use)) pick = i;
  }
  if (!pick) return;
  settle(buffers_[*pick]);  // a clean buffer's own read may still be running
  start_read(*pick, unit);
  buffers_[*pick].ahead = true;
  ++read_aheads_;
}

at::Tensor ParamSwap::read(std::size_t unit) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(holds(unit), "zero: unit ", unit, " does not live on NVMe");
  check_not_lost(unit);
  std::optional<std::size_t> index = buffer_of(unit);
  if (!index) {
    index = acquire(unit);
    start_read(*index, unit);
  }
  Buffer& buffer = buffers_[*index];
  TORCH_CHECK(buffer.state == State::kClean || buffer.state == State::kWriting,
              "zero: unit ", unit, " is read while its buffer is lent out or being filled");
  settle(buffer);
  buffer.state = State::kTaken;
  buffer.ahead = false;
  buffer.last_use = ++clock_;
  return shard_view(buffer);
}

void ParamSwap::finish_read(std::size_t unit) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::optional<std::size_t> index = buffer_of(unit);
  TORCH_CHECK(index && buffers_[*index].state == State::kTaken, "zero: finish_read(", unit,
              ") without read()");
  buffers_[*index].state = State::kClean;  // still equal to the tile: later reads reuse it
}

void ParamSwap::write(std::size_t unit, const at::Tensor& values) {
  TORCH_CHECK(values.numel() == unit_numel_.at(unit), "zero: unit ", unit, " has ",
              unit_numel_.at(unit), " elements on NVMe, got ", values.numel());
  write_part(unit, 0, values);
}

void ParamSwap::write_part(std::size_t unit, std::int64_t begin, const at::Tensor& values) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(holds(unit), "zero: unit ", unit, " does not live on NVMe");
  std::optional<std::size_t> index = buffer_of(unit);
  if (!index || buffers_[*index].state != State::kFilling) {
    // A fill starts at the unit's first element: every piece of it is about to be replaced.
    TORCH_CHECK(begin == 0, "zero: unit ", unit, "'s new parameters start at element ", begin,
                ", not 0; every piece of an NVMe unit must be stored, in order");
    if (index) {
      TORCH_CHECK(buffers_[*index].state != State::kTaken, "zero: unit ", unit,
                  " is written while read() lends its buffer out");
      settle(buffers_[*index]);
    } else {
      index = acquire(unit);
    }
    buffers_[*index].state = State::kFilling;
    buffers_[*index].filled = 0;
    buffers_[*index].ahead = false;
    lost_[unit] = false;  // the whole unit is being written afresh
  }
  Buffer& buffer = buffers_[*index];
  TORCH_CHECK(begin == buffer.filled && begin + values.numel() <= unit_numel_[unit], "zero: unit ",
              unit, "'s new parameters arrived out of order or past its end (elements [", begin,
              ", ", begin + values.numel(), ") after ", buffer.filled, " of ", unit_numel_[unit],
              ")");
  buffer.memory.narrow(0, begin, values.numel()).copy_(values.reshape({-1}));
  buffer.filled += values.numel();
  if (buffer.filled == unit_numel_[unit]) start_write(buffer);
}

void ParamSwap::flush() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Buffer& buffer : buffers_) {
    if (buffer.state == State::kFilling) {  // a step that failed part-way through this unit
      lost_.at(buffer.unit) = true;
      buffer.state = State::kFree;
      TORCH_CHECK(false, "zero: unit ", buffer.unit, "'s new parameters are incomplete (",
                  buffer.filled, " of ", unit_numel_[buffer.unit], " elements stored)");
    }
    if (buffer.state == State::kWriting) settle(buffer);
  }
}

}  // namespace zero::adapter
