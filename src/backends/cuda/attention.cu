// Causal attention over the KV cache and the step's own keys (AttentionOp; kernels.h): the prefill
// kernel, one block per (token t, KV head h) over all of t's keys (attention_common.cuh).
#include "backends/cuda/attention_common.cuh"

namespace g4::cuda {
namespace {

template <int DPL, int KV>
__global__ void AttentionKernel(AttentionArgs a, StepArrays s) {
  const int t = blockIdx.x, h = blockIdx.y;
  const int G = a.num_heads / a.num_kv_heads, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int qh = h * G + warp, p = s.positions[t];
  float q[DPL], acc[DPL];
  if (warp < G) LoadQuery<DPL>(a, t, qh, q);
#pragma unroll
  for (int i = 0; i < DPL; ++i) acc[i] = 0;
  float m = -INFINITY, l = 0;
  AttendKeys<DPL, KV>(a, s, t, h, FirstKey(p, a.window), p + 1, q, m, l, acc);
  if (warp >= G) return;
  float* orow = a.out + (static_cast<size_t>(t) * a.num_heads + qh) * (32 * DPL);
#pragma unroll
  for (int i = 0; i < DPL; ++i) orow[lane + 32 * i] = acc[i] / l;
}

}  // namespace

bool AttentionHeadDimSupported(int d) { return d == 32 || d == 64 || d == 128 || d == 256 || d == 512; }

cudaError_t Attention(const AttentionArgs& a, const StepArrays& s, cudaStream_t stream) {
  const int G = a.num_heads / a.num_kv_heads;
  const dim3 grid(s.num_tokens, a.num_kv_heads);
  const size_t shared = AttentionSharedBytes(a.head_dim);
  return WithHeadDimAndKv(a.head_dim, a.kv_type, [&](auto dpl, auto kv) {
    AttentionKernel<decltype(dpl)::value, decltype(kv)::value><<<grid, 32 * G, shared, stream>>>(a, s);
  });
}

cudaError_t AttentionAttributes(int head_dim, int kv_type, cudaFuncAttributes* attr) {
  return InstanceAttributes(head_dim, kv_type, attr, [](auto dpl, auto kv) {
    return reinterpret_cast<const void*>(AttentionKernel<decltype(dpl)::value, decltype(kv)::value>);
  });
}

}  // namespace g4::cuda
