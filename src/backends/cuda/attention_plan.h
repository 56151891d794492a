// Attention math shared by the CUDA kernels and the host tests (G4_HD: blocks.h): the int8 KV
// cache's quantisation (runtime/kv_cache.h's layout, bit for bit cpu::QuantizeKvRow), the merge
// of flash-decoding partials, and the decode kernel's split plan.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "backends/cuda/blocks.h"

namespace g4::cuda {

// KV cache element types the attention kernels read (AttentionArgs::kv_type).
enum KvType : int { kKvF32 = 0, kKvF16 = 1, kKvBF16 = 2, kKvI8 = 3 };

G4_HD float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
// Round to nearest integer, ties to even (std::nearbyint in the default rounding mode).
G4_HD float RoundEven(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}

// One KV head's int8 row: from amax = max |x| over its D elements and whether all are finite, the
// scale stored (amax / 127; 0 for an all-zero head, NaN for a non-finite one) and the factor the
// elements are multiplied by before rounding (127 / amax; 0 where the q are all 0).
struct KvQuantParams {
  float scale, inv;
};
G4_HD KvQuantParams KvQuantFor(float amax, bool finite) {
  if (!finite) return {NAN, 0.0f};
  if (amax == 0.0f) return {0.0f, 0.0f};
  return {Div(amax, 127.0f), Div(127.0f, amax)};
}
// The int8 of element x under `inv` (0 for inv 0: the zero and non-finite heads).
G4_HD int8_t KvQuantElem(float x, float inv) {
  if (inv == 0.0f) return 0;
  float r = RoundEven(Mul(x, inv));
  r = r < -127.0f ? -127.0f : (r > 127.0f ? 127.0f : r);
  return static_cast<int8_t>(r);
}
// A whole head on one thread (host tests; the kernel reduces amax across a warp and then calls
// the two functions above per element, which gives the same bits: max is order-free).
G4_HD void QuantizeKvHead(const float* x, int D, int8_t* q, float* scale) {
  float amax = 0.0f;
  bool finite = true;
  for (int d = 0; d < D; ++d) {
    const float a = x[d] < 0 ? -x[d] : x[d];
    finite = finite && a <= 3.402823466e38f;  // false for NaN and infinities
    if (a > amax) amax = a;
  }
  const KvQuantParams p = KvQuantFor(amax, finite);
  *scale = p.scale;
  for (int d = 0; d < D; ++d) q[d] = KvQuantElem(x[d], p.inv);
}

// Flash decoding: a split's partial state of one query head (running max m, sum l of
// exp(score - m), acc = sum exp(score - m) * v, unnormalised), merged into (M, L, Acc) by
// log-sum-exp rescaling. An empty split has m = -inf, l = 0 and adds nothing.
G4_HD float MergeFactor(float m, float M) { return m == -INFINITY ? 0.0f : expf(m - M); }

// Keys staged through shared memory at a time by both attention kernels, and the shared memory
// one attention block uses (bytes): K and V tiles in f32 and the tiles' per-key scales.
inline constexpr int kAttentionTile = 8;
inline size_t AttentionSharedBytes(int head_dim) {
  return (2u * kAttentionTile * static_cast<size_t>(head_dim) + 2u * kAttentionTile) * sizeof(float);
}

// Decode attention's key-range split: a block per (split, KV head, token); each split takes
// `keys_per_split` consecutive key positions (a multiple of kAttentionTile).
inline constexpr int kDecodeMinKeys = 64;         // fewest keys worth a split of their own
inline constexpr int kDecodeMaxTokens = 32;       // steps of more tokens use the prefill kernel
inline constexpr int kDecodeTokenSplits = 256;    // tokens x splits at most: bounds the partials
struct DecodeSplit {
  int splits = 1, keys_per_split = 0;
};
// For a step of `tokens` tokens over `kv_heads` KV heads whose longest key range is `max_keys`
// positions, on a device of `sm_count` multiprocessors: enough splits for two blocks per
// multiprocessor, none shorter than kDecodeMinKeys keys, tokens x splits <= kDecodeTokenSplits.
inline DecodeSplit PlanDecodeSplit(int tokens, int kv_heads, int max_keys, int sm_count) {
  DecodeSplit p;
  if (tokens < 1 || kv_heads < 1 || max_keys < 1) return p;
  const int base = tokens * kv_heads;
  int s = (2 * (sm_count > 0 ? sm_count : 1) + base - 1) / base;
  const int by_keys = (max_keys + kDecodeMinKeys - 1) / kDecodeMinKeys;
  if (s > by_keys) s = by_keys;
  if (s > kDecodeTokenSplits / tokens) s = kDecodeTokenSplits / tokens;
  if (s < 1) s = 1;
  int per = (max_keys + s - 1) / s;
  per = (per + kAttentionTile - 1) / kAttentionTile * kAttentionTile;
  s = (max_keys + per - 1) / per;  // no split left empty by the rounding up
  p.splits = s;
  p.keys_per_split = per;
  return p;
}
// The key count a decode step's split plan is made for: the longest range rounded up to a power
// of two, at most the layer's `capacity` (its cache slots), so that the plan, which a captured
// step graph holds, changes a few times over a context rather than every kDecodeMinKeys tokens.
inline int DecodePlanKeys(int max_keys, int capacity) {
  int k = 1;
  while (k < max_keys && k < capacity) k *= 2;
  return k < capacity ? k : (capacity > max_keys ? capacity : max_keys);
}
// Split sp's key positions [begin, end) of a query at position p (keys FirstKey(p, window) .. p);
// begin >= end: an empty split (a token with fewer keys than the step's longest range).
G4_HD void SplitKeyRange(int p, int window, int sp, int keys_per_split, int* begin, int* end) {
  *begin = FirstKey(p, window) + sp * keys_per_split;
  *end = *begin + keys_per_split < p + 1 ? *begin + keys_per_split : p + 1;
}
// Bytes of the partial states a decode attention of Nq query heads of head_dim D may write (m, l
// and acc per token, head and split; at most kDecodeTokenSplits token-splits).
inline size_t DecodePartialBytes(int num_heads, int head_dim) {
  return static_cast<size_t>(kDecodeTokenSplits) * num_heads * (head_dim + 2) * sizeof(float);
}

}  // namespace g4::cuda
