// The fused attention kernel (attention.h: AttentionPartial), written once with Google Highway and
// compiled for every target in HWY_TARGETS (x86: SSSE3 .. AVX-512 and the scalar fallback; Arm:
// NEON, SVE, SVE2); HWY_DYNAMIC_DISPATCH picks the best one the CPU supports. Portable Highway ops
// only (plus GCC's __builtin_prefetch, which x86 and Arm both have: Highway 1.0's Prefetch has no
// locality level), and no vectors in arrays or structs (SVE vectors are sizeless). K and V rows are
// f32, f16, bf16 or i8, one type per run (attention.h); a bf16 cache's tiles run on the bf16
// dot-product kernels of attention_bf16.h where the CPU has them (x86 AVX512_BF16); i8 rows are
// widened to f32 in registers, and their per-row scales applied to the scores and the weights.
//
// Per tile of up to kTile keys: scores of all G heads (head blocks of up to 8 heads on targets with
// 32 vector registers, 4 on the others, times 2-4 keys, so each K row chunk is loaded once per head
// block: once in all for MQA at G <= 8), times scale, optional soft-cap, then the streaming softmax
// update (attention.h) and the weighted V sum into acc, in register blocks of the same heads times
// 1-4 vectors over all the tile's keys; the K rows ahead and the V rows are prefetched as the scores
// go, and the next tile's K rows (into L2) as the V sums go.
// The scores of a register block are summed four at a time (Sum4) and the softmax's maximum and
// sum are vector reductions, not one SumOfLanes per score and scalar loops. Each q vector is
// loaded once per head block and key block (G4_IN_REGISTER), not once per multiply-add.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backends/cpu/attention.h"
#include "backends/cpu/attention_bf16.h"
#include "backends/cpu/kernels_bf16.h"
#include "tensor/dtype.h"

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
static_assert(kTile == static_cast<size_t>(kBf16TileKeys), "attention_bf16.h pairs the keys of the same tiles");

// Register blocks. The scores of a head block are computed for all its heads at once, so each K
// row is loaded once per block, and its weighted V sum likewise reads each V row once per block:
// with a block of all G heads (MQA at G = 8: Gemma 4 E2B) K and V are read once per tile. Targets
// with 32 vector registers (AVX-512, NEON, SVE) hold 16 accumulators per block, the others 8.
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr size_t kAccs = 8;
#else
constexpr size_t kAccs = 16;
#endif
constexpr size_t kMaxBlockHeads = kAccs / 2;  // heads per block (2 keys or 2 vectors each at least)

// Keys (scores) or vectors (V sum) per head of a block of H heads: 4, 2 or 1 with H * that <= kAccs.
constexpr size_t PerHead(size_t H) { return kAccs / H >= 4 ? 4 : kAccs / H >= 2 ? 2 : 1; }

// K and V rows are f32, f16 (a KvCache of DType::kF16; hwy::float16_t here) or bf16 (DType::kBF16;
// hwy::bfloat16_t): one vector of N elements from p as f32 (f16 and bf16 -> f32 are exact; bf16
// by shifting its bits into the top half of a 32-bit lane), and one element as f32.
using DH = hn::Rebind<hwy::float16_t, DF>;
using DU16 = hn::Rebind<uint16_t, DF>;
using DU32 = hn::RebindToUnsigned<DF>;
HWY_INLINE VF LoadRow(DF df, const float* HWY_RESTRICT p) { return hn::LoadU(df, p); }
HWY_INLINE VF LoadRow(DF df, const hwy::float16_t* HWY_RESTRICT p) { return hn::PromoteTo(df, hn::LoadU(DH(), p)); }
HWY_INLINE VF LoadRow(DF df, const hwy::bfloat16_t* HWY_RESTRICT p) {
  const auto bits = hn::LoadU(DU16(), reinterpret_cast<const uint16_t*>(p));
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(DU32(), bits)));
}
// i8 (the int8 cache, DType::kI8): the integers widened to f32 (exact); the kernel applies the
// rows' scales to the scores and the weights (AttentionPartialHwy).
using DI8 = hn::Rebind<int8_t, DF>;
using DI32 = hn::RebindToSigned<DF>;
HWY_INLINE VF LoadRow(DF df, const int8_t* HWY_RESTRICT p) {
  return hn::ConvertTo(df, hn::PromoteTo(DI32(), hn::LoadU(DI8(), p)));
}
HWY_INLINE float ElemF32(const int8_t* p, size_t i) { return static_cast<float>(p[i]); }
HWY_INLINE float ElemF32(const float* p, size_t i) { return p[i]; }
HWY_INLINE float ElemF32(const hwy::float16_t* p, size_t i) {
  uint16_t bits;
  std::memcpy(&bits, p + i, sizeof(bits));
  return F16ToF32(bits);
}
HWY_INLINE float ElemF32(const hwy::bfloat16_t* p, size_t i) {
  uint16_t bits;
  std::memcpy(&bits, p + i, sizeof(bits));
  return Bf16ToF32(bits);
}

