#pragma once
// Tiles in one swap file: the NVMe home of optimizer state or parameters.
//
// A tile is a named, fixed-size region at a kIoAlignment-aligned offset; its transfers always
// cover the tile's padded size (its bytes rounded up to kIoAlignment), so one AlignedBuffer of the
// tile's bytes can carry it to and from the file with O_DIRECT. Transfers are asynchronous and
// any number may be in flight (double buffering: read tile k+1 while the optimizer works on tile
// k and tile k-1 is written back); each returns an IoHandle to wait on.
//
// Ordering: requests in flight at the same time are not ordered against each other. Wait for a
// tile's write before reading it back, and do not write a tile while another request on it runs.
//
// Thread safety: the tile table is fixed at construction and the backend's submit is thread-safe,
// so the engine thread (or several) may issue requests while the workers run.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/io_backend.h"
#include "core/io_handle.h"
#include "core/swap_file.h"

namespace zero::core {

struct TileSpec {
  std::string name;
  std::size_t bytes = 0;
};

struct Tile {
  std::string name;
  std::uint64_t offset = 0;   // in the swap file; a multiple of kIoAlignment
  std::size_t bytes = 0;      // as declared
  std::size_t padded = 0;     // round_up(bytes): what every transfer of this tile moves
};

struct SwapStoreOptions {
  AioConfig aio;
  IoBackendKind backend = IoBackendKind::kAuto;
  bool direct = true;               // O_DIRECT when the filesystem allows it
  bool keep_file = false;           // leave the swap file behind on destruction
  FaultInjector* faults = nullptr;  // test hook for the file and the backend; must outlive us
};

class SwapStore {
 public:
  // Lays the tiles out back to back, creates and preallocates the swap file in `directory` and
  // starts the backend. Tile names must be unique and non-empty (std::invalid_argument).
  SwapStore(const std::string& directory, const std::vector<TileSpec>& tiles,
            SwapStoreOptions options = {});
  // Finishes every request already submitted, then removes the swap file.
  ~SwapStore();
  SwapStore(const SwapStore&) = delete;
  SwapStore& operator=(const SwapStore&) = delete;

  // The buffer must hold at least the tile's padded size and, like every buffer here, start on a
  // kIoAlignment boundary (any AlignedBuffer does); std::invalid_argument otherwise. It must
  // stay alive and unmodified (write) / untouched (read) until the handle is waited.
  IoHandle write_async(const std::string& tile, const AlignedBuffer& buffer);
  IoHandle read_async(const std::string& tile, AlignedBuffer& buffer);
  // For memory owned elsewhere (a pinned tensor allocated with the same alignment).
  IoHandle write_async(const std::string& tile, const std::byte* data, std::size_t size);
  IoHandle read_async(const std::string& tile, std::byte* data, std::size_t size);
  // Blocking forms: submit and wait.
  void write(const std::string& tile, const AlignedBuffer& buffer);
  void read(const std::string& tile, AlignedBuffer& buffer);

  const Tile& tile(const std::string& name) const;  // std::out_of_range naming the tiles
  const std::vector<Tile>& tiles() const { return tiles_; }
  const SwapFile& file() const { return file_; }
  const char* backend_name() const { return backend_->name(); }
  // Why the "auto" backend is not io_uring; empty when it is, or when another was asked for.
  const std::string& backend_fallback_reason() const { return backend_fallback_reason_; }

 private:
  static std::vector<Tile> lay_out(const std::vector<TileSpec>& specs);
  IoHandle submit(IoOp op, const std::string& tile, std::byte* data, std::size_t size);

  std::vector<Tile> tiles_;
  std::unordered_map<std::string, std::size_t> index_;
  SwapFile file_;                      // declared before backend_: the backend drains first
  std::unique_ptr<IoBackend> backend_;
  std::string backend_fallback_reason_;
};

}  // namespace zero::core
