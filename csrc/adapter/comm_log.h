#pragma once
// The comms logger's record of the collectives an engine issues (DeepSpeed's `comms_logger`
// block). Off by default: a Communicator only keeps records while its log is enabled, so the
// cost when off is one branch per collective.
//
// A record is made when a collective completes. Its latency runs from the launch to the
// completion: on CPU (gloo) the moment the work's future completes, on the work's worker
// thread, however late the engine waits; elsewhere the moment wait() returns.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace zero::adapter {

enum class CollectiveOp { kAllGather, kReduceScatter, kAllReduce, kBroadcast };

struct CollectiveRecord {
  CollectiveOp op = CollectiveOp::kAllReduce;
  // The buffer the collective is about: the full (gathered / reduced) buffer of an all-gather
  // or reduce-scatter, the tensor of an all-reduce or broadcast.
  std::int64_t message_bytes = 0;
  double latency_ms = 0.0;
  bool control = false;  // rank agreement, launch order: not model payload
  std::string label;     // what the engine was doing at launch (CommLog::set_label)
};

class CommLog {
 public:
  using Clock = std::chrono::steady_clock;

  void set_enabled(bool enabled);
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  // Attached to the records of collectives launched from now on (e.g. "forward").
  void set_label(std::string label);
  std::string label() const;

  void add(CollectiveRecord record);
  // The records made since the last drain, oldest first; the log keeps none of them.
  std::vector<CollectiveRecord> drain();

 private:
  std::atomic<bool> enabled_{false};
  mutable std::mutex mutex_;
  std::string label_;
  std::vector<CollectiveRecord> records_;
};

// What a pending collective needs to leave its record: started at construction, finished by
// complete() (the first call wins), added to the log by commit().
class CollectiveTiming {
 public:
  CollectiveTiming(std::shared_ptr<CommLog> log, CollectiveRecord record);
  void complete();  // thread-safe; stamps the completion time once
  void commit();    // on the waiting thread, after the work is done

 private:
  std::shared_ptr<CommLog> log_;
  CollectiveRecord record_;
  CommLog::Clock::time_point start_;
  std::atomic<std::int64_t> end_ns_{0};
};

}  // namespace zero::adapter