// x[i] = x[i] rounded to the nearest bf16 (even on ties), as f32; i < n, n a multiple of N. For the
// bf16 cache's queries and softmax weights, which are finite (a NaN with only low payload bits
// would round to infinity; F32ToBf16 keeps it a NaN).
HWY_INLINE void RoundToBf16Values(float* HWY_RESTRICT x, size_t n) {
  const DF df;
  const DU32 du;
  const size_t N = hn::Lanes(df);
  const auto bias = hn::Set(du, 0x7fffu), one = hn::Set(du, 1u), top = hn::Set(du, 0xffff0000u);
  for (size_t i = 0; i < n; i += N) {
    const auto u = hn::BitCast(du, hn::LoadU(df, x + i));
    const auto r = hn::And(hn::Add(u, hn::Add(bias, hn::And(hn::ShiftRight<16>(u), one))), top);
    hn::StoreU(hn::BitCast(df, r), df, x + i);
  }
}

// The scalar tail of a dot product: sum of qh[d] * kr[d] for d0 <= d < D (0 when D is a whole
// number of vectors, as at D 256 and 512), one fused multiply-add per element: written as
// `s += q * k`, the compiler contracted it into FMAs for f32 rows and not for f16 ones (AVX2), so
// a key read from an f16 cache and the same key as an f32 step row scored differently.
template <class T>
HWY_INLINE float Tail(const float* HWY_RESTRICT qh, const T* HWY_RESTRICT kr, size_t d0, size_t D) {
  float s = 0.0f;
  for (size_t d = d0; d < D; ++d) s = std::fma(qh[d], ElemF32(kr, d), s);
  return s;
}

// out[0..3] = the lanes of v0..v3 summed, four at once: interleaving 32-bit then 64-bit lanes
// leaves lane i holding partial sums of v(i mod 4) (x86's interleaves work per 128-bit block, which
// keeps that; NEON's vectors are one block), then halves are added down to 4 lanes; SVE (scalable)
// and the scalar target take one SumOfLanes per vector. Against
// four SumOfLanes (a shuffle tree each), about a third of the shuffles and adds; the score pass
// does one such reduction per head and key, 16 per register block of 8 heads x 2 keys.
template <class D, class V = hn::Vec<D>>
HWY_INLINE void Sum4(D df, V v0, V v1, V v2, V v3, float* HWY_RESTRICT out) {
#if HWY_TARGET == HWY_SCALAR || HWY_HAVE_SCALABLE
  out[0] = hn::GetLane(hn::SumOfLanes(df, v0));
  out[1] = hn::GetLane(hn::SumOfLanes(df, v1));
  out[2] = hn::GetLane(hn::SumOfLanes(df, v2));
  out[3] = hn::GetLane(hn::SumOfLanes(df, v3));
#else
  const hn::Repartition<uint64_t, D> du64;
  const V x = hn::Add(hn::InterleaveLower(df, v0, v1), hn::InterleaveUpper(df, v0, v1));
  const V y = hn::Add(hn::InterleaveLower(df, v2, v3), hn::InterleaveUpper(df, v2, v3));
  const auto xu = hn::BitCast(du64, x), yu = hn::BitCast(du64, y);
  const V z = hn::Add(hn::BitCast(df, hn::InterleaveLower(du64, xu, yu)), hn::BitCast(df, hn::InterleaveUpper(du64, xu, yu)));
  if constexpr (hn::MaxLanes(D()) == 4) {
    hn::StoreU(z, df, out);
  } else if constexpr (hn::MaxLanes(D()) == 8) {
    const hn::Half<D> d4;
    hn::StoreU(hn::Add(hn::LowerHalf(d4, z), hn::UpperHalf(d4, z)), d4, out);
  } else {
    static_assert(hn::MaxLanes(D()) == 16, "x86 and NEON vectors of f32 hold 4, 8 or 16 lanes");
    const hn::Half<D> d8;
    const hn::Half<decltype(d8)> d4;
    const auto z8 = hn::Add(hn::LowerHalf(d8, z), hn::UpperHalf(d8, z));
    hn::StoreU(hn::Add(hn::LowerHalf(d4, z8), hn::UpperHalf(d4, z8)), d4, out);
  }
#endif
}

// Accumulators a<h><j> of a register block (head h < 8, key or vector j < 4); the compiler drops
// the ones a block does not use.
#define G4_ACC_ROW(h)                                                                                  \
  [[maybe_unused]] VF a##h##0 = hn::Zero(df), a##h##1 = hn::Zero(df), a##h##2 = hn::Zero(df),         \
                      a##h##3 = hn::Zero(df)
