// The fused attention kernel (attention.h: AttentionPartial), written once with Google Highway and
// compiled for every target in HWY_TARGETS (x86: SSSE3 .. AVX-512 and the scalar fallback; Arm:
// NEON, SVE, SVE2); HWY_DYNAMIC_DISPATCH picks the best one the CPU supports. Portable Highway ops
// only, and no vectors in arrays or structs (SVE vectors are sizeless).
//
// Per tile of up to kTile keys: scores of all G heads (blocks of up to 4 heads times 2 keys, eight
// f32 accumulators, so each K row chunk is loaded once per head block and each q chunk once per key
// pair), times scale, optional soft-cap, then the streaming softmax update (attention.h) and the
// weighted V sum into acc, in register blocks of up to 4 heads x 2 vectors over all the tile's keys.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/cpu/attention.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/cpu/attention_hwy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace g4 {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr size_t kTile = 64;  // keys per softmax tile (a multiple of every target's lane count)

// acc_h (+ acc_h' for the second key) += q_h[d..] * k[d..].
template <int J>
HWY_INLINE void DotStep(DF df, const float* HWY_RESTRICT qh, VF k0, VF k1, VF& a0, VF& a1) {
  const VF qv = hn::LoadU(df, qh);
  a0 = hn::MulAdd(qv, k0, a0);
  if constexpr (J > 1) a1 = hn::MulAdd(qv, k1, a1);
}

// The dot product's lanes summed, plus the scalar tail d0 .. D - 1.
HWY_INLINE float Finish(DF df, VF a, const float* HWY_RESTRICT qh, const float* HWY_RESTRICT kr, size_t d0,
                        size_t D) {
  float s = hn::GetLane(hn::SumOfLanes(df, a));
  for (size_t d = d0; d < D; ++d) s += qh[d] * kr[d];
  return s;
}

// s[h * kTile + j] = q_h . k_j for heads h < H (q rows of D floats) and keys j < J (k0, k1).
template <int H, int J>
HWY_INLINE void DotTile(const float* HWY_RESTRICT q, size_t D, const float* HWY_RESTRICT k0,
                        const float* HWY_RESTRICT k1, float* HWY_RESTRICT s) {
  const DF df;
  const size_t N = hn::Lanes(df);
  VF a00 = hn::Zero(df), a01 = hn::Zero(df), a10 = hn::Zero(df), a11 = hn::Zero(df);
  VF a20 = hn::Zero(df), a21 = hn::Zero(df), a30 = hn::Zero(df), a31 = hn::Zero(df);
  size_t d = 0;
  for (; d + N <= D; d += N) {
    const VF kv0 = hn::LoadU(df, k0 + d);
    const VF kv1 = hn::LoadU(df, (J > 1 ? k1 : k0) + d);
    DotStep<J>(df, q + d, kv0, kv1, a00, a01);
    if constexpr (H > 1) DotStep<J>(df, q + D + d, kv0, kv1, a10, a11);
    if constexpr (H > 2) DotStep<J>(df, q + 2 * D + d, kv0, kv1, a20, a21);
    if constexpr (H > 3) DotStep<J>(df, q + 3 * D + d, kv0, kv1, a30, a31);
  }
  s[0] = Finish(df, a00, q, k0, d, D);
  if constexpr (J > 1) s[1] = Finish(df, a01, q, k1, d, D);
  if constexpr (H > 1) {
    s[kTile] = Finish(df, a10, q + D, k0, d, D);
    if constexpr (J > 1) s[kTile + 1] = Finish(df, a11, q + D, k1, d, D);
  }
  if constexpr (H > 2) {
    s[2 * kTile] = Finish(df, a20, q + 2 * D, k0, d, D);
    if constexpr (J > 1) s[2 * kTile + 1] = Finish(df, a21, q + 2 * D, k1, d, D);
  }
  if constexpr (H > 3) {
    s[3 * kTile] = Finish(df, a30, q + 3 * D, k0, d, D);
    if constexpr (J > 1) s[3 * kTile + 1] = Finish(df, a31, q + 3 * D, k1, d, D);
  }
}

