// SIMD int8-activation matmul (kernels_q8.h), one source for every Highway target.
//
// Per weight block, each 32-element unit is turned into 32 small integers u_k (in registers) plus
// per-half f32 scale a_h and offset b_h (see kernels_q8.h), then multiplied with the activation
// block's int8 q_k:
// - x86 AVX2 and AVX-512 targets: byte multiply-add (vpmaddubsw: u8 x i8 -> pairs of i16; no
//   saturation since |u| <= 128 and |q| <= 127 give |pair| <= 32512), then vpmaddwd with ones
//   (-> exact i32), converted to f32 and multiplied-added with a_h * dx (PairTile below). Signed
//   Q8_0 weights use |u| and sign(q, u).
// - Other targets (SSE4 and older, NEON, SVE, scalar): u decoded with vector operations into i16
//   (UnitVec; scalar code on HWY_SCALAR), i16 x i16 -> i32 multiply-adds
//   (ReorderWidenMulAccumulate) against activations widened to i16 once per call, f32 lanes
//   accumulated per row and reduced once per weight row (DotTile); on Arm CPUs with the
//   Armv8.2 dot product, SDOT on the unit's bytes and the activation bytes (DotTileSdot).
// Tiles (AVX2/AVX-512): four weight rows at a time (PairTile) by one activation row in decode and
// six in prefill; two rows' units share each 256-bit decode, and the four rows share the scale
// conversion, one vphaddd reduction and one f32 multiply-add per unit. The tile prefetches the
// next four rows, since the hardware prefetchers follow four interleaved streams badly.
// Measured single-threaded on this machine's EPYC (bench/kernels_bench.cc BM_Q8, 6144 x 1536,
// CPU time per call, one-row tiles -> four-row tiles): Q4_0 decode 615 -> 330 us, prefill of 64
// rows 22.1 -> 11.7 ms; Q4_K decode 750 -> 380 us; Q8_0 LM head 262144 x 640 14.2 -> 10.5 ms.
// Q6_K, whose unit halves have their own int8 scales, has its own four-row tile (FmtQ6K::Tile4):
// one row's unit per register and the scales and the -32 offset applied in integers; BM_Q8
// 6144 x 1536 Q6_K decode 619 -> 462 us, prefill of 64 rows 19.3 -> 16.1 ms (best of six
// interleaved runs each, machine shared with a build). Q4_K's scales are decoded for the four rows
// at once (FmtK4::BlockScales4): decode 374 -> 321 us.
// Other targets: one activation row or eight by one weight row (DotTile). GEMMA4RT_BENCH_TARGET=SSE4
// runs them here (the 128-bit code NEON shares, with the same vector lengths).
// The offsets b_h * dx * sum(q over the half) use the sums stored in the activation block.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__aarch64__)
#include <arm_neon.h>  // the SDOT tiles use NEON intrinsics on every Arm target (NEON, SVE, SVE2)
#endif

#include "backends/cpu/kernels_q8.h"
#include "base/check.h"
#include "tensor/block_fields.h"
#include "tensor/dtype.h"
#include "tensor/quantize.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/cpu/kernels_q8_hwy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace g4 {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int kPairRows = 6;  // activation rows per four-weight-row tile (PairTile), at most 6
// PairTile prefetches the weight rows this many tiles ahead, into L2. On a Zen 4 EPYC VM (2 cores,
// reads of ~35-53 GB/s), full-size E2B decode (`bench -p 0 -n 32 -r 3`, 3 alternating rounds):
// one tile ahead into L1 -> four tiles ahead into L2, Q4_0 19.2-19.8 -> 20.5-21.6 tokens/s,
// Q4_K_M 17.6-18.2 -> 19.6-19.7; eight tiles ahead was no better, four into L1 worse (17.5-18.8).
constexpr int kPrefetchTiles = 4;

// Weight rows per pass over the activations: decode (up to four activation rows) takes all M in
// one pass; prefill takes groups of ~256 KiB of weights (which stay in L2 while every activation
// tile passes over them), a multiple of `multiple` rows (4 for kQ4_0x4's groups of four).
inline int WeightRowGroup(int rows, int M, size_t row_bytes, int multiple) {
  if (rows <= 4) return M;
  const int fit = static_cast<int>((256u << 10) / std::max<size_t>(row_bytes, 1));
  return std::max(multiple, fit / multiple * multiple);
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define G4_Q8_AVX2 1
#else
#define G4_Q8_AVX2 0
#endif

// The fp16 scale at p as f32, exactly as F16ToF32 (F16C's conversion on AVX2 and better).
HWY_INLINE float HalfQ8(const uint8_t* p) {
#if G4_Q8_AVX2
  return _cvtsh_ss(static_cast<uint16_t>(p[0] | (p[1] << 8)));
#else
  return HalfAt(p);
#endif
}
HWY_INLINE uint32_t U32Q8(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;  // little-endian hosts only (x86, Arm Linux)
}


// ---------------------------------------------------------------------------------------------
// Formats. Each has kQK elements per block of kBytes; kUnits = kQK / 32 units; kSigned (u is a
// signed byte: Q8_0 only); kOffset (b_h != 0); Prepare(block, &params); Scales(params, j, a, b)
// for unit j; Unit(block, j, u) = the unit's 32 integers, scalar (all targets); and on AVX2+,
// PairAvx2(block of row 0, block of row 1, j, lo, hi) = unit j of both rows as bytes, lo =
// [elements 0-15 of row 0 | of row 1], hi = elements 16-31, and BlockScales4(four rows' blocks,
// a, o) = each unit's scale a and offset b for the four rows as [row 0 .. row 3]. Formats with
// kOwnTile (Q6_K, whose unit halves have their own scales) bring their own four-row tile.

#if G4_Q8_AVX2
// Byte k of the result is 0x10 where bit k of the 32-bit mask at qh is set, else 0.
HWY_INLINE __m256i FifthBits32(const uint8_t* qh) {
  const __m256i bits = _mm256_set1_epi32(static_cast<int>(U32Q8(qh)));
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                        3, 3, 3, 3, 3, 3);
  const __m256i sel = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(bits, shuf), sel);
  return _mm256_and_si256(_mm256_cmpeq_epi8(b, sel), _mm256_set1_epi8(0x10));
}
// [16 bytes at p0 | 16 bytes at p1].
HWY_INLINE __m256i Load2x128(const uint8_t* p0, const uint8_t* p1) {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p0))),
                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1)), 1);
}
// The fp16 values at b[0] + off, ..., b[3] + off as four f32 (F16C, exactly as HalfQ8).
HWY_INLINE __m128 Halves4(const uint8_t* const* b, int off) {
  uint16_t h[4];
  for (int i = 0; i < 4; ++i) std::memcpy(&h[i], b[i] + off, 2);
  __m128i v = _mm_cvtsi32_si128(h[0]);
  v = _mm_insert_epi16(v, h[1], 1);
  v = _mm_insert_epi16(v, h[2], 2);
  v = _mm_insert_epi16(v, h[3], 3);
  return _mm_cvtph_ps(v);
}
// The four-row tiles read four interleaved row streams, which the hardware prefetchers follow
// badly (the 262144 x 640 Q8_0 LM head ran at half speed without this): each block step prefetches
// as many bytes of the next tile (at `next`) as it consumes, block ib of kBytes per row.
HWY_INLINE void PrefetchTile(const uint8_t* next, size_t ib, size_t kBytes) {
  for (size_t q = ib * 4 * kBytes; q < (ib + 1) * 4 * kBytes; q += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(next + q), _MM_HINT_T1);
  }
}
#endif

struct FmtQ8_0 {
  static constexpr int kQK = 32, kBytes = 34, kUnits = 1;
  static constexpr bool kSigned = true, kOffset = false;
  struct Params { float d; };
  static HWY_INLINE void Prepare(const uint8_t* b, Params* p) { p->d = HalfQ8(b); }
  static HWY_INLINE void Scales(const Params& p, int, float* a, float* o) { a[0] = a[1] = p.d; o[0] = o[1] = 0; }
  static HWY_INLINE void Unit(const uint8_t* b, int, int16_t* u) {
    for (int k = 0; k < 32; ++k) u[k] = static_cast<int8_t>(b[2 + k]);
  }
#if G4_Q8_AVX2
  static constexpr bool kPaired = true, kOwnTile = false, kSharedTile = false;
  static HWY_INLINE void PairAvx2(const uint8_t* b0, const uint8_t* b1, int, __m256i* lo, __m256i* hi) {
    *lo = Load2x128(b0 + 2, b1 + 2);
    *hi = Load2x128(b0 + 18, b1 + 18);
  }
  static HWY_INLINE void BlockScales4(const uint8_t* const* b, __m128* a, __m128* o) {
    a[0] = Halves4(b, 0);
    o[0] = _mm_setzero_ps();
  }
#endif
};

// Q4_0 / Q4_1 / Q5_0 / Q5_1: d at b, (Q4_1, Q5_1) m at b + 2, then (Q5_*) the 32-bit fifth-bit
// mask at b + kQh, then 16 bytes of nibbles at b + kQs (low nibbles elements 0-15, high 16-31).
// Offset without m: -8 d (Q4_0) or -16 d (Q5_0).
template <bool kFive, bool kMin>
struct FmtLegacy {
  static constexpr int kQK = 32, kUnits = 1;
  static constexpr int kQh = kMin ? 4 : 2, kQs = kQh + (kFive ? 4 : 0), kBytes = kQs + 16;
  static constexpr float kZero = kFive ? -16.0f : -8.0f;
  static constexpr bool kSigned = false, kOffset = true;
  struct Params { float a, o; };
  static HWY_INLINE void Prepare(const uint8_t* b, Params* p) {
    const float d = HalfQ8(b);
    p->a = d;
    p->o = kMin ? HalfQ8(b + 2) : kZero * d;
  }
  static HWY_INLINE void Scales(const Params& p, int, float* a, float* o) { a[0] = a[1] = p.a; o[0] = o[1] = p.o; }
  static HWY_INLINE void Unit(const uint8_t* b, int, int16_t* u) {
    const uint32_t qh = kFive ? U32Q8(b + kQh) : 0;
    for (int k = 0; k < 16; ++k) {
      u[k] = static_cast<int16_t>((b[kQs + k] & 15) | (((qh >> k) & 1) << 4));
      u[k + 16] = static_cast<int16_t>((b[kQs + k] >> 4) | (((qh >> (k + 16)) & 1) << 4));
    }
  }
#if G4_Q8_AVX2
  static constexpr bool kPaired = true, kOwnTile = false, kSharedTile = false;
  static HWY_INLINE void PairAvx2(const uint8_t* b0, const uint8_t* b1, int, __m256i* lo, __m256i* hi) {
    const __m256i v = Load2x128(b0 + kQs, b1 + kQs);
    const __m256i m = _mm256_set1_epi8(0x0f);
    *lo = _mm256_and_si256(v, m);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
    if constexpr (kFive) {
      const __m256i f0 = FifthBits32(b0 + kQh), f1 = FifthBits32(b1 + kQh);
      *lo = _mm256_or_si256(*lo, _mm256_permute2x128_si256(f0, f1, 0x20));
      *hi = _mm256_or_si256(*hi, _mm256_permute2x128_si256(f0, f1, 0x31));
    }
  }
  static HWY_INLINE void BlockScales4(const uint8_t* const* b, __m128* a, __m128* o) {
    a[0] = Halves4(b, 0);
    o[0] = kMin ? Halves4(b, 2) : _mm_mul_ps(a[0], _mm_set1_ps(kZero));
  }
#endif
};
using FmtQ4_0 = FmtLegacy<false, false>;
using FmtQ4_1 = FmtLegacy<false, true>;
using FmtQ5_0 = FmtLegacy<true, false>;
using FmtQ5_1 = FmtLegacy<true, true>;

