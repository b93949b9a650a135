#include "adapter/collectives.h"

#include "adapter/c10d_compat.h"

#include <sstream>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "adapter/errors.h"

namespace zero::adapter {
namespace {

void check_flat(const char* op, const char* role, const at::Tensor& tensor) {
  TORCH_CHECK(tensor.defined(), "zero ", op, ": the ", role, " tensor is undefined");
  TORCH_CHECK(tensor.is_contiguous(), "zero ", op, ": the ", role,
              " tensor must be contiguous (flat buffers are); call .contiguous() first");
}

void check_pair(const char* op, const at::Tensor& full, const at::Tensor& shard, int world_size) {
  check_flat(op, "full", full);
  check_flat(op, "shard", shard);
  TORCH_CHECK(full.scalar_type() == shard.scalar_type(), "zero ", op, ": full buffer is ",
              full.scalar_type(), " but shard is ", shard.scalar_type(), "; use one dtype");
  TORCH_CHECK(full.device() == shard.device(), "zero ", op, ": full buffer is on ",
              full.device(), " but shard is on ", shard.device());
  TORCH_CHECK(full.numel() == shard.numel() * world_size, "zero ", op, ": full buffer has ",
              full.numel(), " elements but shard has ", shard.numel(), " and world size is ",
              world_size, "; the full buffer must have exactly ", shard.numel() * world_size,
              " (shard size x world size)");
}

c10d::ReduceOp to_c10d(Reduction reduction) {
  switch (reduction) {
    case Reduction::kSum:
    case Reduction::kAvg:  // gloo has no AVG: sum, then divide after the wait
      return c10d::ReduceOp::SUM;
    case Reduction::kMax: return c10d::ReduceOp::MAX;
    case Reduction::kMin: return c10d::ReduceOp::MIN;
  }
  TORCH_CHECK(false, "zero: unknown reduction");
}

// A mean is a SUM divided by `divisor`: after the wait, or for fp16 before the collective, in
// `input`, as DeepSpeed divides: fp16's range ends at 65504, and the ranks' sum may pass it
// where every rank's value and their mean fit (an overflow no rank had, skipping the step).
// Called before the collective is launched; returns what finishes the mean after the wait.
std::function<void()> averaging(Reduction reduction, at::Tensor input, at::Tensor result,
                                int divisor) {
  if (reduction != Reduction::kAvg) return {};
  if (input.scalar_type() == at::kHalf) {
    input.div_(divisor);
    return {};
  }
  return [result, divisor]() mutable { result.div_(divisor); };
}

std::int64_t nbytes(const at::Tensor& tensor) {
  return tensor.numel() * static_cast<std::int64_t>(tensor.element_size());
}

}  // namespace

Reduction parse_reduction(const std::string& name) {
  if (name == "sum") return Reduction::kSum;
  if (name == "avg") return Reduction::kAvg;
  if (name == "max") return Reduction::kMax;
  if (name == "min") return Reduction::kMin;
  TORCH_CHECK(false, "zero: unknown reduction '", name, "'; expected sum, avg, max or min");
}

PendingCollective::PendingCollective(std::string description, c10::intrusive_ptr<c10d::Work> work,
                                     std::vector<at::Tensor> keep_alive,
                                     std::function<void()> on_complete,
                                     std::shared_ptr<CollectiveTiming> timing)
    : description_(std::move(description)),
      work_(std::move(work)),
      keep_alive_(std::move(keep_alive)),
      on_complete_(std::move(on_complete)),
      timing_(std::move(timing)) {}

PendingCollective::~PendingCollective() {
  if (waited_) return;
  try {
    wait();
  } catch (...) {
    // A destructor must not throw; the owner that cared about the result called wait().
  }
}

void PendingCollective::wait() {
  if (waited_) {
    TORCH_CHECK(failure_.empty(), failure_);
    return;
  }
  waited_ = true;
  try {
    if (work_) work_->wait();  // (none: done locally, Communicator::all_gather on one rank)
  } catch (const std::exception& error) {
    keep_alive_.clear();
    failure_ = "zero: " + description_ + " failed: " + message_of(error);
    TORCH_CHECK(false, failure_);
  }
  if (timing_) timing_->commit();
  if (on_complete_) on_complete_();
  keep_alive_.clear();
}

Communicator::Communicator(c10::intrusive_ptr<c10d::ProcessGroup> group, int average_over)
    : group_(std::move(group)),
      rank_(group_->getRank()),
      world_size_(group_->getSize()),
      average_over_(average_over > 0 ? average_over : world_size_) {}

c10d::ProcessGroup& Communicator::group() const {
  TORCH_CHECK(group_, "zero: this engine was closed (engine.destroy()); it has no process group "
              "any more: build a new engine to train again");
  return *group_;
}

std::string Communicator::describe(const char* op, const at::Tensor& tensor) const {
  std::ostringstream out;
  out << op << " of " << tensor.numel() << " " << tensor.scalar_type() << " elements on rank "
      << rank_ << " of " << world_size_;
  return out.str();
}

void Communicator::count(std::int64_t& payload, std::int64_t bytes, bool control) {
  if (control) {
    stats_.control_bytes += bytes;
    ++stats_.control_calls;
  } else {
    payload += bytes;
    ++stats_.calls;
  }
}

std::shared_ptr<CollectiveTiming> Communicator::timing(CollectiveOp op, std::int64_t bytes,
                                                      bool control,
                                                      const c10::intrusive_ptr<c10d::Work>& work,
                                                      const at::Tensor& tensor) const {
  if (!log_->enabled()) return nullptr;
  CollectiveRecord record;
  record.op = op;
  record.message_bytes = bytes;
  record.control = control;
  record.label = log_->label();
  auto timing = std::make_shared<CollectiveTiming>(log_, std::move(record));
  if (tensor.is_cpu()) {
    // gloo completes the work's future on its worker thread, when the data has arrived.
    try {
      work->getFuture()->addCallback([timing](c10::ivalue::Future&) { timing->complete(); });
    } catch (const std::exception&) {
      // no future for this backend: the wait stamps the completion instead
    }
  }
  return timing;
}

std::unique_ptr<PendingCollective> Communicator::all_gather(at::Tensor full, at::Tensor shard,
                                                            bool control,
                                                            std::function<void()> on_complete) {
  check_pair("all_gather", full, shard, world_size_);
  if (world_size_ == 1 && !log_->enabled()) {
    // One rank: a copy. gloo's all-gather on a group of one keeps growing the process's
    // memory with every call (an MoE expert group of one rank all-gathers every step).
    full.copy_(shard.reshape(full.sizes()));
    count(stats_.all_gather_bytes, nbytes(full), control);
    return std::make_unique<PendingCollective>(describe("all_gather", full), nullptr,
                                               std::vector<at::Tensor>{},
                                               std::move(on_complete));
  }
  auto work = all_gather_into(group(), full, shard);
  count(stats_.all_gather_bytes, nbytes(full), control);
  auto timed = timing(CollectiveOp::kAllGather, nbytes(full), control, work, full);
  return std::make_unique<PendingCollective>(describe("all_gather", full), std::move(work),
                                             std::vector<at::Tensor>{full, shard},
                                             std::move(on_complete), std::move(timed));
}

std::unique_ptr<PendingCollective> Communicator::all_gather_by_all_reduce(at::Tensor full,
                                                                          at::Tensor shard) {
  check_pair("all_gather", full, shard, world_size_);
  full.zero_();
  full.narrow(0, rank_ * shard.numel(), shard.numel()).copy_(shard.reshape({-1}));
  return all_reduce(full);
}

std::unique_ptr<PendingCollective> Communicator::reduce_scatter(at::Tensor shard, at::Tensor full,
                                                                Reduction reduction) {
  check_pair("reduce_scatter", full, shard, world_size_);
  if (full.is_cpu() && world_size_ > 1 &&
      (reduction == Reduction::kSum || reduction == Reduction::kAvg)) {
    return host_reduce_scatter(std::move(shard), std::move(full), reduction);
  }
  c10d::ReduceScatterOptions options;
  options.reduceOp = to_c10d(reduction);
  auto finish = averaging(reduction, full, shard, average_over_);
  auto work = reduce_scatter_into(group(), shard, full, options);
  stats_.reduce_scatter_bytes += nbytes(full);
  ++stats_.calls;
  auto timed = timing(CollectiveOp::kReduceScatter, nbytes(full), false, work, full);
  return std::make_unique<PendingCollective>(describe("reduce_scatter", full), std::move(work),
                                             std::vector<at::Tensor>{full, shard},
                                             std::move(finish),
                                             std::move(timed));
}

// gloo's reduce-scatter all-reduces a copy of `full` underneath: twice a reduce-scatter's bytes
// (1.4-1.9x the time of this on 2 ranks, 1.9-2.8x on 4: benchmarks/bench_collectives.py).
// Here an all-to-all brings piece r of every rank's `full` to rank r, which sums the pieces in
// rank order after the wait (16-bit sums accumulate in fp32 and round once). `pieces` takes
// the place of gloo's copy.
std::unique_ptr<PendingCollective> Communicator::host_reduce_scatter(at::Tensor shard,
                                                                     at::Tensor full,
                                                                     Reduction reduction) {
  at::Tensor pieces = at::empty_like(full);
  auto work = all_to_all_into(group(), pieces, full);
  stats_.reduce_scatter_bytes += nbytes(full);
  ++stats_.calls;
  auto timed = timing(CollectiveOp::kReduceScatter, nbytes(full), false, work, full);
  const int world = world_size_;
  const int average_over = average_over_;
  auto sum = [pieces, shard, world, average_over, reduction]() mutable {
    const at::Tensor stacked = pieces.view({world, -1});
    if (reduction != Reduction::kAvg) {
      at::sum_out(shard, stacked, {0});
    } else if (shard.element_size() < 4) {  // 16 bits: the mean rounds once (a sum may not fit)
      shard.copy_(at::sum(stacked, {0}, false, at::kFloat).div_(average_over));
    } else {
      at::sum_out(shard, stacked, {0});
      shard.div_(average_over);
    }
  };
  return std::make_unique<PendingCollective>(describe("reduce_scatter", full), std::move(work),
                                             std::vector<at::Tensor>{full, shard, pieces},
                                             std::move(sum), std::move(timed));
}

std::unique_ptr<PendingCollective> Communicator::all_reduce(at::Tensor tensor,
                                                            Reduction reduction, bool control) {
  check_flat("all_reduce", "input", tensor);
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(reduction);
  auto finish = averaging(reduction, tensor, tensor, average_over_);
  auto work = group().allreduce(tensors, options);
  count(stats_.all_reduce_bytes, 2 * nbytes(tensor), control);
  auto timed = timing(CollectiveOp::kAllReduce, nbytes(tensor), control, work, tensor);
  return std::make_unique<PendingCollective>(describe("all_reduce", tensor), std::move(work),
                                             std::move(tensors),
                                             std::move(finish),
                                             std::move(timed));
}

std::unique_ptr<PendingCollective> Communicator::broadcast(at::Tensor tensor, int root,
                                                           bool control) {
  check_flat("broadcast", "input", tensor);
  TORCH_CHECK(root >= 0 && root < world_size_, "zero broadcast: root ", root,
              " is outside [0, ", world_size_, ")");
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  auto work = group().broadcast(tensors, options);
  count(stats_.broadcast_bytes, nbytes(tensor), control);
  auto timed = timing(CollectiveOp::kBroadcast, nbytes(tensor), control, work, tensor);
  return std::make_unique<PendingCollective>(describe("broadcast", tensor), std::move(work),
                                             std::move(tensors), std::function<void()>{},
                                             std::move(timed));
}

std::unique_ptr<PendingCollective> Communicator::exchange(at::Tensor out, at::Tensor in,
                                                          std::function<void()> on_complete) {
  check_flat("all_to_all", "output", out);
  check_flat("all_to_all", "input", in);
  TORCH_CHECK(out.numel() == in.numel() && in.numel() % world_size_ == 0, "zero all_to_all: "
              "input and output must have the same size, a multiple of the world size (",
              world_size_, "); got ", in.numel(), " and ", out.numel());
  auto work = all_to_all_into(group(), out, in);
  stats_.reduce_scatter_bytes += nbytes(in);
  ++stats_.calls;
  auto timed = timing(CollectiveOp::kReduceScatter, nbytes(in), false, work, in);
  return std::make_unique<PendingCollective>(describe("all_to_all", in), std::move(work),
                                             std::vector<at::Tensor>{out, in},
                                             std::move(on_complete), std::move(timed));
}

}  // namespace zero::adapter
