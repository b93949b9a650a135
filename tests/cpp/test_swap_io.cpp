// Swap I/O data path: aligned buffers, round trips (O_DIRECT and buffered), concurrency, handles.

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "swap_io_fixtures.h"

using namespace zero::core;
using namespace swap_io_fixtures;  // and fs = std::filesystem

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