// Q4_K / Q5_K: unit j = sub-block j; nibbles of qs[32 (j / 2) ..] (low for even j); Q5_K's fifth
// bit of element l is bit j of qh[l].
template <bool kFive>
struct FmtK4 {
  static constexpr int kQK = 256, kBytes = kFive ? 176 : 144, kUnits = 8;
  static constexpr int kQs = kFive ? 48 : 16;
  static constexpr bool kSigned = false, kOffset = true;
  struct Params { float a[8], o[8]; };
  static HWY_INLINE void Prepare(const uint8_t* b, Params* p) {
    const float d = HalfQ8(b);
    const float dmin = HalfQ8(b + 2);
    for (int s = 0; s < 8; ++s) {
      int sc, mn;
      ScaleMinK4(b + 4, s, &sc, &mn);
      p->a[s] = d * static_cast<float>(sc);
      p->o[s] = -(dmin * static_cast<float>(mn));
    }
  }
  static HWY_INLINE void Scales(const Params& p, int j, float* a, float* o) {
    a[0] = a[1] = p.a[j];
    o[0] = o[1] = p.o[j];
  }
  static HWY_INLINE void Unit(const uint8_t* b, int j, int16_t* u) {
    const uint8_t* qs = b + kQs + 32 * (j / 2);
    for (int l = 0; l < 32; ++l) {
      int v = (j % 2 == 0) ? (qs[l] & 15) : (qs[l] >> 4);
      if (kFive) v |= ((b[16 + l] >> j) & 1) << 4;
      u[l] = static_cast<int16_t>(v);
    }
  }
#if G4_Q8_AVX2
  static constexpr bool kPaired = true, kOwnTile = false, kSharedTile = true;
  static HWY_INLINE void PairAvx2(const uint8_t* b0, const uint8_t* b1, int j, __m256i* lo, __m256i* hi) {
    const size_t q = kQs + 32 * (j / 2);
    const __m256i m = _mm256_set1_epi8(0x0f);
    const __m256i vl = Load2x128(b0 + q, b1 + q), vh = Load2x128(b0 + q + 16, b1 + q + 16);
    __m256i l = (j % 2 == 0) ? _mm256_and_si256(vl, m) : _mm256_and_si256(_mm256_srli_epi16(vl, 4), m);
    __m256i h = (j % 2 == 0) ? _mm256_and_si256(vh, m) : _mm256_and_si256(_mm256_srli_epi16(vh, 4), m);
    if constexpr (kFive) {
      const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << j)), five = _mm256_set1_epi8(0x10);
      const __m256i ql = Load2x128(b0 + 16, b1 + 16), qh = Load2x128(b0 + 32, b1 + 32);
      l = _mm256_or_si256(l, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(ql, bit), bit), five));
      h = _mm256_or_si256(h, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), five));
    }
    *lo = l;
    *hi = h;
  }
  // The 6-bit scale and min fields (ScaleMinK4) of four rows' blocks at once: their 12 packed
  // bytes transposed into 32-bit words (word w of row i in lane i); *_lo hold sub-blocks 0-3 and
  // *_hi sub-blocks 4-7, one byte per sub-block in each row's lane.
  static HWY_INLINE void Fields4(const uint8_t* const* b, __m128i* sc_lo, __m128i* sc_hi, __m128i* mn_lo,
                                 __m128i* mn_hi) {
    const auto ld = [&](int i) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i] + 4)); };
    const __m128i r0 = ld(0), r1 = ld(1), r2 = ld(2), r3 = ld(3);
    const __m128i t0 = _mm_unpacklo_epi32(r0, r1), t1 = _mm_unpacklo_epi32(r2, r3);  // words 0, 1
    const __m128i t2 = _mm_unpackhi_epi32(r0, r1), t3 = _mm_unpackhi_epi32(r2, r3);  // words 2, 3
    const __m128i u0 = _mm_unpacklo_epi64(t0, t1), u1 = _mm_unpackhi_epi64(t0, t1), u2 = _mm_unpacklo_epi64(t2, t3);
    const __m128i m6 = _mm_set1_epi8(0x3f), m4 = _mm_set1_epi8(0x0f), m2 = _mm_set1_epi8(0x30);
    *sc_lo = _mm_and_si128(u0, m6);
    *mn_lo = _mm_and_si128(u1, m6);
    *sc_hi = _mm_or_si128(_mm_and_si128(u2, m4), _mm_and_si128(_mm_srli_epi32(u0, 2), m2));
    *mn_hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi32(u2, 4), m4), _mm_and_si128(_mm_srli_epi32(u1, 2), m2));
  }
  // The four rows' eight scales a[j] = d * sc[j] and offsets o[j] = -dmin * mn[j] (j < 8), as
  // [row 0 .. row 3] (the same f32 products as Prepare): Fields4, then one byte shuffle per pair
  // of sub-blocks (j, j + 4) spreads each row's field into its own 32-bit lane. (Decoding each row
  // on its own and transposing the f32 results cost twice the operations: Q4_K decode 6144 x 1536,
  // BM_Q8, 369 -> 330 us.)
  static HWY_INLINE void BlockScales4(const uint8_t* const* b, __m128* a, __m128* o) {
    __m128i sc_lo, sc_hi, mn_lo, mn_hi;
    Fields4(b, &sc_lo, &sc_hi, &mn_lo, &mn_hi);
    // Lane 0: sub-blocks 0-3, lane 1: sub-blocks 4-7, one byte per sub-block in each row's word.
    const __m256i sc = _mm256_set_m128i(sc_hi, sc_lo);
    const __m256i mn = _mm256_set_m128i(mn_hi, mn_lo);
    const __m128 d4 = Halves4(b, 0), m4f = _mm_xor_ps(Halves4(b, 2), _mm_set1_ps(-0.0f));
    const __m256 d = _mm256_set_m128(d4, d4), dm = _mm256_set_m128(m4f, m4f);
    HWY_UNROLL(4)
    for (int j = 0; j < 4; ++j) {
      const char z = static_cast<char>(0x80);
      const __m256i pick = _mm256_setr_epi8(j, z, z, z, 4 + j, z, z, z, 8 + j, z, z, z, 12 + j, z, z, z,  //
                                            j, z, z, z, 4 + j, z, z, z, 8 + j, z, z, z, 12 + j, z, z, z);
      const __m256 av = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_shuffle_epi8(sc, pick)));
      const __m256 ov = _mm256_mul_ps(dm, _mm256_cvtepi32_ps(_mm256_shuffle_epi8(mn, pick)));
      a[j] = _mm256_castps256_ps128(av);
      a[j + 4] = _mm256_extractf128_ps(av, 1);
      o[j] = _mm256_castps256_ps128(ov);
      o[j + 4] = _mm256_extractf128_ps(ov, 1);
    }
  }
  // For the shared-scale tile: sb = the four rows' eight 6-bit scales as bytes, lane 0 [row 0 |
  // row 2], lane 1 [row 1 | row 3] (eight bytes each); mb the same for the mins; d8 = d and
  // dm8 = -dmin as [r0 r0 r2 r2 | r1 r1 r3 r3] (PairTile's lane layout). Fields as Fields4.
  static HWY_INLINE void ScalesShared4(const uint8_t* const* b, __m256i* sb, __m256i* mb, __m256* d8, __m256* dm8) {
    __m128i sc_lo, sc_hi, mn_lo, mn_hi;
    Fields4(b, &sc_lo, &sc_hi, &mn_lo, &mn_hi);
    const auto arrange = [](__m128i lo, __m128i hi) {  // lane i: row i's sub-blocks 0-3 (lo), 4-7 (hi)
      const __m128i r01 = _mm_unpacklo_epi32(lo, hi), r23 = _mm_unpackhi_epi32(lo, hi);
      return _mm256_set_m128i(_mm_unpackhi_epi64(r01, r23), _mm_unpacklo_epi64(r01, r23));
    };
    *sb = arrange(sc_lo, sc_hi);
    *mb = arrange(mn_lo, mn_hi);
    const __m256i spread = _mm256_setr_epi32(0, 0, 2, 2, 1, 1, 3, 3);
    *d8 = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(Halves4(b, 0)), spread);
    *dm8 = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_xor_ps(Halves4(b, 2), _mm_set1_ps(-0.0f))), spread);
  }
  // Four weight rows by R activation rows whose activations share one scale per 256 elements
  // (QuantizeRowsQ8 group 256): each unit as PairTile (two rows' units per register, vpmaddubsw,
  // the halves added, one vphaddw for both pairs: [r0 x4 r2 x4 | r1 x4 r3 x4] in i16), then
  // vpmaddwd with the sub-block's integer scales (instead of ones) and added into an i32
  // accumulator for the whole superblock ([r0 r0 r2 r2 | r1 r1 r3 r3]; |lane| <= 8 * 2 * 31496 *
  // 63 < 2^31). Once per superblock: converted to f32 (rounded beyond 2^24, deterministically) and
  // multiplied-added with d * dx, and the offsets -dmin * sum_j mn_j * (dx sum q over unit j)
  // added in the same lanes (units j and j + 4 in a row's two lanes). Against PairTile this drops
  // the per-unit conversion, scale multiply, multiply-add and offset multiply-add. Every lane does
  // the same operations for any R and tile position (batch-invariant).
  template <int R>
  static HWY_INLINE void Tile4Shared(const ActBlockQ8* const* x, const float* const* usums, const uint8_t* const* w,
                                     size_t nb, const uint8_t* prefetch, float (*out)[4]) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    const char z = static_cast<char>(0x80);
    for (size_t ib = 0; ib < nb; ++ib) {
      const uint8_t* b[4];
      for (int i = 0; i < 4; ++i) b[i] = w[i] + ib * kBytes;
      PrefetchTile(prefetch, ib, kBytes);
      __m256i sb, mb;
      __m256 d8, dm8;
      ScalesShared4(b, &sb, &mb, &d8, &dm8);
      __m256i iacc[R];
      for (int r = 0; r < R; ++r) iacc[r] = _mm256_setzero_si256();
      HWY_UNROLL(8)
      for (int j = 0; j < kUnits; ++j) {
        const size_t unit = ib * kUnits + j;
        __m256i lo01, hi01, lo23, hi23;
        PairAvx2(b[0], b[1], j, &lo01, &hi01);
        PairAvx2(b[2], b[3], j, &lo23, &hi23);
        const char c0 = static_cast<char>(j), c1 = static_cast<char>(8 + j);
        const __m256i sj = _mm256_shuffle_epi8(sb, _mm256_setr_epi8(c0, z, c0, z, c0, z, c0, z, c1, z, c1, z, c1, z, c1, z,
                                                                     c0, z, c0, z, c0, z, c0, z, c1, z, c1, z, c1, z, c1, z));
        for (int r = 0; r < R; ++r) {
          const ActBlockQ8& xb = x[r][unit];
          const __m256i xlo = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.q)));
          const __m256i xhi = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.q + 16)));
          // |u| <= 31: i16 lanes <= 4 * 31 * 127 before vphaddw, 31496 after.
          const __m256i p = _mm256_hadd_epi16(
              _mm256_add_epi16(_mm256_maddubs_epi16(lo01, xlo), _mm256_maddubs_epi16(hi01, xhi)),
              _mm256_add_epi16(_mm256_maddubs_epi16(lo23, xlo), _mm256_maddubs_epi16(hi23, xhi)));
          iacc[r] = _mm256_add_epi32(iacc[r], _mm256_madd_epi16(p, sj));
        }
      }
      // Mins of units (j, j + 4) for the four rows, in the accumulators' lanes, times -dmin.
      __m256 mf[4];
      for (int j = 0; j < 4; ++j) {
        const char a0 = static_cast<char>(j), a1 = static_cast<char>(j + 4), a2 = static_cast<char>(8 + j),
                   a3 = static_cast<char>(12 + j);
        const __m256i pick = _mm256_setr_epi8(a0, z, z, z, a1, z, z, z, a2, z, z, z, a3, z, z, z,  //
                                              a0, z, z, z, a1, z, z, z, a2, z, z, z, a3, z, z, z);
        mf[j] = _mm256_mul_ps(dm8, _mm256_cvtepi32_ps(_mm256_shuffle_epi8(mb, pick)));
      }
      for (int r = 0; r < R; ++r) {
        const __m256 dx = _mm256_broadcast_ss(&x[r][ib * kUnits].d);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[r]), _mm256_mul_ps(d8, dx), acc[r]);
        const __m256 us = _mm256_loadu_ps(usums[r] + ib * kUnits);
        for (int j = 0; j < 4; ++j) {
          const __m256i idx = _mm256_setr_epi32(j, j + 4, j, j + 4, j, j + 4, j, j + 4);
          acc[r] = _mm256_fmadd_ps(mf[j], _mm256_permutevar8x32_ps(us, idx), acc[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      HWY_ALIGN float t[8];
      _mm256_store_ps(t, acc[r]);
      out[r][0] = t[0] + t[1];
      out[r][1] = t[4] + t[5];
      out[r][2] = t[2] + t[3];
      out[r][3] = t[6] + t[7];
    }
  }
#endif
};
using FmtQ4K = FmtK4<false>;
using FmtQ5K = FmtK4<true>;

