#include "core/swap_store.h"

#include <sstream>
#include <stdexcept>
#include <unordered_set>
#include <utility>

namespace zero::core {
namespace {

std::uint64_t total_bytes(const std::vector<Tile>& tiles) {
  return tiles.empty() ? 0 : tiles.back().offset + tiles.back().padded;
}

std::string tile_names(const std::vector<Tile>& tiles) {
  std::string names;
  for (const Tile& tile : tiles) names += (names.empty() ? "'" : ", '") + tile.name + "'";
  return names.empty() ? "none" : names;
}

}  // namespace

std::vector<Tile> SwapStore::lay_out(const std::vector<TileSpec>& specs) {
  std::vector<Tile> tiles;
  std::unordered_set<std::string> seen;
  std::uint64_t offset = 0;
  for (const TileSpec& spec : specs) {
    if (spec.name.empty()) throw std::invalid_argument("SwapStore: a tile name is empty");
    if (!seen.insert(spec.name).second) {
      throw std::invalid_argument("SwapStore: tile name '" + spec.name + "' is used twice");
    }
    const std::size_t padded = round_up(spec.bytes);
    tiles.push_back({spec.name, offset, spec.bytes, padded});
    offset += padded;
  }
  return tiles;
}

SwapStore::SwapStore(const std::string& directory, const std::vector<TileSpec>& tiles,
                     SwapStoreOptions options)
    : tiles_(lay_out(tiles)),
      file_(directory, total_bytes(tiles_),
            SwapFileOptions{options.direct, options.keep_file, options.faults}) {
  for (std::size_t i = 0; i < tiles_.size(); ++i) index_.emplace(tiles_[i].name, i);
  IoBackendChoice choice = make_io_backend(options.aio, options.backend, options.faults);
  backend_ = std::move(choice.backend);
  backend_fallback_reason_ = std::move(choice.fallback_reason);
}

SwapStore::~SwapStore() {
  backend_.reset();  // explicit: every queued transfer finishes before the file goes away
}

const Tile& SwapStore::tile(const std::string& name) const {
  const auto found = index_.find(name);
  if (found == index_.end()) {
    throw std::out_of_range("SwapStore: no tile named '" + name + "' (tiles: " +
                            tile_names(tiles_) + ")");
  }
  return tiles_[found->second];
}

IoHandle SwapStore::write_async(const std::string& tile, const AlignedBuffer& buffer) {
  // The backend only reads from a write's buffer; IoRequest has one pointer type for both.
  return submit(IoOp::kWrite, tile, const_cast<std::byte*>(buffer.data()), buffer.size());
}

IoHandle SwapStore::read_async(const std::string& tile, AlignedBuffer& buffer) {
  return submit(IoOp::kRead, tile, buffer.data(), buffer.size());
}

IoHandle SwapStore::write_async(const std::string& tile, const std::byte* data,
                                std::size_t size) {
  return submit(IoOp::kWrite, tile, const_cast<std::byte*>(data), size);
}

IoHandle SwapStore::read_async(const std::string& tile, std::byte* data, std::size_t size) {
  return submit(IoOp::kRead, tile, data, size);
}

void SwapStore::write(const std::string& tile, const AlignedBuffer& buffer) {
  write_async(tile, buffer).wait();
}

void SwapStore::read(const std::string& tile, AlignedBuffer& buffer) {
  read_async(tile, buffer).wait();
}

IoHandle SwapStore::submit(IoOp op, const std::string& name, std::byte* data, std::size_t size) {
  const Tile& target = tile(name);
  if (size < target.padded) {
    throw std::invalid_argument("SwapStore: " + std::string(op_name(op)) + " of tile '" + name +
                                "' needs a buffer of at least " + std::to_string(target.padded) +
                                " bytes (its " + std::to_string(target.bytes) +
                                " bytes rounded up to " + std::to_string(kIoAlignment) +
                                "), got " + std::to_string(size) +
                                "; allocate it as AlignedBuffer(tile bytes)");
  }
  // Checked on every filesystem, not only under O_DIRECT, so code that works against a tmpfs
  // test directory keeps working on the NVMe drive.
  const auto address = reinterpret_cast<std::uintptr_t>(data);
  if (target.padded > 0 && (data == nullptr || address % kIoAlignment != 0)) {
    std::ostringstream message;
    message << "SwapStore: " << op_name(op) << " of tile '" << name << "': buffer address "
            << static_cast<const void*>(data) << " is not aligned to " << kIoAlignment
            << " bytes, which O_DIRECT requires; allocate it with AlignedBuffer";
    throw std::invalid_argument(message.str());
  }
  IoRequest request;
  request.op = op;
  request.fd = file_.fd();
  request.path = file_.path();
  request.buffer = data;
  request.offset = target.offset;
  request.length = target.padded;
  request.direct = file_.direct();
  std::ostringstream description;
  description << op_name(op) << " of tile '" << name << "' (" << target.padded
              << " bytes at offset " << target.offset << ") in '" << file_.path() << "'";
  return IoHandle(backend_->submit(std::move(request)), description.str());
}

}  // namespace zero::core
