#include "adapter/grad_access.h"

#include <algorithm>
#include <functional>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace zero::adapter {
namespace {

// Calls visit(piece's gradients in the range, position in the range) for each of this rank's
// pieces that [offset, offset + numel) overlaps; the range must lie in the shard.
void for_each_overlap(Group& group, std::int64_t offset, std::int64_t numel,
                      const std::function<void(const at::Tensor&, std::int64_t)>& visit) {
  const std::int64_t shard_numel = group.layout().shard_numel();
  TORCH_CHECK_VALUE(offset >= 0 && numel >= 0 && offset + numel <= shard_numel,
                    "zero: gradients [", offset, ", ", offset + numel,
                    ") lie outside this rank's shard of ", shard_numel, " elements");
  // A gradient shard given back after the last step comes back zero-filled, and a host
  // shard's units no reduction has reached since are zeroed: what the step would read.
  group.hold_grads();
  group.reducer().zero_unreduced();
  for (const ShardPiece& piece : group.shard_pieces()) {
    const std::int64_t begin = std::max(offset, piece.offset);
    const std::int64_t end = std::min(offset + numel, piece.offset + piece.grad.numel());
    if (begin >= end) continue;
    visit(piece.grad.narrow(0, begin - piece.offset, end - begin), begin - offset);
  }
}

}  // namespace

at::Tensor read_grads(Group& group, std::int64_t offset, std::int64_t numel) {
  at::NoGradGuard no_grad;
  const at::Device where = group.grads_on_host() ? at::Device(at::kCPU) : group.device();
  at::Tensor out = at::zeros({numel}, at::TensorOptions().dtype(at::kFloat).device(where));
  for_each_overlap(group, offset, numel, [&out](const at::Tensor& grads, std::int64_t at) {
    out.narrow(0, at, grads.numel()).copy_(grads);
  });
  return out;
}

void write_grads(Group& group, std::int64_t offset, const at::Tensor& values) {
  at::NoGradGuard no_grad;
  const at::Tensor flat = values.reshape({-1});
  for_each_overlap(group, offset, flat.numel(), [&flat](const at::Tensor& grads, std::int64_t at) {
    grads.copy_(flat.narrow(0, at, grads.numel()));
  });
}

}  // namespace zero::adapter