// Q6_K: unit j = elements 32 j .. 32 j + 31, in half h = j / 4 at r = 32 (j % 4): low nibble
// (j % 4 < 2) or high nibble of ql[64 h + r % 64 ..], bits 2 (j % 4), +1 of qh[32 h ..]; scales
// d * scales[2 j] (elements 0-15 of the unit) and d * scales[2 j + 1]; offsets -32 a.
struct FmtQ6K {
  static constexpr int kQK = 256, kBytes = 210, kUnits = 8;
  static constexpr bool kSigned = false, kOffset = true;
  struct Params { float a[16]; };
  static HWY_INLINE void Prepare(const uint8_t* b, Params* p) {
    const float d = HalfQ8(b + 208);
    const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
    for (int i = 0; i < 16; ++i) p->a[i] = d * static_cast<float>(scales[i]);
  }
  static HWY_INLINE void Scales(const Params& p, int j, float* a, float* o) {
    a[0] = p.a[2 * j];
    a[1] = p.a[2 * j + 1];
    o[0] = -32.0f * a[0];
    o[1] = -32.0f * a[1];
  }
  static HWY_INLINE void Unit(const uint8_t* b, int j, int16_t* u) {
    const int h = j / 4, f = j % 4;
    const uint8_t* ql = b + 64 * h + 32 * (f % 2);
    const uint8_t* qh = b + 128 + 32 * h;
    for (int l = 0; l < 32; ++l) {
      const int lo = (ql[l] >> (4 * (f / 2))) & 15;
      const int hi = (qh[l] >> (2 * f)) & 3;
      u[l] = static_cast<int16_t>(lo | (hi << 4));
    }
  }
#if G4_Q8_AVX2
  static constexpr bool kPaired = true, kOwnTile = true, kSharedTile = false;
  // Unit j of one row as 32 bytes u_k in [0, 63] (ql's nibble | qh's two bits << 4).
  static HWY_INLINE __m256i UnitAvx2(const uint8_t* b, int j) {
    const int h = j / 4, f = j % 4;
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32 * (f % 2)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x30);
    const __m256i lo4 = f < 2 ? _mm256_and_si256(ql, m4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
    __m256i hi2;
    switch (f) {
      case 0: hi2 = _mm256_slli_epi16(qh, 4); break;
      case 1: hi2 = _mm256_slli_epi16(qh, 2); break;
      case 2: hi2 = qh; break;
      default: hi2 = _mm256_srli_epi16(qh, 2); break;
    }
    return _mm256_or_si256(lo4, _mm256_and_si256(hi2, m2));
  }
  // The block's 16 int8 scales as i16, even ones (first halves of units 0-7) in the low 128-bit
  // lane and odd ones in the high lane, so one in-lane broadcast gives unit j's [scale of
  // elements 0-15 x 8 | scale of elements 16-31 x 8].
  static HWY_INLINE __m256i ScalesI16(const uint8_t* b) {
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
    const __m128i evens_odds = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, evens_odds));
  }
  // Q6_K, four weight rows by R activation rows, one row's unit per 256-bit register (as the
  // activation block's 32 bytes are laid out): per row and unit, vpmaddubsw of u (0..63) with q,
  // minus vpmaddubsw of 32 with q (the offset -32, in integers: each i16 lane is then a pair sum of
  // (u - 32) q, |.| <= 2 * 32 * 127), then vpmaddwd with the unit's two int8 scales (elements 0-15
  // in the low lane, 16-31 in the high lane), so the sub-block scales apply in integers (|sum| <=
  // 16 * 32 * 127 * 128 < 2^24: exact in i32 and in its f32 conversion). Three vphaddd give
  // [r0 r1 r2 r3 | r0 r1 r2 r3] (halves 0 and 1), converted and multiplied-added with d * dx, the
  // halves added at the end. Against the paired tile this drops the float offsets, one of two
  // reductions and conversions per unit, and the 128-bit inserts of the paired decode.
  // BM_Q8 Q6_K 6144 x 1536 decode, single-threaded, this machine: 619 -> 462 us (paired tile ->
  // this one); prefill of 64 rows 19.3 -> 16.1 ms. The same layout for Q4_K/Q5_K (one scale per
  // unit, so nothing to share) measured 10% slower than their paired tile and was not kept.
  template <int R>
  static HWY_INLINE void Tile4(const ActBlockQ8* const* x, const float* const*, const uint8_t* const* w, size_t nb,
                               const uint8_t* prefetch, float (*out)[4]) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    const __m256i m32 = _mm256_set1_epi8(32);
    for (size_t ib = 0; ib < nb; ++ib) {
      const uint8_t* b[4];
      for (int i = 0; i < 4; ++i) b[i] = w[i] + ib * kBytes;
      PrefetchTile(prefetch, ib, kBytes);
      __m256i sc[4];
      for (int i = 0; i < 4; ++i) sc[i] = ScalesI16(b[i]);
      const __m128 d4 = Halves4(b, 208);
      const __m256 d8 = _mm256_set_m128(d4, d4);
      HWY_UNROLL(8)
      for (int j = 0; j < kUnits; ++j) {
        const size_t unit = ib * kUnits + j;
        const __m256i pick = _mm256_set1_epi16(static_cast<int16_t>((2 * j) | ((2 * j + 1) << 8)));
        __m256i u[4], s[4];
        for (int i = 0; i < 4; ++i) {
          u[i] = UnitAvx2(b[i], j);
          s[i] = _mm256_shuffle_epi8(sc[i], pick);
        }
        for (int r = 0; r < R; ++r) {
          const ActBlockQ8& xb = x[r][unit];
          const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.q));
          const __m256i x32 = _mm256_maddubs_epi16(m32, xq);
          __m256i p[4];
          for (int i = 0; i < 4; ++i) p[i] = _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(u[i], xq), x32), s[i]);
          const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), _mm256_mul_ps(d8, _mm256_broadcast_ss(&xb.d)), acc[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      HWY_ALIGN float t[8];
      _mm256_store_ps(t, acc[r]);
      for (int i = 0; i < 4; ++i) out[r][i] = t[i] + t[i + 4];
    }
  }
#endif
};

// ---------------------------------------------------------------------------------------------
// Tiles: R activation rows (x[r]: that row's blocks, sums[r]: its half sums) by one weight row
// (w, nb blocks): out[r] = the R dot products. Each row has one f32 accumulator fed once per unit
// in unit order, and its offsets are one dot product of the weight row's b_h (collected in ob)
// with the row's sums, so a row's result is the same for every R.

// sum_i a[i] * b[i], n elements, the same operations for any caller.
HWY_INLINE float DotF32(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, size_t n) {
  const hn::CappedTag<float, 8> df;
  const size_t N = hn::Lanes(df);
  auto acc = hn::Zero(df);
  size_t i = 0;
  for (; i + N <= n; i += N) acc = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc);
  float s = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

#if G4_Q8_AVX2
// AVX-512 VNNI (Ice Lake, Zen 4 and later; cpu::HasInt8Vnni): on the AVX3 target PairTile and
// PairRowsTile are compiled with avx512vnni enabled and instantiated twice, kVnni = true using
// vpdpbusd (u8 x i8 products summed in fours straight into i32 lanes) in place of vpmaddubsw +
// vpmaddwd (+ vphaddw); MatMulFmt picks the instantiation at run time. Each i32 lane then holds the
// same products as in the AVX2 sequence and integer sums are exact: the outputs are the same bits
// (KernelsQ8Test runs both). Not Highway's AVX3_DL target: Highway 1.0.3 builds that one for
// AVX-VNNI (the VEX form, which Zen 4 and Ice Lake lack), a SIGILL there.
#if HWY_TARGET == HWY_AVX3
#define G4_Q8_VNNI 1
#pragma GCC push_options
#pragma GCC target("avx512vnni")
#else
#define G4_Q8_VNNI 0
#endif
// Four weight rows at a time (formats with one scale and one offset per unit, kPaired): each
// pair of rows' unit is decoded into two registers, lo = [elements 0-15 of row 0 | of row 1] and
// hi = [elements 16-31 of row 0 | of row 1], multiplied with the activation's halves broadcast to
// both 128-bit lanes (vpmaddubsw, then the two halves' i16 sums added: |sum| <= 4 * 31 * 127, or
// for signed Q8_0 widened separately), widened to i32 (vpmaddwd with ones) and reduced for both
// pairs by one vphaddd into [r0 r0 r2 r2 | r1 r1 r3 r3] (two exact partial sums per row). One f32
// multiply-add per unit then scales all four rows (a_m * dx, lane-wise), and the offsets
// b_m * (dx * sum q) go into a second accumulator [r0 r1 r2 r3]. Against the one-row tile this
// shares the scale conversion, the multiply-add and the reduction among four rows and decodes
// two rows' nibbles per 256-bit operation. Every lane does the same operations whichever tile
// position its row has and whatever R is, so results stay batch-invariant.
template <class Fmt, int R, bool kVnni>
HWY_INLINE void PairTile(const ActBlockQ8* const* x, const float* const* sums, const float* const* usums,
                         const uint8_t* const* w, size_t nb,
                         const uint8_t* prefetch, float (*out)[4]) {
  __m256 acc[R];
  __m128 off[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    off[r] = _mm_setzero_ps();
  }
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i spread = _mm256_setr_epi32(0, 0, 2, 2, 1, 1, 3, 3);
  for (size_t ib = 0; ib < nb; ++ib) {
    const uint8_t* b[4];
    for (int i = 0; i < 4; ++i) b[i] = w[i] + ib * Fmt::kBytes;
    PrefetchTile(prefetch, ib, Fmt::kBytes);
    __m128 a4s[Fmt::kUnits], o4s[Fmt::kUnits];
    Fmt::BlockScales4(b, a4s, o4s);
    HWY_UNROLL(8)
    for (int j = 0; j < Fmt::kUnits; ++j) {
      const size_t unit = ib * Fmt::kUnits + j;
      __m256i lo01, hi01, lo23, hi23;
      Fmt::PairAvx2(b[0], b[1], j, &lo01, &hi01);
      Fmt::PairAvx2(b[2], b[3], j, &lo23, &hi23);
      const __m128 a4 = a4s[j], o4 = o4s[j];
      const __m256 a8 = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(a4), spread);
      for (int r = 0; r < R; ++r) {
        const ActBlockQ8& xb = x[r][unit];
        const __m256i xlo = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.q)));
        const __m256i xhi = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.q + 16)));
        __m256i p01;
#if G4_Q8_VNNI
        if constexpr (kVnni) {
          // Row i's lane j of dpbusd(dpbusd(0, lo, xlo), hi, xhi): products 4j..4j+3 and
          // 16+4j..19+4j; vphaddd then pairs lanes (0, 1) and (2, 3), as the sequence below does.
          // Q8_0 (signed weights) multiplies |u| with sign(q, u), as below.
          const auto dot2 = [&](__m256i lo, __m256i hi) {
            if constexpr (Fmt::kSigned) {
              const __m256i z =
                  _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(lo, lo), _mm256_sign_epi8(xlo, lo));
              return _mm256_dpbusd_epi32(z, _mm256_sign_epi8(hi, hi), _mm256_sign_epi8(xhi, hi));
            } else {
              return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, xlo), hi, xhi);
            }
          };
          p01 = _mm256_hadd_epi32(dot2(lo01, hi01), dot2(lo23, hi23));
        } else
#endif
        if constexpr (Fmt::kSigned) {
          const auto dot = [&](__m256i u, __m256i xq) {
            return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(u, u), _mm256_sign_epi8(xq, u)), ones);
          };
          p01 = _mm256_add_epi32(dot(lo01, xlo), dot(hi01, xhi));
          const __m256i p23 = _mm256_add_epi32(dot(lo23, xlo), dot(hi23, xhi));
          p01 = _mm256_hadd_epi32(p01, p23);
        } else {
          // |u| <= 31: each i16 lane below is at most 4 * 31 * 127 = 15748 in magnitude, so the
          // pairwise i16 add of vphaddw cannot overflow.
          p01 = _mm256_madd_epi16(
              _mm256_hadd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo01, xlo), _mm256_maddubs_epi16(hi01, xhi)),
                                _mm256_add_epi16(_mm256_maddubs_epi16(lo23, xlo), _mm256_maddubs_epi16(hi23, xhi))),
              ones);
        }
        const __m256 h = _mm256_cvtepi32_ps(p01);
        acc[r] = _mm256_fmadd_ps(h, _mm256_mul_ps(a8, _mm256_broadcast_ss(&xb.d)), acc[r]);
        if constexpr (Fmt::kOffset) {
          off[r] = _mm_fmadd_ps(o4, _mm_broadcast_ss(&usums[r][unit]), off[r]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    HWY_ALIGN float t[8];
    HWY_ALIGN float o[4];
    _mm256_store_ps(t, acc[r]);
    _mm_store_ps(o, off[r]);
    out[r][0] = (t[0] + t[1]) + o[0];
    out[r][1] = (t[4] + t[5]) + o[1];
    out[r][2] = (t[2] + t[3]) + o[2];
    out[r][3] = (t[6] + t[7]) + o[3];
  }
}

