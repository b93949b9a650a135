#include "adapter/quantized_comm.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include "core/block_quantizer.h"

namespace zero::adapter {
namespace {

// The tensor's values as a contiguous fp32 CPU tensor (the CPU kernels' input).
at::Tensor as_float(const at::Tensor& values) {
  return values.to(at::TensorOptions().dtype(at::kFloat).device(at::kCPU)).contiguous();
}

void check_floating(const char* op, const at::Tensor& tensor) {
  TORCH_CHECK(tensor.defined() && tensor.is_contiguous() && at::isFloatingType(tensor.scalar_type()),
              "zero ", op, ": needs a contiguous floating-point tensor, got ",
              tensor.defined() ? c10::toString(tensor.scalar_type()) : "an undefined tensor");
}

// pieces packed end to end: piece i of `values` (each `piece` values long) at i * stride bytes.
at::Tensor pack(const at::Tensor& values, std::int64_t pieces, std::int64_t piece) {
  const at::Tensor source = as_float(values);
  const std::int64_t stride = core::quantized_bytes(piece);
  at::Tensor packed = at::empty({pieces * stride}, at::TensorOptions().dtype(at::kByte));
  const float* in = source.data_ptr<float>();
  std::uint8_t* out = packed.data_ptr<std::uint8_t>();
  for (std::int64_t i = 0; i < pieces; ++i) {
    core::quantize_int8(in + i * piece, piece, out + i * stride);
  }
  return packed.to(values.device());
}

}  // namespace

std::unique_ptr<PendingCollective> quantized_all_gather(Communicator& communicator,
                                                        at::Tensor full, at::Tensor shard) {
  check_floating("quantized all_gather", full);
  check_floating("quantized all_gather", shard);
  const std::int64_t world = communicator.world_size();
  const std::int64_t piece = shard.numel();
  TORCH_CHECK(full.numel() == piece * world, "zero quantized all_gather: full buffer has ",
              full.numel(), " elements, expected ", piece * world, " (shard x world size)");
  at::Tensor mine = pack(shard, 1, piece);
  at::Tensor everyone = at::empty({world * mine.numel()}, mine.options());
  auto decode = [full, everyone, world, piece]() mutable {
    const at::Tensor packed = everyone.to(at::kCPU);
    at::Tensor values = at::empty({world * piece}, at::TensorOptions().dtype(at::kFloat));
    const std::int64_t stride = core::quantized_bytes(piece);
    for (std::int64_t r = 0; r < world; ++r) {
      core::dequantize_int8(packed.data_ptr<std::uint8_t>() + r * stride, piece,
                            values.data_ptr<float>() + r * piece);
    }
    full.copy_(values);
  };
  return communicator.all_gather(everyone, mine, /*control=*/false, std::move(decode));
}

std::unique_ptr<PendingCollective> quantized_reduce_scatter(Communicator& communicator,
                                                            at::Tensor shard, at::Tensor full,
                                                            Reduction reduction) {
  check_floating("quantized reduce_scatter", full);
  check_floating("quantized reduce_scatter", shard);
  TORCH_CHECK(reduction == Reduction::kSum || reduction == Reduction::kAvg,
              "zero quantized reduce_scatter: only sum and avg reduce in fp32 sums");
  const std::int64_t world = communicator.world_size();
  const std::int64_t piece = shard.numel();
  TORCH_CHECK(full.numel() == piece * world, "zero quantized reduce_scatter: full buffer has ",
              full.numel(), " elements, expected ", piece * world, " (shard x world size)");
  at::Tensor outgoing = pack(full, world, piece);
  at::Tensor incoming = at::empty_like(outgoing);
  const bool average = reduction == Reduction::kAvg;
  auto reduce = [shard, incoming, world, piece, average]() mutable {
    const at::Tensor packed = incoming.to(at::kCPU);
    at::Tensor sum = at::zeros({piece}, at::TensorOptions().dtype(at::kFloat));
    const std::int64_t stride = core::quantized_bytes(piece);
    for (std::int64_t r = 0; r < world; ++r) {
      core::dequantize_add_int8(packed.data_ptr<std::uint8_t>() + r * stride, piece,
                                sum.data_ptr<float>());
    }
    if (average) sum.div_(static_cast<double>(world));
    shard.copy_(sum);
  };
  return communicator.exchange(incoming, outgoing, std::move(reduce));
}

}  // namespace zero::adapter
