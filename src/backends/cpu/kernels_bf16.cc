#include "backends/cpu/kernels_bf16.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "backends/cpu/simd_cap.h"
#include "base/check.h"
#include "tensor/dtype.h"

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12's AVX-512 intrinsics leave an "undefined" operand that -Wuninitialized reports.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define G4_BF16_X86 1
// Compiled for AVX-512 with BF16 whatever the build's -march; run only where HasBf16Dot().
#define G4_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#else
#define G4_BF16_X86 0
#endif

namespace g4::cpu {
namespace {

// bf16 -> f32 with denormals taken as (signed) zero, as the instruction reads its inputs.
inline float Bf16ToF32Daz(uint16_t h) { return Bf16ToF32((h & 0x7f80u) == 0 ? (h & 0x8000u) : h); }

inline float Ftz(float v) { return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v; }

#if G4_BF16_X86

// F32ToBf16 (tensor/dtype.h) 16 lanes at a time: the same integer rounding, NaNs made quiet.
G4_BF16_TARGET void ConvertRowsAvx512(const float* x, size_t n, uint16_t* xb) {
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff), quiet = _mm512_set1_epi32(0x40);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512i u = _mm512_castps_si512(v);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(hi, one))), 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_or_si512(hi, quiet));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xb + i), _mm512_cvtepi32_epi16(r));
  }
  for (; i < n; ++i) xb[i] = F32ToBf16(x[i]);
}

G4_BF16_TARGET inline __m512bh LoadBh(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
G4_BF16_TARGET inline __m512bh LoadBhTail(const uint16_t* p, __mmask32 m) {
  return (__m512bh)_mm512_maskz_loadu_epi16(m, p);
}

// W weight rows (stride ldw elements) x R activation rows (stride ldx) over K columns:
// out[j * R + r] = dot(weight row j, activation row r) by the header's sequence, W * R accumulators.
template <int W, int R>
G4_BF16_TARGET inline void Tile(const uint16_t* x, size_t ldx, const uint16_t* w, size_t ldw, size_t K, float* out) {
  __m512 acc[W][R];
#pragma GCC unroll 8
  for (int j = 0; j < W; ++j)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[j][r] = _mm512_setzero_ps();
  size_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512bh xv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) xv[r] = LoadBh(x + r * ldx + k);
#pragma GCC unroll 8
    for (int j = 0; j < W; ++j) {
      const __m512bh wv = LoadBh(w + j * ldw + k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[j][r] = _mm512_dpbf16_ps(acc[j][r], wv, xv[r]);
    }
  }
  if (k < K) {
    const __mmask32 m = static_cast<__mmask32>((uint64_t{1} << (K - k)) - 1);
    __m512bh xv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) xv[r] = LoadBhTail(x + r * ldx + k, m);
#pragma GCC unroll 8
    for (int j = 0; j < W; ++j) {
      const __m512bh wv = LoadBhTail(w + j * ldw + k, m);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[j][r] = _mm512_dpbf16_ps(acc[j][r], wv, xv[r]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < W; ++j)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) out[j * R + r] = _mm512_reduce_add_ps(acc[j][r]);
}

// Weight rows [m0, m1) against activation rows [0, R): tiles of W weight rows, then 4, then 1.
template <int W, int R>
G4_BF16_TARGET __attribute__((noinline)) void Tiles(const uint16_t* x, size_t ldx, size_t K, const uint16_t* w,
                                                    int m0, int m1, float* y, size_t ldy) {
  float s[W * R];
  int m = m0;
  auto put = [&](int rows_w) {
    for (int j = 0; j < rows_w; ++j)
      for (int r = 0; r < R; ++r) y[r * ldy + m + j] = s[j * R + r];
    m += rows_w;
  };
  for (; m + W <= m1;) {
    Tile<W, R>(x, ldx, w + static_cast<size_t>(m) * K, K, K, s);
    put(W);
  }
  if constexpr (W > 4) {
    if (m + 4 <= m1) {
      Tile<4, R>(x, ldx, w + static_cast<size_t>(m) * K, K, K, s);
      put(4);
    }
  }
  while (m < m1) {
    Tile<1, R>(x, ldx, w + static_cast<size_t>(m) * K, K, K, s);
    put(1);
  }
}