template <int H>
HWY_INLINE void DotHeads(const float* HWY_RESTRICT q, size_t D, const float* HWY_RESTRICT k, int64_t ld, size_t nk,
                         float* HWY_RESTRICT s) {
  size_t j = 0;
  for (; j + 2 <= nk; j += 2) DotTile<H, 2>(q, D, k + j * ld, k + (j + 1) * ld, s + j);
  if (j < nk) DotTile<H, 1>(q, D, k + j * ld, k + j * ld, s + j);
}

// acc_h[d0 .. d0 + VB * N) += p_h,j * v_j[...] for the HB heads h of a block and keys j < n in
// order (one multiply-add per key and element): the block's HB x VB accumulators stay in
// registers across the keys, so per key the kernel loads VB vectors of V and HB weights for HB x VB
// multiply-adds (a loop over heads per key, as before, loaded and stored acc once per 4 keys and
// reloaded V per head: 5 loads per 4 multiply-adds, and the decode kernel was bound by them).
// p: head h's weights at p + h * kTile; a: head h's acc row at a + h * D.
template <int HB, int VB>
HWY_INLINE void AccumulateVBlock(const float* HWY_RESTRICT p, const float* HWY_RESTRICT v, int64_t ld, size_t n,
                                 size_t D, size_t d0, float* HWY_RESTRICT a) {
  const DF df;
  const size_t N = hn::Lanes(df);
  float* HWY_RESTRICT a0 = a + d0;
  float* HWY_RESTRICT a1 = a0 + (HB > 1 ? D : 0);
  float* HWY_RESTRICT a2 = a0 + (HB > 2 ? 2 * D : 0);
  float* HWY_RESTRICT a3 = a0 + (HB > 3 ? 3 * D : 0);
  VF c00 = hn::LoadU(df, a0), c01 = VB > 1 ? hn::LoadU(df, a0 + N) : hn::Zero(df);
  VF c10 = HB > 1 ? hn::LoadU(df, a1) : hn::Zero(df), c11 = HB > 1 && VB > 1 ? hn::LoadU(df, a1 + N) : hn::Zero(df);
  VF c20 = HB > 2 ? hn::LoadU(df, a2) : hn::Zero(df), c21 = HB > 2 && VB > 1 ? hn::LoadU(df, a2 + N) : hn::Zero(df);
  VF c30 = HB > 3 ? hn::LoadU(df, a3) : hn::Zero(df), c31 = HB > 3 && VB > 1 ? hn::LoadU(df, a3 + N) : hn::Zero(df);
  for (size_t j = 0; j < n; ++j) {
    const float* HWY_RESTRICT vr = v + static_cast<int64_t>(j) * ld + d0;
    const VF v0 = hn::LoadU(df, vr);
    const VF v1 = VB > 1 ? hn::LoadU(df, vr + N) : v0;
    VF w = hn::Set(df, p[j]);
    c00 = hn::MulAdd(w, v0, c00);
    if constexpr (VB > 1) c01 = hn::MulAdd(w, v1, c01);
    if constexpr (HB > 1) {
      w = hn::Set(df, p[kTile + j]);
      c10 = hn::MulAdd(w, v0, c10);
      if constexpr (VB > 1) c11 = hn::MulAdd(w, v1, c11);
    }
    if constexpr (HB > 2) {
      w = hn::Set(df, p[2 * kTile + j]);
      c20 = hn::MulAdd(w, v0, c20);
      if constexpr (VB > 1) c21 = hn::MulAdd(w, v1, c21);
    }
    if constexpr (HB > 3) {
      w = hn::Set(df, p[3 * kTile + j]);
      c30 = hn::MulAdd(w, v0, c30);
      if constexpr (VB > 1) c31 = hn::MulAdd(w, v1, c31);
    }
  }
  hn::StoreU(c00, df, a0);
  if constexpr (VB > 1) hn::StoreU(c01, df, a0 + N);
  if constexpr (HB > 1) {
    hn::StoreU(c10, df, a1);
    if constexpr (VB > 1) hn::StoreU(c11, df, a1 + N);
  }
  if constexpr (HB > 2) {
    hn::StoreU(c20, df, a2);
    if constexpr (VB > 1) hn::StoreU(c21, df, a2 + N);
  }
  if constexpr (HB > 3) {
    hn::StoreU(c30, df, a3);
    if constexpr (VB > 1) hn::StoreU(c31, df, a3 + N);
  }
}

