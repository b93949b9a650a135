#include "core/range_pool.h"

#include <algorithm>
#include <system_error>

namespace zero::core {

RangePool::RangePool(int threads) : threads_(std::max(threads, 1)) {
  // What the workers need, allocated before any starts (start_workers then allocates nothing
  // of its own).
  errors_.resize(static_cast<std::size_t>(threads_));
  workers_.reserve(static_cast<std::size_t>(threads_ - 1));
}

void RangePool::start_workers() {
  started_ = true;
  for (int index = 1; index < threads_; ++index) {
    try {
      workers_.emplace_back(&RangePool::work, this, index, generation_);
    } catch (const std::system_error&) {
      break;  // out of threads: the ones started, and the caller, do the work
    }
  }
}

RangePool::~RangePool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void RangePool::run_range(int index) {
  const std::int64_t begin = index * share_;
  if (begin >= n_) return;
  try {
    (*fn_)(begin, std::min(n_, begin + share_));
  } catch (...) {
    errors_[static_cast<std::size_t>(index)] = std::current_exception();
  }
}

void RangePool::work(int index, std::uint64_t seen) {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
    }
    run_range(index);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

void RangePool::run(std::int64_t n, std::int64_t least, const RangeFn& fn, std::int64_t align) {
  if (n <= 0) return;
  std::lock_guard<std::mutex> one_run(run_mutex_);
  align = std::max<std::int64_t>(align, 1);
  std::int64_t ranges_wanted = std::clamp<std::int64_t>(n / std::max<std::int64_t>(least, 1), 1,
                                                        threads_);
  if (ranges_wanted > 1 && !started_) start_workers();
  ranges_wanted = std::min<std::int64_t>(ranges_wanted,
                                         static_cast<std::int64_t>(workers_.size()) + 1);
  std::int64_t share = (n + ranges_wanted - 1) / ranges_wanted;
  share = (share + align - 1) / align * align;
  if (share >= n || workers_.empty()) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = &fn;
    n_ = n;
    share_ = share;
    std::fill(errors_.begin(), errors_.end(), nullptr);
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  run_range(0);
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    fn_ = nullptr;
  }
  for (const std::exception_ptr& error : errors_) {
    if (error) std::rethrow_exception(error);
  }
}

}  // namespace zero::core
