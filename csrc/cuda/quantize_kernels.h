#pragma once
// core/block_quantizer.h's block-wise int8 code on the GPU, byte for byte the CPU's: a packed
// piece of n values is the fp32 scales of its blocks (max|x| / 127, NaN for a block holding
// inf or NaN) followed by the int8 values, padded to 4 bytes. Torch-free; only compiled with
// nvcc. The adapter (quantized_comm.cpp) calls them for CUDA tensors in CUDA builds.
#include <cstdint>

#include <cuda_runtime_api.h>

namespace zero::cuda {

// packed (core::quantized_bytes(n, block) bytes) <- values[0, n); block <= 1024.
cudaError_t quantize_int8(const float* values, std::int64_t n, std::uint8_t* packed,
                          std::int64_t block, cudaStream_t stream);

// out[0, n) <- (add: +=) the values packed holds.
cudaError_t dequantize_int8(const std::uint8_t* packed, std::int64_t n, float* out,
                            std::int64_t block, bool add, cudaStream_t stream);

}  // namespace zero::cuda
