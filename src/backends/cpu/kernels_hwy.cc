// SIMD versions of the CPU kernels (kernels.h), written once with Google Highway and compiled for
// every target in HWY_TARGETS (x86: SSSE3, SSE4, AVX2, AVX-512 and the scalar fallback; Arm: NEON,
// SVE, SVE2); HWY_DYNAMIC_DISPATCH picks the best one the CPU supports on the first call.
//
// Matrix products read the weights in their stored form. Per weight block, each vector of
// dequantised weights is built in registers from the packed bytes -- exactly the f32 values
// ConvertToF32 (src/tensor/dequant.cc) produces, with the same f32 operations in the same order --
// and multiplied into f32 accumulators for one to four activation rows (decode) or eight (prefill),
// so a block is decoded once per tile of rows and the dequantised row is never written to memory.
// Plain float weights (F32, F16, BF16) run register tiles of weight rows x activation rows
// (MatMulFloat, kernels_float-inl.h, included below). The element-wise kernels (Dot, GeGlu,
// RmsNorm, ...) are kernels_vec_hwy.cc. This file is compiled with -ffp-contract=off
// (CMakeLists.txt) so that the decoding's separate multiply and add stay separate, as in
// dequant.cc; the dot products use explicit fused multiply-adds (hn::MulAdd) where the target has
// them. Activations are never quantised.
//
// Vectors never straddle a scale group: block formats use at most 16 f32 lanes (one Q6_K scale
// covers 16 elements, a Q4_0 nibble half 16), Q5_0/Q5_1 at most 8, via CappedTag.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels.h"
#include "base/check.h"
#include "tensor/block_fields.h"
#include "tensor/dtype.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/cpu/kernels_hwy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/cache_control.h"
#include "hwy/highway.h"

#ifndef G4_KERNELS_HWY_TABLES_
#define G4_KERNELS_HWY_TABLES_
namespace g4::cpu {
namespace {
// Per byte of a Q5_0/Q5_1 fifth-bit mask, per bit j: the term that bit adds to the element.
struct FifthBitTables {
  int8_t minus16[256][8];  // Q5_0: (nib | bit << 4) - 16 = nib + (bit ? 0 : -16)
  int8_t plus16[256][8];   // Q5_1: nib | bit << 4 = nib + (bit ? 16 : 0)
};
constexpr FifthBitTables MakeFifthBitTables() {
  FifthBitTables t{};
  for (int b = 0; b < 256; ++b) {
    for (int j = 0; j < 8; ++j) {
      const bool set = (b >> j) & 1;
      t.minus16[b][j] = static_cast<int8_t>(set ? 0 : -16);
      t.plus16[b][j] = static_cast<int8_t>(set ? 16 : 0);
    }
  }
  return t;
}
alignas(64) constexpr FifthBitTables kFifthBits = MakeFifthBitTables();
}  // namespace
}  // namespace g4::cpu
#endif  // G4_KERNELS_HWY_TABLES_

HWY_BEFORE_NAMESPACE();
namespace g4 {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lanes per vector for the block formats (see the file comment).
using DFB = hn::CappedTag<float, 16>;
// Full vectors for plain f32 data.
using DFF = hn::ScalableTag<float>;

HWY_INLINE uint32_t U32At(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

// Lanes(DF) bytes at p, zero-extended to i32 lanes.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> LoadBytes(DF, const uint8_t* HWY_RESTRICT p) {
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint8_t, DF> d8;
  return hn::PromoteTo(di, hn::LoadU(d8, p));
}

// The fifth bits of elements e .. e + N - 1 (N <= 8, e % N == 0) of a Q5_0/Q5_1 block whose
// 32-bit mask starts at qh, as i32 lanes of table[bit]: bit e + lane of the mask is bit e % 8 + lane
// of byte e / 8, so all lanes come from one 8-byte table row.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> FifthBits(DF, const int8_t (*table)[8], const uint8_t* qh, size_t e) {
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<int8_t, DF> d8;
  return hn::PromoteTo(di, hn::LoadU(d8, table[qh[e / 8]] + e % 8));
}

