#pragma once
// A flat buffer laid out by a FlatBufferPlan: one allocation, per-parameter views into it,
// and per-rank shard views. Used for full (gathered) buffers; a rank's own shard is a
// TrackedTensor of plan.shard_numel() elements.
#include <vector>

#include <ATen/Tensor.h>

#include "core/partition_plan.h"
#include "adapter/tracked_tensor.h"

namespace zero::adapter {

class FlatBuffer {
 public:
  FlatBuffer(core::FlatBufferPlan plan, core::MemoryRegistry& registry,
             core::MemoryCategory category, core::MemoryLocation location, at::Device device);

  const core::FlatBufferPlan& plan() const { return plan_; }
  const at::Tensor& data() const { return storage_.tensor(); }
  std::int64_t bytes() const { return storage_.bytes(); }
  at::Tensor shard(int rank) const;                // view of rank's range
  at::Tensor param_view(std::size_t index) const;  // view shaped like parameter `index`
  std::vector<at::Tensor> param_views() const;
  // Copies each tensor into its slot; checks count, dtype and shape against the plan.
  void pack(const std::vector<at::Tensor>& params);

 private:
  core::FlatBufferPlan plan_;
  TrackedTensor storage_;
};

// Copies the elements of `params` that `rank` owns into `shard` (plan.shard_numel() elements)
// without materialising the full buffer.
void pack_shard(const core::FlatBufferPlan& plan, int rank, const std::vector<at::Tensor>& params,
                at::Tensor& shard);

}  // namespace zero::adapter
