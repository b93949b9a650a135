#include "cuda/quantize_kernels.h"

namespace zero::cuda {
namespace {

// One thread block per quantization block; blockDim.x == block (a power of two is not needed:
// the reduction below halves a rounded-up width).
__global__ void quantize_kernel(const float* values, std::int64_t n, std::int64_t block,
                                float* scales, std::int8_t* q) {
  extern __shared__ float shared[];  // [0, width): max |x|, [width, 2 width): x * 0 probes
  const int width = blockDim.x;
  const std::int64_t i = blockIdx.x * block + threadIdx.x;
  const bool inside = threadIdx.x < block && i < n;
  const float x = inside ? values[i] : 0.0f;
  shared[threadIdx.x] = fabsf(x);
  shared[width + threadIdx.x] = x * 0.0f;  // NaN for inf or NaN only
  __syncthreads();
  for (int stride = (width + 1) / 2, active = width; active > 1;
       active = stride, stride = (stride + 1) / 2) {
    if (threadIdx.x < active - stride) {
      shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + stride]);
      shared[width + threadIdx.x] += shared[width + threadIdx.x + stride];
    }
    __syncthreads();
  }
  const float largest = shared[0];
  const bool finite = isfinite(shared[width]);
  if (threadIdx.x == 0) scales[blockIdx.x] = finite ? largest / 127.0f : __int_as_float(0x7fc00000);
  if (!inside) return;
  if (!finite) {
    q[i] = 0;
    return;
  }
  const float inverse = largest > 0.0f ? 127.0f / largest : 0.0f;
  const float r = __fmul_rn(x, inverse);  // no fused multiply-add: the CPU's rounding
  q[i] = static_cast<std::int8_t>(static_cast<int>(__fadd_rn(r, copysignf(0.5f, r))));
}

__global__ void dequantize_kernel(const float* scales, const std::int8_t* q, std::int64_t n,
                                  std::int64_t block, float* out, bool add) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float value = __fmul_rn(static_cast<float>(q[i]), scales[i / block]);
    out[i] = add ? __fadd_rn(out[i], value) : value;
  }
}

std::int64_t block_count(std::int64_t n, std::int64_t block) { return (n + block - 1) / block; }

}  // namespace

cudaError_t quantize_int8(const float* values, std::int64_t n, std::uint8_t* packed,
                          std::int64_t block, cudaStream_t stream) {
  if (n < 0 || block < 1 || block > 1024) return cudaErrorInvalidValue;
  const std::int64_t blocks = block_count(n, block);
  auto* q = reinterpret_cast<std::int8_t*>(packed + 4 * blocks);
  const std::int64_t padding = (n + 3) / 4 * 4 - n;
  if (padding > 0) {
    const cudaError_t cleared = cudaMemsetAsync(q + n, 0, static_cast<std::size_t>(padding), stream);
    if (cleared != cudaSuccess) return cleared;
  }
  if (blocks == 0) return cudaSuccess;
  const int threads = static_cast<int>(block);
  quantize_kernel<<<static_cast<unsigned>(blocks), threads, 2 * threads * sizeof(float), stream>>>(
      values, n, block, reinterpret_cast<float*>(packed), q);
  return cudaGetLastError();
}

cudaError_t dequantize_int8(const std::uint8_t* packed, std::int64_t n, float* out,
                            std::int64_t block, bool add, cudaStream_t stream) {
  if (n < 0 || block < 1) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const std::int64_t blocks = block_count(n, block);
  constexpr int kThreads = 256;
  const std::int64_t grid = (n + kThreads - 1) / kThreads;
  dequantize_kernel<<<static_cast<unsigned>(grid < 65535 ? grid : 65535), kThreads, 0, stream>>>(
      reinterpret_cast<const float*>(packed), reinterpret_cast<const std::int8_t*>(packed + 4 * blocks),
      n, block, out, add);
  return cudaGetLastError();
}

}  // namespace zero::cuda
