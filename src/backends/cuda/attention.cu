// Causal attention over the KV cache and the step's own keys (AttentionOp; kernels.h).
//
// Block (token t, KV head h), one warp per query head of h's group (G = Nq / Nkv warps). Token t
// of sequence s at position p attends to positions FirstKey(p, window) .. p: those before the
// step's first position P0 of s from the cache (slot KvSlot(j)), those from P0 on from the step's
// rows (row seq_first[t] + j - P0), rounded to the cache's type so that a key scores the same
// whether it is read now or, in a later step, from the cache. Keys and values go through shared
// memory in tiles of kAttentionTile positions (converted to f32), so each is read from device
// memory once per block; each warp keeps its head's D / 32 query and output elements per lane and
// an online softmax (running max m, sum l; acc rescaled by exp(m_old - m_new)).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backends/cuda/blocks.h"
#include "backends/cuda/kernels.h"

namespace g4::cuda {
namespace {

__device__ __forceinline__ float LoadKv(const void* base, size_t i, int kv_type) {
  if (kv_type == 0) return static_cast<const float*>(base)[i];
  if (kv_type == 1) return __half2float(static_cast<const __half*>(base)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}

// f32 -> the cache's type and back (what KvWrite stores).
__device__ __forceinline__ float RoundToKv(float x, int kv_type) {
  if (kv_type == 1) return __half2float(__float2half_rn(x));
  if (kv_type == 2) return __bfloat162float(__float2bfloat16_rn(x));
  return x;
}

template <int DPL>  // head_dim / 32 elements per lane
__global__ void AttentionKernel(AttentionArgs a, StepArrays s) {
  constexpr int D = 32 * DPL;
  extern __shared__ float tile[];  // K [kAttentionTile, D] then V [kAttentionTile, D]
  float* ks = tile;
  float* vs = tile + kAttentionTile * D;
  const int t = blockIdx.x, h = blockIdx.y;
  const int G = a.num_heads / a.num_kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int qh = h * G + warp;
  const int width = a.num_kv_heads * D;
  const int p = s.positions[t], first = s.seq_first[t], p0 = s.positions[first], seq = s.seq_ids[t];
  const int lo = FirstKey(p, a.window);

  float q[DPL], acc[DPL];
  const float* qrow = a.q + static_cast<size_t>(t) * a.num_heads * D + static_cast<size_t>(qh) * D;
#pragma unroll
  for (int i = 0; i < DPL; ++i) {
    q[i] = qrow[lane + 32 * i];
    acc[i] = 0;
  }
  float m = -INFINITY, l = 0;
  for (int j0 = lo; j0 <= p; j0 += kAttentionTile) {
    const int n = min(kAttentionTile, p - j0 + 1);
    __syncthreads();
    for (int e = threadIdx.x; e < n * D; e += blockDim.x) {
      const int kk = e / D, d = e % D, j = j0 + kk;
      float kv, vv;
      if (j < p0) {
        const size_t off = (static_cast<size_t>(seq) * a.slots + KvSlot(j, a.window, a.slots)) * width + h * D + d;
        kv = LoadKv(a.k_cache, off, a.kv_type);
        vv = LoadKv(a.v_cache, off, a.kv_type);
      } else {
        const size_t off = static_cast<size_t>(first + j - p0) * width + h * D + d;
        kv = RoundToKv(a.k[off], a.kv_type);
        vv = RoundToKv(a.v[off], a.kv_type);
      }
      ks[kk * D + d] = kv;
      vs[kk * D + d] = vv;
    }
    __syncthreads();
    if (warp >= G) continue;
    for (int kk = 0; kk < n; ++kk) {
      float dot = 0;
#pragma unroll
      for (int i = 0; i < DPL; ++i) dot += q[i] * ks[kk * D + lane + 32 * i];
      for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      float score = dot * a.scale;
      if (a.softcap > 0) score = a.softcap * tanhf(score / a.softcap);
      const float m_new = fmaxf(m, score);
      const float c = expf(m - m_new), w = expf(score - m_new);
      l = l * c + w;
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[i] = acc[i] * c + w * vs[kk * D + lane + 32 * i];
      m = m_new;
    }
  }
  if (warp >= G) return;
  float* orow = a.out + static_cast<size_t>(t) * a.num_heads * D + static_cast<size_t>(qh) * D;
#pragma unroll
  for (int i = 0; i < DPL; ++i) orow[lane + 32 * i] = acc[i] / l;
}

}  // namespace

bool AttentionHeadDimSupported(int d) { return d == 32 || d == 64 || d == 128 || d == 256 || d == 512; }

cudaError_t Attention(const AttentionArgs& a, const StepArrays& s, cudaStream_t stream) {
  const int G = a.num_heads / a.num_kv_heads;
  const dim3 grid(s.num_tokens, a.num_kv_heads);
  const size_t shared = AttentionSharedBytes(a.head_dim);
  switch (a.head_dim) {
    case 32: AttentionKernel<1><<<grid, 32 * G, shared, stream>>>(a, s); break;
    case 64: AttentionKernel<2><<<grid, 32 * G, shared, stream>>>(a, s); break;
    case 128: AttentionKernel<4><<<grid, 32 * G, shared, stream>>>(a, s); break;
    case 256: AttentionKernel<8><<<grid, 32 * G, shared, stream>>>(a, s); break;
    case 512: AttentionKernel<16><<<grid, 32 * G, shared, stream>>>(a, s); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace g4::cuda
