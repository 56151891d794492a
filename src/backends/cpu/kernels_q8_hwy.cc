// SIMD int8-activation matmul (kernels_q8.h), one source for every Highway target.
//
// Per weight block, each 32-element unit is turned into 32 small integers u_k (in registers) plus
// per-half f32 scale a_h and offset b_h (see kernels_q8.h), then multiplied with the activation
// block's int8 q_k:
// - x86 AVX2 and AVX-512 targets: byte multiply-add (vpmaddubsw: u8 x i8 -> pairs of i16; no
//   saturation since |u| <= 128 and |q| <= 127 give |pair| <= 32512), then vpmaddwd with ones
//   (-> i32, lanes 0-3 the first half of the unit, 4-7 the second), converted to f32 and
//   multiplied-added with the lane-wise scale [a_0 dx x4, a_1 dx x4] into one f32 accumulator per
//   (activation row, weight row) pair. Signed Q8_0 weights use |u| and sign(q, u).
// - Other targets (SSE4 and older, NEON, SVE, scalar): u decoded by scalar code into i16, i16 x i16
//   -> i32 multiply-adds (ReorderWidenMulAccumulate), one reduction per half.
// Tiles: one activation row by one weight row in decode (measured fastest here: several weight
// rows at once slowed decode), eight activation rows by one weight row in prefill (the weight unit
// is decoded once for eight rows). Decode is bound by the accumulator's FMA latency on 18- to
// 34-byte units; splitting each pair's sum into two chains (tried: sum units in pairs, then add)
// sped Q4_0 decode on the synthetic E2B by 13% but cost 12% of prefill on Gemma 3 270M, so it is
// not used; a decode-only split would make a row's result depend on the batch.
// The offsets b_h * dx * sum(q over the half) use the sums stored in the activation block.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels_q8.h"
#include "base/check.h"
#include "tensor/block_fields.h"
#include "tensor/dtype.h"

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
// UnitAvx2(block, j) = the same 32 integers as bytes of one 256-bit register.

#if G4_Q8_AVX2
HWY_INLINE __m256i Nibbles16(const uint8_t* qs) {  // 16 bytes: low nibbles then high nibbles
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}
// Byte k of the result is 0x10 where bit k of the 32-bit mask at qh is set, else 0.
HWY_INLINE __m256i FifthBits32(const uint8_t* qh) {
  const __m256i bits = _mm256_set1_epi32(static_cast<int>(U32Q8(qh)));
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                        3, 3, 3, 3, 3, 3);
  const __m256i sel = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(bits, shuf), sel);
  return _mm256_and_si256(_mm256_cmpeq_epi8(b, sel), _mm256_set1_epi8(0x10));
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
  static HWY_INLINE __m256i UnitAvx2(const uint8_t* b, int) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)); }
#endif
};

// Q4_0 / Q4_1: nibbles at qs = b + kQs; d at b, (Q4_1) m at b + 2.
template <int kQs, bool kMin>
struct FmtQ4Legacy {
  static constexpr int kQK = 32, kBytes = kMin ? 20 : 18, kUnits = 1;
  static constexpr bool kSigned = false, kOffset = true;
  struct Params { float a, o; };
  static HWY_INLINE void Prepare(const uint8_t* b, Params* p) {
    const float d = HalfQ8(b);
    p->a = d;
    p->o = kMin ? HalfQ8(b + 2) : -8.0f * d;
  }
  static HWY_INLINE void Scales(const Params& p, int, float* a, float* o) { a[0] = a[1] = p.a; o[0] = o[1] = p.o; }
  static HWY_INLINE void Unit(const uint8_t* b, int, int16_t* u) {
    for (int k = 0; k < 16; ++k) {
      u[k] = b[kQs + k] & 15;
      u[k + 16] = b[kQs + k] >> 4;
    }
  }
#if G4_Q8_AVX2
  static HWY_INLINE __m256i UnitAvx2(const uint8_t* b, int) { return Nibbles16(b + kQs); }
#endif
};
using FmtQ4_0 = FmtQ4Legacy<2, false>;
using FmtQ4_1 = FmtQ4Legacy<4, true>;

