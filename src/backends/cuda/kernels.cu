// The CUDA backend's kernels for the graph's ops other than matmul and attention: one kernel per
// op, f32 activations, the arithmetic of the CPU backend's reference kernels (cpu/kernels.cc).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "backends/cuda/blocks.h"
#include "backends/cuda/dispatch.cuh"
#include "backends/cuda/kernels.h"

namespace g4::cuda {
namespace {

unsigned Blocks(size_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

__device__ __forceinline__ float GeluTanh(float x) {
  const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(inner));
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ float BlockSum(float v, float* shared32) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  float s = 0;
  for (int i = 0; i < warps; ++i) s += shared32[i];
  return s;
}

template <int F>
__global__ void EmbedKernel(const uint8_t* table, size_t row_bytes, int cols, float scale, const int32_t* tokens,
                            float* out) {
  const int t = blockIdx.x;
  const uint8_t* row = table + static_cast<size_t>(tokens[t]) * row_bytes;
  float y[32];
  for (int c = threadIdx.x; c < cols / 32; c += blockDim.x) {
    DecodeChunk32<F>(row, c, y);
    float* o = out + static_cast<size_t>(t) * cols + 32 * c;
    for (int l = 0; l < 32; ++l) o[l] = y[l] * scale;
  }
}

// One block per (row, group).
__global__ void RmsNormKernel(const float* x, int cols, int group, const float* w, float eps, float offset, float* out) {
  __shared__ float partial[32];
  const size_t base = static_cast<size_t>(blockIdx.x) * cols + static_cast<size_t>(blockIdx.y) * group;
  float ss = 0;
  for (int j = threadIdx.x; j < group; j += blockDim.x) ss += x[base + j] * x[base + j];
  ss = BlockSum(ss, partial);
  const float inv = 1.0f / sqrtf(ss / group + eps);
  for (int j = threadIdx.x; j < group; j += blockDim.x) {
    float v = x[base + j] * inv;
    if (w != nullptr) v = v * (offset + w[j]);
    out[base + j] = v;
  }
}

// One thread per (row, head, pair j < head_dim / 2).
__global__ void RopeKernel(const float* x, int rows, int cols, int head_dim, const float* inv_freq,
                           const int32_t* positions, float* out) {
  const int half = head_dim / 2, heads = cols / head_dim;
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(rows) * heads * half) return;
  const int j = static_cast<int>(i % half);
  const size_t rh = i / half;
  const int r = static_cast<int>(rh / heads);
  const size_t lo = rh * head_dim + j, hi = lo + half;
  const float a = x[lo], b = x[hi];
  if (inv_freq[j] == 0.0f) {  // an unrotated pair (proportional RoPE)
    out[lo] = a;
    out[hi] = b;
    return;
  }
  const float angle = static_cast<float>(positions[r]) * inv_freq[j];
  const float c = cosf(angle), s = sinf(angle);
  out[lo] = a * c - b * s;
  out[hi] = b * c + a * s;
}

template <typename T>
__device__ __forceinline__ T FromF32(float f) {
  if constexpr (std::is_same_v<T, float>) return f;
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(f);
  else return __float2bfloat16_rn(f);
}

// One block per step token; threads over the row's width.
template <typename T>
__global__ void KvWriteKernel(const float* k, const float* v, int width, T* kc, T* vc, int slots, int window,
                              const int32_t* positions, const int32_t* seq_ids, int tokens) {
  const int t = blockIdx.x;
  if (!KvRowSurvives(t, tokens, seq_ids, window, slots)) return;
  const size_t row = (static_cast<size_t>(seq_ids[t]) * slots + KvSlot(positions[t], window, slots)) * width;
  for (int j = threadIdx.x; j < width; j += blockDim.x) {
    kc[row + j] = FromF32<T>(k[static_cast<size_t>(t) * width + j]);
    vc[row + j] = FromF32<T>(v[static_cast<size_t>(t) * width + j]);
  }
}

__global__ void GeGluKernel(const float* a, const float* b, size_t n, float* out) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = GeluTanh(a[i]) * b[i];
}
__global__ void AddKernel(const float* a, const float* b, size_t n, float scale, float* out) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = scale == 1.0f ? a[i] + b[i] : (a[i] + b[i]) * scale;
}
__global__ void ScaleKernel(const float* x, size_t n, float scale, float* out) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] * scale;
}
__global__ void SoftcapKernel(const float* x, size_t n, float cap, float* out) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = cap * tanhf(x[i] / cap);
}
// One block per output row.
__global__ void CopyRowsKernel(const float* x, int src_cols, int begin, int cols, const int32_t* rows, float* out) {
  const int r = blockIdx.x;
  const size_t src = static_cast<size_t>(rows ? rows[r] : r) * src_cols + begin;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) out[static_cast<size_t>(r) * cols + j] = x[src + j];
}

