#pragma once
// ZeRO++'s quantized communication (zero_quantized_weights: qwZ, zero_quantized_gradients:
// qgZ) over any backend, gloo included: what travels is the block-wise int8 code of
// core/block_quantizer.h (fp32 scale per 256 values), about a quarter of fp32's bytes and
// half of bf16's. Values are quantized from, and decoded into, the tensors' own dtype through
// fp32. Both return a PendingCollective like the plain calls: the decode runs in its wait.
//
//   quantized_all_gather:     each rank packs its shard; one all-gather of the packed pieces;
//                             every piece is decoded into `full` (packed_all_gather: the
//                             shard arrives packed already).
//   quantized_reduce_scatter: each rank packs piece r of its `full` for rank r; one all-to-all;
//                             each rank decodes the N pieces it received, sums them in fp32
//                             (then divides by N for kAvg) into `shard`.
#include <memory>

#include <ATen/Tensor.h>

#include "adapter/collectives.h"

namespace zero::adapter {

// One piece: the packed code of `values` (uint8, on values' device) and back (fp32).
at::Tensor quantize(const at::Tensor& values);
at::Tensor dequantize(const at::Tensor& packed, std::int64_t numel);

std::unique_ptr<PendingCollective> quantized_all_gather(Communicator& communicator,
                                                        at::Tensor full, at::Tensor shard);
// The all-gather of a shard kept packed (quantize's code of `piece_numel` values; DeepSpeed's
// zero_quantized_nontrainable_weights): every rank's piece gathered and decoded into `full`.
std::unique_ptr<PendingCollective> packed_all_gather(Communicator& communicator, at::Tensor full,
                                                     at::Tensor packed, std::int64_t piece_numel);

// reduction: kSum or kAvg.
std::unique_ptr<PendingCollective> quantized_reduce_scatter(Communicator& communicator,
                                                            at::Tensor shard, at::Tensor full,
                                                            Reduction reduction);

}  // namespace zero::adapter