template <int HB>
HWY_INLINE void AccumulateVHeads(const float* HWY_RESTRICT p, const float* HWY_RESTRICT v, int64_t ld, size_t n,
                                 size_t D, size_t Dv, float* HWY_RESTRICT a) {
  const size_t N = hn::Lanes(DF());
  size_t d = 0;
  for (; d + 2 * N <= Dv; d += 2 * N) AccumulateVBlock<HB, 2>(p, v, ld, n, D, d, a);
  for (; d + N <= Dv; d += N) AccumulateVBlock<HB, 1>(p, v, ld, n, D, d, a);
}

// acc_g += p_g,j * v_j for g < G and keys j < n in order (p at stride kTile per head, V rows at
// stride ld): whole vectors in register blocks of up to 4 heads, then the scalar tail of D.
HWY_INLINE void AccumulateV(const float* HWY_RESTRICT p, size_t G, size_t D, const float* HWY_RESTRICT v, int64_t ld,
                            size_t n, float* HWY_RESTRICT acc) {
  const size_t N = hn::Lanes(DF());
  const size_t Dv = D / N * N;
  for (size_t g0 = 0; g0 < G; g0 += 4) {
    const float* pg = p + g0 * kTile;
    float* ag = acc + g0 * D;
    switch (std::min<size_t>(4, G - g0)) {
      case 1: AccumulateVHeads<1>(pg, v, ld, n, D, Dv, ag); break;
      case 2: AccumulateVHeads<2>(pg, v, ld, n, D, Dv, ag); break;
      case 3: AccumulateVHeads<3>(pg, v, ld, n, D, Dv, ag); break;
      default: AccumulateVHeads<4>(pg, v, ld, n, D, Dv, ag); break;
    }
  }
  if (Dv == D) return;
  for (size_t g = 0; g < G; ++g) {
    const float* pg = p + g * kTile;
    float* HWY_RESTRICT a = acc + g * D;
    for (size_t j = 0; j < n; ++j) {
      const float* vr = v + static_cast<int64_t>(j) * ld;
      const float w = pg[j];
      for (size_t d = Dv; d < D; ++d) a[d] = std::fma(w, vr[d], a[d]);
    }
  }
}

