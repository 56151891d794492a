// The 8-bit KV caches' quantisation (runtime/kv_cache.h; the arithmetic in attention_plan.h):
// int8 (the same bits as cpu::QuantizeKvRow) and fp8 e4m3. One warp per (row, KV head, K or V)
// reduces max |x| and finiteness over the head's D elements, then rounds each element.
#include "backends/cuda/attention_plan.h"
#include "backends/cuda/kernels.h"

namespace g4::cuda {
namespace {

// Row t of k (blockIdx.z 0) or v (1), [rows, heads * D], head blockIdx.y, into the 8-bit row
// dest_row(t) of q/scale ([.., heads * D] and [.., heads]) as KV (kKvI8 or kKvF8). cache:
// dest_row is the cache row of t's (sequence, slot), and a row that a later step token
// overwrites is skipped; else row t.
template <int KV>
__global__ void QuantizeKvKernel(const float* k, const float* v, int heads, int D, uint8_t* kq, uint8_t* vq, float* ks,
                                 float* vs, bool cache, int slots, int window, const int32_t* positions,
                                 const int32_t* seq_ids, int tokens) {
  const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
  size_t row = t;
  if (cache) {
    if (!KvRowSurvives(t, tokens, seq_ids, window, slots)) return;
    row = static_cast<size_t>(seq_ids[t]) * slots + KvSlot(positions[t], window, slots);
  }
  const int width = heads * D;
  const float* x = (blockIdx.z == 0 ? k : v) + static_cast<size_t>(t) * width + static_cast<size_t>(h) * D;
  uint8_t* q = (blockIdx.z == 0 ? kq : vq) + row * width + static_cast<size_t>(h) * D;
  float amax = 0.0f;
  bool finite = true;
  for (int d = lane; d < D; d += 32) {
    const float a = fabsf(x[d]);
    finite = finite && a <= 3.402823466e38f;
    amax = fmaxf(amax, a);
  }
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  finite = __all_sync(0xffffffffu, finite);
  float* scale = (blockIdx.z == 0 ? ks : vs) + row * heads + h;
  if constexpr (KV == kKvF8) {
    const float s = KvScaleF8(amax, finite);
    if (lane == 0) *scale = s;
    for (int d = lane; d < D; d += 32) q[d] = KvQuantElemF8(x[d], s);
  } else {
    const KvQuantParams p = KvQuantFor(amax, finite);
    if (lane == 0) *scale = p.scale;
    for (int d = lane; d < D; d += 32) q[d] = static_cast<uint8_t>(KvQuantElem(x[d], p.inv));
  }
}

// Calls fn(QuantizeKvKernel<KV>) for kv_type, then returns the launch's error.
template <typename Fn>
cudaError_t WithQuantKernel(int kv_type, Fn&& fn) {
  if (kv_type == kKvI8) fn(QuantizeKvKernel<kKvI8>);
  else if (kv_type == kKvF8) fn(QuantizeKvKernel<kKvF8>);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

}  // namespace

const void* QuantizeKvKernelFor(int kv_type) {
  if (kv_type == kKvI8) return reinterpret_cast<const void*>(QuantizeKvKernel<kKvI8>);
  if (kv_type == kKvF8) return reinterpret_cast<const void*>(QuantizeKvKernel<kKvF8>);
  return nullptr;
}

cudaError_t QuantizeKvRows(const float* k, const float* v, int rows, int heads, int D, int kv_type, void* kq, void* vq,
                           float* ks, float* vs, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return WithQuantKernel(kv_type, [&](auto kernel) {
    kernel<<<dim3(rows, heads, 2), 32, 0, stream>>>(k, v, heads, D, static_cast<uint8_t*>(kq),
                                                    static_cast<uint8_t*>(vq), ks, vs, false, 0, 0, nullptr, nullptr,
                                                    rows);
  });
}

cudaError_t KvWrite8(const float* k, const float* v, int heads, int D, int kv_type, void* k_cache, void* v_cache,
                     float* k_scale, float* v_scale, int slots, int window, const StepArrays& s, cudaStream_t stream) {
  return WithQuantKernel(kv_type, [&](auto kernel) {
    kernel<<<dim3(s.num_tokens, heads, 2), 32, 0, stream>>>(k, v, heads, D, static_cast<uint8_t*>(k_cache),
                                                            static_cast<uint8_t*>(v_cache), k_scale, v_scale, true,
                                                            slots, window, s.positions, s.seq_ids, s.num_tokens);
  });
}

}  // namespace g4::cuda