// Decode (one activation row): one weight row after another, so that each thread reads its rows as
// one sequential stream, which the hardware prefetcher follows without help (tiles of 8 rows
// would read eight interleaved short streams, slower even with a software prefetch). A row's
// arithmetic is the same either way (one accumulator per row and activation row, in k order).
// Prefill: the weights in panels
// of ~kPanelBytes (which stay in L2) while tiles of 4 weight rows x 6 activation rows (24
// accumulators, 10 loads per 24 dot-product instructions) pass over them.
void MatMulAvx512(const uint16_t* x, int rows, int K, const uint16_t* w, int M, float* y, int ldy) {
  constexpr size_t kPanelBytes = 256 << 10;
  const size_t ldx = static_cast<size_t>(K), ly = static_cast<size_t>(ldy);
  const int panel = rows == 1 ? M : std::max(4, static_cast<int>(kPanelBytes / (2 * ldx)) / 4 * 4);
  for (int m0 = 0; m0 < M; m0 += panel) {
    const int m1 = std::min(M, m0 + panel);
    for (int r0 = 0; r0 < rows;) {
      const int R = std::min(6, rows - r0);
      const uint16_t* xr = x + static_cast<size_t>(r0) * ldx;
      float* yr = y + static_cast<size_t>(r0) * ly;
      switch (R) {
        case 6: Tiles<4, 6>(xr, ldx, K, w, m0, m1, yr, ly); break;
        case 5: Tiles<4, 5>(xr, ldx, K, w, m0, m1, yr, ly); break;
        case 4: Tiles<4, 4>(xr, ldx, K, w, m0, m1, yr, ly); break;
        case 3: Tiles<4, 3>(xr, ldx, K, w, m0, m1, yr, ly); break;
        case 2: Tiles<4, 2>(xr, ldx, K, w, m0, m1, yr, ly); break;
        default: Tiles<1, 1>(xr, ldx, K, w, m0, m1, yr, ly); break;
      }
      r0 += R;
    }
  }
}

#endif  // G4_BF16_X86

}  // namespace

bool HasBf16Dot() {
#if G4_BF16_X86
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16") &&
                          SimdCapAllowsAvx512();
  return has;
#else
  return false;
#endif
}

void ConvertRowsToBf16(const float* x, int rows, int K, uint16_t* xb) {
  const size_t n = static_cast<size_t>(std::max(rows, 0)) * static_cast<size_t>(std::max(K, 0));
#if G4_BF16_X86
  if (HasBf16Dot()) return ConvertRowsAvx512(x, n, xb);
#endif
  for (size_t i = 0; i < n; ++i) xb[i] = F32ToBf16(x[i]);
}

void MatMulBf16Dot(const uint16_t* xb, int rows, int K, const uint8_t* w, int M, float scale, float* y, int ldy) {
  G4_CHECK(HasBf16Dot());
  if (rows <= 0 || M <= 0) return;
  G4_CHECK(K >= 1);
#if G4_BF16_X86
  MatMulAvx512(xb, rows, K, reinterpret_cast<const uint16_t*>(w), M, y, ldy);
#endif
  if (scale != 1.0f) {
    for (int r = 0; r < rows; ++r)
      for (int m = 0; m < M; ++m) y[static_cast<size_t>(r) * ldy + m] *= scale;
  }
}

void MatMulBf16DotReference(const uint16_t* xb, int rows, int K, const uint8_t* w, int M, float scale, float* y,
                            int ldy) {
  const auto* wb = reinterpret_cast<const uint16_t*>(w);
  for (int r = 0; r < rows; ++r) {
    const uint16_t* xr = xb + static_cast<size_t>(r) * K;
    for (int m = 0; m < M; ++m) {
      const uint16_t* wr = wb + static_cast<size_t>(m) * K;
      float lane[16] = {};
      for (int c = 0; c < K; c += 32) {
        for (int i = 0; i < 16; ++i) {
          for (int e : {2 * i + 1, 2 * i}) {
            if (c + e >= K) continue;  // zeros past K add nothing
            lane[i] = Ftz(std::fma(Bf16ToF32Daz(wr[c + e]), Bf16ToF32Daz(xr[c + e]), lane[i]));
          }
        }
      }
      float s = 0;
      for (float v : lane) s += v;
      y[static_cast<size_t>(r) * ldy + m] = s * scale;
    }
  }
}

}  // namespace g4::cpu