// ---------------------------------------------------------------------------------------------
// Block decoders. Each has kQK elements per block of kBytes bytes, a Prepare that reads the
// block's scales into Params, and Get(df, block, params, g, e) = dequantised elements
// g * kGroup + e .. + N - 1 (e < kGroup a multiple of N = Lanes(df)), bit-identical to dequant.cc.
// Groups repeat one bit layout: the kernels loop over g and unroll e, so e is a constant.

struct DecQ8_0 {
  static constexpr size_t kQK = 32, kGroup = 32, kBytes = 34;
  using Tag = DFB;
  struct Params { float d; };
  static HWY_INLINE void Prepare(const uint8_t* b, Params* p) { p->d = HalfAt(b); }
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Get(DF df, const uint8_t* HWY_RESTRICT b, const Params& p, size_t /*g*/, size_t e) {
    const hn::RebindToSigned<DF> di;
    const hn::Rebind<int8_t, DF> d8;
    const auto q = hn::PromoteTo(di, hn::LoadU(d8, reinterpret_cast<const int8_t*>(b + 2 + e)));
    return hn::Mul(hn::ConvertTo(df, q), hn::Set(df, p.d));  // float(q) * d
  }
};

// Symmetric 4-bit blocks, Q4_0's nibble order: x = scale * (nib - 8), the scale an fp16 (Q4_0)
// or a bf16 (W4G32, dtype.h) at the block's start.
template <bool kBf16Scale>
struct DecQ4Sym {
  static constexpr size_t kQK = 32, kGroup = 32, kBytes = 18;
  using Tag = DFB;
  struct Params { float d; };
  static HWY_INLINE void Prepare(const uint8_t* b, Params* p) {
    p->d = kBf16Scale ? Bf16ToF32(static_cast<uint16_t>(b[0] | (b[1] << 8))) : HalfAt(b);
  }
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Get(DF df, const uint8_t* HWY_RESTRICT b, const Params& p, size_t /*g*/, size_t e) {
    const hn::RebindToSigned<DF> di;
    auto q = LoadBytes(df, b + 2 + (e & 15));
    if (e < 16) {
      q = hn::And(q, hn::Set(di, 15));
    } else {
      q = hn::ShiftRight<4>(q);
    }
    return hn::Mul(hn::Set(df, p.d), hn::ConvertTo(df, hn::Sub(q, hn::Set(di, 8))));  // d * (nib - 8)
  }
};
using DecQ4_0 = DecQ4Sym<false>;
using DecW4G32 = DecQ4Sym<true>;

struct DecQ4_1 {
  static constexpr size_t kQK = 32, kGroup = 32, kBytes = 20;
  using Tag = DFB;
  struct Params { float d, m; };
  static HWY_INLINE void Prepare(const uint8_t* b, Params* p) {
    p->d = HalfAt(b);
    p->m = HalfAt(b + 2);
  }
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Get(DF df, const uint8_t* HWY_RESTRICT b, const Params& p, size_t /*g*/, size_t e) {
    const hn::RebindToSigned<DF> di;
    auto q = LoadBytes(df, b + 4 + (e & 15));
    if (e < 16) {
      q = hn::And(q, hn::Set(di, 15));
    } else {
      q = hn::ShiftRight<4>(q);
    }
    return hn::Add(hn::Mul(hn::Set(df, p.d), hn::ConvertTo(df, q)), hn::Set(df, p.m));  // d * nib + m
  }
};

struct DecQ5_0 {
  static constexpr size_t kQK = 32, kGroup = 32, kBytes = 22;
  using Tag = hn::CappedTag<float, 8>;  // FifthBits reads one mask byte per vector
  struct Params { float d; };
  static HWY_INLINE void Prepare(const uint8_t* b, Params* p) { p->d = HalfAt(b); }
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Get(DF df, const uint8_t* HWY_RESTRICT b, const Params& p, size_t /*g*/, size_t e) {
    const hn::RebindToSigned<DF> di;
    auto q = LoadBytes(df, b + 6 + (e & 15));
    if (e < 16) {
      q = hn::And(q, hn::Set(di, 15));
    } else {
      q = hn::ShiftRight<4>(q);
    }
    q = hn::Add(q, FifthBits(df, kFifthBits.minus16, b + 2, e));
    return hn::Mul(hn::Set(df, p.d), hn::ConvertTo(df, q));  // d * ((nib | bit << 4) - 16)
  }
};

