// Matrix-vector kernels (decode, and MoE experts) and the weight dequantisation for cuBLAS
// (prefill): weights decoded in registers 32 elements at a time (blocks.h), f32 accumulation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backends/cuda/blocks.h"
#include "backends/cuda/dispatch.cuh"
#include "backends/cuda/kernels.h"

namespace g4::cuda {
namespace {

constexpr int kMaxRows = 8;       // rows per read of the weights
constexpr int kWarpsPerBlock = 4;

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// acc[r] += w_row . x[r] over this lane's chunks (lane, lane + 32, ...), for r < rows.
template <int F>
__device__ __forceinline__ void LaneDot(const uint8_t* w_row, int K, const float* x, int rows, float* acc) {
  float w[32];
  for (int c = threadIdx.x % 32; c < K / 32; c += 32) {
    DecodeChunk32<F>(w_row, c, w);
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
      if (r >= rows) break;
      const float4* xr = reinterpret_cast<const float4*>(x + static_cast<size_t>(r) * K + 32 * c);
      float a = 0;
#pragma unroll
      for (int l = 0; l < 8; ++l) {
        const float4 v = xr[l];
        a += w[4 * l] * v.x + w[4 * l + 1] * v.y + w[4 * l + 2] * v.z + w[4 * l + 3] * v.w;
      }
      acc[r] += a;
    }
  }
}

// grid (ceil(N / warps), ceil(rows / 8)); warp n of the grid computes column n for 8 rows.
template <int F>
__global__ void MatVecKernel(const uint8_t* w, size_t row_bytes, int N, int K, const float* x, int rows,
                             float out_scale, float* out) {
  const int n = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int r0 = blockIdx.y * kMaxRows;
  if (n >= N) return;
  const int nr = min(kMaxRows, rows - r0);
  float acc[kMaxRows] = {0, 0, 0, 0, 0, 0, 0, 0};
  LaneDot<F>(w + n * row_bytes, K, x + static_cast<size_t>(r0) * K, nr, acc);
  for (int r = 0; r < nr; ++r) {
    const float s = WarpSum(acc[r]);
    if (threadIdx.x % 32 == 0) out[static_cast<size_t>(r0 + r) * N + n] = s * out_scale;
  }
}

// grid (ceil(N / warps), jobs): job j multiplies x[j / x_div] by expert expert_ids[j]'s matrix.
template <int F>
__global__ void ExpertMatVecKernel(const uint8_t* w, size_t row_bytes, size_t expert_bytes, int N, int K,
                                   const float* x, int x_div, const int32_t* expert_ids, float* out) {
  const int n = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int j = blockIdx.y;
  if (n >= N) return;
  float acc[kMaxRows] = {0, 0, 0, 0, 0, 0, 0, 0};
  const uint8_t* we = w + static_cast<size_t>(expert_ids[j]) * expert_bytes;
  LaneDot<F>(we + n * row_bytes, K, x + static_cast<size_t>(j / x_div) * K, 1, acc);
  const float s = WarpSum(acc[0]);
  if (threadIdx.x % 32 == 0) out[static_cast<size_t>(j) * N + n] = s;
}

// grid (n, ceil(K / 32 / 128)); thread c decodes chunk c of row n0 + blockIdx.x.
template <int F, typename T>
__global__ void DequantRowsKernel(const uint8_t* w, size_t row_bytes, int n0, int K, T* out) {
  const int row = blockIdx.x;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= K / 32) return;
  float y[32];
  DecodeChunk32<F>(w + static_cast<size_t>(n0 + row) * row_bytes, c, y);
  T* o = out + static_cast<size_t>(row) * K + 32 * c;
  for (int l = 0; l < 32; ++l) {
    if constexpr (sizeof(T) == 2 && std::is_same_v<T, __half>) o[l] = __float2half_rn(y[l]);
    else o[l] = __float2bfloat16_rn(y[l]);
  }
}

__global__ void ToHalf16Kernel(const float* x, size_t n, bool half16, void* out) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (half16) static_cast<__half*>(out)[i] = __float2half_rn(x[i]);
  else static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(x[i]);
}

}  // namespace

cudaError_t MatVec(const uint8_t* w, int format, size_t row_bytes, int N, int K, const float* x, int rows,
                   float out_scale, float* out, cudaStream_t stream) {
  if (K % 32 != 0 || rows < 1) return cudaErrorInvalidValue;
  const dim3 grid((N + kWarpsPerBlock - 1) / kWarpsPerBlock, (rows + kMaxRows - 1) / kMaxRows);
  return WithFormat(format, [&](auto f) {
    MatVecKernel<decltype(f)::value><<<grid, 32 * kWarpsPerBlock, 0, stream>>>(w, row_bytes, N, K, x, rows, out_scale, out);
  });
}

cudaError_t ExpertMatVec(const uint8_t* w, int format, size_t row_bytes, size_t expert_bytes, int N, int K,
                         const float* x, int x_div, const int32_t* expert_ids, int jobs, float* out,
                         cudaStream_t stream) {
  if (K % 32 != 0 || jobs < 1) return cudaErrorInvalidValue;
  const dim3 grid((N + kWarpsPerBlock - 1) / kWarpsPerBlock, jobs);
  return WithFormat(format, [&](auto f) {
    ExpertMatVecKernel<decltype(f)::value>
        <<<grid, 32 * kWarpsPerBlock, 0, stream>>>(w, row_bytes, expert_bytes, N, K, x, x_div, expert_ids, out);
  });
}

cudaError_t DequantRows(const uint8_t* w, int format, size_t row_bytes, int n0, int n, int K, bool half16, void* out,
                        cudaStream_t stream) {
  if (K % 32 != 0 || n < 1) return cudaErrorInvalidValue;
  const dim3 grid(n, (K / 32 + 127) / 128);
  return WithFormat(format, [&](auto f) {
    constexpr int F = decltype(f)::value;
    if (half16) DequantRowsKernel<F, __half><<<grid, 128, 0, stream>>>(w, row_bytes, n0, K, static_cast<__half*>(out));
    else DequantRowsKernel<F, __nv_bfloat16><<<grid, 128, 0, stream>>>(w, row_bytes, n0, K, static_cast<__nv_bfloat16*>(out));
  });
}

cudaError_t ToHalf16(const float* x, size_t n, bool half16, void* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ToHalf16Kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(x, n, half16, out);
  return cudaGetLastError();
}

cudaError_t AppendMatMulKernelLaunches(std::vector<KernelLaunchInfo>* out) {
  KernelLaunchList list{out};
  ForEachFormat([&](auto c) {
    constexpr int F = decltype(c)::value;
    list.Add("matrix-vector", reinterpret_cast<const void*>(MatVecKernel<F>), 32 * kWarpsPerBlock);
    list.Add("expert matrix-vector", reinterpret_cast<const void*>(ExpertMatVecKernel<F>), 32 * kWarpsPerBlock);
    list.Add("dequantisation", reinterpret_cast<const void*>(DequantRowsKernel<F, __half>), 128);
    list.Add("dequantisation", reinterpret_cast<const void*>(DequantRowsKernel<F, __nv_bfloat16>), 128);
  });
  list.Add("16-bit conversion", reinterpret_cast<const void*>(ToHalf16Kernel), 256);
  return list.err;
}

}  // namespace g4::cuda