// Rows [0, R) of the activations against weight rows [m0, m1), four weight rows at a time (the
// last group repeats row m1 - 1 to fill the tile; those results are dropped).
template <class Fmt, int R, bool kShared, bool kVnni>
HWY_NOINLINE void PairRowsTile(const ActBlockQ8* xq, const float* sums, const float* usums, size_t units, int m0,
                               int m1, const uint8_t* w, size_t row_bytes, float scale, float* y, size_t ldy) {
  const ActBlockQ8* x[R];
  const float* s[R];
  const float* us[R];
  for (int r = 0; r < R; ++r) {
    x[r] = xq + r * units;
    s[r] = sums + r * 2 * units;
    us[r] = usums + r * units;
  }
  const size_t nb = units / Fmt::kUnits;
  float out[R][4];
  for (int m = m0; m < m1; m += 4) {
    const uint8_t* rows[4];
    for (int i = 0; i < 4; ++i) rows[i] = w + static_cast<size_t>(std::min(m + i, m1 - 1)) * row_bytes;
    const uint8_t* prefetch = w + static_cast<size_t>(m + kPrefetchTiles * 4) * row_bytes;
    if constexpr (kShared) {
      Fmt::template Tile4Shared<R>(x, us, rows, nb, prefetch, out);
    } else if constexpr (Fmt::kOwnTile) {
      Fmt::template Tile4<R>(x, us, rows, nb, prefetch, out);
    } else {
      PairTile<Fmt, R, kVnni>(x, s, us, rows, nb, prefetch, out);
    }
    const int n = std::min(4, m1 - m);
    for (int r = 0; r < R; ++r) {
      for (int i = 0; i < n; ++i) y[r * ldy + m + i] = out[r][i] * scale;
    }
  }
}
#if HWY_TARGET == HWY_AVX3
// kQ4_0x4 weights (dtype.h: per group of four rows the scales, then the nibbles, block by block)
// on AVX-512. Per block of a group: its four rows' nibbles are one 512-bit load, v = [row 0 |
// row 1 | row 2 | row 3] (16 bytes each), lo = v & 15 (elements 0-15), hi = (v >> 4) & 15
// (elements 16-31), and its four scales one 8-byte load, converted and spread to
// d16 = [d_0 x4 | d_1 x4 | d_2 x4 | d_3 x4]. Per activation row r: i32 lane 4i + j = row i's
// products of elements 4j..4j+3 and 16+4j..19+4j, started at neg = -2 * (the block's sum of q),
// so the four lanes of a row add up to sum (u - 8) q exactly: vpdpbusd twice with VNNI, else
// vpmaddubsw twice, vpaddw (|i16| <= 4 * 15 * 127), vpmaddwd with ones and vpaddd (the same
// integers, so the same bits). Converted and multiplied-added with d16 * dx into one f32
// accumulator per activation row; each row's four lanes are added once, at the end of the row.
// Every row gets the same operations whatever R is and wherever its group is (batch-invariant).
// Against PairTile on Q4_0 (four 128-bit loads and inserts, four 2-byte scale loads and inserts,
// a vphaddd and a float offset per unit) the in-cache decode of 6144 x 1536 takes ~2/3 of the
// time, and streamed it reads faster: docs/PERFORMANCE.md.
// Q4_0x4Rows prefetches this many bytes ahead of the group it reads (a group of four rows is
// 4 * 18 * K / 32 bytes, contiguous, so a matrix or a thread's chunk of it is one stream). It was
// four groups ahead: 13.5 KiB at K = 1536 but 108 KiB at K = 12288, where the first third of each
// 331 KiB chunk then had no software prefetch. E2B's matrices on 2 threads, alternating in one
// process (each 300 MB of one shape), speed at 8 KiB / four groups ahead: 1536 x 12288 1.033-1.056,
// 1536 x 6144 1.035-1.043, 1536 x 2048 1.036, 12288 x 1536 0.995-1.008, 2048 x 1536 1.008-1.025;
// 4 KiB was slower (0.77 at 1536 x 12288), 12 and 16 KiB between. E2B Q4_0 decode with 8 KiB on
// alternate tokens in one process (`bench -t 2 -p 0 -n 64 -r 4`): 1.035x and 1.038x (12 KiB 1.018x).
constexpr size_t kQ4_0x4PrefetchBytes = 8192;

template <int R, bool kVnni>
HWY_NOINLINE void Q4_0x4Rows(const ActBlockQ8* xq, const int32_t* neg, size_t nb, int m0, int m1, const uint8_t* w,
                             size_t row_bytes, float scale, float* y, size_t ldy) {
  const __m512i m15 = _mm512_set1_epi8(15);
  const __m512i ones = _mm512_set1_epi16(1);
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  for (int m = m0; m < m1; m += 4) {
    const uint8_t* sc = w + static_cast<size_t>(m) * row_bytes;
    const uint8_t* qs = sc + 8 * nb;
    // kQ4_0x4PrefetchBytes ahead in the matrix's one stream, into L2, as many bytes per block as
    // are read.
    const char* next = reinterpret_cast<const char*>(sc) + kQ4_0x4PrefetchBytes;
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (size_t b = 0; b < nb; ++b) {
      for (size_t q = 72 * b; q < 72 * (b + 1); q += 64) _mm_prefetch(next + q, _MM_HINT_T1);
      const __m512i v = _mm512_loadu_si512(qs + 64 * b);
      const __m512i lo = _mm512_and_si512(v, m15), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m15);
      const __m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 8 * b)));
      const __m512 d16 = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(d4));
      for (int r = 0; r < R; ++r) {
        const ActBlockQ8& xb = xq[r * nb + b];
        const __m512i xl = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.q)));
        const __m512i xh = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.q + 16)));
        const __m512i n = _mm512_set1_epi32(neg[r * nb + b]);
        __m512i p;
        if constexpr (kVnni) {
          p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(n, lo, xl), hi, xh);
        } else {
          p = _mm512_add_epi32(
              _mm512_madd_epi16(_mm512_add_epi16(_mm512_maddubs_epi16(lo, xl), _mm512_maddubs_epi16(hi, xh)), ones), n);
        }
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(d16, _mm512_set1_ps(xb.d)), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      HWY_ALIGN float t[16];
      _mm512_store_ps(t, acc[r]);
      for (int i = 0; i < 4; ++i) {
        y[r * ldy + m + i] = ((t[4 * i] + t[4 * i + 1]) + (t[4 * i + 2] + t[4 * i + 3])) * scale;
      }
    }
  }
}

template <bool kVnni>
void MatMulQ4_0x4Native(const ActBlockQ8* xq, int rows, int K, const uint8_t* w, int M, float scale, float* y,
                        int ldy) {
  const size_t nb = static_cast<size_t>(K) / 32;
  const size_t row_bytes = DTypeRowBytes(DType::kQ4_0x4, K);
  // neg[r * nb + b] = -2 * (sum of block b's 32 q of activation row r): each of a row's four
  // lanes starts at it, so the four add the -8 offset's -8 * sum q.
  thread_local std::vector<int32_t> neg;
  if (neg.size() < static_cast<size_t>(rows) * nb) neg.resize(static_cast<size_t>(rows) * nb);
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  for (size_t i = 0; i < static_cast<size_t>(rows) * nb; ++i) {
    // 1 x q summed in pairs (i16), then in fours (i32), then across the eight lanes: exact.
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[i].q));
    const __m256i s8 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
    const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
    const __m128i s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
    neg[i] = -2 * _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, _MM_SHUFFLE(2, 3, 0, 1))));
  }
  // Weight-row groups as MatMulFmt's (WeightRowGroup, whole groups of four rows) against tiles
  // of eight activation rows (then 4, 3, 2, 1).
  const int group = WeightRowGroup(rows, M, row_bytes, 4);
  for (int m0 = 0; m0 < M; m0 += group) {
    const int m1 = std::min(M, m0 + group);
    for (int r0 = 0; r0 < rows;) {
      const int R = rows - r0 >= 8 ? 8 : std::min(4, rows - r0);
      const ActBlockQ8* xr = xq + static_cast<size_t>(r0) * nb;
      const int32_t* nr = neg.data() + static_cast<size_t>(r0) * nb;
      float* yr = y + static_cast<size_t>(r0) * ldy;
      switch (R) {
        case 8: Q4_0x4Rows<8, kVnni>(xr, nr, nb, m0, m1, w, row_bytes, scale, yr, ldy); break;
        case 4: Q4_0x4Rows<4, kVnni>(xr, nr, nb, m0, m1, w, row_bytes, scale, yr, ldy); break;
        case 3: Q4_0x4Rows<3, kVnni>(xr, nr, nb, m0, m1, w, row_bytes, scale, yr, ldy); break;
        case 2: Q4_0x4Rows<2, kVnni>(xr, nr, nb, m0, m1, w, row_bytes, scale, yr, ldy); break;
        default: Q4_0x4Rows<1, kVnni>(xr, nr, nb, m0, m1, w, row_bytes, scale, yr, ldy); break;
      }
      r0 += R;
    }
  }
}
// K-quant weight rows on AVX-512 (Q4_K and Q6_K with activations quantised per 256, act_group
// 256): one weight row at a time, so each thread reads one sequential stream, prefetched
// kRowPrefetchBytes ahead into L2 (4-16 KiB ahead measured alike; none, 8% slower). The
// activations are read as ActSuperblockQ8 (kernels_q8.h: two 32-element units per 512-bit
// register in the order of the format's loads, integer sums per 16 elements, dx), prepared once
// per matmul by the caller. Against the four-row tiles they replace (FmtK4::Tile4Shared,
// Q6_K's four-row shared tile: four interleaved row streams, 256-bit decoding): E2B's
// matrices on 2 threads, interleaved in one process (bench/decode_sweep.cc's harness with the old
// tiles behind a temporary switch), decode 1.18x (Q4_K) and 1.12x (Q6_K) faster, at 97-100% of
// a plain streaming read of the same bytes. Prefill of 64 rows, single-threaded (BM_Q8 6144 x
// 1536, alternating runs): Q6_K ~1.27x faster, Q4_K ~3% slower (its float work per activation
// row and superblock is shared by four weight rows in the old tile; the same sweep harness
// once measured 1.18x faster at 2 threads, which a separate-run sweep did not reproduce). Every
// activation row gets the same operations whatever R is and wherever the weight range starts
// (batch-invariant); VNNI or not, the integers and so the bits are the same.
constexpr size_t kRowPrefetchBytes = 8192;

// The first `bytes` of [begin, end) into L2 at once: a row kernel's range of weight rows (a
// thread's chunk of a matmul, a fused MLP's block of columns) may start where no earlier prefetch
// reached. gemma4rt_sweep, E2B's shapes on 2 threads, against a plain read (speed ratios): Q4_K
// 0.999 -> 1.021, Q6_K 0.989 -> 1.051 (one run each, when the steady prefetch stopped at the
// range end; a reviewer's runs gave Q4_K 0.91-1.03 and Q6_K 1.04-1.11). Tried on Q4_0x4Rows too
// and not kept: 0.96-1.02.
HWY_INLINE void PrefetchRangeStart(const uint8_t* begin, const uint8_t* end, size_t bytes) {
  const uint8_t* stop = begin + std::min(bytes, static_cast<size_t>(end - begin));
  for (const uint8_t* p = begin; p < stop; p += 64) _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
}

// The lines of one superblock (kBytes) kRowPrefetchBytes past p into L2, also past the end of
// the range (a prefetch never faults). Past the end lie the thread's next chunk of the same
// matrix (for a chunk claimed from the front of its run; after one taken from the back of
// another's, a chunk already read) or, in a fused MLP, its next block of columns, read after the
// other matrix's block; stopping at the end left each 64-row block of a fused MLP to start on a
// burst of demand misses. E2B Q4_K_M decode, 2 threads, the two ways on alternate tokens in one process (128
// tokens each, median time per token): 1.039x and 1.044x as fast without the stop.
template <size_t kBytes>
HWY_INLINE void PrefetchRowsAhead(const uint8_t* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) + kRowPrefetchBytes;  // an integer: may be past the object
  for (size_t o = 0; o < kBytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(a + o), _MM_HINT_T1);
}

// i + t * s in i32 lanes (pairs of i16 products): vpdpwssd, or vpmaddwd + vpaddd (the same sum).
template <bool kVnni>
HWY_INLINE __m512i DotI16(__m512i i, __m512i t, __m512i s) {
  if constexpr (kVnni) {
    return _mm512_dpwssd_epi32(i, t, s);
  } else {
    return _mm512_add_epi32(i, _mm512_madd_epi16(t, s));
  }
}

// The products of u (u8, <= 63) and x (i8, |x| <= 127) summed in fours into i32 lanes (|lane| <=
// 4 * 63 * 127 = 32004): vpdpbusd, or vpmaddubsw (pairs, no saturation) + vpmaddwd with ones.
template <bool kVnni>
HWY_INLINE __m512i Quads(__m512i u, __m512i x) {
  if constexpr (kVnni) {
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x);
  } else {
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, x), _mm512_set1_epi16(1));
  }
}

// The 16 i32 lanes of i added pairwise (lane j + lane j + 8, exact) into 8.
HWY_INLINE __m256i FoldI32(__m512i i) {
  return _mm256_add_epi32(_mm512_castsi512_si256(i), _mm512_extracti64x4_epi64(i, 1));
}

// The 8 lanes of v added in a fixed tree (8 -> 4 -> 2 -> 1).
HWY_INLINE float SumLanes(__m256 v) {
  const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  return _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
}

