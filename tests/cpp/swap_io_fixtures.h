// Shared fixtures of the swap I/O tests (test_swap_io*.cpp): temporary directories, scratch
// mounts, random buffers, the backends this machine can run, and a tile round trip.
// Header-only: every function is inline, so each test file may include it.
#pragma once

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/fault_injector.h"
#include "core/io_backend.h"
#include "core/io_handle.h"
#include "core/swap_file.h"
#include "core/swap_store.h"

namespace swap_io_fixtures {

namespace fs = std::filesystem;
using namespace zero::core;

// A fresh directory under `base`, removed with everything in it when the test ends.
class TempDir {
 public:
  explicit TempDir(const fs::path& base = "/tmp") {
    std::string pattern = (base / "zero-swap-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("mkdtemp under " + base.string() + ": " + std::strerror(errno));
    }
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

// A private filesystem mounted for one test (needs CAP_SYS_ADMIN); unmounted on destruction.
class ScratchMount {
 public:
  // nullopt (with the reason in `why`) when the kernel refuses the mount.
  static std::unique_ptr<ScratchMount> try_mount(const std::string& type, const std::string& data,
                                                 unsigned long flags, std::string& why) {
    auto mount = std::unique_ptr<ScratchMount>(new ScratchMount());
    if (::mount(type.c_str(), mount->dir_.str().c_str(), type.c_str(), flags, data.c_str()) != 0) {
      why = "mount -t " + type + " -o " + data + " refused: " + std::strerror(errno);
      return nullptr;
    }
    mount->mounted_ = true;
    return mount;
  }
  ~ScratchMount() {
    if (mounted_) ::umount2(dir_.str().c_str(), MNT_DETACH);
  }
  std::string str() const { return dir_.str(); }

 private:
  ScratchMount() = default;
  TempDir dir_;
  bool mounted_ = false;
};

inline void fill_random(AlignedBuffer& buffer, std::uint32_t seed) {
  std::mt19937 random(seed);
  for (std::size_t i = 0; i < buffer.size(); ++i) {
    buffer.data()[i] = static_cast<std::byte>(random() & 0xff);
  }
}

inline bool same_bytes(const AlignedBuffer& a, const AlignedBuffer& b, std::size_t bytes) {
  return std::memcmp(a.data(), b.data(), bytes) == 0;
}

inline std::vector<std::string> swap_files_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("zero-swap-", 0) == 0) names.push_back(name);
  }
  return names;
}

// Backends this machine can run: the thread pool always, io_uring when built in and allowed.
inline std::vector<IoBackendKind> runnable_backends() {
  std::vector<IoBackendKind> kinds{IoBackendKind::kThreadPool};
  if (!io_uring_compiled()) return kinds;
  try {
    make_io_backend(AioConfig{}, IoBackendKind::kIoUring);
    kinds.push_back(IoBackendKind::kIoUring);
  } catch (const std::exception& e) {
    WARN("io_uring backend not testable here: " << e.what());
  }
  return kinds;
}

inline SwapStoreOptions store_options(IoBackendKind kind, bool direct,
                                      FaultInjector* faults = nullptr) {
  SwapStoreOptions options;
  options.backend = kind;
  options.direct = direct;
  options.faults = faults;
  options.aio.block_size = 64 * 1024;  // small pieces so every tile is cut up
  options.aio.queue_depth = 8;
  options.aio.intra_op_parallelism = 2;
  return options;
}

// Writes random data through every tile, reads it back into fresh buffers, compares.
inline void round_trip(SwapStore& store, std::uint32_t seed) {
  std::vector<AlignedBuffer> written;
  std::vector<IoHandle> handles;
  for (const Tile& tile : store.tiles()) {
    written.emplace_back(tile.bytes);
    fill_random(written.back(), seed++);
    handles.push_back(store.write_async(tile.name, written.back()));
  }
  for (IoHandle& handle : handles) handle.wait();
  handles.clear();
  std::vector<AlignedBuffer> read;
  for (const Tile& tile : store.tiles()) {
    read.emplace_back(tile.bytes);
    handles.push_back(store.read_async(tile.name, read.back()));
  }
  for (IoHandle& handle : handles) handle.wait();
  for (std::size_t i = 0; i < store.tiles().size(); ++i) {
    INFO("tile " << store.tiles()[i].name);
    CHECK(same_bytes(written[i], read[i], written[i].size()));
  }
}

inline const std::vector<TileSpec> kTiles = {
    {"exp_avg", 3 * 1024 * 1024 + 123},  // not a multiple of the block size nor of 4096
    {"exp_avg_sq", 1024 * 1024},
    {"master", 5000},
    {"tiny", 1},
};

// Whether O_DIRECT on this fd bypasses the page cache for real: the kernel then rejects a
// misaligned buffer. Only meaningful where statx reports direct-I/O alignment (tmpfs accepts
// O_DIRECT since Linux 6.6 but serves it from the page cache with no alignment rule).
inline std::optional<bool> misaligned_write_rejected(int fd) {
#ifdef STATX_DIOALIGN
  struct statx info {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &info) != 0 ||
      (info.stx_mask & STATX_DIOALIGN) == 0 || info.stx_dio_mem_align <= 1) {
    return std::nullopt;
  }
  // A write, not a read: reads of never-written (unwritten-extent) blocks are served as zeros
  // without the alignment check. The bytes do not matter, the file is fresh.
  AlignedBuffer buffer(2 * kIoAlignment);
  const ssize_t result = ::pwrite(fd, buffer.data() + 1, kIoAlignment, 0);
  return result < 0 && errno == EINVAL;
#else
  (void)fd;
  return std::nullopt;
#endif
}

// The repository's build/ directory: a real on-disk filesystem next to the sources.
inline fs::path repo_build_dir() {
  return fs::path(__FILE__).parent_path().parent_path().parent_path() / "build";
}

inline std::string captured_stderr_of(const std::function<void()>& action) {
  std::ostringstream captured;
  std::streambuf* original = std::cerr.rdbuf(captured.rdbuf());
  try {
    action();
  } catch (...) {
    std::cerr.rdbuf(original);
    throw;
  }
  std::cerr.rdbuf(original);
  return captured.str();
}

}  // namespace swap_io_fixtures