#define G4_ACCS G4_ACC_ROW(0); G4_ACC_ROW(1); G4_ACC_ROW(2); G4_ACC_ROW(3); G4_ACC_ROW(4); G4_ACC_ROW(5); \
  G4_ACC_ROW(6); G4_ACC_ROW(7)

// K rows ahead of the ones being scored that the score loop prefetches, into L2 (kPrefetchLocality
// 2: x86 prefetcht1). Decode reads the cache from memory (a full layer's K and V at 4000 keys are
// 8-16 MB, no cache holds them), and a block of 8 heads does 16 multiply-adds per K vector, so the
// hardware prefetcher alone left the loop waiting on K; the V rows of the keys being scored are
// prefetched too, for the weighted sum after the tile's softmax. Into L2 rather than L1: L1's
// few miss buffers would limit the lines in flight per core (distances: docs/PERFORMANCE.md).
constexpr size_t kPrefetchRows = 12;
constexpr int kPrefetchLocality = 2;

// Keeps v in a register (GCC and clang, x86): GCC 12 folds each q load of the score loop into
// every multiply-add that uses it (a memory operand per key: 16 loads of q per 16 multiply-adds
// at 8 heads x 2 keys, besides the K loads and 4 prefetches), and the loop then waits on the load
// ports. With this, q is loaded once per head.
#undef G4_IN_REGISTER  // defined once per Highway target (foreach_target.h)
#if HWY_ARCH_X86 && defined(__GNUC__) && HWY_TARGET <= HWY_AVX2
#define G4_IN_REGISTER(v) asm("" : "+v"(v.raw))
#else
#define G4_IN_REGISTER(v) (void)0
#endif