struct DecQ5_1 {
  static constexpr size_t kQK = 32, kGroup = 32, kBytes = 24;
  using Tag = hn::CappedTag<float, 8>;
  struct Params { float d, m; };
  static HWY_INLINE void Prepare(const uint8_t* b, Params* p) {
    p->d = HalfAt(b);
    p->m = HalfAt(b + 2);
  }
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Get(DF df, const uint8_t* HWY_RESTRICT b, const Params& p, size_t /*g*/, size_t e) {
    const hn::RebindToSigned<DF> di;
    auto q = LoadBytes(df, b + 8 + (e & 15));
    if (e < 16) {
      q = hn::And(q, hn::Set(di, 15));
    } else {
      q = hn::ShiftRight<4>(q);
    }
    q = hn::Add(q, FifthBits(df, kFifthBits.plus16, b + 4, e));
    return hn::Add(hn::Mul(hn::Set(df, p.d), hn::ConvertTo(df, q)), hn::Set(df, p.m));  // d * q + m
  }
};


struct ParamsK4 {
  float ds[8], dm[8];  // per sub-block of 32: d * scale, dmin * min
};
HWY_INLINE void PrepareK4(const uint8_t* b, ParamsK4* p) {
  const float d = HalfAt(b);
  const float dmin = HalfAt(b + 2);
  for (int s = 0; s < 8; ++s) {
    int sc, mn;
    ScaleMinK4(b + 4, s, &sc, &mn);
    p->ds[s] = d * static_cast<float>(sc);
    p->dm[s] = dmin * static_cast<float>(mn);
  }
}

struct DecQ4K {
  static constexpr size_t kQK = 256, kGroup = 64, kBytes = 144;
  using Tag = DFB;
  using Params = ParamsK4;
  static HWY_INLINE void Prepare(const uint8_t* b, Params* p) { PrepareK4(b, p); }
  // Group g: sub-blocks 2g (low nibbles of qs[32g .. 32g + 31]) and 2g + 1 (high nibbles).
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Get(DF df, const uint8_t* HWY_RESTRICT b, const Params& p, size_t g, size_t e) {
    const hn::RebindToSigned<DF> di;
    const size_t s = 2 * g + e / 32, l = e % 32;
    auto q = LoadBytes(df, b + 16 + 32 * g + l);
    if (e < 32) {
      q = hn::And(q, hn::Set(di, 15));
    } else {
      q = hn::ShiftRight<4>(q);
    }
    return hn::Sub(hn::Mul(hn::Set(df, p.ds[s]), hn::ConvertTo(df, q)), hn::Set(df, p.dm[s]));
  }
};

struct DecQ5K {
  static constexpr size_t kQK = 256, kGroup = 64, kBytes = 176;
  using Tag = DFB;
  using Params = ParamsK4;
  static HWY_INLINE void Prepare(const uint8_t* b, Params* p) { PrepareK4(b, p); }
  // As Q4_K, plus the fifth bit of element l of sub-block s: bit s of qh[l].
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Get(DF df, const uint8_t* HWY_RESTRICT b, const Params& p, size_t g, size_t e) {
    const hn::RebindToSigned<DF> di;
    const size_t s = 2 * g + e / 32, l = e % 32;
    auto q = LoadBytes(df, b + 48 + 32 * g + l);
    if (e < 32) {
      q = hn::And(q, hn::Set(di, 15));
    } else {
      q = hn::ShiftRight<4>(q);
    }
    const auto hb = hn::And(hn::ShiftRightSame(LoadBytes(df, b + 16 + l), static_cast<int>(s)), hn::Set(di, 1));
    q = hn::Or(q, hn::ShiftLeft<4>(hb));
    return hn::Sub(hn::Mul(hn::Set(df, p.ds[s]), hn::ConvertTo(df, q)), hn::Set(df, p.dm[s]));
  }
};

