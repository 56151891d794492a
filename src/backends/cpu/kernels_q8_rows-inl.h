// One-weight-row tiles of the int8-activation matmul (kernels_q8_hwy.cc) for the targets below
// AVX2: SSE4 and older, NEON, SVE, scalar.
// Included by kernels_q8_hwy.cc inside namespace g4::cpu::HWY_NAMESPACE, once per Highway target
// (not a standalone header).

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

#if HWY_TARGET != HWY_SCALAR
// Fmt::Unit with vector operations: the same 32 integers, decoded 16 bytes at a time (a
// CappedTag<uint8_t, 16> has 16 lanes on every target but HWY_SCALAR: NEON, SVE of any length,
// SSE4, EMU128) and widened to i16 into u: the scalar Unit would take most of the time of the
// one-row tiles these targets run.
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

// Block ib of a weight row `w`: each of its units' two scales (a[j][0] for the unit's first half,
// a[j][1] for its second, Fmt::Scales) and offset terms (ob, two per unit, indexed by unit in
// the row). Returns the block.
template <class Fmt>
HWY_INLINE const uint8_t* UnitScales(const uint8_t* HWY_RESTRICT w, size_t ib, float* HWY_RESTRICT ob,
                                     float (*a)[2]) {
  const uint8_t* blk = w + ib * Fmt::kBytes;
  typename Fmt::Params p;
  Fmt::Prepare(blk, &p);
  for (int j = 0; j < Fmt::kUnits; ++j) Fmt::Scales(p, j, a[j], ob + 2 * (ib * Fmt::kUnits + j));
  return blk;
}

// One weight row against R activation rows given as i16 (xw[r]: the row's K int8 values widened
// once per RowsTile call, not once per weight row) and their blocks (x[r]: the scales dx): each
// unit's 32 weights are decoded once (u, i16) and multiplied with every row by i16 x i16 -> i32
// multiply-adds (ReorderWidenMulAccumulate: NEON smlal, SSE4 pmaddwd), exact per unit half; the
// i32 lanes are converted to f32 and multiplied-added with dx * a_h into the row's f32 lanes,
// which are summed once at the end (no reduction per unit). Every row gets the same operations
// whatever R is, so results stay batch-invariant. (Keeping the decoded row in memory and looping
// over rows first, which SVE would allow without this accumulator array, is slower.)
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
    float scales[Fmt::kUnits][2];
    const uint8_t* blk = UnitScales<Fmt>(w, ib, ob, scales);
    for (int j = 0; j < Fmt::kUnits; ++j) {
      const size_t unit = ib * Fmt::kUnits + j;
      const float* a = scales[j];
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
  TileRows<R>(xq, sums, units, x, s);
  const int16_t* xw[R];
  for (int r = 0; r < R; ++r) {
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
// from DotTile's (both are within the reference's tolerance; the tests run both where the CPU
// has the dot product, as under qemu -cpu max). Every row gets the same operations whatever R
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
    float scales[Fmt::kUnits][2];
    const uint8_t* blk = UnitScales<Fmt>(w, ib, ob, scales);
    for (int j = 0; j < Fmt::kUnits; ++j) {
      const size_t unit = ib * Fmt::kUnits + j;
      const float* a = scales[j];
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
  TileRows<R>(xq, sums, units, x, s);
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
