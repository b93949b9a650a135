#pragma once
// One optimizer parameter group of one dtype, laid out by a ShardedLayout:
//
//   stage | model params (param) | grads (gradient)   | fp32 master + optimizer state
//   0     | full                 | full               | full (nothing is sharded)
//   1     | full                 | full               | this rank's 1/N of every unit
//   2     | full                 | this rank's 1/N    | this rank's 1/N
//
// The model's parameters become views of the full param buffer, so the all-gather after the
// step writes straight into them. At stages 0 and 1 param.grad are views of the full grad
// buffer (autograd accumulates in place); at stage 2 grads are copied into unit buckets as
// they become ready and released. In fp32 training the master is the param buffer itself
// (this rank's pieces of it): no extra copy.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "adapter/collectives.h"
#include "adapter/grad_reducer.h"
#include "adapter/optimizer_math.h"
#include "adapter/tracked_tensor.h"
#include "core/sharded_layout.h"

namespace zero::adapter {

struct GroupOptions {
  int stage = 0;
  std::int64_t alignment = 1;  // elements
  std::int64_t unit_numel = 500'000'000;
  bool overlap_comm = true;
  OptimizerKind optimizer = OptimizerKind::kAdam;
  bool sgd_momentum = false;  // SGD keeps a momentum buffer only when momentum != 0
};

class ParamGroup {
 public:
  ParamGroup(std::vector<at::Tensor> params, const GroupOptions& options,
             core::MemoryRegistry& registry, Communicator& communicator);

  // --- backward ---
  // Stages 0/1: makes every param.grad our view again (a user's zero_grad may have set it
  // to None).
  void prepare_backward();
  void grad_ready(std::size_t index, bool boundary);
  void finish_backward(bool boundary);

  // --- step ---
  bool has_nonfinite_grads() const;
  double grad_square_sum() const;  // over the gradients this rank owns, in fp32
  // step: 1-based count of applied optimizer steps, including this one.
  void optimizer_step(const OptimizerHyper& hyper, double grad_scale, std::int64_t step);
  void gather_params();
  void zero_grads();

  // --- inspection and checkpoints (shard layout: this rank's pieces of every unit) ---
  const core::ShardedLayout& layout() const { return layout_; }
  at::Device device() const { return param_buffer_.tensor().device(); }
  at::Tensor master_shard() const;  // a copy
  void load_master_shard(const at::Tensor& saved);
  std::vector<std::pair<std::string, at::Tensor>> optimizer_state() const;
  at::Tensor owned_grads() const;  // a copy
  std::size_t bucket_count() const { return reducer_->bucket_count(); }
  std::int64_t bucket_bytes() const { return reducer_->bucket_bytes(); }

 private:
  bool mixed_precision() const { return layout_.dtype() != core::DType::kFloat32; }
  std::int64_t piece_numel(std::size_t unit) const { return layout_.unit(unit).shard_numel(); }
  at::Tensor full_piece(const at::Tensor& full, std::size_t unit) const;
  at::Tensor shard_piece(const at::Tensor& shard, std::size_t unit) const;
  at::Tensor grad_piece(std::size_t unit) const;
  at::Tensor master_piece(std::size_t unit) const;
  at::Tensor param_view(std::size_t index) const;

  std::vector<at::Tensor> params_;
  GroupOptions options_;
  Communicator& communicator_;
  int rank_;  // rank within the layout (0 at stage 0, where nothing is sharded)
  core::ShardedLayout layout_;
  TrackedTensor param_buffer_;
  TrackedTensor grad_full_;   // stages 0, 1
  TrackedTensor grad_shard_;  // stage 2
  TrackedTensor master_;      // mixed precision only
  TrackedTensor exp_avg_;
  TrackedTensor exp_avg_sq_;
  TrackedTensor momentum_;
  std::unique_ptr<GradReducer> reducer_;
};

}  // namespace zero::adapter
