#pragma once
// One contiguous piece of this rank's shard, as a group hands it to the optimizer step: its
// gradients and the parameters the step writes (model dtype, `grad.numel()` elements) at
// `offset` in the shard.
#include <cstdint>
#include <functional>

#include <ATen/Tensor.h>

namespace zero::adapter {

// The new parameters go into `param`, or, when the parameters live on NVMe, to `store`,
// which receives them in order as (begin within the piece, values).
struct ShardPiece {
  using Store = std::function<void(std::int64_t begin, const at::Tensor& values)>;
  at::Tensor grad;
  at::Tensor param;  // undefined when `store` is set
  std::int64_t offset = 0;
  Store store;
  std::int64_t store_base = 0;  // this piece starts here in what `store` was made for
};

// Writes new parameters [begin, begin + values.numel()) of the piece; `copy` moves them into
// `param` (CopyEngine::copy inside a copy-engine batch).
void store_params(const ShardPiece& piece, std::int64_t begin, const at::Tensor& values,
                  void (*copy)(const at::Tensor& dst, const at::Tensor& src) = nullptr);
// Elements [begin, begin + numel) of the piece, at `offset` in the shard.
ShardPiece sub_piece(const ShardPiece& piece, std::int64_t begin, std::int64_t numel,
                     std::int64_t offset);

}  // namespace zero::adapter