struct DecQ6K {
  static constexpr size_t kQK = 256, kGroup = 128, kBytes = 210;
  using Tag = DFB;
  struct Params { float ds[16]; };  // d * scales[i], per 16 elements
  static HWY_INLINE void Prepare(const uint8_t* b, Params* p) {
    const float d = HalfAt(b + 208);
    const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
    for (int i = 0; i < 16; ++i) p->ds[i] = d * static_cast<float>(scales[i]);
  }
  // Group h (a half of 128), element r: low 4 bits from nibble r / 64 of ql[64 h + r % 64], top 2
  // bits from field r / 32 of qh[32 h + r % 32]; scale ds[8 h + r / 16].
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Get(DF df, const uint8_t* HWY_RESTRICT b, const Params& p, size_t h, size_t r) {
    const hn::RebindToSigned<DF> di;
    auto lo = LoadBytes(df, b + 64 * h + r % 64);
    if (r < 64) {
      lo = hn::And(lo, hn::Set(di, 15));
    } else {
      lo = hn::ShiftRight<4>(lo);
    }
    // Field j = r / 32 (bits 2j, 2j + 1) moved to bits 4, 5.
    auto hi = LoadBytes(df, b + 128 + 32 * h + r % 32);
    const int j = static_cast<int>(r / 32);
    if (j < 2) {
      hi = hn::ShiftLeftSame(hi, 4 - 2 * j);
    } else if (j == 3) {
      hi = hn::ShiftRightSame(hi, 2);
    }
    const auto q = hn::Sub(hn::Or(lo, hn::And(hi, hn::Set(di, 0x30))), hn::Set(di, 32));
    return hn::Mul(hn::Set(df, p.ds[8 * h + r / 16]), hn::ConvertTo(df, q));
  }
};

// ---------------------------------------------------------------------------------------------
// Block weights with f32 activations. Every (activation row, weight row) dot product follows one
// canonical sequence of f32 operations, whatever the tile it is computed in -- decode and prefill,
// any batch size, any first weight row give bit-identical outputs:
//   the columns are cut into slices of kBlockSliceCols from column 0. Per slice, the N-lane
//   weight vectors in the decoder's order (Dec::Get over groups, then elements; a group holds an
//   even number of vectors) alternate between two accumulators, a (even vectors) and c (odd), one
//   fused multiply-add each; the slice's sum is SumOfLanes(a) + SumOfLanes(c). The slices' sums
//   are added in order (t = s0, t = t + s1, ...), and the caller's scale multiplies the total.
// Decode (DotBlocks) computes whole rows with a and c interleaved, two chains per row, ending a
// slice where prefill would; prefill (DotBlocks8) one slice at a time for eight packed rows, the
// even vectors in one pass and the odd ones in a second (sixteen accumulators would not fit in
// AVX2's registers), the slices' sums added in y.
constexpr size_t kBlockSliceCols = 512;

