#include <catch2/catch.hpp>

#include <stdexcept>
#include <thread>
#include <vector>

#include "core/task_worker.h"

using zero::core::TaskWorker;

TEST_CASE("task worker runs jobs in submission order on another thread", "[task_worker]") {
  TaskWorker worker;
  std::vector<int> order;
  std::thread::id ran_on;
  std::vector<std::shared_future<void>> done;
  for (int i = 0; i < 50; ++i) {
    done.push_back(worker.submit([&order, &ran_on, i] {
      order.push_back(i);
      ran_on = std::this_thread::get_id();
    }));
  }
  for (auto& d : done) d.wait();
  REQUIRE(order.size() == 50);
  for (int i = 0; i < 50; ++i) REQUIRE(order[i] == i);
  REQUIRE(ran_on != std::this_thread::get_id());
}

TEST_CASE("a job's exception reaches its waiter and later jobs still run", "[task_worker]") {
  TaskWorker worker;
  auto failing = worker.submit([] { throw std::runtime_error("copy failed"); });
  bool later_ran = false;
  auto later = worker.submit([&] { later_ran = true; });
  REQUIRE_THROWS_WITH(failing.get(), "copy failed");
  later.get();
  REQUIRE(later_ran);
}

TEST_CASE("destroying the worker finishes what was queued", "[task_worker]") {
  int count = 0;
  {
    TaskWorker worker;
    for (int i = 0; i < 20; ++i) worker.submit([&count] { ++count; });
  }
  REQUIRE(count == 20);
}
