#include "backends/cpu/attention_bf16.h"

#include <type_traits>

#include "backends/cpu/kernels_bf16.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// GCC 12's AVX-512 intrinsics leave an "undefined" operand that -Wuninitialized reports.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define G4_ATTN_BF16_X86 1
// Compiled for AVX-512 with BF16 whatever the build's -march; run only where HasBf16Attention().
#define G4_ATTN_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#else
#define G4_ATTN_BF16_X86 0
#endif

namespace g4::cpu {

bool HasBf16Attention() { return G4_ATTN_BF16_X86 && HasBf16Dot(); }

#if G4_ATTN_BF16_X86
namespace {

constexpr int kPairs = kBf16TileKeys / 2;  // weight pairs per head and tile
constexpr int64_t kAheadRows = 12;           // K rows prefetched ahead: attention_hwy.cc kPrefetchRows

G4_ATTN_BF16_TARGET inline __m512bh LoadBh(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }

// Lane n of the result = the sum of v[n]'s 16 lanes (n < 16), by a fixed tree: pairs of vectors
// interleaved by 32 then 64 bits and added (each 128-bit block then holds partial sums of 4
// vectors), then the blocks added across vectors. 45 shuffles and adds for 16 sums.
G4_ATTN_BF16_TARGET inline __m512 Sum16(const __m512 (&v)[16]) {
  __m512 x[8], y[4];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)
    x[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(x[2 * i]), b = _mm512_castps_pd(x[2 * i + 1]);
    y[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // 0x88: blocks 0, 2 of each source; 0xDD: blocks 1, 3.
  const __m512 z0 = _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], 0x88), _mm512_shuffle_f32x4(y[0], y[1], 0xDD));
  const __m512 z1 = _mm512_add_ps(_mm512_shuffle_f32x4(y[2], y[3], 0x88), _mm512_shuffle_f32x4(y[2], y[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(z0, z1, 0x88), _mm512_shuffle_f32x4(z0, z1, 0xDD));
}

// Keys j0 .. j0 + n - 1 (n <= J) of H heads: H x J accumulators (16 at H 8 x 2 keys and H 4 x 4,
// fewer for smaller head blocks), each q vector loaded once per 32 elements (kept in a register:
// GCC would fold it into every instruction that uses it as a memory operand, as in
// attention_hwy.cc's G4_IN_REGISTER) and each K vector once per head block. Keys past n repeat
// the last one (computed, not stored). pf: the K rows kAheadRows keys ahead (addresses only),
// prefetched into L2 with these keys' V rows, as attention_hwy.cc's kPrefetchLocality.
template <int H, int J>
G4_ATTN_BF16_TARGET inline void ScoreKeys(const uint16_t* qb, int D, const uint16_t* k, const uint16_t* v, int64_t ld,
                                          uintptr_t pf, uintptr_t row_bytes, int n, float* s) {
  const uint16_t* kr[J];
  const uint16_t* vr[J];
#pragma GCC unroll 4
  for (int j = 0; j < J; ++j) {
    const int jj = j < n ? j : n - 1;
    kr[j] = k + jj * ld;
    vr[j] = v + jj * ld;
  }
  __m512 a[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) a[i] = _mm512_setzero_ps();
  for (int d = 0; d < D; d += 32) {
    __m512bh kb[J];
#pragma GCC unroll 4
    for (int j = 0; j < J; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(pf + static_cast<uintptr_t>(j) * row_bytes + 2 * static_cast<uintptr_t>(d)),
                   _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(vr[j] + d), _MM_HINT_T1);
      kb[j] = LoadBh(kr[j] + d);
    }
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) {
      __m512i qi = _mm512_loadu_si512(qb + static_cast<size_t>(h) * D + d);
      asm("" : "+v"(qi));
#pragma GCC unroll 4
      for (int j = 0; j < J; ++j) a[h * J + j] = _mm512_dpbf16_ps(a[h * J + j], (__m512bh)qi, kb[j]);
    }
  }
  alignas(64) float t[16];
  _mm512_store_ps(t, Sum16(a));
#pragma GCC unroll 8
  for (int h = 0; h < H; ++h)
    for (int j = 0; j < n; ++j) s[h * kBf16TileKeys + j] = t[h * J + j];
}

