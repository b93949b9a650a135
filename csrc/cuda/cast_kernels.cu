#include "cuda/cast_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace zero::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(std::int64_t n) {
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 ? blocks : 65535);  // grid-stride loops cover the rest
}

template <typename Out>
__device__ Out from_float(float value);
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float value) {
  return __float2bfloat16_rn(value);
}
template <>
__device__ __half from_float<__half>(float value) {
  return __float2half_rn(value);
}

template <typename Out>
__global__ void cast_scaled_kernel(const float* src, Out* dst, std::int64_t n, float scale) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = from_float<Out>(src[i] * scale);
  }
}

template <typename In>
__device__ float to_float(In value) {
  return static_cast<float>(value);
}
template <>
__device__ float to_float<__nv_bfloat16>(__nv_bfloat16 value) {
  return __bfloat162float(value);
}
template <>
__device__ float to_float<__half>(__half value) {
  return __half2float(value);
}

template <typename In>
__global__ void check_nonfinite_kernel(const In* data, std::int64_t n, int* found) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    if (!isfinite(to_float(data[i]))) {
      *found = 1;  // benign race: every writer writes the same value
      return;
    }
  }
}

}  // namespace

cudaError_t cast_scaled(const float* src, void* dst, core::DType dst_dtype, std::int64_t n,
                        float scale, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (dst_dtype) {
    case core::DType::kBFloat16:
      cast_scaled_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
          src, static_cast<__nv_bfloat16*>(dst), n, scale);
      break;
    case core::DType::kFloat16:
      cast_scaled_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
          src, static_cast<__half*>(dst), n, scale);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t check_nonfinite(const void* data, core::DType dtype, std::int64_t n,
                            int* found_nonfinite, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (dtype) {
    case core::DType::kFloat32:
      check_nonfinite_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
          static_cast<const float*>(data), n, found_nonfinite);
      break;
    case core::DType::kBFloat16:
      check_nonfinite_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(data), n, found_nonfinite);
      break;
    case core::DType::kFloat16:
      check_nonfinite_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
          static_cast<const __half*>(data), n, found_nonfinite);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace zero::cuda