// R activation rows (stride ldx, R <= 4) with one weight row of nb blocks; out[r] = the R sums.
template <class Dec, int R>
HWY_INLINE void DotBlocks(const float* HWY_RESTRICT x, size_t ldx, const uint8_t* HWY_RESTRICT w, size_t nb,
                          float* HWY_RESTRICT out) {
  static_assert(kBlockSliceCols % Dec::kQK == 0, "slices end on block boundaries");
  constexpr size_t kSliceBlocks = kBlockSliceCols / Dec::kQK;
  const typename Dec::Tag df;
  const size_t N = hn::Lanes(df);
  const float* HWY_RESTRICT x0 = x;
  const float* HWY_RESTRICT x1 = x + (R > 1 ? ldx : 0);
  const float* HWY_RESTRICT x2 = x + (R > 2 ? 2 * ldx : 0);
  const float* HWY_RESTRICT x3 = x + (R > 3 ? 3 * ldx : 0);
  float t[4] = {0, 0, 0, 0};
  for (size_t s0 = 0; s0 < nb; s0 += kSliceBlocks) {
    auto a0 = hn::Zero(df), c0 = hn::Zero(df), a1 = hn::Zero(df), c1 = hn::Zero(df);
    auto a2 = hn::Zero(df), c2 = hn::Zero(df), a3 = hn::Zero(df), c3 = hn::Zero(df);
    for (size_t ib = s0; ib < std::min(nb, s0 + kSliceBlocks); ++ib) {
      const uint8_t* HWY_RESTRICT blk = w + ib * Dec::kBytes;
      typename Dec::Params p;
      Dec::Prepare(blk, &p);
      HWY_UNROLL(4)
      for (size_t g = 0; g < Dec::kQK / Dec::kGroup; ++g) {
        const size_t o = ib * Dec::kQK + g * Dec::kGroup;
        HWY_UNROLL(16)
        for (size_t e = 0; e < Dec::kGroup; e += 2 * N) {
          const auto w0 = Dec::Get(df, blk, p, g, e);
          const auto w1 = Dec::Get(df, blk, p, g, e + N);
          a0 = hn::MulAdd(w0, hn::LoadU(df, x0 + o + e), a0);
          c0 = hn::MulAdd(w1, hn::LoadU(df, x0 + o + e + N), c0);
          if constexpr (R > 1) {
            a1 = hn::MulAdd(w0, hn::LoadU(df, x1 + o + e), a1);
            c1 = hn::MulAdd(w1, hn::LoadU(df, x1 + o + e + N), c1);
          }
          if constexpr (R > 2) {
            a2 = hn::MulAdd(w0, hn::LoadU(df, x2 + o + e), a2);
            c2 = hn::MulAdd(w1, hn::LoadU(df, x2 + o + e + N), c2);
          }
          if constexpr (R > 3) {
            a3 = hn::MulAdd(w0, hn::LoadU(df, x3 + o + e), a3);
            c3 = hn::MulAdd(w1, hn::LoadU(df, x3 + o + e + N), c3);
          }
        }
      }
    }
    const bool first = s0 == 0;
    const auto add = [&](int r, decltype(a0) a, decltype(a0) c) {
      const float v = hn::GetLane(hn::SumOfLanes(df, a)) + hn::GetLane(hn::SumOfLanes(df, c));
      t[r] = first ? v : t[r] + v;
    };
    add(0, a0, c0);
    if constexpr (R > 1) add(1, a1, c1);
    if constexpr (R > 2) add(2, a2, c2);
    if constexpr (R > 3) add(3, a3, c3);
  }
  for (int r = 0; r < R; ++r) out[r] = t[r];
}

