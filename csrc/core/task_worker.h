#pragma once
// One background thread that runs submitted jobs in submission order: the copy engine of
// offloaded steps on CPU builds (and the host side of copies on GPU builds), so the copies of
// one tile overlap the optimizer's work on another. A job's exception reaches whoever waits
// on its future; the destructor finishes queued jobs and joins.
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

namespace zero::core {

class TaskWorker {
 public:
  TaskWorker();
  TaskWorker(const TaskWorker&) = delete;
  TaskWorker& operator=(const TaskWorker&) = delete;
  ~TaskWorker();

  std::shared_future<void> submit(std::function<void()> job);

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after the queue exists
};

}  // namespace zero::core
