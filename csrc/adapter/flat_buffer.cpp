#include "adapter/flat_buffer.h"

#include <c10/util/Exception.h>

#include "adapter/dtype_map.h"

namespace zero::adapter {
namespace {

void check_param(const core::FlatBufferPlan& plan, std::size_t index, const at::Tensor& param) {
  const core::ParamSlot& slot = plan.params()[index];
  TORCH_CHECK(param.numel() == slot.numel, "zero: parameter ", index, " has ", param.numel(),
              " elements but the plan expects ", slot.numel, " (shape ", c10::IntArrayRef(slot.shape),
              "); the model changed after the plan was made");
  TORCH_CHECK(to_core_dtype(param.scalar_type()) == plan.dtype(), "zero: parameter ", index,
              " is ", param.scalar_type(), " but its buffer is ", core::dtype_name(plan.dtype()));
}

void check_param_count(const core::FlatBufferPlan& plan, const std::vector<at::Tensor>& params) {
  TORCH_CHECK(params.size() == plan.params().size(), "zero: got ", params.size(),
              " tensors for a buffer planned for ", plan.params().size());
}

}  // namespace

FlatBuffer::FlatBuffer(core::FlatBufferPlan plan, core::MemoryRegistry& registry,
                       core::MemoryCategory category, core::MemoryLocation location,
                       at::Device device)
    : plan_(std::move(plan)),
      storage_(registry, category, location, plan_.numel(),
               at::TensorOptions().dtype(to_scalar_type(plan_.dtype())).device(device)) {}

at::Tensor FlatBuffer::shard(int rank) const {
  const core::ShardRange range = plan_.shard_range(rank);
  return data().narrow(0, range.begin, range.end - range.begin);
}

at::Tensor FlatBuffer::param_view(std::size_t index) const {
  TORCH_CHECK(index < plan_.params().size(), "zero: parameter index ", index,
              " is outside the buffer's ", plan_.params().size(), " parameters");
  const core::ParamSlot& slot = plan_.params()[index];
  return data().narrow(0, slot.offset, slot.numel).view(slot.shape);
}

std::vector<at::Tensor> FlatBuffer::param_views() const {
  std::vector<at::Tensor> views;
  views.reserve(plan_.params().size());
  for (std::size_t i = 0; i < plan_.params().size(); ++i) views.push_back(param_view(i));
  return views;
}

void FlatBuffer::pack(const std::vector<at::Tensor>& params) {
  check_param_count(plan_, params);
  for (std::size_t i = 0; i < params.size(); ++i) {
    check_param(plan_, i, params[i]);
    param_view(i).copy_(params[i].view(plan_.params()[i].shape));
  }
}

void pack_shard(const core::FlatBufferPlan& plan, int rank, const std::vector<at::Tensor>& params,
                at::Tensor& shard) {
  check_param_count(plan, params);
  TORCH_CHECK(shard.dim() == 1 && shard.numel() == plan.shard_numel(), "zero: shard has ",
              shard.numel(), " elements but the plan's shard size is ", plan.shard_numel());
  for (const auto& [index, slice] : plan.slices_owned_by(rank)) {
    check_param(plan, index, params[index]);
    const std::int64_t length = slice.param_end - slice.param_begin;
    shard.narrow(0, slice.shard_offset, length)
        .copy_(params[index].reshape({-1}).narrow(0, slice.param_begin, length));
  }
}

}  // namespace zero::adapter
