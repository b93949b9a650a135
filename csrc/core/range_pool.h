#pragma once
// Threads that stay alive across calls and split one range of work among themselves: the host
// Adam of an offloaded step runs a few hundred chunks a step, and threads started per chunk
// cost a good part of a chunk's own time. (torch's at::parallel_for is no substitute here: it
// is a header template, parallel only in code compiled with -fopenmp, and this extension is
// not; from 3cd3642 to this pool the offloaded step's CPU Adam ran on one thread, 5.3x slower
// on an H200's 16-core host.)
//
// run() is for one caller at a time (a second waits for the first); the caller's own thread
// takes the first range. The workers start at the first run that splits its range, so an
// engine whose steps never use the pool has no threads for it. A range must not call run()
// on its own pool (it would wait on itself). The destructor joins the workers. As the other
// thread owners here (TaskWorker), a pool is not for a forked child: its workers stay in the
// parent.
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace zero::core {

class RangePool {
 public:
  using RangeFn = std::function<void(std::int64_t begin, std::int64_t end)>;

  // threads >= 1: the caller plus threads - 1 workers (fewer if the system refuses threads).
  explicit RangePool(int threads);
  RangePool(const RangePool&) = delete;
  RangePool& operator=(const RangePool&) = delete;
  ~RangePool();

  int threads() const { return threads_; }

  // Calls fn on contiguous ranges that cover [0, n) once: at most threads() of them, each at
  // least `least` elements (but the last), their starts multiples of `align`. Returns when every
  // range is done; an exception from any range is rethrown here (the first range's first).
  void run(std::int64_t n, std::int64_t least, const RangeFn& fn, std::int64_t align = 64);

 private:
  void start_workers();  // under run_mutex_
  // Worker `index` (1-based: range 0 is the caller's), started after run `seen`.
  void work(int index, std::uint64_t seen);
  void run_range(int index);

  const int threads_;
  bool started_ = false;  // the workers were started (as many as the system gave)

  std::mutex run_mutex_;  // one run at a time
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::uint64_t generation_ = 0;  // bumped per run: the workers' signal to start
  bool stopping_ = false;
  int pending_ = 0;               // workers with a range of the current run not yet done
  // The current run, read by the workers between its wake and its done.
  const RangeFn* fn_ = nullptr;
  std::int64_t n_ = 0;
  std::int64_t share_ = 0;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> workers_;  // last: they start after the rest exists
};

}  // namespace zero::core