// The 16 lanes of v added in a fixed tree (16 -> 8, then as above).
HWY_INLINE float SumLanes(__m512 v) {
  return SumLanes(_mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

// vpshufb control for 16-bit scales: in 128-bit lane L, i16 lanes 0-3 take byte lo[L] and lanes
// 4-7 byte hi[L] of the source lane, zero-extended (kHigh = false) or in the high byte (kHigh:
// for a sign-extending shift right by 8 after).
template <bool kHigh>
HWY_INLINE __m512i ScaleControl(const int (&lo)[4], const int (&hi)[4]) {
  int v[16];
  for (int L = 0; L < 4; ++L) {
    for (int h = 0; h < 2; ++h) {
      const int b = h == 0 ? lo[L] : hi[L];
      const int w = kHigh ? (0x80 | (b << 8)) : (b | 0x8000);
      v[4 * L + 2 * h] = v[4 * L + 2 * h + 1] = w | (w << 16);
    }
  }
  return _mm512_setr_epi32(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12], v[13],
                           v[14], v[15]);
}

// Both formats, per activation row and weight superblock: each of the four weight registers u
// (one byte per element, 0..15 or 0..63) times its activation register by Quads (four products
// per i32 lane); two registers' quads packed to i16 (vpackssdw: 128-bit lane L = [4 quads of the
// first | 4 of the second]; |quad| <= 32004, no saturation) and multiplied-added with the i16
// scales of their elements by vpmaddwd (vpdpwssd): i32 lanes that add up to sum_e scale(e) *
// u_e * q_e, exactly. They are folded to 8 lanes (FoldI32, exact; Q4_K then to 4), converted
// once per superblock and multiplied-added with d * dx into the row's 256-bit f32 accumulator,
// whose lanes are added once, at the end of the weight row (SumLanes).

// One activation row against one weight superblock, before the float tail: the i32 lanes of the
// scaled products (16), the lanes of the format's second term (8: Q4_K's negated mins, Q6_K's
// offset), and the multipliers of the folded lanes (d * dx, and Q4_K's dmin * dx).
struct KQuantPart {
  __m512i i;
  __m256i extra;
  __m256 mul;
};

// The scaled products of one decoded weight superblock u (four registers of unsigned values in
// ActSuperblockQ8's order for the format) with one activation superblock a: the i32 quads of
// units [0 | 1] and [2 | 3] packed to i16 and multiplied-added with their scales sa and sb (the
// i16 lanes of the packed quads), 16 i32 lanes whose sum is sum_e scale(e) * u_e * q_e, exactly
// (each format's bounds: at Q4KKernel and Q6KKernel).
template <bool kVnni>
HWY_INLINE __m512i ScaledQuads(const __m512i (&u)[4], __m512i sa, __m512i sb, const ActSuperblockQ8& a) {
  const auto xv = [&](int k) { return _mm512_load_si512(a.q[k]); };
  const __m512i pa = _mm512_packs_epi32(Quads<kVnni>(u[0], xv(0)), Quads<kVnni>(u[1], xv(1)));
  const __m512i pb = _mm512_packs_epi32(Quads<kVnni>(u[2], xv(2)), Quads<kVnni>(u[3], xv(3)));
  return DotI16<kVnni>(_mm512_madd_epi16(pa, sa), pb, sb);
}

// Q4_K: per superblock, the nibbles of two 512-bit loads (ActSuperblockQ8's Q4_K order); the
// 6-bit scales and mins (ScaleMinK4) unpacked once into 16 bytes [sc_0..7 | mn_0..7], the scales
// spread into the i16 lanes of their quads by vpshufb (|lane| <= 2 * 2 * 7620 * 63 < 2^31). The
// mins' -sum_j mn_j * (sum of unit j's q) is a vpmaddwd of the mins (each twice) with the
// negated 16-element sums of Q4_K's order. Both folded to 4 lanes, [sums | -mins] are converted
// together and multiplied-added with [d * dx x 4 | dmin * dx x 4] (one 256-bit conversion and
// multiply-add per activation row and superblock: with 16 lanes, Q4_K prefill of 64 rows was ~8%
// slower than the old tile's, with 8 ~3%, and decode ~7% faster single-threaded). The negated
// sums spare the sign change, so [d | dmin] is one vpermps of the converted pair: BM_Q8
// single-threaded, three alternating rounds, 6144 x 1536 by 64 rows 9.03-9.26 -> 8.50-8.63 ms,
// decode of 512 x 1536 (in L2) 22.9-24.6 -> 21.9-22.9 us, the same bits.
//
// Q4_K's kernel: Decode unpacks a weight superblock once (for every activation row of a tile),
// Dot takes one activation row to a KQuantPart, Accumulate adds it into the row's accumulator
// (fold, conversion, multiply-add: the tail). Constants built once per kernel object.
template <bool kVnni>
struct Q4KKernel {
  static constexpr size_t kBytes = FmtQ4K::kBytes;
  struct Superblock {
    __m512i u[4];    // nibbles: [units 0 | 2], [1 | 3], [4 | 6], [5 | 7] (ActSuperblockQ8's Q4_K order)
    __m512i sa, sb;  // the scales of the packed quads' i16 lanes
    __m256i mn;      // mn_j zero-extended into i16 lanes 2j and 2j + 1
    __m256 dm;       // [d x 4 | dmin x 4]
  };
  HWY_INLINE Q4KKernel() {}  // user-provided: the members' initialisers compiled for this target
  const __m512i m15 = _mm512_set1_epi8(15);
  // Packed registers: [units 0 | 1] in 128-bit lanes 0-1, [2 | 3] in lanes 2-3 (then 4-7).
  const __m512i ca = ScaleControl<false>({0, 0, 2, 2}, {1, 1, 3, 3});
  const __m512i cb = ScaleControl<false>({4, 4, 6, 6}, {5, 5, 7, 7});
  const __m256i mins = _mm256_setr_epi8(8, -128, 8, -128, 9, -128, 9, -128, 10, -128, 10, -128, 11, -128, 11, -128,
                                        12, -128, 12, -128, 13, -128, 13, -128, 14, -128, 14, -128, 15, -128, 15, -128);
  const __m128i m6 = _mm_set1_epi8(0x3f), m4 = _mm_set1_epi8(0x0f), m2 = _mm_set1_epi8(0x30);
  const __m128i shift = _mm_setr_epi32(0, 4, 0, 0);
  const __m256i spread_dm = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);

  HWY_INLINE Superblock Decode(const uint8_t* b) const {
    Superblock s;
    const __m512i v0 = _mm512_loadu_si512(b + 16), v1 = _mm512_loadu_si512(b + 80);
    s.u[0] = _mm512_and_si512(v0, m15);
    s.u[1] = _mm512_and_si512(_mm512_srli_epi16(v0, 4), m15);
    s.u[2] = _mm512_and_si512(v1, m15);
    s.u[3] = _mm512_and_si512(_mm512_srli_epi16(v1, 4), m15);
    // ScaleMinK4's fields from the 12 bytes at b + 4 (words w0, w1, w2): sc_0..3 = w0 & 63,
    // mn_0..3 = w1 & 63, sc_4..7 = (w2 & 15) | (w0 >> 6) << 4, mn_4..7 = (w2 >> 4) | (w1 >> 6) << 4.
    const __m128i f = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 4));
    const __m128i lo = _mm_and_si128(f, m6);
    const __m128i hi = _mm_or_si128(_mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(f, 0xAA), shift), m4),
                                    _mm_and_si128(_mm_srli_epi32(f, 2), m2));
    const __m128i sm = _mm_unpacklo_epi32(lo, hi);  // bytes sc_0..7, mn_0..7
    const __m512i sm4 = _mm512_broadcast_i32x4(sm);
    s.sa = _mm512_shuffle_epi8(sm4, ca);
    s.sb = _mm512_shuffle_epi8(sm4, cb);
    s.mn = _mm256_shuffle_epi8(_mm512_castsi512_si256(sm4), mins);
    uint32_t dbits;
    std::memcpy(&dbits, b, 4);
    const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dbits)));  // d, dmin (as HalfQ8)
    s.dm = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(dd), spread_dm);
    return s;
  }
  HWY_INLINE KQuantPart Dot(const Superblock& s, const ActSuperblockQ8& a) const {
    return {ScaledQuads<kVnni>(s.u, s.sa, s.sb, a),
            _mm256_madd_epi16(s.mn, _mm256_load_si256(reinterpret_cast<const __m256i*>(a.s))),
            _mm256_mul_ps(s.dm, _mm256_set1_ps(a.dx))};
  }
  // [sums folded to 4 lanes | mins folded to 4 lanes] (exact), converted and multiplied-added.
  static HWY_INLINE __m256 Accumulate(const KQuantPart& p, __m256 acc) {
    const __m256i i8 = FoldI32(p.i);
    const __m256i both = _mm256_add_epi32(_mm256_permute2x128_si256(i8, p.extra, 0x20),
                                          _mm256_permute2x128_si256(i8, p.extra, 0x31));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(both), p.mul, acc);
  }
};

// Q6_K: per half of a superblock (128 elements), ql's 64 bytes are one load whose low nibbles
// are units [0 | 1] and high nibbles [2 | 3] of the half; qh's 32 bytes, broadcast to both
// 256-bit halves, give each its two bits (bits 0-1 | 2-3 for the low nibbles, 4-5 | 6-7 for the
// high) by a per-half shift into bits 4-5: u = ql nibble | qh bits << 4 in 0..63. Register k's
// 128-bit lane L holds the 16 elements of scale group 4k + L, so the packed registers' lanes
// take scales[L] | scales[4 + L] and scales[8 + L] | scales[12 + L] (vpshufb into the high byte,
// sign-extending shift right by 8; |lane| <= 2 * 2 * 32004 * 128 < 2^25). The -32 offset is
// taken once per superblock: 32 * sum_g scales[g] * (sum of q over the 16 elements g), one
// 256-bit vpmaddwd, subtracted from the folded sums (|lane| < 2^26: converted with rounding
// beyond 2^24, the same way every time).
template <bool kVnni>
struct Q6KKernel {
  static constexpr size_t kBytes = FmtQ6K::kBytes;
  struct Superblock {
    __m512i u[4];   // 6-bit values: [units 0 | 1], [2 | 3] of each half (ActSuperblockQ8's Q6_K order)
    __m512i sa, sb; // the scales of the packed quads' i16 lanes (sign-extended)
    __m256i sc16;   // the 16 scales as i16
    __m256 d8;      // d x 8
  };
  HWY_INLINE Q6KKernel() {}  // user-provided: the members' initialisers compiled for this target
  const __m512i m15 = _mm512_set1_epi8(15), m48 = _mm512_set1_epi8(0x30);
  const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
  const __m512i shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
  const __m512i ca = ScaleControl<true>({0, 1, 2, 3}, {4, 5, 6, 7});
  const __m512i cb = ScaleControl<true>({8, 9, 10, 11}, {12, 13, 14, 15});

  HWY_INLINE Superblock Decode(const uint8_t* b) const {
    Superblock s;
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(b + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h)));
      // (ql & 15) | (qh shifted & 0x30): vpternlogd A | (B & C) = 0xF8.
      s.u[2 * h] = _mm512_ternarylogic_epi32(_mm512_and_si512(ql, m15), _mm512_sllv_epi16(qh, shl), m48, 0xF8);
      s.u[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m15),
                                                 _mm512_srlv_epi16(qh, shr), m48, 0xF8);
    }
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
    const __m512i sc4 = _mm512_broadcast_i32x4(sc);
    s.sa = _mm512_srai_epi16(_mm512_shuffle_epi8(sc4, ca), 8);
    s.sb = _mm512_srai_epi16(_mm512_shuffle_epi8(sc4, cb), 8);
    s.sc16 = _mm256_cvtepi8_epi16(sc);
    s.d8 = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(b[208] | (b[209] << 8))));  // as HalfQ8
    return s;
  }
  HWY_INLINE KQuantPart Dot(const Superblock& s, const ActSuperblockQ8& a) const {
    return {ScaledQuads<kVnni>(s.u, s.sa, s.sb, a),
            _mm256_slli_epi32(_mm256_madd_epi16(s.sc16, _mm256_load_si256(reinterpret_cast<const __m256i*>(a.s))), 5),
            _mm256_mul_ps(s.d8, _mm256_set1_ps(a.dx))};
  }
  // The sums folded to 8 lanes less the offset's, converted and multiplied-added.
  static HWY_INLINE __m256 Accumulate(const KQuantPart& p, __m256 acc) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(FoldI32(p.i), p.extra)), p.mul, acc);
  }
};

// Weight rows [m0, m1) of a K-quant Kernel against R >= 2 activation rows (one row goes to
// KQuantRowPipelined): per superblock the weights decoded once, then each row's Dot and
// Accumulate. Shapes: nsb = K / 256 superblocks per row; weight row m at w + m * row_bytes
// (row_bytes = nsb * Kernel::kBytes); activation row r's superblock ib at xa[2 * (r * nsb + ib)]
// (every second ActSuperblockQ8; for Q4_K the caller has already offset xa by one); output
// y[r * ldy + m] = scale * (row r . weight row m) for m in [m0, m1) only. nsb >= 1.
template <int R, class Kernel>
HWY_NOINLINE void KQuantRows(const ActSuperblockQ8* xa, size_t nsb, int m0, int m1, const uint8_t* w,
                             size_t row_bytes, float scale, float* y, size_t ldy) {
  const Kernel k;
  const uint8_t* end = w + static_cast<size_t>(m1) * row_bytes;
  PrefetchRangeStart(w + static_cast<size_t>(m0) * row_bytes, end, kRowPrefetchBytes);
  for (int m = m0; m < m1; ++m) {
    const uint8_t* row = w + static_cast<size_t>(m) * row_bytes;
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (size_t ib = 0; ib < nsb; ++ib) {
      const uint8_t* b = row + ib * Kernel::kBytes;
      PrefetchRowsAhead<Kernel::kBytes>(b);
      const typename Kernel::Superblock s = k.Decode(b);
      for (int r = 0; r < R; ++r) acc[r] = Kernel::Accumulate(k.Dot(s, xa[2 * (static_cast<size_t>(r) * nsb + ib)]), acc[r]);
    }
    for (int r = 0; r < R; ++r) y[r * ldy + m] = SumLanes(acc[r]) * scale;
  }
}