// s[h * kTile + j] = q_h . k_j for heads h < H (q rows of D floats) and keys j < J (k rows at
// stride ld from k): per D-chunk of N floats, J K loads and H q loads for H x J multiply-adds.
// Prefetches the J rows at kpf (K) and at v (V), row stride ld, as it goes.
template <size_t H, size_t J, class T>
HWY_INLINE void DotTile(const float* HWY_RESTRICT q, size_t D, const T* HWY_RESTRICT k, int64_t ld, const T* kpf,
                        const T* v, float* HWY_RESTRICT s) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const T* HWY_RESTRICT k0 = k;
  const T* HWY_RESTRICT k1 = k + (J > 1 ? ld : 0);
  const T* HWY_RESTRICT k2 = k + (J > 2 ? 2 * ld : 0);
  const T* HWY_RESTRICT k3 = k + (J > 3 ? 3 * ld : 0);
  G4_ACCS;
  size_t d = 0;
  for (; d + N <= D; d += N) {
    const VF kv0 = LoadRow(df, k0 + d);
    const VF kv1 = J > 1 ? LoadRow(df, k1 + d) : kv0;
    const VF kv2 = J > 2 ? LoadRow(df, k2 + d) : kv0;
    const VF kv3 = J > 3 ? LoadRow(df, k3 + d) : kv0;
    for (size_t j = 0; j < J; ++j) {
      __builtin_prefetch(kpf + static_cast<int64_t>(j) * ld + d, 0, kPrefetchLocality);
      __builtin_prefetch(v + static_cast<int64_t>(j) * ld + d, 0, kPrefetchLocality);
    }
#define G4_DOT_HEAD(h)                                        \
  if constexpr (H > h) {                                      \
    VF qv = hn::LoadU(df, q + h * D + d);                     \
    G4_IN_REGISTER(qv);                                       \
    a##h##0 = hn::MulAdd(qv, kv0, a##h##0);                   \
    if constexpr (J > 1) a##h##1 = hn::MulAdd(qv, kv1, a##h##1); \
    if constexpr (J > 2) a##h##2 = hn::MulAdd(qv, kv2, a##h##2); \
    if constexpr (J > 3) a##h##3 = hn::MulAdd(qv, kv3, a##h##3); \
  }
    G4_DOT_HEAD(0) G4_DOT_HEAD(1) G4_DOT_HEAD(2) G4_DOT_HEAD(3)
    G4_DOT_HEAD(4) G4_DOT_HEAD(5) G4_DOT_HEAD(6) G4_DOT_HEAD(7)
#undef G4_DOT_HEAD
  }
  // The H x J sums, four at a time (Sum4): J = 4, a head's keys; J = 2, two heads' keys; J = 1,
  // four heads' key. Then each score's scalar tail (none where N divides D).
  float t[4];
  const VF z = hn::Zero(df);
  [[maybe_unused]] auto put = [&](size_t h, size_t j, float x) { s[h * kTile + j] = x; };
  if constexpr (J == 4) {
#define G4_FIN(h)                                                                                \
  if constexpr (H > h) {                                                                         \
    Sum4(df, a##h##0, a##h##1, a##h##2, a##h##3, t);                                             \
    put(h, 0, t[0]), put(h, 1, t[1]), put(h, 2, t[2]), put(h, 3, t[3]);                        \
  }
    G4_FIN(0) G4_FIN(1) G4_FIN(2) G4_FIN(3) G4_FIN(4) G4_FIN(5) G4_FIN(6) G4_FIN(7)
#undef G4_FIN
  } else if constexpr (J == 2) {
#define G4_FIN(h, i)                                                                             \
  if constexpr (H > h) {                                                                         \
    Sum4(df, a##h##0, a##h##1, H > i ? a##i##0 : z, H > i ? a##i##1 : z, t);                     \
    put(h, 0, t[0]), put(h, 1, t[1]);                                                            \
    if constexpr (H > i) put(i, 0, t[2]), put(i, 1, t[3]);                                       \
  }
    G4_FIN(0, 1) G4_FIN(2, 3) G4_FIN(4, 5) G4_FIN(6, 7)
#undef G4_FIN
  } else {
#define G4_FIN(h, i, k, l)                                                                       \
  if constexpr (H > h) {                                                                         \
    Sum4(df, a##h##0, H > i ? a##i##0 : z, H > k ? a##k##0 : z, H > l ? a##l##0 : z, t);          \
    put(h, 0, t[0]);                                                                             \
    if constexpr (H > i) put(i, 0, t[1]);                                                        \
    if constexpr (H > k) put(k, 0, t[2]);                                                        \
    if constexpr (H > l) put(l, 0, t[3]);                                                        \
  }
    G4_FIN(0, 1, 2, 3) G4_FIN(4, 5, 6, 7)
#undef G4_FIN
  }
  if (d < D) {
    for (size_t h = 0; h < H; ++h) {
      for (size_t j = 0; j < J; ++j) s[h * kTile + j] += Tail(q + h * D, k + static_cast<int64_t>(j) * ld, d, D);
    }
  }
}

// Scores of a head block (H heads at q) over the nk keys of a segment (K and V rows at k, v, stride
// ld) into s (head h's at s + h * kTile). The K prefetch runs kPrefetchRows past the segment's
// last row: in a cache, where the next chunk's rows follow (the split-K driver hands a thread
// consecutive chunks), so a chunk does not start cold. Those addresses are formed as integers and
// only prefetched (a prefetch never faults, on x86 or Arm), never dereferenced.
template <size_t H, class T>
HWY_INLINE void DotHeads(const float* HWY_RESTRICT q, size_t D, const T* HWY_RESTRICT k, const T* v, int64_t ld,
                         size_t nk, float* HWY_RESTRICT s) {
  constexpr size_t J = PerHead(H);
  const int64_t row_bytes = ld * static_cast<int64_t>(sizeof(T));
  auto ahead = [&](size_t j) {
    return reinterpret_cast<const T*>(reinterpret_cast<uintptr_t>(k) +
                                      static_cast<uintptr_t>(static_cast<int64_t>(j + kPrefetchRows) * row_bytes));
  };
  auto row = [ld](const T* base, size_t j) { return base + static_cast<int64_t>(j) * ld; };
  size_t j = 0;
  for (; j + J <= nk; j += J) DotTile<H, J>(q, D, row(k, j), ld, ahead(j), row(v, j), s + j);
  for (; j < nk; ++j) DotTile<H, 1>(q, D, row(k, j), ld, ahead(j), row(v, j), s + j);
}

// acc_h[d0 .. d0 + VB * N) += p_h,j * v_j[...] for the H heads h of a block and keys j < n in
// order (one multiply-add per key and element): the block's H x VB accumulators stay in
// registers across the keys, so per key the kernel loads VB vectors of V and H weights for H x VB
// multiply-adds. p: head h's weights at p + h * kTile; a: head h's acc row at a + h * D.
// The next tile's K rows (this KV head's slice of each), fetched into L2 one 64-byte line per key
// step of the V sums, so that memory streams K while the V sums compute on what the score pass
// fetched, instead of idling until the next score pass (see AttentionPartialHwy). At D 512 in f16
// with 8 heads in a block (Gemma 4's full layers) the steps cover the next 64 rows exactly; with
// fewer steps per line (f32 rows, or 4 heads at D 256: Gemma 3) the first part of them (NextRows,
// attention_bf16.h).

template <size_t H, size_t VB, class T>
HWY_INLINE void AccumulateVBlock(const float* HWY_RESTRICT p, const T* HWY_RESTRICT v, int64_t ld, size_t n,
                                 size_t D, size_t d0, float* HWY_RESTRICT a, NextRows& next_k) {
  const DF df;
  const size_t N = hn::Lanes(df);
  G4_ACCS;
#define G4_V_LOAD(h)                                                        \
  if constexpr (H > h) {                                                    \
    a##h##0 = hn::LoadU(df, a + h * D + d0);                                \
    if constexpr (VB > 1) a##h##1 = hn::LoadU(df, a + h * D + d0 + N);      \
    if constexpr (VB > 2) a##h##2 = hn::LoadU(df, a + h * D + d0 + 2 * N);  \
    if constexpr (VB > 3) a##h##3 = hn::LoadU(df, a + h * D + d0 + 3 * N);  \
  }
  G4_V_LOAD(0) G4_V_LOAD(1) G4_V_LOAD(2) G4_V_LOAD(3) G4_V_LOAD(4) G4_V_LOAD(5) G4_V_LOAD(6) G4_V_LOAD(7)
#undef G4_V_LOAD
  for (size_t j = 0; j < n; ++j) {
    next_k.Step();
    const T* HWY_RESTRICT vr = v + static_cast<int64_t>(j) * ld + d0;
    const VF v0 = LoadRow(df, vr);
    const VF v1 = VB > 1 ? LoadRow(df, vr + N) : v0;
    const VF v2 = VB > 2 ? LoadRow(df, vr + 2 * N) : v0;
    const VF v3 = VB > 3 ? LoadRow(df, vr + 3 * N) : v0;
#define G4_V_HEAD(h)                                                \
  if constexpr (H > h) {                                            \
    const VF w = hn::Set(df, p[h * kTile + j]);                     \
    a##h##0 = hn::MulAdd(w, v0, a##h##0);                           \
    if constexpr (VB > 1) a##h##1 = hn::MulAdd(w, v1, a##h##1);     \
    if constexpr (VB > 2) a##h##2 = hn::MulAdd(w, v2, a##h##2);     \
    if constexpr (VB > 3) a##h##3 = hn::MulAdd(w, v3, a##h##3);     \
  }
    G4_V_HEAD(0) G4_V_HEAD(1) G4_V_HEAD(2) G4_V_HEAD(3) G4_V_HEAD(4) G4_V_HEAD(5) G4_V_HEAD(6) G4_V_HEAD(7)
#undef G4_V_HEAD
  }
#define G4_V_STORE(h)                                                        \
  if constexpr (H > h) {                                                     \
    hn::StoreU(a##h##0, df, a + h * D + d0);                                 \
    if constexpr (VB > 1) hn::StoreU(a##h##1, df, a + h * D + d0 + N);       \
    if constexpr (VB > 2) hn::StoreU(a##h##2, df, a + h * D + d0 + 2 * N);   \
    if constexpr (VB > 3) hn::StoreU(a##h##3, df, a + h * D + d0 + 3 * N);   \
  }
  G4_V_STORE(0) G4_V_STORE(1) G4_V_STORE(2) G4_V_STORE(3) G4_V_STORE(4) G4_V_STORE(5) G4_V_STORE(6) G4_V_STORE(7)
#undef G4_V_STORE
}
#undef G4_ACCS
#undef G4_ACC_ROW

template <size_t H, class T>
HWY_INLINE void AccumulateVHeads(const float* HWY_RESTRICT p, const T* HWY_RESTRICT v, int64_t ld, size_t n,
                                 size_t D, size_t Dv, float* HWY_RESTRICT a, NextRows& next_k) {
  constexpr size_t VB = PerHead(H);
  const size_t N = hn::Lanes(DF());
  size_t d = 0;
  for (; d + VB * N <= Dv; d += VB * N) AccumulateVBlock<H, VB>(p, v, ld, n, D, d, a, next_k);
  for (; d + N <= Dv; d += N) AccumulateVBlock<H, 1>(p, v, ld, n, D, d, a, next_k);
}

// Calls fn(g0, integral_constant<H>) for the head blocks of G heads: blocks of kMaxBlockHeads, the
// last one the rest.
template <class Fn>
HWY_INLINE void ForHeadBlocks(size_t G, const Fn& fn) {
  for (size_t g0 = 0; g0 < G; g0 += kMaxBlockHeads) {
    switch (std::min(kMaxBlockHeads, G - g0)) {
      case 1: fn(g0, std::integral_constant<size_t, 1>()); break;
      case 2: fn(g0, std::integral_constant<size_t, 2>()); break;
      case 3: fn(g0, std::integral_constant<size_t, 3>()); break;
      case 4: fn(g0, std::integral_constant<size_t, 4>()); break;
#if !(HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3)
      case 5: fn(g0, std::integral_constant<size_t, 5>()); break;
      case 6: fn(g0, std::integral_constant<size_t, 6>()); break;
      case 7: fn(g0, std::integral_constant<size_t, 7>()); break;
      case 8: fn(g0, std::integral_constant<size_t, 8>()); break;
#endif
      default: break;
    }
  }
}

// acc_g += p_g,j * v_j for g < G and keys j < n in order (p at stride kTile per head, V rows at
// stride ld): whole vectors in register blocks, then the scalar tail of D.
template <class T>
HWY_INLINE void AccumulateV(const float* HWY_RESTRICT p, size_t G, size_t D, const T* HWY_RESTRICT v, int64_t ld,
                            size_t n, float* HWY_RESTRICT acc, NextRows& next_k) {
  const size_t N = hn::Lanes(DF());
  const size_t Dv = D / N * N;
  ForHeadBlocks(G, [&](size_t g0, auto h) {
    AccumulateVHeads<decltype(h)::value, T>(p + g0 * kTile, v, ld, n, D, Dv, acc + g0 * D, next_k);
  });
  if (Dv == D) return;
  for (size_t g = 0; g < G; ++g) {
    const float* pg = p + g * kTile;
    float* HWY_RESTRICT a = acc + g * D;
    for (size_t j = 0; j < n; ++j) {
      const T* vr = v + static_cast<int64_t>(j) * ld;
      const float w = pg[j];
      for (size_t d = Dv; d < D; ++d) a[d] = std::fma(w, ElemF32(vr, d), a[d]);
    }
  }
}

// x[h * kTile + j] *= sc[j * stride] for heads h < H and keys j < n: an i8 run's scores (K scales) or
// weights (V scales). One f32 multiply per key and head.
HWY_INLINE void ScaleKeys(const float* HWY_RESTRICT sc, int64_t stride, int n, size_t H, float* HWY_RESTRICT x) {
  float row[kTile];
  for (int j = 0; j < n; ++j) row[j] = sc[j * stride];
  for (size_t h = 0; h < H; ++h)
    for (int j = 0; j < n; ++j) x[h * kTile + static_cast<size_t>(j)] *= row[j];
}

// Calls fn(kv.k, kv.v as pointers to the run's element type: float, hwy::float16_t, hwy::bfloat16_t
// or int8_t).
template <class Fn>
HWY_INLINE void WithRowType(const KvRun& kv, const Fn& fn) {
  switch (kv.type) {
    case DType::kF16: return fn(static_cast<const hwy::float16_t*>(kv.k), static_cast<const hwy::float16_t*>(kv.v));
    case DType::kBF16: return fn(static_cast<const hwy::bfloat16_t*>(kv.k), static_cast<const hwy::bfloat16_t*>(kv.v));
    case DType::kI8: return fn(static_cast<const int8_t*>(kv.k), static_cast<const int8_t*>(kv.v));
    default: return fn(static_cast<const float*>(kv.k), static_cast<const float*>(kv.v));
  }
}

// Whether this target may run the bf16 cache's tiles on the bf16 dot-product kernels
// (attention_bf16.h; x86 AVX-512 targets, where HasBf16Attention() says the CPU has them).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr bool kMayDotBf16 = true;
#else
constexpr bool kMayDotBf16 = false;
#endif

void AttentionPartialHwy(const float* HWY_RESTRICT q, int G_, int D_, const KvRun* runs, int num_runs, int64_t ld,
                         float scale, float softcap, float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                         float* HWY_RESTRICT acc) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const size_t G = static_cast<size_t>(G_), D = static_cast<size_t>(D_);
  thread_local std::vector<float> tile;  // scores then weights, [G, kTile]
  if (tile.size() < G * kTile) tile.resize(G * kTile);
  float* HWY_RESTRICT s = tile.data();
  // A bf16 cache (all runs bf16: attention.h) multiplies bf16 queries by K and bf16 weights by V:
  // on the bf16 dot-product kernels where this target and CPU have them and D is a multiple of
  // 32 (dot), else here in f32 on the same bf16 values.
  const bool bf16 = runs[0].type == DType::kBF16;
  const bool dot = kMayDotBf16 && bf16 && D % 32 == 0 && HasBf16Attention();
  thread_local std::vector<float> q_round;      // bf16 (not dot): q rounded to bf16, as f32
  thread_local std::vector<uint16_t> q_bf16;    // dot: q as bf16
  thread_local std::vector<uint32_t> w_pairs;   // dot: a tile's weights as bf16 pairs, [G, kTile / 2]
  thread_local std::vector<const uint16_t*> v_rows;  // dot: a tile's V rows, [kTile]
  if (dot) {
    if (q_bf16.size() < G * D) q_bf16.resize(G * D);
    if (w_pairs.size() < G * kTile / 2) w_pairs.resize(G * kTile / 2);
    if (v_rows.size() < kTile) v_rows.resize(kTile);
    ConvertRowsToBf16(q, G_, D_, q_bf16.data());
  } else if (bf16) {
    const size_t nq = (G * D + N - 1) / N * N;
    if (q_round.size() < nq) q_round.resize(nq);
    std::copy(q, q + G * D, q_round.begin());
    RoundToBf16Values(q_round.data(), nq);
    q = q_round.data();
  }
  std::fill(acc, acc + G * D, 0.0f);
  for (size_t g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
  }
  const VF vscale = hn::Set(df, scale), vcap = hn::Set(df, softcap);
  const int64_t scale_stride = ld / D_;  // i8: scales per row (Nkv)
  // Tiles of kTile keys of the runs' concatenation: a tile may span runs, so the tiles (and with
  // them every rounding of the streaming softmax) depend only on the keys' indices, not on where
  // the cache ends and the step's rows begin.
  struct Segment {
    KvRun rows;  // rows.n keys
    size_t at;   // first index in the tile
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
      seg[nseg++] = Segment{runs[r].Offset(static_cast<int64_t>(in_run) * ld, static_cast<int>(take)), filled};
      filled += take;
      in_run += take;
    }
    // Scores, in head blocks.
    ForHeadBlocks(G, [&](size_t g0, auto h) {
      constexpr size_t H = decltype(h)::value;
      for (size_t i = 0; i < nseg; ++i) {
        const KvRun& kv = seg[i].rows;
        float* sg = s + g0 * kTile + seg[i].at;
        if (dot) {
          Bf16Scores(q_bf16.data() + g0 * D, static_cast<int>(H), D_, static_cast<const uint16_t*>(kv.k),
                     static_cast<const uint16_t*>(kv.v), ld, kv.n, sg);
          continue;
        }
        WithRowType(kv, [&](auto k, auto v) { DotHeads<H>(q + g0 * D, D, k, v, ld, static_cast<size_t>(kv.n), sg); });
        if (kv.type == DType::kI8) ScaleKeys(kv.ks, scale_stride, kv.n, H, sg);  // q . k_int -> q . k
      }
    });
    const size_t nv = (nk + N - 1) / N * N;  // whole vectors (<= kTile)
    for (size_t g = 0; g < G; ++g) {
      float* sg = s + g * kTile;
      // Same f32 operations as the reference: s * scale, then cap * tanh(s / cap).
      for (size_t j = 0; j < nv; j += N) {
        VF x = hn::Mul(hn::LoadU(df, sg + j), vscale);
        if (softcap > 0) x = hn::Mul(vcap, hn::Tanh(df, hn::Div(x, vcap)));
        hn::StoreU(x, df, sg + j);
      }
      for (size_t j = nk; j < nv; ++j) sg[j] = -INFINITY;  // padding: weight exp(-inf) = 0
      VF vmx = hn::Set(df, m[g]);
      for (size_t j = 0; j < nv; j += N) vmx = hn::Max(vmx, hn::LoadU(df, sg + j));
      const float mx = hn::GetLane(hn::MaxOfLanes(df, vmx));
      if (mx > m[g]) {  // rescale the state to the new maximum
        const float alpha = SoftmaxWeight(m[g] - mx);  // 0 on the first tile (m = -inf)
        l[g] *= alpha;
        const VF va = hn::Set(df, alpha);
        float* a = acc + g * D;
        size_t d = 0;
        for (; d + N <= D; d += N) hn::StoreU(hn::Mul(hn::LoadU(df, a + d), va), df, a + d);
        for (; d < D; ++d) a[d] *= alpha;
        m[g] = mx;
      }
      const VF vm = hn::Set(df, mx), vfloor = hn::Set(df, kWeightFloor);
      VF vsum = hn::Zero(df);
      for (size_t j = 0; j < nv; j += N) {
        // SoftmaxWeight: x below the floor (padding's -inf too) clamped before Exp, whose last
        // multiply would otherwise make a subnormal for x in [-104, -87.3], and its weight 0.
        const VF x = hn::Sub(hn::LoadU(df, sg + j), vm);
        const auto low = hn::Lt(x, vfloor);
        const VF e = hn::IfThenZeroElse(low, hn::Exp(df, hn::IfThenElse(low, vfloor, x)));
        hn::StoreU(e, df, sg + j);
        vsum = hn::Add(vsum, hn::IfThenElseZero(hn::FirstN(df, nk - j), e));  // l: the nk keys' weights only
      }
      l[g] += hn::GetLane(hn::SumOfLanes(df, vsum));
      if (bf16 && !dot) RoundToBf16Values(sg, nv);  // V's weights in bf16 (l sums them unrounded)
    }
    // Weighted V sum in key order (one multiply-add per key and element), while the next tile's
    // K rows of the same run (up to kTile) are fetched into L2 (NextRows). The K rows ahead and the V
    // rows that the score pass prefetches come from memory during the scores only; the V sums,
    // about half the multiply-adds, would leave it idle. The call's last tile fetches the kTile
    // rows after its last run (addresses only prefetched, as in DotHeads): in a cache those are
    // the next split-K chunk's, which the same thread usually runs next (ParallelFor's owned
    // runs), so that chunk does not start cold.
    const KvRun& last = seg[nseg - 1].rows;
    const size_t elem = DTypeSize(last.type);
    const size_t stride = static_cast<size_t>(ld) * elem;
    const size_t keys_after = static_cast<size_t>(runs[r].n) - in_run;  // the last segment's run is runs[r]
    NextRows next_k{reinterpret_cast<uintptr_t>(last.k) + static_cast<uintptr_t>(last.n) * stride, 0, D * elem,
                    t0 + kTile >= total ? kTile : std::min(kTile, keys_after), stride};
    if (dot) {  // the tile's keys in pairs by index in the tile, whichever runs they come from
      Bf16PackWeights(s, G_, static_cast<int>(nk), w_pairs.data());
      for (size_t i = 0; i < nseg; ++i) {
        const KvRun& kv = seg[i].rows;
        for (int j = 0; j < kv.n; ++j)
          v_rows[seg[i].at + static_cast<size_t>(j)] = static_cast<const uint16_t*>(kv.v) + static_cast<int64_t>(j) * ld;
      }
      ForHeadBlocks(G, [&](size_t g0, auto h) {
        Bf16AccumulateV(w_pairs.data() + g0 * kTile / 2, static_cast<int>(decltype(h)::value), D_,
                        v_rows.data(), static_cast<int>(nk), acc + g0 * D,
                        &next_k);
      });
      continue;
    }
    for (size_t i = 0; i < nseg; ++i) {
      const KvRun& kv = seg[i].rows;
      // i8: the weights times the V rows' scales, p v = (p * v_scale) v_int (l summed them unscaled).
      if (kv.type == DType::kI8) ScaleKeys(kv.vs, scale_stride, kv.n, G, s + seg[i].at);
      WithRowType(kv, [&](auto, auto v) { AccumulateV(s + seg[i].at, G, D, v, ld, static_cast<size_t>(kv.n), acc, next_k); });
    }
  }
  if (dot) Bf16AccToNatural(acc, G_, D_);
}

// f32 -> f16 with round-to-nearest-even, as F32ToF16: the CPU's conversion (x86 F16C, which
// Highway's AVX2 and AVX-512 targets have; Arm's FCVT) where the target has one, else F32ToF16
// per element (Highway's emulation on SSE2-SSE4 truncates): the same bits as F32ToF16 on every
// target.
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2) || \
    (HWY_ARCH_ARM_A64 && HWY_TARGET != HWY_EMU128 && HWY_TARGET != HWY_SCALAR)
#define G4_NATIVE_F16 1
#else
#define G4_NATIVE_F16 0
#endif

void ToF16Hwy(const float* HWY_RESTRICT x, int64_t n, uint16_t* HWY_RESTRICT out) {
  int64_t i = 0;
#if G4_NATIVE_F16
  const DF df;
  const DH dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (; i + N <= n; i += N) hn::StoreU(hn::DemoteTo(dh, hn::LoadU(df, x + i)), dh, reinterpret_cast<hwy::float16_t*>(out + i));
#endif
  for (; i < n; ++i) out[i] = F32ToF16(x[i]);
}

void RoundToF16Hwy(float* HWY_RESTRICT x, int64_t n) {
  int64_t i = 0;
#if G4_NATIVE_F16
  const DF df;
  const DH dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (; i + N <= n; i += N) hn::StoreU(hn::PromoteTo(df, hn::DemoteTo(dh, hn::LoadU(df, x + i))), df, x + i);
#endif
  for (; i < n; ++i) x[i] = F16ToF32(F32ToF16(x[i]));
}
#undef G4_NATIVE_F16

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace g4
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace g4 {
namespace cpu {

HWY_EXPORT(AttentionPartialHwy);
HWY_EXPORT(ToF16Hwy);
HWY_EXPORT(RoundToF16Hwy);

void ToF16(const float* x, int64_t n, uint16_t* out) { HWY_DYNAMIC_DISPATCH(ToF16Hwy)(x, n, out); }
void RoundToF16(float* x, int64_t n) { HWY_DYNAMIC_DISPATCH(RoundToF16Hwy)(x, n); }

void AttentionPartial(const float* q, int G, int D, const KvRun* runs, int num_runs, int64_t ld, float scale,
                      float softcap, float* m, float* l, float* acc) {
  HWY_DYNAMIC_DISPATCH(AttentionPartialHwy)(q, G, D, runs, num_runs, ld, scale, softcap, m, l, acc);
}

}  // namespace cpu
}  // namespace g4
#endif  // HWY_ONCE