// One block per token; shared: z [H], logits [E], 32 partial sums.
template <int F>
__global__ void MoeRouteKernel(const float* r, int H, const float* router_scale, const uint8_t* proj, size_t row_bytes,
                               const float* per_expert_scale, int E, int k, float eps, int32_t* chosen, float* weight) {
  extern __shared__ float sh[];
  float* z = sh;
  float* logits = z + H;
  float* partial = logits + E;
  const int t = blockIdx.x;
  const float* rt = r + static_cast<size_t>(t) * H;
  float ss = 0;
  for (int j = threadIdx.x; j < H; j += blockDim.x) ss += rt[j] * rt[j];
  ss = BlockSum(ss, partial);
  const float inv = 1.0f / sqrtf(ss / H + eps), root = 1.0f / sqrtf(static_cast<float>(H));
  for (int j = threadIdx.x; j < H; j += blockDim.x) z[j] = rt[j] * inv * router_scale[j] * root;
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  float w[32];
  for (int e = warp; e < E; e += warps) {
    float acc = 0;
    for (int c = lane; c < H / 32; c += 32) {
      DecodeChunk32<F>(proj + static_cast<size_t>(e) * row_bytes, c, w);
      for (int l = 0; l < 32; ++l) acc += w[l] * z[32 * c + l];
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) logits[e] = acc;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  float mx = -INFINITY, sum = 0;
  for (int e = 0; e < E; ++e) mx = fmaxf(mx, logits[e]);
  for (int e = 0; e < E; ++e) sum += logits[e] = expf(logits[e] - mx);
  for (int e = 0; e < E; ++e) logits[e] /= sum;
  // Top-k by repeated selection (highest probability, ties to the lower index), marked by -1,
  // then emitted in increasing expert order.
  int32_t* ct = chosen + static_cast<size_t>(t) * k;
  float* wt = weight + static_cast<size_t>(t) * k;
  for (int i = 0; i < k; ++i) {
    int best = -1;
    for (int e = 0; e < E; ++e)
      if (logits[e] >= 0 && (best < 0 || logits[e] > logits[best])) best = e;
    ct[i] = best;
    wt[i] = logits[best];
    logits[best] = -1;
  }
  for (int i = 1; i < k; ++i)  // insertion sort by expert id
    for (int j = i; j > 0 && ct[j] < ct[j - 1]; --j) {
      const int32_t c = ct[j]; ct[j] = ct[j - 1]; ct[j - 1] = c;
      const float x = wt[j]; wt[j] = wt[j - 1]; wt[j - 1] = x;
    }
  float wsum = 0;
  for (int i = 0; i < k; ++i) wsum += wt[i];
  for (int i = 0; i < k; ++i) wt[i] = wt[i] / wsum * per_expert_scale[ct[i]];
}

__global__ void MoeGeGluKernel(const float* gu, int jobs, int I, float* act) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(jobs) * I) return;
  const size_t j = i / I, c = i % I;
  act[i] = GeluTanh(gu[j * 2 * I + c]) * gu[j * 2 * I + I + c];
}

__global__ void MoeCombineKernel(const float* eo, const float* weight, int rows, int k, int H, float* out) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(rows) * H) return;
  const size_t t = i / H, c = i % H;
  float acc = 0;
  for (int e = 0; e < k; ++e) acc += eo[(t * k + e) * H + c] * weight[t * k + e];
  out[i] = acc;
}

}  // namespace

cudaError_t Embed(const uint8_t* table, int format, size_t row_bytes, int cols, float scale, const StepArrays& s,
                  float* out, cudaStream_t stream) {
  if (cols % 32 != 0) return cudaErrorInvalidValue;
  return WithFormat(format, [&](auto f) {
    EmbedKernel<decltype(f)::value><<<s.num_tokens, 128, 0, stream>>>(table, row_bytes, cols, scale, s.tokens, out);
  });
}

cudaError_t RmsNorm(const float* x, int rows, int cols, int group, const float* w, float eps, float offset, float* out,
                    cudaStream_t stream) {
  const int threads = group >= 1024 ? 1024 : ((group + 31) / 32) * 32;
  RmsNormKernel<<<dim3(rows, cols / group), threads, 0, stream>>>(x, cols, group, w, eps, offset, out);
  return cudaGetLastError();
}

cudaError_t Rope(const float* x, int rows, int cols, int head_dim, const float* inv_freq, const StepArrays& s,
                 float* out, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(rows) * (cols / head_dim) * (head_dim / 2);
  RopeKernel<<<Blocks(n, 256), 256, 0, stream>>>(x, rows, cols, head_dim, inv_freq, s.positions, out);
  return cudaGetLastError();
}

cudaError_t KvWrite(const float* k, const float* v, int width, void* k_cache, void* v_cache, int kv_type, int slots,
                    int window, const StepArrays& s, cudaStream_t stream) {
  const int n = s.num_tokens;
  if (kv_type == 0)
    KvWriteKernel<float><<<n, 256, 0, stream>>>(k, v, width, static_cast<float*>(k_cache), static_cast<float*>(v_cache),
                                                 slots, window, s.positions, s.seq_ids, n);
  else if (kv_type == 1)
    KvWriteKernel<__half><<<n, 256, 0, stream>>>(k, v, width, static_cast<__half*>(k_cache), static_cast<__half*>(v_cache),
                                                  slots, window, s.positions, s.seq_ids, n);
  else
    KvWriteKernel<__nv_bfloat16><<<n, 256, 0, stream>>>(k, v, width, static_cast<__nv_bfloat16*>(k_cache),
                                                         static_cast<__nv_bfloat16*>(v_cache), slots, window,
                                                         s.positions, s.seq_ids, n);
  return cudaGetLastError();
}

