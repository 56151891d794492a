// SIMD int8-activation matmul (kernels_q8.h), one source for every Highway target.
//
// Per weight block, each 32-element unit is turned into 32 small integers u_k (in registers) plus
// per-half f32 scale a_h and offset b_h (see kernels_q8.h), then multiplied with the activation
// block's int8 q_k:
// - x86 AVX2 and AVX-512 targets: byte multiply-add (vpmaddubsw: u8 x i8 -> pairs of i16; no
//   saturation since |u| <= 128 and |q| <= 127 give |pair| <= 32512), then vpmaddwd with ones
//   (-> exact i32), converted to f32 and multiplied-added with a_h * dx (PairTile). Signed
//   Q8_0 weights use |u| and sign(q, u).
// - Other targets (SSE4 and older, NEON, SVE, scalar): u decoded with vector operations into i16
//   (UnitVec; scalar code on HWY_SCALAR), i16 x i16 -> i32 multiply-adds
//   (ReorderWidenMulAccumulate) against activations widened to i16 once per call, f32 lanes
//   accumulated per row and reduced once per weight row (DotTile); on Arm CPUs with the
//   Armv8.2 dot product, SDOT on the unit's bytes and the activation bytes (DotTileSdot).
// Tiles (AVX2/AVX-512): four weight rows at a time (PairTile) by up to six activation rows; two
// rows' units share each 256-bit decode, and the four rows share the scale conversion, one
// vphaddd reduction and one f32 multiply-add per unit. The tile prefetches the next rows, since
// the hardware prefetchers follow four interleaved streams badly. Q6_K, whose unit halves have
// their own int8 scales, has its own four-row tile (FmtQ6K::Tile4). On AVX-512, kQ4_0x4, Q4_K and
// Q6_K have row kernels of their own (kernels_q8_avx512-inl.h).
// Other targets: one activation row or eight by one weight row (DotTile). GEMMA4RT_BENCH_TARGET=SSE4
// runs them on x86 (the 128-bit code NEON shares, with the same vector lengths).
// The offsets b_h * dx * sum(q over the half) use the sums stored in the activation block.
//
// The code is split by kernel family into fragments included below, inside this file's
// per-target namespace: the weight formats (kernels_q8_formats-inl.h), the x86 four-row tiles
// (kernels_q8_pair-inl.h), the AVX-512 row kernels (kernels_q8_avx512-inl.h) and the tiles of the
// other targets (kernels_q8_rows-inl.h). Activation quantisation is kernels_q8_act_hwy.cc.
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
// PairTile prefetches the weight rows this many tiles ahead, into L2 (docs/PERFORMANCE.md).
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

// The R activation rows of a tile: row r's blocks (x[r], `units` blocks of 32) and their offset
// sums (s[r], two per block), from the rows' blocks xq and sums laid out row after row.
template <int R>
HWY_INLINE void TileRows(const ActBlockQ8* xq, const float* sums, size_t units, const ActBlockQ8** x, const float** s) {
  for (int r = 0; r < R; ++r) {
    x[r] = xq + r * units;
    s[r] = sums + r * 2 * units;
  }
}

// The kernels, in the order they build on each other.
#include "backends/cpu/kernels_q8_formats-inl.h"
#include "backends/cpu/kernels_q8_pair-inl.h"
#include "backends/cpu/kernels_q8_avx512-inl.h"
#include "backends/cpu/kernels_q8_rows-inl.h"

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
      const auto tile = [&](auto r) {
        constexpr int kR = decltype(r)::value;
#if G4_Q8_SDOT
        if (UseArmDotprod()) return RowsTileSdot<Fmt, kR>(xr, sr, units, m0, m1, w, row_bytes, scale, ob.data(), yr, ldy);
#endif
        RowsTile<Fmt, kR>(xr, sr, units, m0, m1, w, row_bytes, scale, ob.data(), yr, ldy);
      };
      switch (R) {
        case kPrefillRows: tile(std::integral_constant<int, kPrefillRows>()); break;
        case 4: tile(std::integral_constant<int, 4>()); break;
        case 3: tile(std::integral_constant<int, 3>()); break;
        case 2: tile(std::integral_constant<int, 2>()); break;
        default: tile(std::integral_constant<int, 1>()); break;
      }
      r0 += R;
    }
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