// One pass of DotBlocks8: the even (kPass 0) or odd (kPass 1) weight vectors of each group, eight
// packed activation rows; sum[r] = SumOfLanes of row r's accumulator. kPass is a template
// argument so that the decoders' branches on the element index fold away.
template <class Dec, size_t kPass>
HWY_INLINE void DotBlocks8Pass(const float* HWY_RESTRICT xp, const uint8_t* HWY_RESTRICT w,
                               const typename Dec::Params* HWY_RESTRICT params, size_t nb, float* HWY_RESTRICT sum) {
  const typename Dec::Tag df;
  const size_t N = hn::Lanes(df);
  auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  auto a4 = hn::Zero(df), a5 = hn::Zero(df), a6 = hn::Zero(df), a7 = hn::Zero(df);
  for (size_t ib = 0; ib < nb; ++ib) {
    const uint8_t* HWY_RESTRICT blk = w + ib * Dec::kBytes;
    const typename Dec::Params& p = params[ib];
    HWY_UNROLL(1)
    for (size_t g = 0; g < Dec::kQK / Dec::kGroup; ++g) {
      const float* HWY_RESTRICT xb = xp + 8 * (ib * Dec::kQK + g * Dec::kGroup);
      HWY_UNROLL(16)
      for (size_t e = kPass * N; e < Dec::kGroup; e += 2 * N) {
        const auto w0 = Dec::Get(df, blk, p, g, e);
        const float* HWY_RESTRICT xe = xb + 8 * e;
        a0 = hn::MulAdd(w0, hn::LoadU(df, xe), a0);
        a1 = hn::MulAdd(w0, hn::LoadU(df, xe + N), a1);
        a2 = hn::MulAdd(w0, hn::LoadU(df, xe + 2 * N), a2);
        a3 = hn::MulAdd(w0, hn::LoadU(df, xe + 3 * N), a3);
        a4 = hn::MulAdd(w0, hn::LoadU(df, xe + 4 * N), a4);
        a5 = hn::MulAdd(w0, hn::LoadU(df, xe + 5 * N), a5);
        a6 = hn::MulAdd(w0, hn::LoadU(df, xe + 6 * N), a6);
        a7 = hn::MulAdd(w0, hn::LoadU(df, xe + 7 * N), a7);
      }
    }
  }
  sum[0] = hn::GetLane(hn::SumOfLanes(df, a0));
  sum[1] = hn::GetLane(hn::SumOfLanes(df, a1));
  sum[2] = hn::GetLane(hn::SumOfLanes(df, a2));
  sum[3] = hn::GetLane(hn::SumOfLanes(df, a3));
  sum[4] = hn::GetLane(hn::SumOfLanes(df, a4));
  sum[5] = hn::GetLane(hn::SumOfLanes(df, a5));
  sum[6] = hn::GetLane(hn::SumOfLanes(df, a6));
  sum[7] = hn::GetLane(hn::SumOfLanes(df, a7));
}

// Eight activation rows (prefill), packed by Pack8, over one slice (nb <= kBlockSliceCols / kQK
// blocks): each decoded weight vector feeds eight independent fused multiply-adds, and one pointer
// walks the activations; the even vectors in one pass, the odd ones in a second, the blocks'
// scales decoded once for both.
template <class Dec>
HWY_INLINE void DotBlocks8(const float* HWY_RESTRICT xp, const uint8_t* HWY_RESTRICT w, size_t nb,
                           float* HWY_RESTRICT out) {
  constexpr size_t kSliceBlocks = kBlockSliceCols / Dec::kQK;
  HWY_DASSERT(nb <= kSliceBlocks);
  typename Dec::Params params[kSliceBlocks];
  for (size_t ib = 0; ib < nb; ++ib) Dec::Prepare(w + ib * Dec::kBytes, &params[ib]);
  float even[8], odd[8];
  DotBlocks8Pass<Dec, 0>(xp, w, params, nb, even);
  DotBlocks8Pass<Dec, 1>(xp, w, params, nb, odd);
  for (int r = 0; r < 8; ++r) out[r] = even[r] + odd[r];
}

// Packs k columns (a multiple of N) of eight rows of x (stride ldx) for DotBlocks8: the N-lane
// vectors of the eight rows for columns [c, c + N) lie together, row after row, at xp + 8 c.
template <class DF>
HWY_INLINE void Pack8(DF df, const float* HWY_RESTRICT x, size_t ldx, size_t k, float* HWY_RESTRICT xp) {
  const size_t N = hn::Lanes(df);
  for (size_t c = 0; c < k; c += N)
    for (size_t r = 0; r < 8; ++r) hn::StoreU(hn::LoadU(df, x + r * ldx + c), df, xp + 8 * c + r * N);
}

#include "backends/cpu/kernels_float-inl.h"

// One weight row of block type Dec against R activation rows (R <= 4, or R == 8 packed by Pack8
// with ldx unused, one slice at most): Dot<R>(x, ldx, k, w, out) for k elements; Offset(k) =
// bytes of k elements.
template <class Dec>
struct BlockRow {
  static constexpr int kSliceCols = static_cast<int>(kBlockSliceCols);
  using Tag = typename Dec::Tag;
  template <int R>
  static HWY_INLINE void Dot(const float* x, size_t ldx, size_t k, const uint8_t* w, float* out) {
    if constexpr (R == 8) {
      DotBlocks8<Dec>(x, w, k / Dec::kQK, out);
    } else {
      DotBlocks<Dec, R>(x, ldx, w, k / Dec::kQK, out);
    }
  }
  static size_t Offset(size_t k) { return k / Dec::kQK * Dec::kBytes; }
};

