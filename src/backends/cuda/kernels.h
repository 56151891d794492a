// The CUDA backend's kernels (kernels.cu, matmul.cu, attention*.cu, kv_q8.cu), one per graph op,
// launched on `stream`. Activations between ops are f32 row-major [rows, cols] device arrays (the graph's
// values); weights are device bytes in a WeightFormat (blocks.h); KV caches are device arrays of
// f32, f16, bf16, int8 or fp8 e4m3 with scales (kv_type: attention_plan.h's KvType) laid out as
// runtime/kv_cache.h's KvCache ([max_seqs, slots, Nkv*D] per layer). Every launcher returns the launch's cudaError_t.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/cuda/attention_plan.h"

namespace g4::cuda {

// Per-step token arrays on the device, each [tokens]: ids, absolute positions, sequence ids, and
// the step index of the first token of each token's sequence.
struct StepArrays {
  const int32_t* tokens;
  const int32_t* positions;
  const int32_t* seq_ids;
  const int32_t* seq_first;
  const int32_t* output_rows;  // [output rows]
  int num_tokens;
};

// out[t] = table[token[t]] * scale (table rows of `cols` elements in `format`).
cudaError_t Embed(const uint8_t* table, int format, size_t row_bytes, int cols, float scale, const StepArrays& s,
                  float* out, cudaStream_t stream);
// out[r, n] = (x[r] . w[n]) * out_scale for r < rows, n < N; w [N, K] rows of row_bytes in `format`.
// Matrix-vector kernel: one warp per output column, the weights decoded in registers, up to 8 rows
// per read of the weights (rows beyond 8: the weights are read once per 8 rows).
cudaError_t MatVec(const uint8_t* w, int format, size_t row_bytes, int N, int K, const float* x, int rows,
                   float out_scale, float* out, cudaStream_t stream);
// Mixture-of-experts form of MatVec: row j of x (index j / x_div) times expert expert_ids[j]'s
// matrix (at w + expert_ids[j] * expert_bytes) into out[j], for j < jobs.
cudaError_t ExpertMatVec(const uint8_t* w, int format, size_t row_bytes, size_t expert_bytes, int N, int K,
                         const float* x, int x_div, const int32_t* expert_ids, int jobs, float* out,
                         cudaStream_t stream);
// Rows [n0, n0 + n) of w decoded into a 16-bit matrix [n, K] (half16: 1 f16, 0 bf16), for cuBLAS.
cudaError_t DequantRows(const uint8_t* w, int format, size_t row_bytes, int n0, int n, int K, bool half16,
                        void* out, cudaStream_t stream);
// x [n] f32 -> 16-bit (half16: f16, else bf16), round to nearest even.
cudaError_t ToHalf16(const float* x, size_t n, bool half16, void* out, cudaStream_t stream);
// RmsNormOp per row and group; w: f32 [group] or nullptr.
cudaError_t RmsNorm(const float* x, int rows, int cols, int group, const float* w, float eps, float offset, float* out,
                    cudaStream_t stream);
// NeoX RoPE of every head of head_dim in each row at the row's position; inv_freq [head_dim / 2] on the device.
cudaError_t Rope(const float* x, int rows, int cols, int head_dim, const float* inv_freq, const StepArrays& s,
                 float* out, cudaStream_t stream);
// The step's K and V rows [tokens, width] into a layer's cache ([max_seqs, slots, width] of kv_type).
cudaError_t KvWrite(const float* k, const float* v, int width, void* k_cache, void* v_cache, int kv_type, int slots,
                    int window, const StepArrays& s, cudaStream_t stream);
struct AttentionArgs {
  const float* q;  // [tokens, Nq*D]
  const float* k;  // [tokens, Nkv*D] the step's keys (f32; rounded to kv_type as the cache holds them)
  const float* v;
  // kv_type i8 or fp8: the step's keys and values quantised (QuantizeKvRows), int8 or e4m3 codes
  // [tokens, Nkv*D], and their scales [tokens, Nkv]; unused otherwise.
  const void* k_q = nullptr;
  const void* v_q = nullptr;
  const float* k_qscale = nullptr;
  const float* v_qscale = nullptr;
  const void* k_cache;  // [max_seqs, slots, Nkv*D] of kv_type
  const void* v_cache;
  const float* k_scale_cache = nullptr;  // i8, fp8: [max_seqs, slots, Nkv]
  const float* v_scale_cache = nullptr;
  float* out;  // [tokens, Nq*D]
  int kv_type, slots, window, num_heads, num_kv_heads, head_dim;  // kv_type: KvType (attention_plan.h)
  float scale, softcap;
};
// Causal attention (AttentionOp) of a prefill step: one block per (token, KV head), one warp per
// query head of that KV head's group; keys and values staged through shared memory in tiles of
// kAttentionTile rows, so each is read from device memory once for the whole group; online
// softmax in f32 (attention_common.cuh).
// kAttentionTile, AttentionSharedBytes: attention_plan.h.
// Whether the attention kernels have an instance for this head_dim (32, 64, 128, 256, 512).
bool AttentionHeadDimSupported(int head_dim);
cudaError_t Attention(const AttentionArgs& a, const StepArrays& s, cudaStream_t stream);
// Flash decoding for steps of at most kDecodeMaxTokens tokens (attention_decode.cu): the split
// plan's ranges of keys per block, partial states in `partials` (DecodePartialBytes), merged by a
// second kernel where plan.splits > 1. DecodeAttentionThreads: its block size.
cudaError_t DecodeAttention(const AttentionArgs& a, const StepArrays& s, const DecodeSplit& plan, float* partials,
                            cudaStream_t stream);
int DecodeAttentionThreads(int num_heads, int num_kv_heads);
// The compiled kernels' attributes (registers, static shared memory, largest block) for the launch
// checks; cudaErrorInvalidValue for a head_dim or kv_type with no instance.
cudaError_t AttentionAttributes(int head_dim, int kv_type, cudaFuncAttributes* attr);
cudaError_t DecodeAttentionAttributes(int head_dim, int kv_type, cudaFuncAttributes* attr);
// The 8-bit KV caches (runtime/kv_cache.h; kv_q8.cu), kv_type kKvI8 (int8) or kKvF8 (e4m3
// codes): the step's K and V rows [rows, heads * D] quantised into kq/vq [rows, heads * D] bytes
// and scales ks/vs [rows, heads]; and KvWrite's form, into a layer's 8-bit cache and its scales
// ([max_seqs, slots, heads]). cudaErrorInvalidValue for another kv_type.
cudaError_t QuantizeKvRows(const float* k, const float* v, int rows, int heads, int D, int kv_type, void* kq, void* vq,
                           float* ks, float* vs, cudaStream_t stream);
const void* QuantizeKvKernelFor(int kv_type);  // the kernel instance (for its attributes); nullptr for others
cudaError_t KvWrite8(const float* k, const float* v, int heads, int D, int kv_type, void* k_cache, void* v_cache,
                     float* k_scale, float* v_scale, int slots, int window, const StepArrays& s, cudaStream_t stream);
// out = gelu_tanh(a) * b; out = (a + b) * scale; out = x * scale; out = cap * tanh(x / cap).
cudaError_t GeGlu(const float* a, const float* b, size_t n, float* out, cudaStream_t stream);
cudaError_t Add(const float* a, const float* b, size_t n, float scale, float* out, cudaStream_t stream);
cudaError_t Scale(const float* x, size_t n, float scale, float* out, cudaStream_t stream);
cudaError_t Softcap(const float* x, size_t n, float cap, float* out, cudaStream_t stream);
// out[r] = x[r, begin : begin + cols] (x rows of src_cols).
cudaError_t Slice(const float* x, int rows, int src_cols, int begin, int cols, float* out, cudaStream_t stream);
// out[r] = x[output_rows[r]].
cudaError_t SelectRows(const float* x, int rows, int cols, const int32_t* output_rows, float* out, cudaStream_t stream);
// MoE routing (MoEOp's router) per token: rms(r) * router_scale * H^-1/2, logits against proj
// [E, H] (format), softmax, top-k (ties to the lower index) in increasing expert order,
// renormalised, times per_expert_scale. chosen/weight [tokens, k]. One block per token.
cudaError_t MoeRoute(const float* r, int rows, int H, const float* router_scale, const uint8_t* proj, int proj_format,
                     size_t proj_row_bytes, const float* per_expert_scale, int E, int k, float eps, int32_t* chosen,
                     float* weight, cudaStream_t stream);
// Shared memory MoeRoute uses (bytes).
inline size_t MoeRouteSharedBytes(int H, int E) { return (static_cast<size_t>(H) + E + 32) * sizeof(float); }
// GeGLU of the experts' gate/up rows: act[j] = gelu_tanh(gu[j, :I]) * gu[j, I:2I].
cudaError_t MoeGeGlu(const float* gu, int jobs, int I, float* act, cudaStream_t stream);
// out[t] = sum over i < k, in order, of eo[t * k + i] * weight[t * k + i].
cudaError_t MoeCombine(const float* eo, const float* weight, int rows, int k, int H, float* out, cudaStream_t stream);


// A kernel launched with a block size fixed by its launcher (the largest, where it varies), for
// the check against the device's limits when the backend is made (cuda_policy.h's
// CheckKernelLaunch); the attention kernels are checked per op at Compile instead.
struct KernelLaunchInfo {
  const char* name;
  cudaFuncAttributes attr;
  int threads;
  size_t dynamic_shared;
};
// Collects launches into *out (their cudaFuncGetAttributes), keeping the first error in err.
struct KernelLaunchList {
  std::vector<KernelLaunchInfo>* out;
  cudaError_t err = cudaSuccess;
  void Add(const char* name, const void* fn, int threads) {
    KernelLaunchInfo k{name, {}, threads, 0};
    const cudaError_t e = cudaFuncGetAttributes(&k.attr, fn);
    if (e != cudaSuccess && err == cudaSuccess) err = e;
    out->push_back(k);
  }
};
// Appends every such kernel instance of kernels.cu, matmul.cu, kv_q8.cu and attention_decode.cu
// (its combine kernel); the first cudaFuncGetAttributes error, if any.
cudaError_t AppendFixedKernelLaunches(std::vector<KernelLaunchInfo>* out);
cudaError_t AppendMatMulKernelLaunches(std::vector<KernelLaunchInfo>* out);
cudaError_t AppendAttentionAuxKernelLaunches(std::vector<KernelLaunchInfo>* out);

}  // namespace g4::cuda
