// CPU attention (AttentionOp, src/graph/graph.h): a fused SIMD kernel (attention_hwy.cc, Google
// Highway, every x86 and Arm target) and its scalar reference (attention.cc).
//
// Work item: one query token and one KV head, with the G = Nq / Nkv query heads that share that KV
// head handled together, so each K and V row is read from memory once per token for the whole
// group (MQA: all heads). The keys a token attends to (positions lo..p, lo = p - window + 1 on
// sliding layers, else 0) are at most three runs of consecutive rows in positional order: the
// cache before the step (one run, or two where a sliding layer's ring wraps) and the step's own
// k/v rows.
//
// Softmax: streaming ("online") over tiles of 64 keys, counted from the item's first key across
// the runs (a tile may span the cache and the step). Per tile, the scores of all G heads go to a
// small buffer (f32: q.k * scale, then the optional soft-cap cap * tanh(s / cap)); the running
// maximum m, the running sum l = sum exp(s - m) and the un-normalised output acc = sum exp(s - m) v
// are rescaled by exp(m_old - m_new) when a tile raises the maximum; out = acc / l at the end.
// The same state (m, l, acc) is what a split-K chunk returns, and AttentionMerge combines chunks.
//
// Threading (Attention): items = tokens x Nkv. Each item's keys are cut into chunks (by index from
// its first key: 64 keys below 2048 keys, longer beyond, attention.cc ChunkKeys), each chunk's
// state computed on its own and the states folded in order (AttentionMerge). With at least as
// many items as threads, whole items are spread over the pool in zig-zag order (item 0, last, 1,
// last - 1, ...), so that the causal prefill's short and long items pair up in each thread's
// range; with fewer (decode: one token; MQA: one KV head) the chunks of all items are, and where
// those are fewer than the threads, also the query heads in groups (decode of a short context),
// and then the merges, per head. Either way a token's output is the same bits whatever the thread
// count, the other sequences in the step, or where its cache ends and its step begins (chunked
// prefill).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "tensor/dtype.h"

namespace g4 {
class ThreadPool;
}