// Keys per score block: 2 for 5-8 heads, 4 for up to 4 (16 accumulators at 8 and 4 heads).
constexpr int KeysPerBlock(int H) { return H > 4 ? 2 : 4; }

template <int H>
G4_ATTN_BF16_TARGET void Scores(const uint16_t* qb, int D, const uint16_t* k, const uint16_t* v, int64_t ld, int nk,
                                float* s) {
  constexpr int J = KeysPerBlock(H);
  const uintptr_t row_bytes = static_cast<uintptr_t>(ld) * 2;
  const uintptr_t ahead = reinterpret_cast<uintptr_t>(k) + static_cast<uintptr_t>(kAheadRows) * row_bytes;
  for (int j = 0; j < nk; j += J) {
    ScoreKeys<H, J>(qb, D, k + j * ld, v + j * ld, ld, ahead + static_cast<uintptr_t>(j) * row_bytes, row_bytes,
                    nk - j < J ? nk - j : J, s + j);
  }
}

// 32-element groups of D per V block: 1 for 5-8 heads (16 accumulators at 8), 2 for up to 4.
constexpr int GroupsPerBlock(int H) { return H > 4 ? 1 : 2; }

template <int H, int B>
G4_ATTN_BF16_TARGET void AccumulateVBlock(const uint32_t* w, int D, int d0, const uint16_t* const* vrows, int nk,
                                          float* acc, NextRows* next_k) {
  __m512 a[H][2 * B];
#pragma GCC unroll 8
  for (int h = 0; h < H; ++h)
#pragma GCC unroll 4
    for (int i = 0; i < 2 * B; ++i) a[h][i] = _mm512_loadu_ps(acc + static_cast<size_t>(h) * D + d0 + 16 * i);
  for (int j = 0; j < nk; j += 2) {
#pragma GCC unroll 2
    for (int i = 0; i < 2 * B; ++i) next_k->Step();
    __m512bh lo[B], hi[B];
#pragma GCC unroll 2
    for (int b = 0; b < B; ++b) {
      const __m512i r0 = _mm512_loadu_si512(vrows[j] + d0 + 32 * b);
      const __m512i r1 = j + 1 < nk ? _mm512_loadu_si512(vrows[j + 1] + d0 + 32 * b) : _mm512_setzero_si512();
      lo[b] = (__m512bh)_mm512_unpacklo_epi16(r0, r1);
      hi[b] = (__m512bh)_mm512_unpackhi_epi16(r0, r1);
    }
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) {
      const __m512bh wv = (__m512bh)_mm512_set1_epi32(static_cast<int>(w[h * kPairs + j / 2]));
#pragma GCC unroll 2
      for (int b = 0; b < B; ++b) {
        a[h][2 * b] = _mm512_dpbf16_ps(a[h][2 * b], wv, lo[b]);
        a[h][2 * b + 1] = _mm512_dpbf16_ps(a[h][2 * b + 1], wv, hi[b]);
      }
    }
  }
#pragma GCC unroll 8
  for (int h = 0; h < H; ++h)
#pragma GCC unroll 4
    for (int i = 0; i < 2 * B; ++i) _mm512_storeu_ps(acc + static_cast<size_t>(h) * D + d0 + 16 * i, a[h][i]);
}

template <int H>
G4_ATTN_BF16_TARGET void AccumulateV(const uint32_t* w, int D, const uint16_t* const* vrows, int nk, float* acc,
                                     NextRows* next_k) {
  constexpr int B = GroupsPerBlock(H);
  int d0 = 0;
  for (; d0 + 32 * B <= D; d0 += 32 * B) AccumulateVBlock<H, B>(w, D, d0, vrows, nk, acc, next_k);
  for (; d0 < D; d0 += 32) AccumulateVBlock<H, 1>(w, D, d0, vrows, nk, acc, next_k);
}