// KQuantRows for one activation row (decode, or a prefill tile's last row), with the same
// operations in another order, so the same bits: each superblock's tail (Accumulate) issued
// after the next superblock's Decode and Dot (software pipelining). Shapes as KQuantRows with
// R = 1: xa[2 * ib] is the row's superblock ib, y[m] its output for m in [m0, m1); nsb >= 1.
// A superblock's tail waits on a dependent chain (the loads, four vpdpbusd, vpackssdw, vpmaddwd,
// vpdpwssd, the fold, the conversion: some 40 cycles by the instruction tables' latencies, an
// estimate, not a measurement); in program order it held the scheduler's entries while the next
// superblock's independent work queued behind it, and now finds its inputs ready. Measured on
// the Zen 4 VM (eighteenth session, docs/PERFORMANCE.md), the old and new kernels behind a
// temporary switch in one binary (not committed), calls alternating (3000 each, median):
// single-threaded, 512 x 1536 in L2, quiet VM: Q4_K 16.2 -> 15.2 us (1.06x), Q6_K 18.8 ->
// 18.1-18.4 us (1.02-1.04x); at busier moments 1.14x and 1.07-1.14x. From memory, E2B's
// matrices on 2 threads (gemma4rt_sweep, alternating steps): Q4_K 1.01-1.02x while the VM read
// ~28 GB/s. Full-size E2B Q4_K_M (Q4_K + Q6_K), `gemma4rt bench -t 2 -p 0 -n 64 -r 3`, old and
// new binaries alternating three times while the VM copied 57 GB/s: 31.6-31.7 -> 32.7-32.9 t/s
// (1.04x). Two weight rows at a time, pipelined alike, were 1.04x faster again in L2 (Q4_K;
// Q6_K alike) but from memory 0.90-1.04x as fast as one row (two interleaved streams; slowest
// when the VM's bandwidth was low), and two streams half a range apart 0.95-0.97x.
template <class Kernel>
HWY_NOINLINE void KQuantRowPipelined(const ActSuperblockQ8* xa, size_t nsb, int m0, int m1, const uint8_t* w,
                                     size_t row_bytes, float scale, float* y) {
  const Kernel k;
  const uint8_t* end = w + static_cast<size_t>(m1) * row_bytes;
  PrefetchRangeStart(w + static_cast<size_t>(m0) * row_bytes, end, kRowPrefetchBytes);
  for (int m = m0; m < m1; ++m) {
    const uint8_t* row = w + static_cast<size_t>(m) * row_bytes;
    const auto part = [&](size_t ib) {
      const uint8_t* b = row + ib * Kernel::kBytes;
      PrefetchRowsAhead<Kernel::kBytes>(b);
      return k.Dot(k.Decode(b), xa[2 * ib]);
    };
    __m256 acc = _mm256_setzero_ps();
    KQuantPart prev = part(0);
    for (size_t ib = 1; ib < nsb; ++ib) {
      const KQuantPart cur = part(ib);
      acc = Kernel::Accumulate(prev, acc);
      prev = cur;
    }
    y[m] = SumLanes(Kernel::Accumulate(prev, acc)) * scale;
  }
}

// MatMulQ8 for Q4_K (kQ4K) or Q6_K weights with activations quantised per 256, read as the
// superblocks xs (PrepareActSuperblocks of xq; nullptr: prepared here, into a thread-local
// buffer of 2 rows * K / 256), in WeightRowGroup's groups of weight rows against tiles of eight
// activation rows (then 4, 3, 2; a tile of one row, as in decode, runs KQuantRowPipelined).
// K = 0 gives zeros (an empty sum).
template <bool kQ4K, bool kVnni>
void MatMulKQuantRows(const ActBlockQ8* xq, const ActSuperblockQ8* xs, int rows, int K, const uint8_t* w, int M,
                      float scale, float* y, int ldy) {
  const size_t nsb = static_cast<size_t>(K) / 256;
  const size_t row_bytes = nsb * (kQ4K ? FmtQ4K::kBytes : FmtQ6K::kBytes);
  if (nsb == 0) {  // the kernels read at least one superblock
    for (int r = 0; r < rows; ++r) std::fill_n(y + static_cast<size_t>(r) * ldy, M, 0.0f);
    return;
  }
  if (xs == nullptr) {
    thread_local std::vector<ActSuperblockQ8> own;
    if (own.size() < 2 * static_cast<size_t>(rows) * nsb) own.resize(2 * static_cast<size_t>(rows) * nsb);
    PrepareActSuperblocks(xq, rows, K, own.data());
    xs = own.data();
  }
  if constexpr (kQ4K) ++xs;  // the Q4_K order: every second superblock from xs[1]
  const int group = WeightRowGroup(rows, M, row_bytes, 1);
  for (int m0 = 0; m0 < M; m0 += group) {
    const int m1 = std::min(M, m0 + group);
    for (int r0 = 0; r0 < rows;) {
      const int R = rows - r0 >= 8 ? 8 : std::min(4, rows - r0);
      const ActSuperblockQ8* xr = xs + 2 * static_cast<size_t>(r0) * nsb;
      float* yr = y + static_cast<size_t>(r0) * ldy;
      using Kernel = std::conditional_t<kQ4K, Q4KKernel<kVnni>, Q6KKernel<kVnni>>;
      const auto run = [&](auto r) {
        constexpr int kR = decltype(r)::value;
        if constexpr (kR == 1) {
          KQuantRowPipelined<Kernel>(xr, nsb, m0, m1, w, row_bytes, scale, yr);
        } else {
          KQuantRows<kR, Kernel>(xr, nsb, m0, m1, w, row_bytes, scale, yr, ldy);
        }
      };
      switch (R) {
        case 8: run(std::integral_constant<int, 8>()); break;
        case 4: run(std::integral_constant<int, 4>()); break;
        case 3: run(std::integral_constant<int, 3>()); break;
        case 2: run(std::integral_constant<int, 2>()); break;
        default: run(std::integral_constant<int, 1>()); break;
      }
      r0 += R;
    }
  }
}
#endif
#if G4_Q8_VNNI
#pragma GCC pop_options
#endif
#endif  // G4_Q8_AVX2

#if HWY_TARGET != HWY_SCALAR
// Fmt::Unit with vector operations: the same 32 integers, decoded 16 bytes at a time (a
// CappedTag<uint8_t, 16> has 16 lanes on every target but HWY_SCALAR: NEON, SVE of any length,
// SSE4, EMU128) and widened to i16 into u. The scalar Unit took most of the time of the one-row
// tiles these targets run (SSE4, bench/kernels_bench.cc BM_Q8: see the file comment).
template <int kShift>
HWY_INLINE hn::Vec<hn::CappedTag<uint8_t, 16>> ShrU8(hn::Vec<hn::CappedTag<uint8_t, 16>> v) {
  if constexpr (kShift == 0) return v;
  else return hn::ShiftRight<kShift>(v);
}
// v >> (2 * f) for a run-time f in [0, 4) (after unrolling, a constant).
HWY_INLINE hn::Vec<hn::CappedTag<uint8_t, 16>> ShrU8By2x(hn::Vec<hn::CappedTag<uint8_t, 16>> v, int f) {
  switch (f) {
    case 0: return v;
    case 1: return ShrU8<2>(v);
    case 2: return ShrU8<4>(v);
    default: return ShrU8<6>(v);
  }
}
// Stores the 16 bytes v (lanes of d8, a CappedTag<uint8_t or int8_t, 16>; not DFromV, which on
// SVE is the whole vector) as elements 16 * half .. of a unit: widened to i16 at (int16_t*) u +
// 16 * half (kWide), or as bytes at (int8_t*) u + 16 * half.
template <bool kWide, class D8, class V8>
HWY_INLINE void StoreUnitHalf(D8 d8, V8 v, void* HWY_RESTRICT u, int half) {
  if constexpr (kWide) {
    const hn::Half<D8> d8h;
    const hn::Rebind<int16_t, decltype(d8h)> d16;
    int16_t* p = static_cast<int16_t*>(u) + 16 * half;
    hn::StoreU(hn::PromoteTo(d16, hn::LowerHalf(d8h, v)), d16, p);
    hn::StoreU(hn::PromoteTo(d16, hn::UpperHalf(d8h, v)), d16, p + 8);
  } else {
    hn::StoreU(v, d8, reinterpret_cast<hn::TFromD<D8>*>(static_cast<int8_t*>(u) + 16 * half));
  }
}
// kWide: u is int16_t[32]; else int8_t[32] (every format's integers fit: 0..63, or Q8_0's bytes).
template <class Fmt, bool kWide = true>
HWY_INLINE void UnitVec(const uint8_t* HWY_RESTRICT b, int j, void* HWY_RESTRICT u) {
  const hn::CappedTag<uint8_t, 16> du8;
  const hn::CappedTag<int8_t, 16> di8;
  const auto m4 = hn::Set(du8, 0x0f);
  if constexpr (std::is_same_v<Fmt, FmtQ8_0>) {
    StoreUnitHalf<kWide>(di8, hn::LoadU(di8, reinterpret_cast<const int8_t*>(b + 2)), u, 0);
    StoreUnitHalf<kWide>(di8, hn::LoadU(di8, reinterpret_cast<const int8_t*>(b + 18)), u, 1);
  } else if constexpr (std::is_same_v<Fmt, FmtQ6K>) {
    const int h = j / 4, f = j % 4;
    const uint8_t* ql = b + 64 * h + 32 * (f % 2);
    const uint8_t* qh = b + 128 + 32 * h;
    for (int half = 0; half < 2; ++half) {
      auto lo = hn::LoadU(du8, ql + 16 * half);
      lo = hn::And(f / 2 == 0 ? lo : ShrU8<4>(lo), m4);
      const auto hi = hn::And(ShrU8By2x(hn::LoadU(du8, qh + 16 * half), f), hn::Set(du8, 3));
      StoreUnitHalf<kWide>(du8, hn::Or(lo, hn::ShiftLeft<4>(hi)), u, half);
    }
  } else if constexpr (Fmt::kQK == 256) {  // FmtK4<kFive>
    constexpr bool kFive = Fmt::kBytes == 176;
    const uint8_t* qs = b + Fmt::kQs + 32 * (j / 2);
    for (int half = 0; half < 2; ++half) {
      auto v = hn::LoadU(du8, qs + 16 * half);
      v = hn::And(j % 2 == 0 ? v : ShrU8<4>(v), m4);
      if constexpr (kFive) {
        const auto bit = hn::TestBit(hn::LoadU(du8, b + 16 + 16 * half), hn::Set(du8, static_cast<uint8_t>(1u << j)));
        v = hn::Or(v, hn::IfThenElseZero(bit, hn::Set(du8, 0x10)));
      }
      StoreUnitHalf<kWide>(du8, v, u, half);
    }
  } else {  // FmtLegacy: Q4_0, Q4_1, Q5_0, Q5_1
    const auto v = hn::LoadU(du8, b + Fmt::kQs);
    auto lo = hn::And(v, m4), hi = ShrU8<4>(v);
    if constexpr (Fmt::kQs != Fmt::kQh) {  // Q5_*: bit k of the 32-bit mask is element k's fifth bit
      const auto five = hn::Set(du8, 0x10);
      lo = hn::Or(lo, hn::IfThenElseZero(hn::LoadMaskBits(du8, b + Fmt::kQh), five));
      hi = hn::Or(hi, hn::IfThenElseZero(hn::LoadMaskBits(du8, b + Fmt::kQh + 2), five));
    }
    StoreUnitHalf<kWide>(du8, lo, u, 0);
    StoreUnitHalf<kWide>(du8, hi, u, 1);
  }
}
#endif