// Q5_0 / Q5_1: fifth-bit mask at b + kQh, nibbles at b + kQh + 4.
template <int kQh, bool kMin>
struct FmtQ5Legacy {
  static constexpr int kQK = 32, kBytes = kMin ? 24 : 22, kUnits = 1;
  static constexpr bool kSigned = false, kOffset = true;
  struct Params { float a, o; };
  static HWY_INLINE void Prepare(const uint8_t* b, Params* p) {
    const float d = HalfQ8(b);
    p->a = d;
    p->o = kMin ? HalfQ8(b + 2) : -16.0f * d;
  }
  static HWY_INLINE void Scales(const Params& p, int, float* a, float* o) { a[0] = a[1] = p.a; o[0] = o[1] = p.o; }
  static HWY_INLINE void Unit(const uint8_t* b, int, int16_t* u) {
    const uint32_t qh = U32Q8(b + kQh);
    for (int k = 0; k < 16; ++k) {
      u[k] = static_cast<int16_t>((b[kQh + 4 + k] & 15) | (((qh >> k) & 1) << 4));
      u[k + 16] = static_cast<int16_t>((b[kQh + 4 + k] >> 4) | (((qh >> (k + 16)) & 1) << 4));
    }
  }
#if G4_Q8_AVX2
  static HWY_INLINE __m256i UnitAvx2(const uint8_t* b, int) {
    return _mm256_or_si256(Nibbles16(b + kQh + 4), FifthBits32(b + kQh));
  }
#endif
};
using FmtQ5_0 = FmtQ5Legacy<2, false>;
using FmtQ5_1 = FmtQ5Legacy<4, true>;

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
  static HWY_INLINE __m256i UnitAvx2(const uint8_t* b, int j) {
    const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + kQs + 32 * (j / 2)));
    const __m256i m = _mm256_set1_epi8(0x0f);
    __m256i u = (j % 2 == 0) ? _mm256_and_si256(qs, m) : _mm256_and_si256(_mm256_srli_epi16(qs, 4), m);
    if constexpr (kFive) {
      const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << j));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
      u = _mm256_or_si256(u, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    }
    return u;
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
  static HWY_INLINE __m256i UnitAvx2(const uint8_t* b, int j) {
    const int h = j / 4, f = j % 4;
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32 * (f % 2)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x30);
    const __m256i lo = f < 2 ? _mm256_and_si256(ql, m4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
    __m256i hi;  // field f (bits 2f, 2f + 1) moved to bits 4, 5 of each byte
    switch (f) {
      case 0: hi = _mm256_slli_epi16(qh, 4); break;
      case 1: hi = _mm256_slli_epi16(qh, 2); break;
      case 2: hi = qh; break;
      default: hi = _mm256_srli_epi16(qh, 2); break;
    }
    return _mm256_or_si256(lo, _mm256_and_si256(hi, m2));
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
template <class Fmt, int R>
HWY_INLINE void DotTile(const ActBlockQ8* const* x, const float* const* sums, const uint8_t* HWY_RESTRICT w, size_t nb,
                        float* HWY_RESTRICT ob, float* out) {
  const size_t units = nb * Fmt::kUnits;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (size_t ib = 0; ib < nb; ++ib) {
    const uint8_t* blk = w + ib * Fmt::kBytes;
    typename Fmt::Params p;
    Fmt::Prepare(blk, &p);
    HWY_UNROLL(8)
    for (int j = 0; j < Fmt::kUnits; ++j) {
      const size_t unit = ib * Fmt::kUnits + j;
      float a[2], o[2];
      Fmt::Scales(p, j, a, o);
      const __m256 av = _mm256_set_m128(_mm_set1_ps(a[1]), _mm_set1_ps(a[0]));
      if constexpr (Fmt::kOffset) {
        ob[2 * unit] = o[0];
        ob[2 * unit + 1] = o[1];
      }
      const __m256i u = Fmt::UnitAvx2(blk, j);
      const __m256i ua = Fmt::kSigned ? _mm256_sign_epi8(u, u) : u;
      for (int r = 0; r < R; ++r) {
        const ActBlockQ8& xb = x[r][unit];
        __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.q));
        if constexpr (Fmt::kSigned) xq = _mm256_sign_epi8(xq, u);
        const __m256i p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(ua, xq), ones);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), _mm256_mul_ps(av, _mm256_broadcast_ss(&xb.d)), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    const __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
    float v = _mm_cvtss_f32(s1);
    if constexpr (Fmt::kOffset) v += DotF32(ob, sums[r], 2 * units);
    out[r] = v;
  }
}
#else
// Sum over 16 elements of u (i16) times q (i8), exact in i32.
HWY_INLINE int32_t DotHalf(const int16_t* HWY_RESTRICT u, const int8_t* HWY_RESTRICT q) {
  const hn::CappedTag<int16_t, 16> d16;
  const hn::Repartition<int32_t, decltype(d16)> d32;
  const hn::Rebind<int8_t, decltype(d16)> d8;
  const size_t N = hn::Lanes(d16);
  auto s0 = hn::Zero(d32), s1 = hn::Zero(d32);
  for (size_t e = 0; e < 16; e += N) {
    s0 = hn::ReorderWidenMulAccumulate(d32, hn::LoadU(d16, u + e), hn::PromoteTo(d16, hn::LoadU(d8, q + e)), s0, s1);
  }
  return hn::GetLane(hn::SumOfLanes(d32, hn::Add(s0, s1)));
}

