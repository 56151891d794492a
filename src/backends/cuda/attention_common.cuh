// The attention kernels' shared core (attention.cu: prefill; attention_decode.cu: flash decoding):
// one block per (key range, KV head h, token t), one warp per query head of h's group (warps
// beyond the group only help load). Keys and values go through shared memory in tiles of
// kAttentionTile positions, four elements per thread per load, so each is read from device memory
// once per block for the whole group; each warp keeps its head's D / 32 query and output elements
// per lane and an online softmax (running max m, sum l; acc rescaled by exp(m_old - m_new)).
//
// Token t of sequence s at position p attends to FirstKey(p, window) .. p: positions before the
// step's first position P0 of s from the cache (slot KvSlot(j)), those from P0 on from the step's
// rows (row seq_first[t] + j - P0) as the cache holds them (rounded to f16/bf16; i8: the step's
// quantised rows), so that a key scores the same whether it is read now or in a later step. An i8
// key stays an integer in shared memory beside its scale: score = (q . k_int) * k_scale * scale,
// and the V sum adds (w * v_scale) * v_int, as the CPU backend computes (cpu/attention.h); an fp8
// key likewise as its e4m3 code's value (E4m3ToF32, decoded in registers on the load).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backends/cuda/attention_plan.h"
#include "backends/cuda/blocks.h"
#include "backends/cuda/kernels.h"

namespace g4::cuda {

// Four consecutive elements i .. i+3 (i a multiple of 4) of a cache array of type KV, as f32.
template <int KV>
__device__ __forceinline__ void Load4(const void* base, size_t i, float* y) {
  if constexpr (KV == kKvF32) {
    const float4 f = *reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
    y[0] = f.x, y[1] = f.y, y[2] = f.z, y[3] = f.w;
  } else if constexpr (KV == kKvI8) {
    const char4 c = *reinterpret_cast<const char4*>(static_cast<const int8_t*>(base) + i);
    y[0] = c.x, y[1] = c.y, y[2] = c.z, y[3] = c.w;
  } else if constexpr (KV == kKvF8) {
    const uchar4 c = *reinterpret_cast<const uchar4*>(static_cast<const uint8_t*>(base) + i);
    y[0] = E4m3ToF32(c.x), y[1] = E4m3ToF32(c.y), y[2] = E4m3ToF32(c.z), y[3] = E4m3ToF32(c.w);
  } else {
    const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(base) + i);
    const uint16_t h[4] = {static_cast<uint16_t>(u.x & 0xffffu), static_cast<uint16_t>(u.x >> 16),
                           static_cast<uint16_t>(u.y & 0xffffu), static_cast<uint16_t>(u.y >> 16)};
#pragma unroll
    for (int e = 0; e < 4; ++e) y[e] = KV == kKvF16 ? __half2float(__ushort_as_half(h[e])) : Bf16BitsToF32(h[e]);
  }
}

// f32 -> the cache's type and back (what KvWrite stores; f32, i8 and fp8 unchanged here).
template <int KV>
__device__ __forceinline__ float RoundToKv(float x) {
  if constexpr (KV == kKvF16) return __half2float(__float2half_rn(x));
  else if constexpr (KV == kKvBF16) return __bfloat162float(__float2bfloat16_rn(x));
  else return x;
}

