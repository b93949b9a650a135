#pragma once
// Flat-buffer collectives issued from C++ through a c10d::ProcessGroup. The same calls serve
// CPU tensors on gloo and CUDA tensors on NCCL: ProcessGroup dispatches on the tensor's device.
//
// Every call returns a PendingCollective that keeps its tensors alive until the work is
// waited; its destructor waits too, so no collective is ever left unwaited.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "adapter/comm_log.h"

namespace zero::adapter {

enum class Reduction { kSum, kAvg, kMax, kMin };
Reduction parse_reduction(const std::string& name);

// Payload bytes, counted the way the ZeRO paper counts volume: an all-gather or a
// reduce-scatter of a buffer of B bytes moves B, an all-reduce 2B, a broadcast B. Control
// messages (rank agreement on event order, the learned launch order) are counted apart so
// the payload can be compared with the paper's formulas.
struct CommStats {
  std::int64_t all_gather_bytes = 0;
  std::int64_t reduce_scatter_bytes = 0;
  std::int64_t all_reduce_bytes = 0;
  std::int64_t broadcast_bytes = 0;
  std::int64_t calls = 0;
  std::int64_t control_bytes = 0;
  std::int64_t control_calls = 0;
  std::int64_t total_bytes() const {
    return all_gather_bytes + reduce_scatter_bytes + all_reduce_bytes + broadcast_bytes;
  }
  CommStats& operator+=(const CommStats& other) {
    all_gather_bytes += other.all_gather_bytes;
    reduce_scatter_bytes += other.reduce_scatter_bytes;
    all_reduce_bytes += other.all_reduce_bytes;
    broadcast_bytes += other.broadcast_bytes;
    calls += other.calls;
    control_bytes += other.control_bytes;
    control_calls += other.control_calls;
    return *this;
  }
};

class PendingCollective {
 public:
  PendingCollective(std::string description, c10::intrusive_ptr<c10d::Work> work,
                    std::vector<at::Tensor> keep_alive, std::function<void()> on_complete = {},
                    std::shared_ptr<CollectiveTiming> timing = nullptr);
  PendingCollective(const PendingCollective&) = delete;
  PendingCollective& operator=(const PendingCollective&) = delete;
  ~PendingCollective();

  // Blocks until done; idempotent. A failure or timeout is rethrown naming the operation, and
  // again at every later wait: a failed collective's buffers never count as its result.
  void wait();
  bool completed() const { return waited_ && failure_.empty(); }

 private:
  std::string description_;
  c10::intrusive_ptr<c10d::Work> work_;
  std::vector<at::Tensor> keep_alive_;
  std::function<void()> on_complete_;
  std::shared_ptr<CollectiveTiming> timing_;  // set while the comms logger is on
  bool waited_ = false;
  std::string failure_;  // set when the wait failed
};

class Communicator {
 public:
  // average_over: what a mean (Reduction::kAvg) divides the sum by; 0: the group's size.
  // DeepSpeed-MoE's expert gradients are summed over the few ranks holding the same experts
  // and divided by the whole data-parallel world, so their value does not change with ep_size.
  explicit Communicator(c10::intrusive_ptr<c10d::ProcessGroup> group, int average_over = 0);

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const CommStats& stats() const { return stats_; }
  // Lets go of the process group (EngineCore::close, without the GIL): the engine must not
  // hold the last reference to a group the script has destroyed, or that group's teardown
  // would run wherever the engine is dropped, possibly under the GIL that gloo's workers need.
  // A collective after this is an error.
  void release() { group_.reset(); }
  void reset_stats() { stats_ = CommStats{}; }
  // The comms logger's records (off until enabled); shared with the pending collectives.
  CommLog& log() { return *log_; }

  // full (world_size * shard.numel() elements) <- every rank's shard, in rank order.
  // on_complete runs after the wait (quantized_comm.h decodes there).
  std::unique_ptr<PendingCollective> all_gather(at::Tensor full, at::Tensor shard,
                                                bool control = false,
                                                std::function<void()> on_complete = {});
  // The same result as all_gather, by an all-reduce (sum) of `full` zeroed but for this
  // rank's slice (DeepSpeed's stage3_use_all_reduce_for_fetch_params, for networks where
  // all-reduce is the faster collective); counted as the all-reduce it is.
  std::unique_ptr<PendingCollective> all_gather_by_all_reduce(at::Tensor full, at::Tensor shard);
  // shard <- this rank's slice of the reduction of every rank's full buffer. On the host a
  // sum or mean is an all-to-all and a local sum (host_reduce_scatter).
  std::unique_ptr<PendingCollective> reduce_scatter(at::Tensor shard, at::Tensor full,
                                                    Reduction reduction = Reduction::kSum);
  std::unique_ptr<PendingCollective> all_reduce(at::Tensor tensor,
                                                Reduction reduction = Reduction::kSum,
                                                bool control = false);
  std::unique_ptr<PendingCollective> broadcast(at::Tensor tensor, int root, bool control = false);
  // The all-to-all a quantized reduce-scatter is made of (quantized_comm.h): piece r of `in`
  // goes to rank r, piece s of `out` comes from rank s (equal pieces); on_complete runs after
  // the wait. Counted as reduce-scatter payload, `in`'s bytes, like reduce_scatter's full buffer.
  std::unique_ptr<PendingCollective> exchange(at::Tensor out, at::Tensor in,
                                              std::function<void()> on_complete);

 private:
  c10d::ProcessGroup& group() const;
  std::unique_ptr<PendingCollective> host_reduce_scatter(at::Tensor shard, at::Tensor full,
                                                         Reduction reduction);
  std::string describe(const char* op, const at::Tensor& tensor) const;
  void count(std::int64_t& payload, std::int64_t bytes, bool control);
  // A timing for the comms logger when it is on (else null), finished by the work's future
  // on CPU or by the wait.
  std::shared_ptr<CollectiveTiming> timing(CollectiveOp op, std::int64_t bytes, bool control,
                                           const c10::intrusive_ptr<c10d::Work>& work,
                                           const at::Tensor& tensor) const;

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  int rank_;
  int world_size_;
  int average_over_;  // a mean's divisor
  CommStats stats_;
  std::shared_ptr<CommLog> log_ = std::make_shared<CommLog>();
};

}  // namespace zero::adapter