template <class Fn>
inline void WithHeads(int H, const Fn& fn) {
  switch (H) {
    case 1: return fn(std::integral_constant<int, 1>());
    case 2: return fn(std::integral_constant<int, 2>());
    case 3: return fn(std::integral_constant<int, 3>());
    case 4: return fn(std::integral_constant<int, 4>());
    case 5: return fn(std::integral_constant<int, 5>());
    case 6: return fn(std::integral_constant<int, 6>());
    case 7: return fn(std::integral_constant<int, 7>());
    case 8: return fn(std::integral_constant<int, 8>());
    default: break;
  }
}

G4_ATTN_BF16_TARGET void PackWeights(const float* p, int G, int nk, uint32_t* w) {
  const int pairs = (nk + 1) / 2;
  for (int g = 0; g < G; ++g) {
    const float* pg = p + g * kBf16TileKeys;
    uint32_t* wg = w + g * kPairs;
    for (int i = 0; i < pairs; i += 16) {
      // 32 weights in order: keys 2i + 2c (low half) and 2i + 2c + 1 (high half) in word c.
      const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(pg + 2 * i + 16), _mm512_loadu_ps(pg + 2 * i));
      _mm512_storeu_si512(wg + i, (__m512i)b);
    }
    if (nk % 2 != 0) wg[nk / 2] &= 0xffffu;  // the missing key weighs 0
  }
}

// Lanes of an accumulator pair (lo, hi) of Bf16AccumulateV: lo lane 4b + i holds element 8b + i
// of its 32, hi lane 4b + i element 8b + 4 + i (b < 4, i < 4). kNatural[n] = the lane of element n
// in the pair as _mm512_permutex2var_ps indexes it (lo 0..15, hi 16..31).
constexpr int NaturalIndex(int n) { return n % 8 < 4 ? 4 * (n / 8) + n % 8 : 16 + 4 * (n / 8) + n % 8 - 4; }

G4_ATTN_BF16_TARGET void AccToNatural(float* acc, int G, int D) {
  alignas(64) int32_t idx[32];
  for (int n = 0; n < 32; ++n) idx[n] = NaturalIndex(n);
  const __m512i i0 = _mm512_load_si512(idx), i1 = _mm512_load_si512(idx + 16);
  const size_t total = static_cast<size_t>(G) * D;
  for (size_t d = 0; d < total; d += 32) {
    const __m512 lo = _mm512_loadu_ps(acc + d), hi = _mm512_loadu_ps(acc + d + 16);
    _mm512_storeu_ps(acc + d, _mm512_permutex2var_ps(lo, i0, hi));
    _mm512_storeu_ps(acc + d + 16, _mm512_permutex2var_ps(lo, i1, hi));
  }
}

}  // namespace

void Bf16Scores(const uint16_t* qb, int H, int D, const uint16_t* k, const uint16_t* v, int64_t ld, int nk, float* s) {
  WithHeads(H, [&](auto h) { Scores<decltype(h)::value>(qb, D, k, v, ld, nk, s); });
}

void Bf16PackWeights(const float* p, int G, int nk, uint32_t* w) { PackWeights(p, G, nk, w); }

void Bf16AccumulateV(const uint32_t* w, int H, int D, const uint16_t* const* vrows, int nk, float* acc,
                     NextRows* next_k) {
  WithHeads(H, [&](auto h) { AccumulateV<decltype(h)::value>(w, D, vrows, nk, acc, next_k); });
}

void Bf16AccToNatural(float* acc, int G, int D) { AccToNatural(acc, G, D); }

#else  // not x86: HasBf16Attention() is false and nothing calls these.

void Bf16Scores(const uint16_t*, int, int, const uint16_t*, const uint16_t*, int64_t, int, float*) {}
void Bf16PackWeights(const float*, int, int, uint32_t*) {}
void Bf16AccumulateV(const uint32_t*, int, int, const uint16_t* const*, int, float*, NextRows*) {}
void Bf16AccToNatural(float*, int, int) {}

#endif

}  // namespace g4::cpu