cudaError_t GeGlu(const float* a, const float* b, size_t n, float* out, cudaStream_t stream) {
  GeGluKernel<<<Blocks(n, 256), 256, 0, stream>>>(a, b, n, out);
  return cudaGetLastError();
}
cudaError_t Add(const float* a, const float* b, size_t n, float scale, float* out, cudaStream_t stream) {
  AddKernel<<<Blocks(n, 256), 256, 0, stream>>>(a, b, n, scale, out);
  return cudaGetLastError();
}
cudaError_t Scale(const float* x, size_t n, float scale, float* out, cudaStream_t stream) {
  ScaleKernel<<<Blocks(n, 256), 256, 0, stream>>>(x, n, scale, out);
  return cudaGetLastError();
}
cudaError_t Softcap(const float* x, size_t n, float cap, float* out, cudaStream_t stream) {
  SoftcapKernel<<<Blocks(n, 256), 256, 0, stream>>>(x, n, cap, out);
  return cudaGetLastError();
}
cudaError_t Slice(const float* x, int rows, int src_cols, int begin, int cols, float* out, cudaStream_t stream) {
  CopyRowsKernel<<<rows, 256, 0, stream>>>(x, src_cols, begin, cols, nullptr, out);
  return cudaGetLastError();
}
cudaError_t SelectRows(const float* x, int rows, int cols, const int32_t* output_rows, float* out, cudaStream_t stream) {
  CopyRowsKernel<<<rows, 256, 0, stream>>>(x, cols, 0, cols, output_rows, out);
  return cudaGetLastError();
}

cudaError_t MoeRoute(const float* r, int rows, int H, const float* router_scale, const uint8_t* proj, int proj_format,
                     size_t proj_row_bytes, const float* per_expert_scale, int E, int k, float eps, int32_t* chosen,
                     float* weight, cudaStream_t stream) {
  if (H % 32 != 0 || k < 1 || k > E) return cudaErrorInvalidValue;
  return WithFormat(proj_format, [&](auto f) {
    MoeRouteKernel<decltype(f)::value><<<rows, 256, MoeRouteSharedBytes(H, E), stream>>>(
        r, H, router_scale, proj, proj_row_bytes, per_expert_scale, E, k, eps, chosen, weight);
  });
}
cudaError_t MoeGeGlu(const float* gu, int jobs, int I, float* act, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(jobs) * I;
  MoeGeGluKernel<<<Blocks(n, 256), 256, 0, stream>>>(gu, jobs, I, act);
  return cudaGetLastError();
}
cudaError_t MoeCombine(const float* eo, const float* weight, int rows, int k, int H, float* out, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(rows) * H;
  MoeCombineKernel<<<Blocks(n, 256), 256, 0, stream>>>(eo, weight, rows, k, H, out);
  return cudaGetLastError();
}

cudaError_t AppendFixedKernelLaunches(std::vector<KernelLaunchInfo>* out) {
  KernelLaunchList list{out};
  auto add = [&](const char* name, const void* fn, int threads) { list.Add(name, fn, threads); };
  ForEachFormat([&](auto c) {
    add("embedding", reinterpret_cast<const void*>(EmbedKernel<decltype(c)::value>), 128);
    add("MoE routing", reinterpret_cast<const void*>(MoeRouteKernel<decltype(c)::value>), 256);  // shared: at Compile
  });
  add("RMS norm", reinterpret_cast<const void*>(RmsNormKernel), 1024);
  add("RoPE", reinterpret_cast<const void*>(RopeKernel), 256);
  add("KV write", reinterpret_cast<const void*>(KvWriteKernel<float>), 256);
  add("KV write", reinterpret_cast<const void*>(KvWriteKernel<__half>), 256);
  add("KV write", reinterpret_cast<const void*>(KvWriteKernel<__nv_bfloat16>), 256);
  add("GeGLU", reinterpret_cast<const void*>(GeGluKernel), 256);
  add("add", reinterpret_cast<const void*>(AddKernel), 256);
  add("scale", reinterpret_cast<const void*>(ScaleKernel), 256);
  add("soft-cap", reinterpret_cast<const void*>(SoftcapKernel), 256);
  add("row copy", reinterpret_cast<const void*>(CopyRowsKernel), 256);
  add("MoE GeGLU", reinterpret_cast<const void*>(MoeGeGluKernel), 256);
  add("MoE combine", reinterpret_cast<const void*>(MoeCombineKernel), 256);
  return list.err;
}

}  // namespace g4::cuda