// One weight row against R activation rows given as i16 (xw[r]: the row's K int8 values widened
// once per RowsTile call, not once per weight row) and their blocks (x[r]: the scales dx): each
// unit's 32 weights are decoded once (u, i16) and multiplied with every row by i16 x i16 -> i32
// multiply-adds (ReorderWidenMulAccumulate: NEON smlal, SSE4 pmaddwd), exact per unit half; the
// i32 lanes are converted to f32 and multiplied-added with dx * a_h into the row's f32 lanes,
// which are summed once at the end (no reduction per unit). Every row gets the same operations
// whatever R is, so results stay batch-invariant. SSE4, BM_Q8 6144 x 1536 decode, best of four
// interleaved runs, against a scalar decode of each unit and two reductions per unit: Q8_0
// 1149 -> 684 us, Q4_0 1320 -> 866, Q5_0 6196 -> 1247, Q4_K 1719 -> 1072, Q6_K 2943 -> 1332;
// 64-row prefill Q4_0 46.1 -> 36.3 ms (docs/PERFORMANCE.md). (Keeping the decoded row in memory and looping over rows first, which
// SVE would allow without this accumulator array, measured 10-30% slower.)
template <class Fmt, int R>
HWY_INLINE void DotTile(const int16_t* const* xw, const ActBlockQ8* const* x, const float* const* sums,
                        const uint8_t* HWY_RESTRICT w, size_t nb, float* HWY_RESTRICT ob, float* out) {
  const hn::CappedTag<int16_t, 16> d16;
  const hn::Repartition<int32_t, decltype(d16)> d32;
  const hn::Repartition<float, decltype(d16)> df;
  const size_t N = hn::Lanes(d16);
  // Q6_K's unit halves have their own scales; the other formats' two halves share one.
  constexpr bool kHalfScales = std::is_same_v<Fmt, FmtQ6K>;
  const size_t units = nb * Fmt::kUnits;
#if HWY_HAVE_SCALABLE || HWY_TARGET == HWY_SVE || HWY_TARGET == HWY_SVE2 || HWY_TARGET == HWY_SVE_256 || \
    HWY_TARGET == HWY_SVE2_128
  // SVE vectors cannot be array elements: the accumulators live in memory (at most 8 f32 lanes).
  // (Not HWY_HAVE_SCALABLE alone: Highway 1.0.7 and later set it to 0 for SVE_256 and SVE2_128,
  // whose vectors are still sizeless SVE types.)
  HWY_ALIGN float accm[R][16];
  for (int r = 0; r < R; ++r) hn::Store(hn::Zero(df), df, accm[r]);
#define G4_ACC_GET(r) hn::Load(df, accm[r])
#define G4_ACC_SET(r, v) hn::Store((v), df, accm[r])
#else
  hn::Vec<decltype(df)> acc[R];
  for (int r = 0; r < R; ++r) acc[r] = hn::Zero(df);
#define G4_ACC_GET(r) acc[r]
#define G4_ACC_SET(r, v) acc[r] = (v)
#endif
  HWY_ALIGN int16_t u[32];
  for (size_t ib = 0; ib < nb; ++ib) {
    const uint8_t* blk = w + ib * Fmt::kBytes;
    typename Fmt::Params p;
    Fmt::Prepare(blk, &p);
    for (int j = 0; j < Fmt::kUnits; ++j) {
      const size_t unit = ib * Fmt::kUnits + j;
      float a[2];
      Fmt::Scales(p, j, a, ob + 2 * unit);
#if HWY_TARGET == HWY_SCALAR
      Fmt::Unit(blk, j, u);
#else
      UnitVec<Fmt>(blk, j, u);
#endif
      for (int r = 0; r < R; ++r) {
        const int16_t* HWY_RESTRICT xr = xw[r] + unit * 32;
        const float dx = x[r][unit].d;
        auto s0 = hn::Zero(d32), s1 = hn::Zero(d32);
        for (size_t e = 0; e < 16; e += N) {
          s0 = hn::ReorderWidenMulAccumulate(d32, hn::Load(d16, u + e), hn::LoadU(d16, xr + e), s0, s1);
        }
        if constexpr (kHalfScales) {
          G4_ACC_SET(r, hn::MulAdd(hn::ConvertTo(df, hn::Add(s0, s1)), hn::Set(df, dx * a[0]), G4_ACC_GET(r)));
          s0 = hn::Zero(d32);
          s1 = hn::Zero(d32);
        }
        for (size_t e = 16; e < 32; e += N) {
          s0 = hn::ReorderWidenMulAccumulate(d32, hn::Load(d16, u + e), hn::LoadU(d16, xr + e), s0, s1);
        }
        G4_ACC_SET(r, hn::MulAdd(hn::ConvertTo(df, hn::Add(s0, s1)), hn::Set(df, dx * a[1]), G4_ACC_GET(r)));
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    const float sum = hn::GetLane(hn::SumOfLanes(df, G4_ACC_GET(r)));
    out[r] = Fmt::kOffset ? sum + DotF32(ob, sums[r], 2 * units) : sum;
  }
#undef G4_ACC_GET
#undef G4_ACC_SET
}

// Rows [0, R) of the activations against weight rows [m0, m1), one weight row at a time. The
// activation rows are widened to i16 first (a thread-local R x K buffer, 2 bytes per element).
// One buffer per thread for every format and R (not one per RowsTile instantiation).
HWY_NOINLINE int16_t* WideScratch(size_t n) {
  thread_local std::vector<int16_t> wide;
  if (wide.size() < n) wide.resize(n);
  return wide.data();
}

template <class Fmt, int R>
HWY_NOINLINE void RowsTile(const ActBlockQ8* xq, const float* sums, size_t units, int m0, int m1, const uint8_t* w,
                           size_t row_bytes, float scale, float* ob, float* y, size_t ldy) {
  int16_t* const wide = WideScratch(R * units * 32);
  const ActBlockQ8* x[R];
  const float* s[R];
  const int16_t* xw[R];
  for (int r = 0; r < R; ++r) {
    x[r] = xq + r * units;
    s[r] = sums + r * 2 * units;
    int16_t* dst = wide + r * units * 32;
    for (size_t i = 0; i < units; ++i)
      for (int k = 0; k < 32; ++k) dst[i * 32 + k] = x[r][i].q[k];
    xw[r] = dst;
  }
  const size_t nb = units / Fmt::kUnits;
  float out[R];
  for (int m = m0; m < m1; ++m) {
    DotTile<Fmt, R>(xw, x, s, w + static_cast<size_t>(m) * row_bytes, nb, ob, out);
    for (int r = 0; r < R; ++r) y[r * ldy + m] = out[r] * scale;
  }
}

#if HWY_ARCH_ARM_A64 && HWY_TARGET != HWY_SCALAR
// Armv8.2's dot product (SDOT: sixteen i8 x i8 products summed in fours into four i32 lanes, one
// instruction), used where the CPU has it (UseArmDotprod): each unit's weights are decoded to
// bytes (UnitVec<Fmt, false>) and multiplied with the activation block's bytes as they are, two
// SDOTs per unit and activation row in place of widening both and four i16 multiply-adds.
// The integer sums are exact as in DotTile and the f32 steps the same, but lane i of an SDOT holds
// elements 4i..4i+3 where DotTile's lanes hold other partial sums, so the last bits can differ
// from DotTile's (both are within the reference's tolerance; KernelsQ8Test runs both where the
// CPU has the dot product, as under qemu -cpu max). Every row gets the same operations whatever R
// is: batch-invariant.
// The target's own options (Highway's pragma, e.g. +sve) plus the dot product, on Armv8.2 (GCC
// 12 inlines vdotq_s32, defined for arch=armv8.2-a+dotprod, only into functions of that arch or
// later: "+sve+dotprod" alone fails).
#ifdef HWY_TARGET_STR
#define G4_SDOT_ATTR __attribute__((target("arch=armv8.2-a" HWY_TARGET_STR "+dotprod")))
#else
#define G4_SDOT_ATTR __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
template <class Fmt, int R>
G4_SDOT_ATTR HWY_INLINE void DotTileSdot(const ActBlockQ8* const* x, const float* const* sums,
                                                                const uint8_t* HWY_RESTRICT w, size_t nb,
                                                                float* HWY_RESTRICT ob, float* out) {
  constexpr bool kHalfScales = std::is_same_v<Fmt, FmtQ6K>;
  const size_t units = nb * Fmt::kUnits;
  float32x4_t acc[R];
  for (int r = 0; r < R; ++r) acc[r] = vdupq_n_f32(0.0f);
  const int32x4_t zero = vdupq_n_s32(0);
  HWY_ALIGN int8_t u[32];
  for (size_t ib = 0; ib < nb; ++ib) {
    const uint8_t* blk = w + ib * Fmt::kBytes;
    typename Fmt::Params p;
    Fmt::Prepare(blk, &p);
    for (int j = 0; j < Fmt::kUnits; ++j) {
      const size_t unit = ib * Fmt::kUnits + j;
      float a[2];
      Fmt::Scales(p, j, a, ob + 2 * unit);
      UnitVec<Fmt, false>(blk, j, u);
      const int8x16_t w0 = vld1q_s8(u), w1 = vld1q_s8(u + 16);
      for (int r = 0; r < R; ++r) {
        const ActBlockQ8& xb = x[r][unit];
        const int8x16_t x0 = vld1q_s8(xb.q), x1 = vld1q_s8(xb.q + 16);
        if constexpr (kHalfScales) {
          acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(vdotq_s32(zero, w0, x0)), vdupq_n_f32(xb.d * a[0]));
          acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(vdotq_s32(zero, w1, x1)), vdupq_n_f32(xb.d * a[1]));
        } else {
          const int32x4_t s = vdotq_s32(vdotq_s32(zero, w0, x0), w1, x1);
          acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(s), vdupq_n_f32(xb.d * a[1]));
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    const float sum = vaddvq_f32(acc[r]);
    out[r] = Fmt::kOffset ? sum + DotF32(ob, sums[r], 2 * units) : sum;
  }
}

// RowsTile for DotTileSdot (no widened activations). A function of its own rather than a
// parameter of RowsTile: the dot-product intrinsics inline only into functions carrying
// G4_SDOT_ATTR, and lambdas or shared helpers would not inherit it.
template <class Fmt, int R>
G4_SDOT_ATTR HWY_NOINLINE void RowsTileSdot(const ActBlockQ8* xq, const float* sums,
                                                                   size_t units, int m0, int m1, const uint8_t* w,
                                                                   size_t row_bytes, float scale, float* ob, float* y,
                                                                   size_t ldy) {
  const ActBlockQ8* x[R];
  const float* s[R];
  for (int r = 0; r < R; ++r) {
    x[r] = xq + r * units;
    s[r] = sums + r * 2 * units;
  }
  const size_t nb = units / Fmt::kUnits;
  float out[R];
  for (int m = m0; m < m1; ++m) {
    DotTileSdot<Fmt, R>(x, s, w + static_cast<size_t>(m) * row_bytes, nb, ob, out);
    for (int r = 0; r < R; ++r) y[r * ldy + m] = out[r] * scale;
  }
}
#undef G4_SDOT_ATTR
#define G4_Q8_SDOT 1
#else
#define G4_Q8_SDOT 0
#endif

// Prefill's tiles: eight activation rows (then 4, 3, 2, 1), against WeightRowGroup's groups.
constexpr int kPrefillRows = 8;

template <class Fmt>
void MatMulFmt(const ActBlockQ8* xq, const float* sums, int rows, int K, const uint8_t* w, int M, float scale,
               float* y, int ldy, int act_group, const ActSuperblockQ8* xs = nullptr) {
  const size_t units = static_cast<size_t>(K) / 32;
  const size_t row_bytes = static_cast<size_t>(K) / Fmt::kQK * Fmt::kBytes;
  const int group = WeightRowGroup(rows, M, row_bytes, 1);
#if HWY_TARGET == HWY_AVX3
  if constexpr (std::is_same_v<Fmt, FmtQ4K> || std::is_same_v<Fmt, FmtQ6K>) {
    if (act_group == 256) {
      constexpr bool kQ4K = std::is_same_v<Fmt, FmtQ4K>;
      if (UseInt8Vnni()) {
        MatMulKQuantRows<kQ4K, true>(xq, xs, rows, K, w, M, scale, y, ldy);
      } else {
        MatMulKQuantRows<kQ4K, false>(xq, xs, rows, K, w, M, scale, y, ldy);
      }
      return;
    }
  }
#endif
#if G4_Q8_AVX2
  if constexpr (Fmt::kPaired) {
    // The paired tiles add their offsets per unit: the two half sums of each activation unit,
    // added once here rather than in every tile (an own tile, Q6_K's, applies its offset itself).
    // Per tile of at most kPairRows activation rows (a thread-local buffer of kPairRows x units
    // floats, not one of rows x units: 128 KiB per thread for a 512-row step at K = 2048).
    thread_local std::vector<float> usums;
    if constexpr (Fmt::kOffset && !Fmt::kOwnTile) {
      const size_t n = static_cast<size_t>(kPairRows) * units;
      if (usums.size() < n) usums.resize(n);
    }
    for (int m0 = 0; m0 < M; m0 += group) {
      const int m1 = std::min(M, m0 + group);
      for (int r0 = 0; r0 < rows;) {
        const int R = std::min(kPairRows, rows - r0);
        const ActBlockQ8* xr = xq + static_cast<size_t>(r0) * units;
        const float* sr = sums + static_cast<size_t>(r0) * 2 * units;
        if constexpr (Fmt::kOffset && !Fmt::kOwnTile) {
          for (size_t i = 0; i < static_cast<size_t>(R) * units; ++i) usums[i] = sr[2 * i] + sr[2 * i + 1];
        }
        const float* ur = usums.data();
        float* yr = y + static_cast<size_t>(r0) * ldy;
        const auto tile = [&](auto shared, auto vnni) {
          constexpr bool kShared = decltype(shared)::value, kV = decltype(vnni)::value;
          switch (R) {
            case 6: PairRowsTile<Fmt, 6, kShared, kV>(xr, sr, ur, units, m0, m1, w, row_bytes, scale, yr, ldy); break;
            case 5: PairRowsTile<Fmt, 5, kShared, kV>(xr, sr, ur, units, m0, m1, w, row_bytes, scale, yr, ldy); break;
            case 4: PairRowsTile<Fmt, 4, kShared, kV>(xr, sr, ur, units, m0, m1, w, row_bytes, scale, yr, ldy); break;
            case 3: PairRowsTile<Fmt, 3, kShared, kV>(xr, sr, ur, units, m0, m1, w, row_bytes, scale, yr, ldy); break;
            case 2: PairRowsTile<Fmt, 2, kShared, kV>(xr, sr, ur, units, m0, m1, w, row_bytes, scale, yr, ldy); break;
            default: PairRowsTile<Fmt, 1, kShared, kV>(xr, sr, ur, units, m0, m1, w, row_bytes, scale, yr, ldy); break;
          }
        };
        if constexpr (Fmt::kSharedTile) {
          if (act_group == 256) {
            tile(std::true_type(), std::false_type());  // Q4_K/Q5_K's own shared tile: no VNNI form
          } else {
            tile(std::false_type(), std::false_type());
          }
        } else {
#if G4_Q8_VNNI
          if (!Fmt::kOwnTile && UseInt8Vnni()) {
            tile(std::false_type(), std::true_type());
          } else {
            tile(std::false_type(), std::false_type());
          }
#else
          tile(std::false_type(), std::false_type());
#endif
        }
        r0 += R;
      }
    }
    return;
  }
#endif
  thread_local std::vector<float> ob;  // one weight row's offsets b_h, two per unit
  if (ob.size() < 2 * units) ob.resize(2 * units);
  for (int m0 = 0; m0 < M; m0 += group) {
    const int m1 = std::min(M, m0 + group);
    for (int r0 = 0; r0 < rows;) {
      const int R = rows - r0 >= kPrefillRows ? kPrefillRows : std::min(4, rows - r0);
      const ActBlockQ8* xr = xq + static_cast<size_t>(r0) * units;
      const float* sr = sums + static_cast<size_t>(r0) * 2 * units;
      float* yr = y + static_cast<size_t>(r0) * ldy;
#if G4_Q8_SDOT
      if (UseArmDotprod()) {
        switch (R) {
          case kPrefillRows: RowsTileSdot<Fmt, kPrefillRows>(xr, sr, units, m0, m1, w, row_bytes, scale, ob.data(), yr, ldy); break;
          case 4: RowsTileSdot<Fmt, 4>(xr, sr, units, m0, m1, w, row_bytes, scale, ob.data(), yr, ldy); break;
          case 3: RowsTileSdot<Fmt, 3>(xr, sr, units, m0, m1, w, row_bytes, scale, ob.data(), yr, ldy); break;
          case 2: RowsTileSdot<Fmt, 2>(xr, sr, units, m0, m1, w, row_bytes, scale, ob.data(), yr, ldy); break;
          default: RowsTileSdot<Fmt, 1>(xr, sr, units, m0, m1, w, row_bytes, scale, ob.data(), yr, ldy); break;
        }
        r0 += R;
        continue;
      }
#endif
      switch (R) {
        case kPrefillRows: RowsTile<Fmt, kPrefillRows>(xr, sr, units, m0, m1, w, row_bytes, scale, ob.data(), yr, ldy); break;
        case 4: RowsTile<Fmt, 4>(xr, sr, units, m0, m1, w, row_bytes, scale, ob.data(), yr, ldy); break;
        case 3: RowsTile<Fmt, 3>(xr, sr, units, m0, m1, w, row_bytes, scale, ob.data(), yr, ldy); break;
        case 2: RowsTile<Fmt, 2>(xr, sr, units, m0, m1, w, row_bytes, scale, ob.data(), yr, ldy); break;
        default: RowsTile<Fmt, 1>(xr, sr, units, m0, m1, w, row_bytes, scale, ob.data(), yr, ldy); break;
      }
      r0 += R;
    }
  }
}

// QuantizeRowsQ8 (kernels_q8.h), bit-identical to the scalar version in kernels_q8.cc: the same
// max, the same f32 multiply, round-to-nearest-even (the default rounding mode) and exact sums.
void QuantizeRowsQ8Hwy(const float* HWY_RESTRICT x, int rows, int K, ActBlockQ8* HWY_RESTRICT out,
                       float* HWY_RESTRICT sums, int group) {
  const hn::CappedTag<float, 16> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<int8_t, decltype(df)> d8;
  const size_t N = hn::Lanes(df);
  const int64_t groups = static_cast<int64_t>(rows) * (K / group);
  const int per = group / 32;
  for (int64_t g = 0; g < groups; ++g) {
    const float* HWY_RESTRICT xg = x + g * group;
    auto vmax = hn::Zero(df);
    for (size_t e = 0; e < static_cast<size_t>(group); e += N) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(df, xg + e)));
    float amax = hn::GetLane(hn::MaxOfLanes(df, vmax));
    if (!std::isfinite(amax)) amax = INFINITY;
    const float d = amax / 127.0f;
    const auto id = hn::Set(df, amax > 0.0f ? 127.0f / amax : 0.0f);
    for (int i = 0; i < per; ++i) {
      const int64_t b = g * per + i;
      const float* HWY_RESTRICT xb = x + b * 32;
      ActBlockQ8& o = out[b];
      o.d = d;
      auto h0 = hn::Zero(di), h1 = hn::Zero(di);
      for (size_t e = 0; e < 32; e += N) {
        const auto q = hn::NearestInt(hn::Mul(hn::LoadU(df, xb + e), id));
        hn::StoreU(hn::DemoteTo(d8, q), d8, o.q + e);
        if (e < 16) {
          h0 = hn::Add(h0, q);
        } else {
          h1 = hn::Add(h1, q);
        }
      }
      sums[2 * b] = o.d * static_cast<float>(hn::GetLane(hn::SumOfLanes(di, h0)));
      sums[2 * b + 1] = o.d * static_cast<float>(hn::GetLane(hn::SumOfLanes(di, h1)));
    }
  }
}

