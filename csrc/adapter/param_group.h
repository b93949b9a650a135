#pragma once
// One optimizer parameter group of one dtype, flattened and (stage >= 1) sharded:
//
//   stage | model params (param)  | grads (gradient)        | fp32 master + optimizer state
//   0     | full flat buffer      | full flat buffer        | full
//   1     | full flat buffer      | full flat buffer        | this rank's shard
//   2     | full flat buffer      | this rank's shard       | this rank's shard
//
// The model's parameters become views of the flat param buffer, so the all-gather after the
// step writes straight into them. At stages 0 and 1 param.grad are views of the flat grad
// buffer (autograd accumulates in place); at stage 2 grads are copied into reduce-scatter
// buckets as they become ready and released. In fp32 training the master is the param
// buffer's own shard (no copy).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "adapter/collectives.h"
#include "adapter/flat_buffer.h"
#include "adapter/grad_reducer.h"
#include "adapter/optimizer_math.h"
#include "adapter/tracked_tensor.h"

namespace zero::adapter {

struct GroupOptions {
  int stage = 0;
  std::int64_t alignment = 1;      // elements
  std::int64_t bucket_numel = 500'000'000;
  bool overlap_comm = true;
  OptimizerKind optimizer = OptimizerKind::kAdam;
  bool sgd_momentum = false;  // SGD keeps a momentum buffer only when momentum != 0
};

class ParamGroup {
 public:
  ParamGroup(std::vector<at::Tensor> params, const GroupOptions& options,
             core::MemoryRegistry& registry, Communicator& communicator);

  // --- backward ---
  // Stages 0/1: make sure every param.grad is still our view (a user's zero_grad may have
  // set it to None).
  void prepare_backward();
  void grad_ready(std::size_t index, bool boundary);
  void finish_backward(bool boundary);

  // --- step ---
  bool has_nonfinite_grads() const;
  double grad_square_sum() const;  // over the grads this rank owns, in fp32
  // step: 1-based count of applied optimizer steps, including this one.
  void optimizer_step(const OptimizerHyper& hyper, double grad_scale, std::int64_t step);
  void gather_params();
  void zero_grads();

  // --- inspection and checkpoints ---
  const core::FlatBufferPlan& plan() const { return plan_; }
  std::size_t param_count() const { return params_.size(); }
  at::Tensor master() const { return master_view_; }
  // Named optimizer state tensors of this rank ("exp_avg", "exp_avg_sq", "momentum_buffer").
  std::vector<std::pair<std::string, at::Tensor>> optimizer_state() const;
  at::Tensor owned_grads() const;
  std::size_t reducer_bucket_count() const { return reducer_->bucket_count(); }
  std::int64_t bucket_bytes() const { return reducer_->bucket_buffer_bytes(); }

 private:
  bool mixed_precision() const;
  core::ShardRange owned_range() const;

  std::vector<at::Tensor> params_;
  GroupOptions options_;
  Communicator& communicator_;
  int rank_;  // rank inside the plan (0 at stage 0, where nothing is sharded)
  core::FlatBufferPlan plan_;
  FlatBuffer param_buffer_;
  std::unique_ptr<FlatBuffer> grad_buffer_;  // stages 0, 1
  TrackedTensor grad_shard_;                 // stage 2
  TrackedTensor master_;                     // mixed precision only
  at::Tensor master_view_;
  TrackedTensor exp_avg_;
  TrackedTensor exp_avg_sq_;
  TrackedTensor momentum_;
  std::unique_ptr<GradReducer> reducer_;
};

}  // namespace zero::adapter
