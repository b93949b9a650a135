#include "adapter/quantized_comm.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include "core/block_quantizer.h"

#ifdef ZERO_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "cuda/quantize_kernels.h"
#endif

namespace zero::adapter {
namespace {

void check_floating(const char* op, const at::Tensor& tensor) {
  TORCH_CHECK(tensor.defined() && tensor.is_contiguous() && at::isFloatingType(tensor.scalar_type()),
              "zero ", op, ": needs a contiguous floating-point tensor, got ",
              tensor.defined() ? c10::toString(tensor.scalar_type()) : "an undefined tensor");
}

#ifdef ZERO_WITH_CUDA
void check_cuda(cudaError_t status, const char* what) {
  TORCH_CHECK(status == cudaSuccess, "zero: ", what, " failed: ", cudaGetErrorString(status));
}
#endif

// The int8 code of n fp32 values at `values` into `packed`, on the device they live on.
void encode(const at::Tensor& on, const float* values, std::int64_t n, std::uint8_t* packed) {
  if (on.is_cuda()) {
#ifdef ZERO_WITH_CUDA
    check_cuda(cuda::quantize_int8(values, n, packed, core::kQuantBlock,
                                   c10::cuda::getCurrentCUDAStream(on.get_device()).stream()),
               "quantize_int8");
    return;
#else
    TORCH_CHECK(false, "zero: quantized communication of a CUDA tensor needs a CUDA build");
#endif
  }
  core::quantize_int8(values, n, packed);
}

// out[0, n) = (add: +=) the values of the packed piece, on the device they live on.
void decode(const at::Tensor& on, const std::uint8_t* packed, std::int64_t n, float* out,
            bool add) {
  if (on.is_cuda()) {
#ifdef ZERO_WITH_CUDA
    check_cuda(cuda::dequantize_int8(packed, n, out, core::kQuantBlock, add,
                                     c10::cuda::getCurrentCUDAStream(on.get_device()).stream()),
               "dequantize_int8");
    return;
#else
    TORCH_CHECK(false, "zero: quantized communication of a CUDA tensor needs a CUDA build");
#endif
  }
  if (add) {
    core::dequantize_add_int8(packed, n, out);
  } else {
    core::dequantize_int8(packed, n, out);
  }
}

// `pieces` pieces of `values` (each `piece` values long) packed end to end, piece i at
// i * quantized_bytes(piece), on values' device.
at::Tensor pack(const at::Tensor& values, std::int64_t pieces, std::int64_t piece) {
  const at::Tensor source = values.to(at::kFloat).contiguous();
  const std::int64_t stride = core::quantized_bytes(piece);
  at::Tensor packed = at::empty({pieces * stride}, values.options().dtype(at::kByte));
  for (std::int64_t i = 0; i < pieces; ++i) {
    encode(source, source.data_ptr<float>() + i * piece, piece,
           packed.data_ptr<std::uint8_t>() + i * stride);
  }
  return packed;
}

// The `pieces` packed pieces decoded, each into its place (add: all summed into one piece).
at::Tensor unpack(const at::Tensor& packed, std::int64_t pieces, std::int64_t piece, bool add) {
  const auto options = packed.options().dtype(at::kFloat);
  at::Tensor values = add ? at::zeros({piece}, options) : at::empty({pieces * piece}, options);
  const std::int64_t stride = core::quantized_bytes(piece);
  for (std::int64_t i = 0; i < pieces; ++i) {
    decode(packed, packed.data_ptr<std::uint8_t>() + i * stride, piece,
           values.data_ptr<float>() + (add ? 0 : i * piece), add);
  }
  return values;
}

// The `pieces` packed pieces decoded into `full`, one piece at a time: straight into an fp32
// `full`, else through one piece of fp32 scratch (not a whole unit of it).
void decode_into(at::Tensor& full, const at::Tensor& packed, std::int64_t pieces,
                 std::int64_t piece) {
  const std::int64_t stride = core::quantized_bytes(piece);
  const bool direct = full.scalar_type() == at::kFloat;
  at::Tensor scratch = direct ? at::Tensor() : at::empty({piece}, full.options().dtype(at::kFloat));
  for (std::int64_t i = 0; i < pieces; ++i) {
    float* out = direct ? full.data_ptr<float>() + i * piece : scratch.data_ptr<float>();
    decode(packed, packed.data_ptr<std::uint8_t>() + i * stride, piece, out, /*add=*/false);
    if (!direct) full.narrow(0, i * piece, piece).copy_(scratch);
  }
}

}  // namespace

at::Tensor quantize(const at::Tensor& values) {
  check_floating("quantize", values);
  return pack(values, 1, values.numel());
}

at::Tensor dequantize(const at::Tensor& packed, std::int64_t numel) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  packed.numel() == core::quantized_bytes(numel),
              "zero dequantize: expected ", core::quantized_bytes(numel), " contiguous bytes for ",
              numel, " values, got ", packed.numel(), " ", packed.scalar_type());
  return unpack(packed, 1, numel, /*add=*/false);
}

std::unique_ptr<PendingCollective> quantized_all_gather(Communicator& communicator,
                                                        at::Tensor full, at::Tensor shard) {
  check_floating("quantized all_gather", full);
  check_floating("quantized all_gather", shard);
  const std::int64_t world = communicator.world_size();
  const std::int64_t piece = shard.numel();
  TORCH_CHECK(full.numel() == piece * world, "zero quantized all_gather: full buffer has ",
              full.numel(), " elements, expected ", piece * world, " (shard x world size)");
  return packed_all_gather(communicator, std::move(full), pack(shard, 1, piece), piece);
}

std::unique_ptr<PendingCollective> packed_all_gather(Communicator& communicator, at::Tensor full,
                                                     at::Tensor packed, std::int64_t piece_numel) {
  check_floating("packed all_gather", full);
  const std::int64_t world = communicator.world_size();
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  packed.numel() == core::quantized_bytes(piece_numel),
              "zero packed all_gather: expected ", core::quantized_bytes(piece_numel),
              " contiguous bytes for ", piece_numel, " values, got ", packed.numel(), " ",
              packed.scalar_type());
  TORCH_CHECK(full.numel() == piece_numel * world, "zero packed all_gather: full buffer has ",
              full.numel(), " elements, expected ", piece_numel * world,
              " (piece x world size)");
  at::Tensor everyone = at::empty({world * packed.numel()}, packed.options());
  auto decode_all = [full, everyone, world, piece_numel]() mutable {
    decode_into(full, everyone, world, piece_numel);
  };
  return communicator.all_gather(everyone, std::move(packed), /*control=*/false,
                                 std::move(decode_all));
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
    at::Tensor sum = unpack(incoming, world, piece, /*add=*/true);
    if (average) sum.div_(static_cast<double>(world));
    shard.copy_(sum);
  };
  return communicator.exchange(incoming, outgoing, std::move(reduce));
}

}  // namespace zero::adapter
