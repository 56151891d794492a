// Flash decoding (AttentionOp for steps of at most kDecodeMaxTokens tokens; kernels.h): token t's
// keys FirstKey(p) .. p split into ranges of keys_per_split positions, one block per (range, KV
// head h, token t) with every query head of h's group (attention_common.cuh), so a key is read
// once for the group and a long context spreads over the device's multiprocessors. Each block
// writes its (m, l, acc) per query head; DecodeCombineKernel merges a token's ranges by
// log-sum-exp. With one range the block writes the normalised output itself.
#include "backends/cuda/attention_common.cuh"

namespace g4::cuda {
namespace {

// Partials of (token t, query head qh, split sp) at index (t * Nq + qh) * splits + sp; acc rows of D.
template <int DPL, int KV>
__global__ void DecodeAttentionKernel(AttentionArgs a, StepArrays s, int keys_per_split, float* part_m, float* part_l,
                                      float* part_acc) {
  constexpr int D = 32 * DPL;
  const int sp = blockIdx.x, h = blockIdx.y, t = blockIdx.z, splits = gridDim.x;
  const int G = a.num_heads / a.num_kv_heads, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int qh = h * G + warp, p = s.positions[t];
  int begin, end;
  SplitKeyRange(p, a.window, sp, keys_per_split, &begin, &end);
  float q[DPL], acc[DPL];
  if (warp < G) LoadQuery<DPL>(a, t, qh, q);
#pragma unroll
  for (int i = 0; i < DPL; ++i) acc[i] = 0;
  float m = -INFINITY, l = 0;
  AttendKeys<DPL, KV>(a, s, t, h, begin, end, q, m, l, acc);
  if (warp >= G) return;
  if (splits == 1) {
    float* orow = a.out + (static_cast<size_t>(t) * a.num_heads + qh) * D;
#pragma unroll
    for (int i = 0; i < DPL; ++i) orow[lane + 32 * i] = acc[i] / l;
    return;
  }
  const size_t idx = (static_cast<size_t>(t) * a.num_heads + qh) * splits + sp;
  if (lane == 0) {
    part_m[idx] = m;
    part_l[idx] = l;
  }
  float* arow = part_acc + idx * D;
#pragma unroll
  for (int i = 0; i < DPL; ++i) arow[lane + 32 * i] = acc[i];
}

// One block per (query head, token): out = sum_s acc_s f_s / sum_s l_s f_s, f_s = exp(m_s - max m).
__global__ void DecodeCombineKernel(const float* part_m, const float* part_l, const float* part_acc, int splits,
                                    int num_heads, int D, float* out) {
  const int qh = blockIdx.x, t = blockIdx.y;
  const size_t base = (static_cast<size_t>(t) * num_heads + qh) * splits;
  float M = -INFINITY;
  for (int sp = 0; sp < splits; ++sp) M = fmaxf(M, part_m[base + sp]);
  float L = 0;
  for (int sp = 0; sp < splits; ++sp) L += part_l[base + sp] * MergeFactor(part_m[base + sp], M);
  float* orow = out + (static_cast<size_t>(t) * num_heads + qh) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float sum = 0;
    for (int sp = 0; sp < splits; ++sp) sum += part_acc[(base + sp) * D + d] * MergeFactor(part_m[base + sp], M);
    orow[d] = sum / L;
  }
}

}  // namespace

int DecodeAttentionThreads(int num_heads, int num_kv_heads) {
  const int G = num_heads / num_kv_heads;
  return 32 * (G < 4 ? 4 : G);
}

cudaError_t DecodeAttention(const AttentionArgs& a, const StepArrays& s, const DecodeSplit& plan, float* partials,
                            cudaStream_t stream) {
  const int T = s.num_tokens;
  if (T > kDecodeMaxTokens || plan.splits < 1 || T * plan.splits > kDecodeTokenSplits) return cudaErrorInvalidValue;
  const dim3 grid(plan.splits, a.num_kv_heads, T);
  const size_t shared = AttentionSharedBytes(a.head_dim);
  const int threads = DecodeAttentionThreads(a.num_heads, a.num_kv_heads);
  const size_t n = static_cast<size_t>(T) * a.num_heads * plan.splits;
  float* pm = partials;
  float* pl = pm + n;
  float* pacc = pl + n;
  const cudaError_t e = WithHeadDimAndKv(a.head_dim, a.kv_type, [&](auto dpl, auto kv) {
    DecodeAttentionKernel<decltype(dpl)::value, decltype(kv)::value>
        <<<grid, threads, shared, stream>>>(a, s, plan.keys_per_split, pm, pl, pacc);
  });
  if (e != cudaSuccess || plan.splits == 1) return e;
  DecodeCombineKernel<<<dim3(a.num_heads, T), 128, 0, stream>>>(pm, pl, pacc, plan.splits, a.num_heads, a.head_dim,
                                                                a.out);
  return cudaGetLastError();
}

cudaError_t AppendAttentionAuxKernelLaunches(std::vector<KernelLaunchInfo>* out) {
  KernelLaunchList list{out};
  list.Add("decode attention combine", reinterpret_cast<const void*>(DecodeCombineKernel), 128);
  list.Add("int8 KV quantisation", QuantizeKvKernelFor(kKvI8), 32);
  list.Add("fp8 KV quantisation", QuantizeKvKernelFor(kKvF8), 32);
  return list.err;
}

cudaError_t DecodeAttentionAttributes(int head_dim, int kv_type, cudaFuncAttributes* attr) {
  return InstanceAttributes(head_dim, kv_type, attr, [](auto dpl, auto kv) {
    return reinterpret_cast<const void*>(DecodeAttentionKernel<decltype(dpl)::value, decltype(kv)::value>);
  });
}

}  // namespace g4::cuda
