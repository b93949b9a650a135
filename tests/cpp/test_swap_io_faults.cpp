// Swap I/O failures: injected faults (partial transfers, EINTR, EIO, ENOSPC), creation errors
// and short reads, each an IoError naming what failed.

#include <catch2/catch.hpp>

#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <fstream>
#include <string>

#include "swap_io_fixtures.h"

using namespace zero::core;
using namespace swap_io_fixtures;  // and fs = std::filesystem

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
                                 Catch::Contains("is full") && Catch::Contains(dir.str()) &&
                                 Catch::Contains("needs 1048576 bytes") &&
                                 Catch::Contains("are available"));
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
  CHECK(fs::exists(fits.open_path()));
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
  REQUIRE(::truncate(store.file().open_path().c_str(),
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
