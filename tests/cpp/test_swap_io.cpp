#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/fault_injector.h"
#include "core/io_backend.h"
#include "core/io_handle.h"
#include "core/io_thread_pool.h"
#include "core/swap_file.h"
#include "core/swap_store.h"

namespace fs = std::filesystem;
using namespace zero::core;

namespace {

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

void fill_random(AlignedBuffer& buffer, std::uint32_t seed) {
  std::mt19937 random(seed);
  for (std::size_t i = 0; i < buffer.size(); ++i) {
    buffer.data()[i] = static_cast<std::byte>(random() & 0xff);
  }
}

bool same_bytes(const AlignedBuffer& a, const AlignedBuffer& b, std::size_t bytes) {
  return std::memcmp(a.data(), b.data(), bytes) == 0;
}

std::vector<std::string> swap_files_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("zero-swap-", 0) == 0) names.push_back(name);
  }
  return names;
}

// Backends this machine can run: the thread pool always, io_uring when built in and allowed.
std::vector<IoBackendKind> runnable_backends() {
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

SwapStoreOptions store_options(IoBackendKind kind, bool direct, FaultInjector* faults = nullptr) {
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
void round_trip(SwapStore& store, std::uint32_t seed) {
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

const std::vector<TileSpec> kTiles = {
    {"exp_avg", 3 * 1024 * 1024 + 123},  // not a multiple of the block size nor of 4096
    {"exp_avg_sq", 1024 * 1024},
    {"master", 5000},
    {"tiny", 1},
};

// Whether O_DIRECT on this fd bypasses the page cache for real: the kernel then rejects a
// misaligned buffer. Only meaningful where statx reports direct-I/O alignment (tmpfs accepts
// O_DIRECT since Linux 6.6 but serves it from the page cache with no alignment rule).
std::optional<bool> misaligned_write_rejected(int fd) {
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
fs::path repo_build_dir() {
  return fs::path(__FILE__).parent_path().parent_path().parent_path() / "build";
}

std::string captured_stderr_of(const std::function<void()>& action) {
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

}  // namespace

// ---------------------------------------------------------------------------------------------
// AlignedBuffer

TEST_CASE("aligned buffers are page-aligned, rounded up and zero-filled", "[swap][buffer]") {
  AlignedBuffer buffer(5000);
  CHECK(reinterpret_cast<std::uintptr_t>(buffer.data()) % kIoAlignment == 0);
  CHECK(buffer.size() == 8192);
  bool all_zero = true;
  for (std::size_t i = 0; i < buffer.size(); ++i) {
    all_zero = all_zero && buffer.data()[i] == std::byte{0};
  }
  CHECK(all_zero);
  CHECK(AlignedBuffer(0).empty());
}

TEST_CASE("an aligned buffer rejects an alignment that is not a power of two", "[swap][buffer]") {
  CHECK_THROWS_WITH(AlignedBuffer(10, 3000), Catch::Contains("power of two"));
}

TEST_CASE("moving an aligned buffer transfers ownership", "[swap][buffer]") {
  AlignedBuffer source(4096);
  std::byte* data = source.data();
  AlignedBuffer moved(std::move(source));
  CHECK(moved.data() == data);
  CHECK(source.data() == nullptr);  // NOLINT(bugprone-use-after-move): the point of the test
  CHECK(source.size() == 0);
  AlignedBuffer assigned(8192);
  assigned = std::move(moved);
  CHECK(assigned.data() == data);
  CHECK(assigned.size() == 4096);
}

// ---------------------------------------------------------------------------------------------
// Round trips

TEST_CASE("random data round-trips through several tiles with O_DIRECT requested",
          "[swap][roundtrip]") {
  const IoBackendKind kind = GENERATE(from_range(runnable_backends()));
  // /tmp and the build directory are on disk here; /dev/shm is tmpfs. Whichever way each
  // filesystem answers O_DIRECT, the data must come back, and a refusal must carry its reason.
  const std::string base = GENERATE(as<std::string>{}, "/tmp", "/dev/shm", "build");
  const fs::path dir_base = base == "build" ? repo_build_dir() : fs::path(base);
  if (!fs::is_directory(dir_base) || ::access(dir_base.c_str(), W_OK) != 0) {
    WARN("skipping " << dir_base << ": not a writable directory here");
    return;
  }
  TempDir dir(dir_base);
  SwapStore store(dir.str(), kTiles, store_options(kind, /*direct=*/true));
  INFO("backend " << store.backend_name() << " in " << dir.str());
  if (store.file().direct()) {
    CHECK(store.file().direct_fallback_reason().empty());
    if (const auto rejected = misaligned_write_rejected(store.file().fd())) CHECK(*rejected);
  } else {
    CHECK_THAT(store.file().direct_fallback_reason(), Catch::Contains("refused O_DIRECT"));
  }
  round_trip(store, 11);
}

TEST_CASE("random data round-trips through several tiles with buffered I/O",
          "[swap][roundtrip]") {
  const IoBackendKind kind = GENERATE(from_range(runnable_backends()));
  TempDir dir;
  SwapStore store(dir.str(), kTiles, store_options(kind, /*direct=*/false));
  CHECK_FALSE(store.file().direct());
  CHECK(store.file().direct_fallback_reason().empty());  // not asked for, so nothing fell back
  round_trip(store, 23);
}

TEST_CASE("O_DIRECT is really in effect on the on-disk test directory", "[swap][direct]") {
  // Guards against a fallback that silently turns every "direct" test into a buffered one.
  TempDir dir;
  SwapFile file(dir.str(), 1 << 20);
  const auto rejected = misaligned_write_rejected(file.fd());
  if (!file.direct() || !rejected) {
    WARN("/tmp gives no observable O_DIRECT here: " << file.direct_fallback_reason());
    return;
  }
  CHECK(*rejected);
}

TEST_CASE("a filesystem that refuses O_DIRECT gives buffered I/O and a recorded reason",
          "[swap][direct]") {
  FaultInjector faults;
  faults.refuse_direct_io(EINVAL);  // what tmpfs (before 6.6), ramfs and many FUSE mounts say
  TempDir dir;
  SwapStore store(dir.str(), kTiles, store_options(IoBackendKind::kThreadPool, true, &faults));
  CHECK_FALSE(store.file().direct());
  CHECK_THAT(store.file().direct_fallback_reason(),
             Catch::Contains("refused O_DIRECT") && Catch::Contains("Invalid argument") &&
                 Catch::Contains(dir.str()));
  round_trip(store, 31);
}

TEST_CASE("ramfs, which has no O_DIRECT, falls back for real", "[swap][direct][mount]") {
  std::string why;
  const auto ramfs = ScratchMount::try_mount("ramfs", "", 0, why);
  if (!ramfs) {
    WARN("skipped (the injected refusal covers the fallback): " << why);
    return;
  }
  SwapStore store(ramfs->str(), kTiles, store_options(IoBackendKind::kAuto, true));
  CHECK_FALSE(store.file().direct());
  CHECK_THAT(store.file().direct_fallback_reason(),
             Catch::Contains("refused O_DIRECT") && Catch::Contains("Invalid argument"));
  round_trip(store, 37);
}

TEST_CASE("an empty tile transfers nothing and completes at once", "[swap][roundtrip]") {
  TempDir dir;
  SwapStore store(dir.str(), {{"empty", 0}, {"one", 4096}});
  AlignedBuffer nothing;
  IoHandle handle = store.write_async("empty", nothing);
  CHECK(handle.ready());
  handle.wait();
  CHECK(store.tile("one").offset == 0);
}

// ---------------------------------------------------------------------------------------------
// Concurrency

TEST_CASE("many requests can be in flight at once", "[swap][inflight]") {
  const IoBackendKind kind = GENERATE(from_range(runnable_backends()));
  std::vector<TileSpec> specs;
  for (std::size_t i = 0; i < 64; ++i) {
    specs.push_back({"t" + std::to_string(i), 48 * 1024 + 100 * i});
  }
  TempDir dir;
  SwapStoreOptions options = store_options(kind, true);
  options.aio.block_size = 16 * 1024;
  options.aio.intra_op_parallelism = 4;
  SwapStore store(dir.str(), specs, options);
  INFO("backend " << store.backend_name());
  round_trip(store, 41);
}

TEST_CASE("double buffering: the next tile is read while the previous one is written",
          "[swap][inflight]") {
  const IoBackendKind kind = GENERATE(from_range(runnable_backends()));
  std::vector<TileSpec> specs;
  for (int i = 0; i < 8; ++i) specs.push_back({"sub_group" + std::to_string(i), 256 * 1024});
  TempDir dir;
  SwapStore store(dir.str(), specs, store_options(kind, true));
  std::vector<AlignedBuffer> originals;
  for (const Tile& tile : store.tiles()) {
    originals.emplace_back(tile.bytes);
    fill_random(originals.back(), 50 + static_cast<std::uint32_t>(originals.size()));
    store.write(tile.name, originals.back());
  }
  // Two working buffers: process tile k in one while k+1 is read into the other and k-1 is
  // written back from the first; each step adds 1 to every byte.
  AlignedBuffer buffers[2] = {AlignedBuffer(256 * 1024), AlignedBuffer(256 * 1024)};
  IoHandle reading = store.read_async(specs[0].name, buffers[0]);
  IoHandle writing;
  for (std::size_t k = 0; k < specs.size(); ++k) {
    reading.wait();
    AlignedBuffer& current = buffers[k % 2];
    if (writing.pending()) writing.wait();  // the other buffer is free again
    if (k + 1 < specs.size()) reading = store.read_async(specs[k + 1].name, buffers[(k + 1) % 2]);
    for (std::size_t i = 0; i < current.size(); ++i) {
      current.data()[i] = static_cast<std::byte>(static_cast<unsigned>(current.data()[i]) + 1);
    }
    writing = store.write_async(specs[k].name, current);
  }
  writing.wait();
  for (std::size_t k = 0; k < specs.size(); ++k) {
    AlignedBuffer back(256 * 1024);
    store.read(specs[k].name, back);
    bool incremented = true;
    for (std::size_t i = 0; i < back.size(); ++i) {
      const auto expected =
          static_cast<std::byte>(static_cast<unsigned>(originals[k].data()[i]) + 1);
      incremented = incremented && back.data()[i] == expected;
    }
    INFO("tile " << specs[k].name);
    CHECK(incremented);
  }
}

// ---------------------------------------------------------------------------------------------
// Injected faults: partial transfers, EINTR, EIO, ENOSPC

TEST_CASE("partial transfers continue where they stopped", "[swap][faults]") {
  const IoBackendKind kind = GENERATE(from_range(runnable_backends()));
  const bool direct = GENERATE(true, false);
  FaultInjector faults;
  // O_DIRECT continuations must stay block-aligned; buffered ones may stop anywhere.
  faults.shorten_transfers(direct ? kIoAlignment : 1000);
  TempDir dir;
  SwapStore store(dir.str(), kTiles, store_options(kind, direct, &faults));
  INFO("backend " << store.backend_name() << ", direct " << store.file().direct());
  round_trip(store, 53);
  CHECK(faults.counts().shortened > 100);
}

TEST_CASE("interrupted transfers (EINTR) are retried", "[swap][faults]") {
  const IoBackendKind kind = GENERATE(from_range(runnable_backends()));
  FaultInjector faults;
  faults.interrupt_next(25);
  TempDir dir;
  SwapStore store(dir.str(), kTiles, store_options(kind, true, &faults));
  INFO("backend " << store.backend_name());
  round_trip(store, 59);
  CHECK(faults.counts().interrupts == 25);
}

TEST_CASE("EIO at one offset fails the read with an IoError naming file, offset and errno",
          "[swap][faults]") {
  const IoBackendKind kind = GENERATE(from_range(runnable_backends()));
  FaultInjector faults;
  TempDir dir;
  SwapStore store(dir.str(), kTiles, store_options(kind, true, &faults));
  const Tile& target = store.tile("exp_avg_sq");
  const std::uint64_t bad = target.offset + 200 * 1024;
  faults.fail_at(IoOp::kRead, bad, EIO);
  AlignedBuffer buffer(target.bytes);
  store.write(target.name, buffer);  // writes are unaffected
  IoHandle handle = store.read_async(target.name, buffer);
  try {
    handle.wait();
    FAIL("the read should have failed");
  } catch (const IoError& error) {
    CHECK(error.error_number() == EIO);
    CHECK(error.path() == store.file().path());
    CHECK(error.offset() <= bad);
    CHECK(bad < error.offset() + error.length());
    CHECK_THAT(error.what(), Catch::Contains(store.file().path()) &&
                                 Catch::Contains("offset " + std::to_string(error.offset())) &&
                                 Catch::Contains("Input/output error"));
  }
  CHECK(faults.counts().failures >= 1);
}

TEST_CASE("ENOSPC from a write is an IoError, not an abort", "[swap][faults][enospc]") {
  const IoBackendKind kind = GENERATE(from_range(runnable_backends()));
  FaultInjector faults;
  TempDir dir;
  SwapStore store(dir.str(), kTiles, store_options(kind, true, &faults));
  const Tile& target = store.tile("master");
  faults.fail_at(IoOp::kWrite, target.offset, ENOSPC);
  AlignedBuffer buffer(target.bytes);
  try {
    store.write(target.name, buffer);
    FAIL("the write should have failed");
  } catch (const IoError& error) {
    CHECK(error.error_number() == ENOSPC);
    CHECK(error.offset() == target.offset);
    CHECK_THAT(error.what(), Catch::Contains("No space left on device") &&
                                 Catch::Contains(store.file().path()));
  }
  // The store stays usable for the tiles the "disk" still takes.
  AlignedBuffer other(store.tile("tiny").bytes);
  store.write("tiny", other);
}

TEST_CASE("ENOSPC from preallocation fails the swap file and leaves nothing behind",
          "[swap][faults][enospc]") {
  FaultInjector faults;
  faults.fail_preallocation(ENOSPC);
  TempDir dir;
  SwapFileOptions options;
  options.faults = &faults;
  try {
    SwapFile file(dir.str(), 1 << 20, options);
    FAIL("creating the swap file should have failed");
  } catch (const IoError& error) {
    CHECK(error.error_number() == ENOSPC);
    CHECK_THAT(error.what(), Catch::Contains("posix_fallocate") &&
                                 Catch::Contains("No space left on device") &&
                                 Catch::Contains("is full") && Catch::Contains(dir.str()));
  }
  CHECK(swap_files_in(dir.path()).empty());
}

TEST_CASE("preallocating beyond a tiny tmpfs is ENOSPC", "[swap][enospc][mount]") {
  std::string why;
  const auto tiny = ScratchMount::try_mount("tmpfs", "size=1m", 0, why);
  if (!tiny) {
    WARN("skipped (the injected ENOSPC covers this path): " << why);
    return;
  }
  try {
    SwapFile file(tiny->str(), 4 << 20);
    FAIL("4 MiB should not fit in a 1 MiB tmpfs");
  } catch (const IoError& error) {
    CHECK(error.error_number() == ENOSPC);
    CHECK_THAT(error.what(), Catch::Contains("No space left on device"));
  }
  CHECK(swap_files_in(tiny->str()).empty());
  SwapFile fits(tiny->str(), 512 * 1024);  // and a file that fits still works
  CHECK(fs::exists(fits.path()));
}

// ---------------------------------------------------------------------------------------------
// Creation errors

TEST_CASE("a directory that cannot hold files is an IoError naming the directory",
          "[swap][errors]") {
  // chmod 0500 does not stop root, and these tests may run as root. A path whose parent is a
  // regular file fails with ENOTDIR for every user, root included.
  TempDir dir;
  const fs::path file = dir.path() / "not-a-directory";
  std::ofstream(file) << "x";
  const std::string impossible = (file / "sub").string();
  try {
    SwapFile swap(impossible, 4096);
    FAIL("creating a swap file under a regular file should fail");
  } catch (const IoError& error) {
    CHECK(error.error_number() == ENOTDIR);
    CHECK(error.path() == impossible);
    CHECK_THAT(error.what(), Catch::Contains("cannot create a swap file in directory '" +
                                             impossible + "'") &&
                                 Catch::Contains("Not a directory"));
  }
}

TEST_CASE("a missing directory is an IoError naming it", "[swap][errors]") {
  TempDir dir;
  const std::string missing = (dir.path() / "missing").string();
  CHECK_THROWS_MATCHES(SwapFile(missing, 4096), IoError,
                       Catch::Matchers::Predicate<IoError>(
                           [&](const IoError& e) {
                             return e.error_number() == ENOENT && e.path() == missing;
                           },
                           "ENOENT naming the directory"));
}

TEST_CASE("a read-only filesystem is an IoError even for root", "[swap][errors][mount]") {
  std::string why;
  const auto read_only = ScratchMount::try_mount("tmpfs", "size=1m", MS_RDONLY, why);
  if (!read_only) {
    WARN("skipped (ENOTDIR covers the root-proof case): " << why);
    return;
  }
  try {
    SwapFile swap(read_only->str(), 4096);
    FAIL("a read-only mount should refuse the swap file");
  } catch (const IoError& error) {
    CHECK(error.error_number() == EROFS);
    CHECK_THAT(error.what(), Catch::Contains(read_only->str()));
  }
}

// ---------------------------------------------------------------------------------------------
// Short reads

TEST_CASE("reading a truncated swap file is a short-read IoError naming the offset",
          "[swap][errors][truncate]") {
  const IoBackendKind kind = GENERATE(from_range(runnable_backends()));
  const bool direct = GENERATE(true, false);
  // Cut inside the tile on a block boundary, and off one (O_DIRECT then returns a partial
  // block, which must also be reported as the short read it is, not as EINVAL).
  const std::uint64_t cut_inside = GENERATE(std::uint64_t{64 * 1024}, std::uint64_t{5000});
  TempDir dir;
  SwapStore store(dir.str(), kTiles, store_options(kind, direct));
  const Tile& target = store.tile("exp_avg_sq");
  AlignedBuffer buffer(target.bytes);
  fill_random(buffer, 61);
  store.write(target.name, buffer);
  REQUIRE(::truncate(store.file().path().c_str(),
                     static_cast<off_t>(target.offset + cut_inside)) == 0);
  INFO("backend " << store.backend_name() << ", direct " << store.file().direct() << ", cut at "
                  << target.offset + cut_inside);
  try {
    store.read(target.name, buffer);
    FAIL("reading past the truncation should fail");
  } catch (const IoError& error) {
    CHECK(error.error_number() == 0);
    CHECK(error.offset() <= target.offset + cut_inside);
    CHECK(target.offset + cut_inside < error.offset() + error.length());
    CHECK_THAT(error.what(), Catch::Contains("short read") &&
                                 Catch::Contains(store.file().path()) &&
                                 Catch::Contains("offset " + std::to_string(error.offset())));
  }
}

// ---------------------------------------------------------------------------------------------
// Handles

TEST_CASE("a handle is waited exactly once", "[swap][handle]") {
  TempDir dir;
  SwapStore store(dir.str(), {{"a", 4096}});
  AlignedBuffer buffer(4096);
  IoHandle handle = store.write_async("a", buffer);
  CHECK(handle.pending());
  handle.wait();
  CHECK_FALSE(handle.pending());
  CHECK_THROWS_WITH(handle.wait(), Catch::Contains("already waited"));
  CHECK_THROWS_AS(IoHandle().wait(), std::logic_error);
}

TEST_CASE("dropping an unwaited handle waits for the transfer", "[swap][handle]") {
  TempDir dir;
  SwapStore store(dir.str(), {{"a", 1 << 20}});
  AlignedBuffer written(1 << 20);
  fill_random(written, 67);
  store.write("a", written);
  AlignedBuffer read(1 << 20);
  { IoHandle dropped = store.read_async("a", read); }
  CHECK(same_bytes(written, read, written.size()));
}

TEST_CASE("a failed request whose handle is dropped unwaited is reported on stderr",
          "[swap][handle]") {
  FaultInjector faults;
  TempDir dir;
  SwapStore store(dir.str(), {{"a", 8192}},
                  store_options(IoBackendKind::kThreadPool, true, &faults));
  faults.fail_at(IoOp::kWrite, 0, EIO);
  AlignedBuffer buffer(8192);
  const std::string logged = captured_stderr_of([&] {
    IoHandle dropped = store.write_async("a", buffer);
  });
  CHECK_THAT(logged, Catch::Contains("without wait()") && Catch::Contains("tile 'a'") &&
                         Catch::Contains("Input/output error"));
}

// ---------------------------------------------------------------------------------------------
// Swap file lifetime

TEST_CASE("the swap file is removed on destruction", "[swap][file]") {
  TempDir dir;
  std::string path;
  {
    SwapStore store(dir.str(), kTiles);
    path = store.file().path();
    CHECK(fs::exists(path));
    CHECK(fs::path(path).filename().string().rfind(
              "zero-swap-" + std::to_string(::getpid()) + "-", 0) == 0);
  }
  CHECK_FALSE(fs::exists(path));
  CHECK(swap_files_in(dir.path()).empty());
}

TEST_CASE("a swap file asked to be kept stays", "[swap][file]") {
  TempDir dir;
  std::string path;
  {
    SwapFileOptions options;
    options.keep = true;
    SwapFile file(dir.str(), 4096, options);
    path = file.path();
  }
  CHECK(fs::exists(path));
}

TEST_CASE("swap files get unique names and are preallocated", "[swap][file]") {
  TempDir dir;
  SwapFile first(dir.str(), 3 << 20);
  SwapFile second(dir.str(), 5000);
  CHECK(first.path() != second.path());
  CHECK(fs::path(first.path()).filename() == swap_file_name(::getpid(), 0));
  CHECK(fs::path(second.path()).filename() == swap_file_name(::getpid(), 1));
  CHECK(second.size() == 8192);
  struct stat info {};
  REQUIRE(::stat(first.path().c_str(), &info) == 0);
  CHECK(static_cast<std::uint64_t>(info.st_size) == first.size());
  CHECK(static_cast<std::uint64_t>(info.st_blocks) * 512 >= first.size());  // blocks reserved
}

TEST_CASE("stale swap files of dead processes are cleaned up, live ones kept", "[swap][file]") {
  TempDir dir;
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);  // reaped: the pid is free now
  const auto touch = [&](const std::string& name) { std::ofstream(dir.path() / name) << "x"; };
  touch(swap_file_name(child, 0));
  touch(swap_file_name(child, 3));
  touch(swap_file_name(::getpid(), 9));  // ours: alive
  touch(swap_file_name(1, 0));           // init: alive
  touch("zero-swap-notapid-0.bin");      // not our naming scheme: never touched
  touch("notes.txt");
  const std::vector<std::string> removed = cleanup_stale_swap_files(dir.str());
  CHECK(removed.size() == 2);
  const std::set<std::string> left = [&] {
    std::set<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir.path())) {
      names.insert(entry.path().filename().string());
    }
    return names;
  }();
  CHECK(left == std::set<std::string>{swap_file_name(::getpid(), 9), swap_file_name(1, 0),
                                      "zero-swap-notapid-0.bin", "notes.txt"});
}

TEST_CASE("stale cleanup of a missing directory is an IoError naming it", "[swap][file]") {
  TempDir dir;
  const std::string missing = (dir.path() / "missing").string();
  CHECK_THROWS_WITH(cleanup_stale_swap_files(missing),
                    Catch::Contains("'" + missing + "'") && Catch::Contains("No such file"));
}

// ---------------------------------------------------------------------------------------------
// Arguments and configuration

TEST_CASE("misaligned or short buffers are rejected before any I/O", "[swap][args]") {
  TempDir dir;
  SwapStore store(dir.str(), {{"a", 5000}});
  AlignedBuffer big(3 * kIoAlignment);
  CHECK_THROWS_WITH(store.write_async("a", big.data() + 512, 8192),
                    Catch::Contains("not aligned to 4096") && Catch::Contains("AlignedBuffer"));
  CHECK_THROWS_WITH(store.read_async("a", big.data(), 4096),
                    Catch::Contains("at least 8192 bytes"));
}

TEST_CASE("an unknown tile name is an error listing the tiles", "[swap][args]") {
  TempDir dir;
  SwapStore store(dir.str(), {{"a", 5000}, {"c", 1}});
  AlignedBuffer buffer(4096);
  CHECK_THROWS_WITH(store.write_async("b", buffer),
                    Catch::Contains("no tile named 'b'") && Catch::Contains("'a', 'c'"));
  CHECK_THROWS_WITH(SwapStore(dir.str(), {{"a", 1}, {"a", 2}}), Catch::Contains("used twice"));
}

TEST_CASE("O_DIRECT requests with misaligned offset or length are invalid", "[swap][args]") {
  IoThreadPool pool(AioConfig{});
  AlignedBuffer buffer(8192);
  IoRequest request;
  request.fd = 0;
  request.path = "x.bin";
  request.buffer = buffer.data();
  request.length = 4096;
  request.direct = true;
  request.offset = 100;
  CHECK_THROWS_WITH(pool.submit(request), Catch::Contains("file offset 100"));
  request.offset = 0;
  request.length = 1000;
  CHECK_THROWS_WITH(pool.submit(request), Catch::Contains("length 1000"));
  request.length = 4096;
  request.buffer = buffer.data() + 8;
  CHECK_THROWS_WITH(pool.submit(request), Catch::Contains("buffer address"));
}

TEST_CASE("aio settings are validated naming the key", "[swap][args]") {
  AioConfig config;
  config.block_size = 1000;
  CHECK_THROWS_WITH(config.validate(), Catch::Contains("aio.block_size"));
  config = AioConfig{};
  config.queue_depth = 0;
  CHECK_THROWS_WITH(config.validate(), Catch::Contains("aio.queue_depth"));
  config = AioConfig{};
  config.intra_op_parallelism = 0;
  CHECK_THROWS_WITH(config.validate(), Catch::Contains("aio.intra_op_parallelism"));
}

TEST_CASE("backend names parse, and unknown ones list the valid names", "[swap][args]") {
  CHECK(parse_backend_kind("io_uring") == IoBackendKind::kIoUring);
  CHECK(parse_backend_kind("thread_pool") == IoBackendKind::kThreadPool);
  CHECK_THROWS_WITH(parse_backend_kind("libaio"), Catch::Contains("thread_pool"));
}

TEST_CASE("the auto backend is io_uring or says why not", "[swap][backend]") {
  const IoBackendChoice choice = make_io_backend(AioConfig{}, IoBackendKind::kAuto);
  INFO("auto chose " << choice.backend->name() << "; fallback: " << choice.fallback_reason);
  if (std::string(choice.backend->name()) == "io_uring") {
    CHECK(choice.fallback_reason.empty());
  } else {
    CHECK_FALSE(choice.fallback_reason.empty());
  }
  if (!io_uring_compiled()) {
    CHECK_THROWS_WITH(make_io_backend(AioConfig{}, IoBackendKind::kIoUring),
                      Catch::Contains("liburing"));
  }
}