// PrepareActSuperblocks (kernels_q8.h): the units copied as they are, each 16-element sum of q
// as the sum of (q + 128) over its bytes (SumsOf8: psadbw on x86) less 16 * 128, exact. The
// scalar loop it replaces summed byte by byte: 6.2 us for one row of K = 12288 (E2B's wide down
// projections, Q4_K/Q6_K), ahead of every such matmul on the calling thread alone.
void PrepareActSuperblocksHwy(const ActBlockQ8* HWY_RESTRICT xq, int rows, int K, ActSuperblockQ8* HWY_RESTRICT out) {
  static constexpr int kQ4KUnitAt[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  const size_t n = static_cast<size_t>(rows) * (K / 256);
  for (size_t i = 0; i < n; ++i) {
    const ActBlockQ8* u = xq + 8 * i;
    ActSuperblockQ8& a = out[2 * i];
    ActSuperblockQ8& b = out[2 * i + 1];
    for (int k = 0; k < 8; ++k) {
      std::memcpy(a.q[k / 2] + 32 * (k % 2), u[k].q, 32);
      std::memcpy(b.q[k / 2] + 32 * (k % 2), u[kQ4KUnitAt[k]].q, 32);
    }
    for (int g = 0; g < 16; ++g) {
      const int8_t* q = u[g / 2].q + 16 * (g % 2);
      int t = 0;
#if HWY_TARGET == HWY_SCALAR
      for (int l = 0; l < 16; ++l) t += q[l];
#else
      const hn::CappedTag<uint8_t, 16> du8;
      const hn::Repartition<uint64_t, decltype(du8)> du64;
      for (size_t l = 0; l < 16; l += hn::Lanes(du8)) {
        const auto v = hn::Xor(hn::LoadU(du8, reinterpret_cast<const uint8_t*>(q + l)), hn::Set(du8, 0x80));
        t += static_cast<int>(hn::GetLane(hn::SumOfLanes(du64, hn::SumsOf8(v)))) - 128 * static_cast<int>(hn::Lanes(du8));
      }
#endif
      a.s[g] = static_cast<int16_t>(t);
      b.s[g] = static_cast<int16_t>(-t);
    }
    a.dx = b.dx = u[0].d;
  }
}

// kQ4_0x4 weights: the AVX-512 kernel above; on other targets each group of four rows is
// unpacked into Q4_0 rows (UnpackQ4_0x4Group) and multiplied by MatMulFmt<FmtQ4_0> (correct, not
// fast: the engine packs weights only where Q4_0x4KernelAvailable()).
void MatMulQ4_0x4(const ActBlockQ8* xq, const float* sums, int rows, int K, const uint8_t* w, int M, float scale,
                  float* y, int ldy) {
  G4_CHECK(M % 4 == 0);
#if HWY_TARGET == HWY_AVX3
  if (UseInt8Vnni()) {
    MatMulQ4_0x4Native<true>(xq, rows, K, w, M, scale, y, ldy);
  } else {
    MatMulQ4_0x4Native<false>(xq, rows, K, w, M, scale, y, ldy);
  }
#else
  const size_t group_bytes = 4 * DTypeRowBytes(DType::kQ4_0, K);
  thread_local std::vector<uint8_t> rows4;
  rows4.resize(group_bytes);
  for (int m = 0; m < M; m += 4) {
    UnpackQ4_0x4Group(w + static_cast<size_t>(m / 4) * group_bytes, K, rows4.data());
    MatMulFmt<FmtQ4_0>(xq, sums, rows, K, rows4.data(), 4, scale, y + m, ldy, 32);
  }
#endif
}

// Whether the dispatched target has the AVX-512 kernels (Q4_0x4Rows, KQuantRows, KQuantRowPipelined).
bool Avx3KernelsAvailableHwy() { return HWY_TARGET == HWY_AVX3; }

void MatMulQ8Hwy(const ActBlockQ8* xq, const float* sums, int rows, int K, const uint8_t* w, DType wt, int M,
                 float scale, float* y, int ldy, int act_group, const ActSuperblockQ8* xs) {
  if (rows <= 0 || M <= 0) return;
  G4_CHECK(K % DTypeBlockElems(wt) == 0 && K % 32 == 0 && (act_group == 32 || (act_group == 256 && K % 256 == 0)));
  switch (wt) {
    case DType::kQ8_0: return MatMulFmt<FmtQ8_0>(xq, sums, rows, K, w, M, scale, y, ldy, act_group);
    case DType::kQ4_0: return MatMulFmt<FmtQ4_0>(xq, sums, rows, K, w, M, scale, y, ldy, act_group);
    case DType::kQ4_1: return MatMulFmt<FmtQ4_1>(xq, sums, rows, K, w, M, scale, y, ldy, act_group);
    case DType::kQ5_0: return MatMulFmt<FmtQ5_0>(xq, sums, rows, K, w, M, scale, y, ldy, act_group);
    case DType::kQ5_1: return MatMulFmt<FmtQ5_1>(xq, sums, rows, K, w, M, scale, y, ldy, act_group);
    case DType::kQ4_K: return MatMulFmt<FmtQ4K>(xq, sums, rows, K, w, M, scale, y, ldy, act_group, xs);
    case DType::kQ5_K: return MatMulFmt<FmtQ5K>(xq, sums, rows, K, w, M, scale, y, ldy, act_group);
    case DType::kQ6_K: return MatMulFmt<FmtQ6K>(xq, sums, rows, K, w, M, scale, y, ldy, act_group, xs);
    case DType::kQ4_0x4: return MatMulQ4_0x4(xq, sums, rows, K, w, M, scale, y, ldy);
    default: G4_CHECK(false && "MatMulQ8: unsupported weight type");
  }
}

#undef G4_Q8_AVX2
#undef G4_Q8_VNNI
#undef G4_Q8_SDOT

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace g4
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace g4 {
namespace cpu {

HWY_EXPORT(MatMulQ8Hwy);
HWY_EXPORT(Avx3KernelsAvailableHwy);
HWY_EXPORT(QuantizeRowsQ8Hwy);
HWY_EXPORT(PrepareActSuperblocksHwy);

void PrepareActSuperblocks(const ActBlockQ8* xq, int rows, int K, ActSuperblockQ8* out) {
  G4_CHECK(K % 256 == 0);
  HWY_DYNAMIC_DISPATCH(PrepareActSuperblocksHwy)(xq, rows, K, out);
}

void QuantizeRowsQ8(const float* x, int rows, int K, ActBlockQ8* blocks, float* sums, int group) {
  G4_CHECK((group == 32 || group == 256) && K % group == 0);
  HWY_DYNAMIC_DISPATCH(QuantizeRowsQ8Hwy)(x, rows, K, blocks, sums, group);
}

bool Q4_0x4KernelAvailable() { return HWY_DYNAMIC_DISPATCH(Avx3KernelsAvailableHwy)(); }

bool MatMulQ8UsesSuperblocks(DType wt, int K, int act_group) {
  return (wt == DType::kQ4_K || wt == DType::kQ6_K) && act_group == 256 && K % 256 == 0 &&
         HWY_DYNAMIC_DISPATCH(Avx3KernelsAvailableHwy)();
}

void MatMulQ8(const ActBlockQ8* xq, const float* sums, int rows, int K, const uint8_t* w, DType wt, int M,
              float scale, float* y, int ldy, int act_group, const ActSuperblockQ8* xs) {
  HWY_DYNAMIC_DISPATCH(MatMulQ8Hwy)(xq, sums, rows, K, w, wt, M, scale, y, ldy, act_group, xs);
}

}  // namespace cpu
}  // namespace g4
#endif  // HWY_ONCE