// y[r, m] (=, or += when !first) dot(x row r, weight row m) over k elements, for weight rows
// [m0, m1) and activation rows [0, R) of x (stride ldx).
template <class Row, int R>
HWY_NOINLINE void Tile(const float* x, size_t ldx, size_t k, const uint8_t* w, size_t row_bytes, int m0, int m1,
                       bool first, float* y, size_t ldy) {
  float s[8];
  for (int m = m0; m < m1; ++m) {
    Row::template Dot<R>(x, ldx, k, w + static_cast<size_t>(m) * row_bytes, s);
    for (int r = 0; r < R; ++r) y[r * ldy + m] = first ? s[r] : y[r * ldy + m] + s[r];
  }
}

template <class Row>
HWY_INLINE void TileRows(int R, const float* x, size_t ldx, size_t k, const uint8_t* w, size_t row_bytes, int m0,
                         int m1, bool first, float* y, size_t ldy) {
  switch (R) {
    case 8: return Tile<Row, 8>(x, ldx, k, w, row_bytes, m0, m1, first, y, ldy);
    case 4: return Tile<Row, 4>(x, ldx, k, w, row_bytes, m0, m1, first, y, ldy);
    case 3: return Tile<Row, 3>(x, ldx, k, w, row_bytes, m0, m1, first, y, ldy);
    case 2: return Tile<Row, 2>(x, ldx, k, w, row_bytes, m0, m1, first, y, ldy);
    default: return Tile<Row, 1>(x, ldx, k, w, row_bytes, m0, m1, first, y, ldy);
  }
}

// Decode (rows <= 4): one pass over the weights, each row's dot product in one go (its slices'
// sums added in registers). Prefill: tiles of eight activation rows (then 4, 3, 2, 1) over slices
// of kSlice columns, against groups of weight rows whose slices (~128 KiB) stay in L2; the slices'
// partial sums are added in y, in the same order. `scale` is applied to the finished sums.
template <class Row>
void MatMulRows(const float* x, int rows, int K, const uint8_t* w, int M, float scale, float* y, int ldy) {
  const size_t row_bytes = Row::Offset(K);
  const size_t ldx = static_cast<size_t>(K);
  if (rows <= 4) {
    TileRows<Row>(rows, x, ldx, K, w, row_bytes, 0, M, true, y, ldy);
  } else {
    constexpr int kSlice = Row::kSliceCols;
    thread_local std::vector<float> packed;
    packed.resize(8 * kSlice);
    const int group = std::max(1, static_cast<int>((128 << 10) / std::max<size_t>(Row::Offset(std::min(K, kSlice)), 1)));
    for (int m0 = 0; m0 < M; m0 += group) {
      const int m1 = std::min(M, m0 + group);
      for (int k0 = 0; k0 < K; k0 += kSlice) {
        const size_t k = static_cast<size_t>(std::min(kSlice, K - k0));
        const uint8_t* wk = w + Row::Offset(k0);
        for (int r0 = 0; r0 < rows;) {
          const int R = rows - r0 >= 8 ? 8 : std::min(4, rows - r0);
          const float* xr = x + r0 * ldx + k0;
          if (R == 8) {
            Pack8(typename Row::Tag(), xr, ldx, k, packed.data());
            xr = packed.data();
          }
          TileRows<Row>(R, xr, ldx, k, wk, row_bytes, m0, m1, k0 == 0, y + static_cast<size_t>(r0) * ldy, ldy);
          r0 += R;
        }
      }
    }
  }
  if (scale != 1.0f) {
    for (int r = 0; r < rows; ++r)
      for (int m = 0; m < M; ++m) y[static_cast<size_t>(r) * ldy + m] *= scale;
  }
}

