#include <catch2/catch.hpp>

#include <atomic>
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

bool cover_once(const std::set<std::pair<std::int64_t, std::int64_t>>& ranges, std::int64_t n) {
  std::int64_t next = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin != next || end <= begin) return false;
    next = end;
  }
  return next == n;
}

}  // namespace

TEST_CASE("a run covers the range once, split over every thread", "[range_pool]") {
  RangePool pool(4);
  REQUIRE(pool.threads() == 4);
  Ranges seen;
  // Each range waits until all four have started: only four threads at once can finish it.
  std::atomic<int> started{0};
  pool.run(1'000'000, 1000, [&](std::int64_t begin, std::int64_t end) {
    seen.add(begin, end);
    ++started;
    while (started.load() < 4) std::this_thread::yield();
  });
  REQUIRE(seen.ranges.size() == 4);
  REQUIRE(seen.threads.size() == 4);
  REQUIRE(seen.threads.count(std::this_thread::get_id()) == 1);  // the caller takes one
  REQUIRE(cover_once(seen.ranges, 1'000'000));
  for (const auto& range : seen.ranges) REQUIRE(range.first % 64 == 0);
}

TEST_CASE("the same threads run every call", "[range_pool]") {
  RangePool pool(3);
  Ranges first, second;
  std::atomic<int> started{0};
  auto wait_for_three = [&started] {
    ++started;
    while (started.load() % 3 != 0) std::this_thread::yield();
  };
  pool.run(3000, 1, [&](std::int64_t b, std::int64_t e) { first.add(b, e); wait_for_three(); });
  pool.run(3000, 1, [&](std::int64_t b, std::int64_t e) { second.add(b, e); wait_for_three(); });
  REQUIRE(first.threads.size() == 3);
  REQUIRE(first.threads == second.threads);
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
