// Attention math shared by the CUDA kernels and the host tests (G4_HD: blocks.h): the int8 KV
// cache's quantisation (runtime/kv_cache.h's layout, bit for bit cpu::QuantizeKvRow), the fp8
// (e4m3) cache's, the merge of flash-decoding partials, and the decode kernel's split plan.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backends/cuda/blocks.h"

namespace g4::cuda {

// KV cache element types the attention kernels read (AttentionArgs::kv_type).
// kKvI8 and kKvF8 (e4m3 codes) hold one f32 scale per (slot, KV head) beside the elements.
enum KvType : int { kKvF32 = 0, kKvF16 = 1, kKvBF16 = 2, kKvI8 = 3, kKvF8 = 4 };
constexpr G4_HD bool KvScaled(int kv_type) { return kv_type == kKvI8 || kv_type == kKvF8; }

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
// max |x| over a head's D elements; *finite: whether all are finite.
G4_HD float HeadAmax(const float* x, int D, bool* finite) {
  float amax = 0.0f;
  *finite = true;
  for (int d = 0; d < D; ++d) {
    const float a = x[d] < 0 ? -x[d] : x[d];
    *finite = *finite && a <= 3.402823466e38f;  // false for NaN and infinities
    if (a > amax) amax = a;
  }
  return amax;
}
G4_HD void QuantizeKvHead(const float* x, int D, int8_t* q, float* scale) {
  bool finite;
  const float amax = HeadAmax(x, D, &finite);
  const KvQuantParams p = KvQuantFor(amax, finite);
  *scale = p.scale;
  for (int d = 0; d < D; ++d) q[d] = KvQuantElem(x[d], p.inv);
}

// OCP fp8 e4m3 "FN": sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal
// (m * 2^-9), S.1111.111 is NaN, no infinities, largest finite 448 (S.1111.110). The device runs
// these same functions (integer and exact float operations), not cuda_fp8.h's conversions.
inline constexpr float kE4m3Max = 448.0f;
G4_HD float E4m3ToF32(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t e = (b >> 3) & 15u, m = b & 7u;
  if (e == 15 && m == 7) return BitsToF32(sign | 0x7fc00000u);
  if (e == 0) {
    const float v = static_cast<float>(m) * 0.001953125f;  // m * 2^-9, exact
    return sign ? -v : v;
  }
  return BitsToF32(sign | ((e + 120u) << 23) | (m << 20));
}
// f32 -> e4m3, round to nearest, ties to even; |x| > 448 (infinities too) saturates to +-448; NaN
// -> S.1111.111 with x's sign.
G4_HD uint8_t F32ToE4m3(float x) {
  uint32_t u;
#if defined(__CUDA_ARCH__)
  u = __float_as_uint(x);
#else
  std::memcpy(&u, &x, 4);
#endif
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7f;
  if (a > 0x43e00000u) return sign | 0x7e;  // above 448
  if (a < 0x3c800000u) {                    // below 2^-6: subnormal steps of 2^-9
    const float q = RoundEven(Mul(BitsToF32(a), 512.0f));  // exact scaling; q in 0 .. 8 (8: 2^-6)
    return sign | static_cast<uint8_t>(q);
  }
  const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);  // round the 23-bit mantissa to 3 bits
  return sign | static_cast<uint8_t>((((r >> 23) - 120u) << 3) | ((r >> 20) & 7u));
}
// The fp8 cache's head row: scale amax / 448 (0 for an all-zero head, NaN for a non-finite one, as
// the int8 cache's), elements x / scale in e4m3 (0 where the scale is 0 or NaN).
G4_HD float KvScaleF8(float amax, bool finite) { return finite ? Div(amax, kE4m3Max) : NAN; }
G4_HD uint8_t KvQuantElemF8(float x, float scale) { return scale > 0.0f ? F32ToE4m3(Div(x, scale)) : 0; }
G4_HD void QuantizeKvHeadF8(const float* x, int D, uint8_t* q, float* scale) {
  bool finite;
  const float amax = HeadAmax(x, D, &finite);
  *scale = KvScaleF8(amax, finite);
  for (int d = 0; d < D; ++d) q[d] = KvQuantElemF8(x[d], *scale);
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