void AttentionPartialHwy(const float* HWY_RESTRICT q, int G_, int D_, const KvRun* runs, int num_runs, int64_t ld,
                         float scale, float softcap, float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                         float* HWY_RESTRICT acc) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const size_t G = static_cast<size_t>(G_), D = static_cast<size_t>(D_);
  thread_local std::vector<float> tile;  // scores then weights, [G, kTile]
  if (tile.size() < G * kTile) tile.resize(G * kTile);
  float* HWY_RESTRICT s = tile.data();
  std::fill(acc, acc + G * D, 0.0f);
  for (size_t g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
  }
  const VF vscale = hn::Set(df, scale), vcap = hn::Set(df, softcap);
  // Tiles of kTile keys of the runs' concatenation: a tile may span runs, so the tiles (and with
  // them every rounding of the streaming softmax) depend only on the keys' indices, not on where
  // the cache ends and the step's rows begin.
  struct Segment {
    const float* k;
    const float* v;
    size_t n, at;  // keys, first index in the tile
  };
  size_t total = 0;
  for (int r = 0; r < num_runs; ++r) total += static_cast<size_t>(runs[r].n);
  int r = 0;
  size_t in_run = 0;  // keys of runs[r] already consumed
  for (size_t t0 = 0; t0 < total; t0 += kTile) {
    const size_t nk = std::min(kTile, total - t0);
    Segment seg[4];  // a tile spans at most the three runs
    size_t nseg = 0;
    for (size_t filled = 0; filled < nk;) {
      while (in_run == static_cast<size_t>(runs[r].n)) {
        ++r;
        in_run = 0;
      }
      const size_t take = std::min(nk - filled, static_cast<size_t>(runs[r].n) - in_run);
      seg[nseg++] = Segment{runs[r].k + in_run * ld, runs[r].v + in_run * ld, take, filled};
      filled += take;
      in_run += take;
    }
    // Scores, head blocks of up to 4.
    for (size_t g0 = 0; g0 < G; g0 += 4) {
      const float* qg = q + g0 * D;
      for (size_t i = 0; i < nseg; ++i) {
        float* sg = s + g0 * kTile + seg[i].at;
        switch (std::min<size_t>(4, G - g0)) {
          case 1: DotHeads<1>(qg, D, seg[i].k, ld, seg[i].n, sg); break;
          case 2: DotHeads<2>(qg, D, seg[i].k, ld, seg[i].n, sg); break;
          case 3: DotHeads<3>(qg, D, seg[i].k, ld, seg[i].n, sg); break;
          default: DotHeads<4>(qg, D, seg[i].k, ld, seg[i].n, sg); break;
        }
      }
    }
    const size_t nv = (nk + N - 1) / N * N;  // whole vectors (<= kTile)
    for (size_t g = 0; g < G; ++g) {
      float* sg = s + g * kTile;
      // Same f32 operations as the reference: s * scale, then cap * tanh(s / cap).
      for (size_t j = 0; j < nv; j += N) {
        VF x = hn::Mul(hn::LoadU(df, sg + j), vscale);
        if (softcap > 0) x = hn::Mul(vcap, hn::Tanh(df, hn::Div(x, vcap)));
        hn::StoreU(x, df, sg + j);
      }
      float mx = m[g];
      for (size_t j = 0; j < nk; ++j) mx = std::max(mx, sg[j]);
      for (size_t j = nk; j < nv; ++j) sg[j] = -INFINITY;  // padding: weight exp(-inf) = 0
      if (mx > m[g]) {  // rescale the state to the new maximum
        const float alpha = std::exp(m[g] - mx);  // 0 on the first tile (m = -inf)
        l[g] *= alpha;
        const VF va = hn::Set(df, alpha);
        float* a = acc + g * D;
        size_t d = 0;
        for (; d + N <= D; d += N) hn::StoreU(hn::Mul(hn::LoadU(df, a + d), va), df, a + d);
        for (; d < D; ++d) a[d] *= alpha;
        m[g] = mx;
      }
      const VF vm = hn::Set(df, mx);
      for (size_t j = 0; j < nv; j += N) hn::StoreU(hn::Exp(df, hn::Sub(hn::LoadU(df, sg + j), vm)), df, sg + j);
      float sum = 0;
      for (size_t j = 0; j < nk; ++j) sum += sg[j];
      l[g] += sum;
    }
    // Weighted V sum in key order (one multiply-add per key and element).
    for (size_t i = 0; i < nseg; ++i) AccumulateV(s + seg[i].at, G, D, seg[i].v, ld, seg[i].n, acc);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace g4
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace g4 {
namespace cpu {

HWY_EXPORT(AttentionPartialHwy);

void AttentionPartial(const float* q, int G, int D, const KvRun* runs, int num_runs, int64_t ld, float scale,
                      float softcap, float* m, float* l, float* acc) {
  HWY_DYNAMIC_DISPATCH(AttentionPartialHwy)(q, G, D, runs, num_runs, ld, scale, softcap, m, l, acc);
}

}  // namespace cpu
}  // namespace g4
#endif  // HWY_ONCE
