#pragma once
// The optimizer side of a rank's shard: fp32 master (mixed precision only), Adam's m and v
// or SGD's momentum, all laid out like the shard, and the update over a piece of it.
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "adapter/optimizer_math.h"
#include "adapter/tracked_tensor.h"

namespace zero::adapter {

class ShardState {
 public:
  ShardState(core::MemoryRegistry& registry, std::int64_t shard_numel,
             const c10::TensorOptions& device_options, OptimizerKind kind, bool sgd_momentum,
             bool keep_master);

  bool has_master() const { return master_.defined(); }
  at::Tensor master_piece(std::int64_t offset, std::int64_t numel) const;
  // Updates `master` (this rank's fp32 parameters at shard [offset, offset + numel)) with
  // `grads` (fp32, already scaled) and the matching piece of the optimizer state.
  void update(at::Tensor master, const at::Tensor& grads, std::int64_t offset,
              const OptimizerHyper& hyper, std::int64_t step);
  std::vector<std::pair<std::string, at::Tensor>> optimizer_state() const;

 private:
  OptimizerKind kind_;
  TrackedTensor master_;
  TrackedTensor exp_avg_;
  TrackedTensor exp_avg_sq_;
  TrackedTensor momentum_;
};

}  // namespace zero::adapter