bool ReordersActivationsHwy(DType wt, int K) { return wt == DType::kBF16 && ReordersActivations<LoadBF16>(K); }

void ReorderActivationsHwy(DType wt, const float* x, int rows, int K, float* xr) {
  G4_CHECK(ReordersActivationsHwy(wt, K));
  PackEvenOdd(x, static_cast<size_t>(std::max(rows, 0)), static_cast<size_t>(K), xr);
}

void MatMulHwy(const float* x, int rows, int K, const uint8_t* w, DType wt, int M, float scale, float* y, int ldy,
               float* scratch, bool x_reordered) {
  if (rows <= 0 || M <= 0) return;
  G4_CHECK(K % DTypeBlockElems(wt) == 0);
  G4_CHECK(!x_reordered || ReordersActivationsHwy(wt, K));
  switch (wt) {
    case DType::kF32: return MatMulFloat<LoadF32>(x, rows, K, w, M, scale, y, ldy, false);
    case DType::kBF16: return MatMulFloat<LoadBF16>(x, rows, K, w, M, scale, y, ldy, x_reordered);
    case DType::kF16: return MatMulFloat<LoadF16>(x, rows, K, w, M, scale, y, ldy, false);
    case DType::kQ8_0: return MatMulRows<BlockRow<DecQ8_0>>(x, rows, K, w, M, scale, y, ldy);
    case DType::kQ4_0: return MatMulRows<BlockRow<DecQ4_0>>(x, rows, K, w, M, scale, y, ldy);
    case DType::kQ4_1: return MatMulRows<BlockRow<DecQ4_1>>(x, rows, K, w, M, scale, y, ldy);
    case DType::kQ5_0: return MatMulRows<BlockRow<DecQ5_0>>(x, rows, K, w, M, scale, y, ldy);
    case DType::kQ5_1: return MatMulRows<BlockRow<DecQ5_1>>(x, rows, K, w, M, scale, y, ldy);
    case DType::kQ4_K: return MatMulRows<BlockRow<DecQ4K>>(x, rows, K, w, M, scale, y, ldy);
    case DType::kQ5_K: return MatMulRows<BlockRow<DecQ5K>>(x, rows, K, w, M, scale, y, ldy);
    case DType::kQ6_K: return MatMulRows<BlockRow<DecQ6K>>(x, rows, K, w, M, scale, y, ldy);
    case DType::kW4G32: return MatMulRows<BlockRow<DecW4G32>>(x, rows, K, w, M, scale, y, ldy);
    default: return MatMulReference(x, rows, K, w, wt, M, scale, y, ldy, scratch);
  }
}

const char* TargetNameHwy() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace g4
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace g4 {
namespace cpu {

HWY_EXPORT(MatMulHwy);
HWY_EXPORT(ReordersActivationsHwy);
HWY_EXPORT(ReorderActivationsHwy);
HWY_EXPORT(TargetNameHwy);

void MatMul(const float* x, int rows, int K, const uint8_t* w, DType wt, int M, float scale, float* y, int ldy,
            float* scratch) {
  HWY_DYNAMIC_DISPATCH(MatMulHwy)(x, rows, K, w, wt, M, scale, y, ldy, scratch, false);
}
bool MatMulReordersActivations(DType wt, int K) { return HWY_DYNAMIC_DISPATCH(ReordersActivationsHwy)(wt, K); }
void ReorderActivations(DType wt, const float* x, int rows, int K, float* xr) {
  HWY_DYNAMIC_DISPATCH(ReorderActivationsHwy)(wt, x, rows, K, xr);
}
void MatMulReordered(const float* xr, int rows, int K, const uint8_t* w, DType wt, int M, float scale, float* y,
                     int ldy) {
  HWY_DYNAMIC_DISPATCH(MatMulHwy)(xr, rows, K, w, wt, M, scale, y, ldy, nullptr, true);
}
const char* SimdTargetName() { return HWY_DYNAMIC_DISPATCH(TargetNameHwy)(); }

}  // namespace cpu
}  // namespace g4
#endif  // HWY_ONCE