namespace g4::cpu {

struct AttentionParams {
  int num_heads, num_kv_heads, head_dim;
  int window;     // > 0: sliding layer, keys p - window + 1 .. p
  float scale;    // scores = q.k * scale
  float softcap;  // > 0: scores = softcap * tanh(scores / softcap)
};

// One attention op's inputs for one step. Rows of q/out are Nq*D floats, rows of k/v Nkv*D
// elements of step_type, rows of the cache Nkv*D elements of cache_type: DType::kF32, kF16 (IEEE
// binary16), kBF16 or kI8. Token t of sequence s at position p attends to the cache rows of positions
// before the step (first step position of s = positions[seq_first[t]]) and to the step rows of s.
// With an f16 cache, the step rows must hold f16 values (step_type kF16: the rows in f16, as the
// CPU backend passes them; or f32 rows of values that f16 represents exactly, RoundToF16), so a
// key reads the same whether it comes from the step or, in a later step, from the cache. With a
// bf16 cache the step rows are bf16 (step_type kBF16): the kernel then computes with q and the
// softmax weights rounded to bf16 (attention_bf16.h), which it decides by the rows' type. With an
// i8 cache (kv_cache.h) the step rows are i8 too (QuantizeKvRow), with their scales: per KV head,
// the score is (q . k_int) * k_scale and the V sum adds (p * v_scale) * v_int, on the integers
// widened to f32 in registers (exact), so a key scores the same bits from the step or the cache.
struct AttentionStep {
  int tokens;
  const float* q;  // [tokens, Nq*D]
  const void* k;   // [tokens, Nkv*D]: the step's keys, of step_type
  const void* v;   // [tokens, Nkv*D]
  float* out;      // [tokens, Nq*D]; may be q (Attention only: in place)
  const int32_t* positions;      // [tokens] absolute positions
  const int32_t* seq_first;      // [tokens] step index of the first token of t's sequence
  const void* const* k_cache;    // [tokens] cache K row of slot 0 of t's sequence
  const void* const* v_cache;    // [tokens] cache V row of slot 0 of t's sequence
  int slots;                     // cache rows per sequence
  bool ring;                     // slot of position j = j % slots (sliding layer), else j
  DType cache_type = DType::kF32;  // the cache rows' elements: kF32, kF16, kBF16 or kI8
  DType step_type = DType::kF32;   // the step's k and v rows' (as the cache holds them; kF32 with an f32 cache)
  // kI8 only: the step rows' scales [tokens, Nkv], and per token the scale row (Nkv floats) of
  // slot 0 of its sequence's cache (slot j's at + j * Nkv).
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  const float* const* k_scale_cache = nullptr;
  const float* const* v_scale_cache = nullptr;
};

// x[i] = the f16 nearest to x[i] (round to nearest even, as F32ToF16), as f32; n floats.
void RoundToF16(float* x, int64_t n);
// out[i] = F32ToF16(x[i]) (the bits: IEEE binary16, round to nearest even); n floats.
void ToF16(const float* x, int64_t n, uint16_t* out);
// n floats x as a KV cache of `type` holds them at out: kF32 copied, kF16 ToF16, kBF16
// ConvertRowsToBf16 (round to nearest even); G4_CHECK on other types.
void ToKvType(DType type, const float* x, int64_t n, void* out);

// One row of `heads` KV heads of D floats x as the i8 cache holds it: per head h, scale[h] = max_d
// |x[h*D + d]| / 127 and q[h*D + d] = x / scale rounded to nearest even (|q| <= 127), so that
// q * scale is within scale / 2 of x; an all-zero head has scale 0 and q 0; a head with a NaN or
// infinity has scale NaN (its scores and outputs become NaN, as in an f32 cache) and q 0. The
// same bits on every CPU (scalar IEEE arithmetic).
void QuantizeKvRow(const float* x, int heads, int D, int8_t* q, float* scale);

// Scratch the threaded driver reuses across calls (grown on first use only).
struct AttentionScratch {
  std::vector<float> state;    // split-K: per chunk m[G], l[G], acc[G*D]
  std::vector<int64_t> units;  // split-K: per unit item, chunk, first head, end head
  std::vector<int64_t> merges;  // split-K: per merged head first unit, end unit, head
};

// Fused SIMD attention of a whole step over the pool (nullptr: on the calling thread).
void Attention(const AttentionParams& p, const AttentionStep& s, ThreadPool* pool, AttentionScratch* scratch);
// Scalar reference: per token and query head, f32 scores over all keys in positional order,
// two-pass f32 softmax (max, exp, sum), p_j = e_j / sum, out = sum p_j v_j (single accumulators).
void AttentionReference(const AttentionParams& p, const AttentionStep& s);

// ---- The kernel and its pieces (for the driver and the tests) ----------------------------------

// `n` consecutive K and V rows (row stride `ld` elements, given to the kernel) of `type`: DType::kF32,
// kF16, kBF16 or kI8. The runs of one kernel call are all bf16 or none (attention_bf16.h), and all
// i8 or none. i8: one scale per `group` elements (a KV head's D), the scale of element e of the
// rows at ks[e / group] and vs[e / group] (so row j's, at stride ld, is ks[j * ld / group]).
struct KvRun {
  const void* k;
  const void* v;
  int n;
  DType type = DType::kF32;
  const float* ks = nullptr;
  const float* vs = nullptr;
  int group = 0;
  // The `count` rows starting `elems` elements (DTypeSize(type) bytes each) after k and v.
  KvRun Offset(int64_t elems, int count) const {
    const int64_t bytes = elems * static_cast<int64_t>(DTypeSize(type));
    const int64_t se = group > 0 ? elems / group : 0;
    return KvRun{static_cast<const unsigned char*>(k) + bytes, static_cast<const unsigned char*>(v) + bytes, count, type,
                 ks != nullptr ? ks + se : nullptr, vs != nullptr ? vs + se : nullptr, group};
  }
};

// Softmax weights exp(x), x = a score minus the running maximum (x <= 0), below exp(kWeightFloor)
// = exp(-64) = 1.6e-28 are 0: in the kernel's tiles, the rescale of its state when a tile raises
// the maximum, and the split-K merge (SoftmaxWeight; the SIMD kernel clamps x before its Exp, whose
// last multiply makes a subnormal float for x in [-104, -87.3]). Why: Intel cores run each
// multiply or multiply-add that takes or makes a subnormal float (below FLT_MIN = 1.18e-38) in a
// microcode assist of about a hundred cycles (Intel's optimization manual: "floating-point
// assists"); AMD's Zen cores do not. With Gemma 4's scale of 1 on RMS-normed q and k, scores
// spread by tens, so without the floor a few percent of the weights in a long decode are
// subnormal, each then an input to D / 16 multiply-adds of the V sum. The
// floor sits well above FLT_MIN so that a weight times a value, and the state times a rescale
// factor, stay normal floats too unless the value or the state is below FLT_MIN / 1.6e-28 = 7e-11
// in magnitude. The cost: a weight under 1.6e-28 next to the largest, 1, is 2^68 below f32's
// resolution of l (>= 1), so it changes l and acc by nothing a float holds (short of a
// cancellation in acc to below ~1e-20 of its terms). NaN: the scalar SoftmaxWeight keeps it, the
// SIMD tile does not (Highway's Exp gives 0 for NaN, as before this floor); -inf (padding) gives 0.
constexpr float kWeightFloor = -64.0f;
inline float SoftmaxWeight(float x) { return x < kWeightFloor ? 0.0f : std::exp(x); }

// SIMD kernel: G query heads q [G, D] (contiguous) over the keys of runs[0..num_runs) in order.
// Writes the un-normalised softmax state: m[g] the highest score, l[g] = sum_j w(s_gj - m[g]),
// acc[g * D + d] = sum_j w(s_gj - m[g]) v_j[d], w = SoftmaxWeight. At least one key.
void AttentionPartial(const float* q, int G, int D, const KvRun* runs, int num_runs, int64_t ld, float scale,
                      float softcap, float* m, float* l, float* acc);
// Combines `parts` states (m, l [parts, G]; acc [parts, G, D]) into out [G, D] = the softmax-weighted
// sum over all the parts' keys: folded left to right (part 0, then each next one: both states
// rescaled to the larger maximum and added), then out = acc / l. Attention folds its chunks with
// the same operations in both of its paths.
void AttentionMerge(int G, int D, int parts, const float* m, const float* l, const float* acc, float* out);
// The key runs of token t and KV head kvh (at most 3), and their total length.
int AttentionKeyRuns(const AttentionParams& p, const AttentionStep& s, int t, int kvh, KvRun* runs, int* num_runs);
// runs restricted to keys [begin, end) of their concatenation.
int SliceKeyRuns(const KvRun* runs, int num_runs, int begin, int end, int64_t ld, KvRun* out);

}  // namespace g4::cpu
