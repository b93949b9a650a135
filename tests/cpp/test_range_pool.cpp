#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <cstdint>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "core/range_pool.h"

using zero::core::RangePool;

namespace {

// The ranges one run hands out, sorted, and the threads that ran them.
struct Ranges {
  std::mutex mutex;
  std::set<std::pair<std::int64_t, std::int64_t>> ranges;
  std::set<std::thread::id> threads;
  void add(std::int64_t begin, std::int64_t end) {
    std::lock_guard<std::mutex> lock(mutex);
    ranges.emplace(begin, end);
    threads.insert(std::this_thread::get_id());
  }
};

// Spins until `count` reaches `want` or 10 s pass: a broken pool fails the test, not hangs it.
bool wait_for(const std::atomic<int>& count, int want) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (count.load() < want) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

bool cover_once(const std::set<std::pair<std::int64_t, std::int64_t>>& ranges, std::int64_t n) {
  std::int64_t next = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin != next || end <= begin) return false;
    next = end;
  }
  return next == n;
}

}  // namespace

// This process's threads (Linux: one entry each under /proc/self/task).
std::ptrdiff_t thread_count() {
  const std::filesystem::directory_iterator tasks("/proc/self/task");
  return std::distance(std::filesystem::begin(tasks), std::filesystem::end(tasks));
}

TEST_CASE("a pool starts its threads at the first run that splits", "[range_pool]") {
  const std::ptrdiff_t before = thread_count();
  RangePool pool(4);
  REQUIRE(thread_count() == before);
  pool.run(100, 1000, [](std::int64_t, std::int64_t) {});  // one range: the caller's
  REQUIRE(thread_count() == before);
  pool.run(100'000, 1000, [](std::int64_t, std::int64_t) {});
  REQUIRE(thread_count() == before + 3);
}

TEST_CASE("a run covers the range once, split over every thread", "[range_pool]") {
  RangePool pool(4);
  REQUIRE(pool.threads() == 4);
  Ranges seen;
  // Each range waits until all four have started: only four threads at once can finish it.
  std::atomic<int> started{0};
  std::atomic<int> together{0};
  pool.run(1'000'000, 1000, [&](std::int64_t begin, std::int64_t end) {
    seen.add(begin, end);
    ++started;
    if (wait_for(started, 4)) ++together;
  });
  REQUIRE(together.load() == 4);
  REQUIRE(seen.ranges.size() == 4);
  REQUIRE(seen.threads.size() == 4);
  REQUIRE(seen.threads.count(std::this_thread::get_id()) == 1);  // the caller takes one
  REQUIRE(cover_once(seen.ranges, 1'000'000));
  for (const auto& range : seen.ranges) REQUIRE(range.first % 64 == 0);
}

TEST_CASE("the same threads run every call", "[range_pool]") {
  // A thread's own count of the ranges it ran: threads made per call would start at 0 again.
  static thread_local int ranges_here = 0;
  RangePool pool(3);
  std::mutex mutex;
  std::vector<int> last_counts;  // each thread's count in the last call
  for (int call = 1; call <= 200; ++call) {
    std::atomic<int> started{0};
    pool.run(3000, 1, [&](std::int64_t, std::int64_t) {
      ++ranges_here;
      if (call == 200) {
        std::lock_guard<std::mutex> lock(mutex);
        last_counts.push_back(ranges_here);
      }
      ++started;
      wait_for(started, 3);  // every range on its own thread
    });
  }
  REQUIRE(last_counts == std::vector<int>{200, 200, 200});
}

TEST_CASE("workers without a range of their own sit a run out", "[range_pool]") {
  RangePool pool(8);
  for (int call = 0; call < 100; ++call) {
    Ranges seen;
    pool.run(100, 1, [&](std::int64_t b, std::int64_t e) { seen.add(b, e); });
    REQUIRE(seen.ranges.size() == 2);  // shares of 64 (the alignment): [0, 64), [64, 100)
    REQUIRE(cover_once(seen.ranges, 100));
  }
}

TEST_CASE("an error in the caller's range is rethrown after the workers' ranges finish",
          "[range_pool]") {
  RangePool pool(3);
  std::atomic<int> finished{0};
  REQUIRE_THROWS_WITH(pool.run(3 * 64, 1,
                               [&](std::int64_t begin, std::int64_t) {
                                 if (begin == 0) throw std::runtime_error("first range");
                                 ++finished;
                               }),
                      "first range");
  REQUIRE(finished.load() == 2);
}

TEST_CASE("a small range is not split below its least share", "[range_pool]") {
  RangePool pool(8);
  Ranges seen;
  pool.run(100, 64, [&](std::int64_t b, std::int64_t e) { seen.add(b, e); }, /*align=*/1);
  REQUIRE(seen.ranges.size() == 1);
  REQUIRE(cover_once(seen.ranges, 100));
  Ranges none;
  pool.run(0, 1, [&](std::int64_t b, std::int64_t e) { none.add(b, e); });
  REQUIRE(none.ranges.empty());
}

TEST_CASE("an error in a worker's range is rethrown once every range has finished",
          "[range_pool]") {
  RangePool pool(4);
  std::atomic<int> finished{0};
  REQUIRE_THROWS_WITH(pool.run(4096, 1,
                               [&](std::int64_t begin, std::int64_t) {
                                 if (begin > 0 && begin < 4096 / 4 + 64) {
                                   throw std::runtime_error("range failed");
                                 }
                                 ++finished;
                               }),
                      "range failed");
  REQUIRE(finished.load() == 3);
  // The pool still works afterwards.
  Ranges seen;
  pool.run(4096, 1, [&](std::int64_t b, std::int64_t e) { seen.add(b, e); });
  REQUIRE(cover_once(seen.ranges, 4096));
}

TEST_CASE("one thread runs the whole range on the caller", "[range_pool]") {
  RangePool pool(1);
  Ranges seen;
  pool.run(1'000'000, 1, [&](std::int64_t b, std::int64_t e) { seen.add(b, e); });
  REQUIRE(seen.ranges.size() == 1);
  REQUIRE(*seen.threads.begin() == std::this_thread::get_id());
}