template <class Fmt, int R>
HWY_INLINE void DotTile(const ActBlockQ8* const* x, const float* const* sums, const uint8_t* HWY_RESTRICT w, size_t nb,
                        float* HWY_RESTRICT ob, float* out) {
  const size_t units = nb * Fmt::kUnits;
  float acc[R] = {};
  HWY_ALIGN int16_t u[32];
  for (size_t ib = 0; ib < nb; ++ib) {
    const uint8_t* blk = w + ib * Fmt::kBytes;
    typename Fmt::Params p;
    Fmt::Prepare(blk, &p);
    for (int j = 0; j < Fmt::kUnits; ++j) {
      const size_t unit = ib * Fmt::kUnits + j;
      float a[2];
      Fmt::Scales(p, j, a, ob + 2 * unit);
      Fmt::Unit(blk, j, u);
      for (int r = 0; r < R; ++r) {
        const ActBlockQ8& xb = x[r][unit];
        const float i0 = static_cast<float>(DotHalf(u, xb.q));
        const float i1 = static_cast<float>(DotHalf(u + 16, xb.q + 16));
        acc[r] += xb.d * (a[0] * i0 + a[1] * i1);
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = Fmt::kOffset ? acc[r] + DotF32(ob, sums[r], 2 * units) : acc[r];
}
#endif

// Rows [0, R) of the activations against weight rows [m0, m1), one weight row at a time.
template <class Fmt, int R>
HWY_NOINLINE void RowsTile(const ActBlockQ8* xq, const float* sums, size_t units, int m0, int m1, const uint8_t* w,
                           size_t row_bytes, float scale, float* ob, float* y, size_t ldy) {
  const ActBlockQ8* x[R];
  const float* s[R];
  for (int r = 0; r < R; ++r) {
    x[r] = xq + r * units;
    s[r] = sums + r * 2 * units;
  }
  const size_t nb = units / Fmt::kUnits;
  float out[R];
  for (int m = m0; m < m1; ++m) {
    DotTile<Fmt, R>(x, s, w + static_cast<size_t>(m) * row_bytes, nb, ob, out);
    for (int r = 0; r < R; ++r) y[r * ldy + m] = out[r] * scale;
  }
}

// Decode (up to four rows): one pass over the weights. Prefill: groups of weight rows (~256 KiB,
// which stay in L2) against tiles of eight activation rows (then 4, 3, 2, 1).
constexpr int kPrefillRows = 8;

template <class Fmt>
void MatMulFmt(const ActBlockQ8* xq, const float* sums, int rows, int K, const uint8_t* w, int M, float scale,
               float* y, int ldy) {
  const size_t units = static_cast<size_t>(K) / 32;
  const size_t row_bytes = static_cast<size_t>(K) / Fmt::kQK * Fmt::kBytes;
  thread_local std::vector<float> ob;  // one weight row's offsets b_h, two per unit
  if (ob.size() < 2 * units) ob.resize(2 * units);
  const int group = rows <= 4 ? M : std::max(1, static_cast<int>((256u << 10) / std::max<size_t>(row_bytes, 1)));
  for (int m0 = 0; m0 < M; m0 += group) {
    const int m1 = std::min(M, m0 + group);
    for (int r0 = 0; r0 < rows;) {
      const int R = rows - r0 >= kPrefillRows ? kPrefillRows : std::min(4, rows - r0);
      const ActBlockQ8* xr = xq + static_cast<size_t>(r0) * units;
      const float* sr = sums + static_cast<size_t>(r0) * 2 * units;
      float* yr = y + static_cast<size_t>(r0) * ldy;
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
                       float* HWY_RESTRICT sums) {
  const hn::CappedTag<float, 16> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<int8_t, decltype(df)> d8;
  const size_t N = hn::Lanes(df);
  const int64_t blocks = static_cast<int64_t>(rows) * (K / 32);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* HWY_RESTRICT xb = x + b * 32;
    auto vmax = hn::Zero(df);
    for (size_t e = 0; e < 32; e += N) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(df, xb + e)));
    float amax = hn::GetLane(hn::MaxOfLanes(df, vmax));
    if (!std::isfinite(amax)) amax = INFINITY;
    ActBlockQ8& o = out[b];
    o.d = amax / 127.0f;
    const auto id = hn::Set(df, amax > 0.0f ? 127.0f / amax : 0.0f);
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

void MatMulQ8Hwy(const ActBlockQ8* xq, const float* sums, int rows, int K, const uint8_t* w, DType wt, int M,
                 float scale, float* y, int ldy) {
  if (rows <= 0 || M <= 0) return;
  G4_CHECK(K % DTypeBlockElems(wt) == 0 && K % 32 == 0);
  switch (wt) {
    case DType::kQ8_0: return MatMulFmt<FmtQ8_0>(xq, sums, rows, K, w, M, scale, y, ldy);
    case DType::kQ4_0: return MatMulFmt<FmtQ4_0>(xq, sums, rows, K, w, M, scale, y, ldy);
    case DType::kQ4_1: return MatMulFmt<FmtQ4_1>(xq, sums, rows, K, w, M, scale, y, ldy);
    case DType::kQ5_0: return MatMulFmt<FmtQ5_0>(xq, sums, rows, K, w, M, scale, y, ldy);
    case DType::kQ5_1: return MatMulFmt<FmtQ5_1>(xq, sums, rows, K, w, M, scale, y, ldy);
    case DType::kQ4_K: return MatMulFmt<FmtQ4K>(xq, sums, rows, K, w, M, scale, y, ldy);
    case DType::kQ5_K: return MatMulFmt<FmtQ5K>(xq, sums, rows, K, w, M, scale, y, ldy);
    case DType::kQ6_K: return MatMulFmt<FmtQ6K>(xq, sums, rows, K, w, M, scale, y, ldy);
    default: G4_CHECK(false && "MatMulQ8: unsupported weight type");
  }
}

#undef G4_Q8_AVX2

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace g4
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace g4 {
namespace cpu {

HWY_EXPORT(MatMulQ8Hwy);
HWY_EXPORT(QuantizeRowsQ8Hwy);

void QuantizeRowsQ8(const float* x, int rows, int K, ActBlockQ8* blocks, float* sums) {
  G4_CHECK(K % 32 == 0);
  HWY_DYNAMIC_DISPATCH(QuantizeRowsQ8Hwy)(x, rows, K, blocks, sums);
}

void MatMulQ8(const ActBlockQ8* xq, const float* sums, int rows, int K, const uint8_t* w, DType wt, int M,
              float scale, float* y, int ldy) {
  HWY_DYNAMIC_DISPATCH(MatMulQ8Hwy)(xq, sums, rows, K, w, wt, M, scale, y, ldy);
}

}  // namespace cpu
}  // namespace g4
#endif  // HWY_ONCE
