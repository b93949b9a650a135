#pragma once
// Torch-free CUDA kernels for the flat buffers: the fp32 master -> 16-bit model copy after
// the optimizer step, and the overflow check of (16-bit or fp32) gradients for fp16 loss
// scaling. Only compiled with nvcc; the adapter calls them in CUDA builds.
#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"

namespace zero::cuda {

// dst[i] = to_dtype(src[i] * scale), dst_dtype bfloat16 or float16 (round to nearest even).
cudaError_t cast_scaled(const float* src, void* dst, core::DType dst_dtype, std::int64_t n,
                        float scale, cudaStream_t stream);

// Sets *found_nonfinite to 1 if any element of data is inf or nan (never resets it, so one
// flag can cover many buffers before a single device-to-host read).
cudaError_t check_nonfinite(const void* data, core::DType dtype, std::int64_t n,
                            int* found_nonfinite, cudaStream_t stream);

}  // namespace zero::cuda
