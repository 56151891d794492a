// The int8 KV cache's quantisation (runtime/kv_cache.h; the arithmetic in attention_plan.h, the
// same bits as cpu::QuantizeKvRow): one warp per (row, KV head, K or V) reduces max |x| and
// finiteness over the head's D elements, then rounds each element.
#include "backends/cuda/attention_plan.h"
#include "backends/cuda/kernels.h"

namespace g4::cuda {
namespace {

// Row t of k (blockIdx.z 0) or v (1), [rows, heads * D], head blockIdx.y, into the int8 row
// dest_row(t) of q/scale ([.., heads * D] and [.., heads]). cache: dest_row is the cache row of
// t's (sequence, slot), and a row that a later step token overwrites is skipped; else row t.
__global__ void QuantizeKvKernel(const float* k, const float* v, int heads, int D, int8_t* kq, int8_t* vq, float* ks,
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
  int8_t* q = (blockIdx.z == 0 ? kq : vq) + row * width + static_cast<size_t>(h) * D;
  float amax = 0.0f;
  bool finite = true;
  for (int d = lane; d < D; d += 32) {
    const float a = fabsf(x[d]);
    finite = finite && a <= 3.402823466e38f;
    amax = fmaxf(amax, a);
  }
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  finite = __all_sync(0xffffffffu, finite);
  const KvQuantParams p = KvQuantFor(amax, finite);
  if (lane == 0) (blockIdx.z == 0 ? ks : vs)[row * heads + h] = p.scale;
  for (int d = lane; d < D; d += 32) q[d] = KvQuantElem(x[d], p.inv);
}

}  // namespace

cudaError_t QuantizeKvAttributes(cudaFuncAttributes* attr) {
  return cudaFuncGetAttributes(attr, reinterpret_cast<const void*>(QuantizeKvKernel));
}

cudaError_t QuantizeKvRows(const float* k, const float* v, int rows, int heads, int D, int8_t* kq, int8_t* vq,
                           float* ks, float* vs, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  QuantizeKvKernel<<<dim3(rows, heads, 2), 32, 0, stream>>>(k, v, heads, D, kq, vq, ks, vs, false, 0, 0, nullptr,
                                                             nullptr, rows);
  return cudaGetLastError();
}

cudaError_t KvWriteI8(const float* k, const float* v, int heads, int D, int8_t* k_cache, int8_t* v_cache,
                      float* k_scale, float* v_scale, int slots, int window, const StepArrays& s, cudaStream_t stream) {
  QuantizeKvKernel<<<dim3(s.num_tokens, heads, 2), 32, 0, stream>>>(k, v, heads, D, k_cache, v_cache, k_scale, v_scale,
                                                                     true, slots, window, s.positions, s.seq_ids,
                                                                     s.num_tokens);
  return cudaGetLastError();
}

}  // namespace g4::cuda
