// Swap files and swap I/O configuration: file lifetime, naming, preallocation and stale cleanup;
// argument checks, aio settings and the backend choice.

#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/io_thread_pool.h"
#include "swap_io_fixtures.h"

using namespace zero::core;
using namespace swap_io_fixtures;  // and fs = std::filesystem

// ---------------------------------------------------------------------------------------------
// Swap file lifetime

TEST_CASE("a swap file has no name while it is open and is gone when closed", "[swap][file]") {
  TempDir dir;
  std::string path;
  {
    SwapStore store(dir.str(), kTiles);
    path = store.file().path();
    CHECK(fs::path(path).filename().string().rfind(
              "zero-swap-" + std::to_string(::getpid()) + "-", 0) == 0);
    CHECK_FALSE(store.file().linked());
    CHECK_FALSE(fs::exists(path));
    CHECK(fs::exists(store.file().open_path()));  // the descriptor is the file
    CHECK(swap_files_in(dir.path()).empty());
  }
  CHECK(swap_files_in(dir.path()).empty());
}

TEST_CASE("a process that dies holding a swap file leaves nothing on disk", "[swap][file]") {
  TempDir dir;
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // no destructor runs: as after SIGKILL or a crash
    SwapFile file(dir.str(), 1 << 20);
    ::_exit(file.linked() ? 1 : 0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK(fs::is_empty(dir.path()));
}

TEST_CASE("a swap file asked to be kept stays", "[swap][file]") {
  TempDir dir;
  std::string path;
  {
    SwapFileOptions options;
    options.keep = true;
    SwapFile file(dir.str(), 4096, options);
    path = file.path();
    CHECK(file.linked());
  }
  CHECK(fs::exists(path));
}

TEST_CASE("swap files get unique names and are preallocated", "[swap][file]") {
  TempDir dir;
  SwapFileOptions kept;
  kept.keep = true;
  SwapFile first(dir.str(), 3 << 20, kept);
  SwapFile unnamed(dir.str(), 5000);  // its name is gone from the directory at once ...
  SwapFile second(dir.str(), 5000);   // ... and still not given to the next file
  const auto number = [](const SwapFile& file) {
    const std::string name = fs::path(file.path()).filename().string();
    const std::string prefix = "zero-swap-" + std::to_string(::getpid()) + "-";
    REQUIRE(name.rfind(prefix, 0) == 0);
    return std::stoull(name.substr(prefix.size()));
  };
  CHECK(number(first) < number(unnamed));
  CHECK(number(unnamed) < number(second));
  CHECK(second.size() == 8192);
  struct stat info {};
  REQUIRE(::fstat(first.fd(), &info) == 0);
  CHECK(static_cast<std::uint64_t>(info.st_size) == first.size());
  CHECK(static_cast<std::uint64_t>(info.st_blocks) * 512 >= first.size());  // blocks reserved
  fs::remove(first.path());
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
