#pragma once
// A group's reduced gradients, read and written by shard position between a backward at the
// accumulation boundary and the optimizer step: what DeepSpeed's safe_get_full_grad /
// safe_set_full_grad reach (zero/param_values.py). Positions are the shard's (the master's
// and the optimizer state's, core::ShardedLayout::shard_offset); the gradients are the
// ranks' average, in the gradients' dtype (the group's, or fp32 with grads_in_fp32), with
// fp16's loss scale still in them.
//
// Only ranges of this rank's pieces (Group::shard_pieces) are touched, so a read copies just
// what it asks for, wherever the shard lives (the device, or host memory with optimizer
// offload).
#include <cstdint>

#include <ATen/Tensor.h>

#include "adapter/group.h"

namespace zero::adapter {

// Gradients [offset, offset + numel) of this rank's shard, as a new fp32 tensor on the host
// when the gradients are there, else on the group's device.
at::Tensor read_grads(Group& group, std::int64_t offset, std::int64_t numel);

// Writes `values` (any dtype, cast to the gradients') at [offset, offset + values.numel()).
void write_grads(Group& group, std::int64_t offset, const at::Tensor& values);

}  // namespace zero::adapter