// Keys [begin, end) of token t for KV head h folded into (m, l, acc) of this warp's query head.
template <int DPL, int KV>
__device__ __forceinline__ void AttendKeys(const AttentionArgs& a, const StepArrays& s, int t, int h, int begin, int end,
                                           const float* q, float& m, float& l, float* acc) {
  constexpr int D = 32 * DPL;
  extern __shared__ float tile[];  // K [kAttentionTile, D], V [kAttentionTile, D], K scales, V scales
  float* ks = tile;
  float* vs = tile + kAttentionTile * D;
  float* ksc = vs + kAttentionTile * D;
  float* vsc = ksc + kAttentionTile;
  const int G = a.num_heads / a.num_kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int width = a.num_kv_heads * D;
  const int first = s.seq_first[t], p0 = s.positions[first], seq = s.seq_ids[t];
  for (int j0 = begin; j0 < end; j0 += kAttentionTile) {
    const int n = min(kAttentionTile, end - j0);
    __syncthreads();
    for (int e = 4 * threadIdx.x; e < n * D; e += 4 * blockDim.x) {
      const int kk = e / D, d = e % D, j = j0 + kk;
      float kv[4], vv[4];
      if (j < p0) {
        const size_t off = (static_cast<size_t>(seq) * a.slots + KvSlot(j, a.window, a.slots)) * width + h * D + d;
        Load4<KV>(a.k_cache, off, kv);
        Load4<KV>(a.v_cache, off, vv);
      } else {
        const size_t off = static_cast<size_t>(first + j - p0) * width + h * D + d;
        if constexpr (KvScaled(KV)) {
          Load4<KV>(a.k_q, off, kv);
          Load4<KV>(a.v_q, off, vv);
        } else {
          Load4<kKvF32>(a.k, off, kv);
          Load4<kKvF32>(a.v, off, vv);
#pragma unroll
          for (int i = 0; i < 4; ++i) kv[i] = RoundToKv<KV>(kv[i]), vv[i] = RoundToKv<KV>(vv[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) ks[kk * D + d + i] = kv[i], vs[kk * D + d + i] = vv[i];
    }
    if constexpr (KvScaled(KV)) {
      for (int kk = threadIdx.x; kk < n; kk += blockDim.x) {
        const int j = j0 + kk;
        if (j < p0) {
          const size_t off = (static_cast<size_t>(seq) * a.slots + KvSlot(j, a.window, a.slots)) * a.num_kv_heads + h;
          ksc[kk] = a.k_scale_cache[off];
          vsc[kk] = a.v_scale_cache[off];
        } else {
          const size_t off = static_cast<size_t>(first + j - p0) * a.num_kv_heads + h;
          ksc[kk] = a.k_qscale[off];
          vsc[kk] = a.v_qscale[off];
        }
      }
    }
    __syncthreads();
    if (warp >= G) continue;
    for (int kk = 0; kk < n; ++kk) {
      float dot = 0;
#pragma unroll
      for (int i = 0; i < DPL; ++i) dot += q[i] * ks[kk * D + lane + 32 * i];
      for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      if constexpr (KvScaled(KV)) dot *= ksc[kk];
      float score = dot * a.scale;
      if (a.softcap > 0) score = a.softcap * tanhf(score / a.softcap);
      const float m_new = fmaxf(m, score);
      const float c = expf(m - m_new);
      float w = expf(score - m_new);
      l = l * c + w;
      if constexpr (KvScaled(KV)) w *= vsc[kk];
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[i] = acc[i] * c + w * vs[kk * D + lane + 32 * i];
      m = m_new;
    }
  }
}

// This warp's query head of token t: its D / 32 elements per lane into q.
template <int DPL>
__device__ __forceinline__ void LoadQuery(const AttentionArgs& a, int t, int qh, float* q) {
  const float* qrow = a.q + (static_cast<size_t>(t) * a.num_heads + qh) * (32 * DPL);
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < DPL; ++i) q[i] = qrow[lane + 32 * i];
}

// Calls fn(std::integral_constant<int, DPL>(), std::integral_constant<int, KV>()) for head_dim and
// kv_type, then returns the launch's error (cudaErrorInvalidValue for one with no instance).
template <typename Fn>
cudaError_t WithHeadDimAndKv(int head_dim, int kv_type, Fn&& fn) {
  auto kv = [&](auto dpl) -> bool {
    switch (kv_type) {
      case kKvF32: fn(dpl, std::integral_constant<int, kKvF32>()); return true;
      case kKvF16: fn(dpl, std::integral_constant<int, kKvF16>()); return true;
      case kKvBF16: fn(dpl, std::integral_constant<int, kKvBF16>()); return true;
      case kKvI8: fn(dpl, std::integral_constant<int, kKvI8>()); return true;
      case kKvF8: fn(dpl, std::integral_constant<int, kKvF8>()); return true;
      default: return false;
    }
  };
  bool ok = false;
  switch (head_dim) {
    case 32: ok = kv(std::integral_constant<int, 1>()); break;
    case 64: ok = kv(std::integral_constant<int, 2>()); break;
    case 128: ok = kv(std::integral_constant<int, 4>()); break;
    case 256: ok = kv(std::integral_constant<int, 8>()); break;
    case 512: ok = kv(std::integral_constant<int, 16>()); break;
    default: break;
  }
  if (!ok) return cudaErrorInvalidValue;
  return cudaGetLastError();
}

// The cudaFuncGetAttributes of the kernel instance pick(dpl, kv) returns (a const void*) for
// head_dim and kv_type; cudaErrorInvalidValue for a pair with no instance.
template <typename Pick>
cudaError_t InstanceAttributes(int head_dim, int kv_type, cudaFuncAttributes* attr, Pick&& pick) {
  cudaError_t e = cudaSuccess;
  const cudaError_t r =
      WithHeadDimAndKv(head_dim, kv_type, [&](auto dpl, auto kv) { e = cudaFuncGetAttributes(attr, pick(dpl, kv)); });
  return e != cudaSuccess ? e : r;
}

}  // namespace g4::cuda
