// Plain float weights (F32, F16, BF16) of the f32-activation matmul (kernels_hwy.cc).
// Included by kernels_hwy.cc inside namespace g4::cpu::HWY_NAMESPACE, once per Highway target
// (not a standalone header).
//
// Every (activation row, weight row) dot product follows one canonical sequence of f32 operations,
// whatever the tile it is computed in -- decode and prefill, any batch size, any first weight row
// give bit-identical outputs:
//   one accumulator; per chunk of 2N elements (N = Lanes(DFF)) two fused multiply-adds, its first
//   half then its second half, in the loader's lane order (below); one more N-lane fused
//   multiply-add for a remaining N elements, in natural order; SumOfLanes; then the last < N
//   elements one by one, s += w * x.
// Loaders: Half<0>/Half<1>(df, row, i) = the two N-lane halves of elements i .. i + 2N - 1 as f32;
// Half<2>(df, row, i) = elements i .. i + N - 1 in natural order; At(row, i) = one element. F32
// and F16 use the natural order (Half<1> = elements i + N ..). BF16 (kEvenOdd) loads 2N values as
// N u32 lanes and takes the even elements (bf16 in the low half of a lane: shift left 16) and the
// odd ones (high half: mask), one ALU op per vector instead of a widening shuffle plus a shift;
// the activations are then packed to match (PackEvenOdd), once per call.
struct LoadF32 {
  static constexpr size_t kSize = 4;
  static constexpr bool kEvenOdd = false;
  template <int H, class DF>
  static HWY_INLINE hn::Vec<DF> Half(DF df, const uint8_t* HWY_RESTRICT w, size_t i) {
    return hn::LoadU(df, reinterpret_cast<const float*>(w) + i + (H == 1 ? hn::Lanes(df) : 0));
  }
  static HWY_INLINE float At(const uint8_t* w, size_t i) {
    float f;
    std::memcpy(&f, w + 4 * i, 4);
    return f;
  }
};
struct LoadBF16 {
  static constexpr size_t kSize = 2;
  // Not on HWY_SCALAR, whose u16 vectors have one lane like its u32 ones.
  static constexpr bool kEvenOdd = HWY_TARGET != HWY_SCALAR;
  template <int H, class DF>
  static HWY_INLINE hn::Vec<DF> Half(DF df, const uint8_t* HWY_RESTRICT w, size_t i) {
    const hn::RebindToUnsigned<DF> du;
    const uint16_t* HWY_RESTRICT p = reinterpret_cast<const uint16_t*>(w) + i;
    if constexpr (kEvenOdd && H != 2) {
      const hn::Repartition<uint16_t, decltype(du)> d16;
      const auto v = hn::BitCast(du, hn::LoadU(d16, p));  // lane j: element 2j (low), 2j + 1 (high)
      if constexpr (H == 0) return hn::BitCast(df, hn::ShiftLeft<16>(v));
      return hn::BitCast(df, hn::And(v, hn::Set(du, 0xFFFF0000u)));
    } else {
      const hn::Rebind<uint16_t, DF> d16;
      const auto v = hn::PromoteTo(du, hn::LoadU(d16, p + (H == 1 ? hn::Lanes(df) : 0)));
      return hn::BitCast(df, hn::ShiftLeft<16>(v));
    }
  }
  static HWY_INLINE float At(const uint8_t* w, size_t i) {
    return Bf16ToF32(static_cast<uint16_t>(w[2 * i] | (w[2 * i + 1] << 8)));
  }
};
struct LoadF16 {
  static constexpr size_t kSize = 2;
  static constexpr bool kEvenOdd = false;
  template <int H, class DF>
  static HWY_INLINE hn::Vec<DF> Half(DF df, const uint8_t* HWY_RESTRICT w, size_t i) {
    const hn::Rebind<hwy::float16_t, DF> d16;
    const auto* HWY_RESTRICT p = reinterpret_cast<const hwy::float16_t*>(w) + i + (H == 1 ? hn::Lanes(df) : 0);
    return hn::PromoteTo(df, hn::LoadU(d16, p));
  }
  static HWY_INLINE float At(const uint8_t* w, size_t i) {
    return F16ToF32(static_cast<uint16_t>(w[2 * i] | (w[2 * i + 1] << 8)));
  }
};

// rows x K activations (stride K) in the order of an even/odd loader: per chunk of 2N columns,
// the even columns then the odd ones; the last K % 2N columns as they are.
HWY_INLINE void PackEvenOdd(const float* HWY_RESTRICT x, size_t rows, size_t K, float* HWY_RESTRICT xp) {
  const DFF df;
  [[maybe_unused]] const size_t N = hn::Lanes(df);
  for (size_t r = 0; r < rows; ++r) {
    const float* HWY_RESTRICT xr = x + r * K;
    float* HWY_RESTRICT o = xp + r * K;
    size_t i = 0;
#if HWY_TARGET != HWY_SCALAR
    for (; i + 2 * N <= K; i += 2 * N) {
      const auto lo = hn::LoadU(df, xr + i), hi = hn::LoadU(df, xr + i + N);
      hn::StoreU(hn::ConcatEven(df, hi, lo), df, o + i);
      hn::StoreU(hn::ConcatOdd(df, hi, lo), df, o + i + N);
    }
#endif
    for (; i < K; ++i) o[i] = xr[i];
  }
}

// The accumulators of a tile: a<j><r> for weight row j < 8 and activation row r < 4 (named
// variables, not arrays: SVE vectors are sizeless). Unused ones are dead code.
#define G4_TILE_ROW(X, j) X(j, 0) X(j, 1) X(j, 2) X(j, 3)
#define G4_TILE_ALL(X)                                                                                   \
  G4_TILE_ROW(X, 0) G4_TILE_ROW(X, 1) G4_TILE_ROW(X, 2) G4_TILE_ROW(X, 3) G4_TILE_ROW(X, 4) G4_TILE_ROW(X, 5) \
  G4_TILE_ROW(X, 6) G4_TILE_ROW(X, 7)
#define G4_TILE_ZERO(j, r) [[maybe_unused]] auto a##j##r = hn::Zero(df);
#define G4_TILE_SUM(j, r) \
  if constexpr (W > j && R > r) out[j * R + r] = hn::GetLane(hn::SumOfLanes(df, a##j##r));
// Weight row j's half H (at x offset XO) into the accumulators of row j.
#define G4_TILE_FMA(H, j)                                                        \
  if constexpr (W > j) {                                                         \
    const auto t = Ld::template Half<H>(df, w##j, i);                            \
    a##j##0 = hn::MulAdd(t, x0v, a##j##0);                                       \
    if constexpr (R > 1) a##j##1 = hn::MulAdd(t, x1v, a##j##1);                  \
    if constexpr (R > 2) a##j##2 = hn::MulAdd(t, x2v, a##j##2);                  \
    if constexpr (R > 3) a##j##3 = hn::MulAdd(t, x3v, a##j##3);                  \
  }
#define G4_TILE_STEP(H, XO)                                                                      \
  {                                                                                              \
    const auto x0v = hn::LoadU(df, x0 + i + (XO));                                               \
    [[maybe_unused]] const auto x1v = hn::LoadU(df, x1 + i + (XO));                              \
    [[maybe_unused]] const auto x2v = hn::LoadU(df, x2 + i + (XO));                              \
    [[maybe_unused]] const auto x3v = hn::LoadU(df, x3 + i + (XO));                              \
    G4_TILE_FMA(H, 0) G4_TILE_FMA(H, 1) G4_TILE_FMA(H, 2) G4_TILE_FMA(H, 3) G4_TILE_FMA(H, 4)    \
    G4_TILE_FMA(H, 5) G4_TILE_FMA(H, 6) G4_TILE_FMA(H, 7)                                        \
  }

// How far ahead a decode tile of 16-bit weights prefetches each row, into L2 (docs/PERFORMANCE.md).
constexpr size_t kDecodePrefetchBytes = 16384;

// W weight rows (stride row_bytes) x R activation rows (stride ldx, in the loader's order) over K
// elements, out[j * R + r] = dot(x row r, weight row j), each by the canonical sequence above. Per
// 2N elements: 2W weight vectors built, 2R activation vectors loaded, 2WR fused multiply-adds
// into W * R independent accumulators.
template <class Ld, int W, int R>
HWY_INLINE void FloatTile(const float* HWY_RESTRICT x, size_t ldx, const uint8_t* HWY_RESTRICT w, size_t row_bytes,
                          size_t K, float* HWY_RESTRICT out) {
  static_assert(W >= 1 && W <= 8 && R >= 1 && R <= 4);
  const DFF df;
  const size_t N = hn::Lanes(df);
  const uint8_t* HWY_RESTRICT wr[8];
  for (int j = 0; j < 8; ++j) wr[j] = w + (j < W ? j : 0) * row_bytes;
  [[maybe_unused]] const uint8_t* HWY_RESTRICT w0 = wr[0];
  [[maybe_unused]] const uint8_t* HWY_RESTRICT w1 = wr[1];
  [[maybe_unused]] const uint8_t* HWY_RESTRICT w2 = wr[2];
  [[maybe_unused]] const uint8_t* HWY_RESTRICT w3 = wr[3];
  [[maybe_unused]] const uint8_t* HWY_RESTRICT w4 = wr[4];
  [[maybe_unused]] const uint8_t* HWY_RESTRICT w5 = wr[5];
  [[maybe_unused]] const uint8_t* HWY_RESTRICT w6 = wr[6];
  [[maybe_unused]] const uint8_t* HWY_RESTRICT w7 = wr[7];
  const float* HWY_RESTRICT xr[4];
  for (int r = 0; r < 4; ++r) xr[r] = x + (r < R ? r : 0) * ldx;
  const float* HWY_RESTRICT x0 = xr[0];
  [[maybe_unused]] const float* HWY_RESTRICT x1 = xr[1];
  [[maybe_unused]] const float* HWY_RESTRICT x2 = xr[2];
  [[maybe_unused]] const float* HWY_RESTRICT x3 = xr[3];
  G4_TILE_ALL(G4_TILE_ZERO)
  size_t i = 0;
  for (; i + 2 * N <= K; i += 2 * N) {
    // Decode of 16-bit weights: a cache line per row per 64 bytes read, kDecodePrefetchBytes ahead
    // in the same row (past its end: the rows that follow), into L2 (prefetcht1). Not for F32,
    // whose loads already fill the load ports.
    if constexpr (R == 1 && Ld::kSize == 2) {
      if (((i * Ld::kSize) & 63) == 0) {
        for (int j = 0; j < W; ++j) __builtin_prefetch(wr[j] + i * Ld::kSize + kDecodePrefetchBytes, 0, 2);
      }
    }
    G4_TILE_STEP(0, 0)
    G4_TILE_STEP(1, N)
  }
  if (i + N <= K) {
    G4_TILE_STEP(2, 0)
    i += N;
  }
  G4_TILE_ALL(G4_TILE_SUM)
  for (; i < K; ++i) {
    for (int j = 0; j < W; ++j) {
      const float wi = Ld::At(wr[j], i);
      for (int r = 0; r < R; ++r) out[j * R + r] += wi * xr[r][i];
    }
  }
}
#undef G4_TILE_STEP
#undef G4_TILE_FMA
#undef G4_TILE_SUM
#undef G4_TILE_ZERO
#undef G4_TILE_ALL
#undef G4_TILE_ROW

// y[r, m] = dot(x row r, weight row m) for weight rows [m0, m1) and activation rows [0, R): tiles of
// W weight rows, then of four, then single rows.
template <class Ld, int W, int R>
HWY_NOINLINE void FloatTiles(const float* x, size_t ldx, size_t K, const uint8_t* w, size_t row_bytes, int m0, int m1,
                             float* y, size_t ldy) {
  float s[W * R];
  int m = m0;
  auto put = [&](int w_rows) {
    for (int j = 0; j < w_rows; ++j)
      for (int r = 0; r < R; ++r) y[r * ldy + m + j] = s[j * R + r];
    m += w_rows;
  };
  for (; m + W <= m1;) {
    FloatTile<Ld, W, R>(x, ldx, w + static_cast<size_t>(m) * row_bytes, row_bytes, K, s);
    put(W);
  }
  if constexpr (W > 4) {
    if (m + 4 <= m1) {
      FloatTile<Ld, 4, R>(x, ldx, w + static_cast<size_t>(m) * row_bytes, row_bytes, K, s);
      put(4);
    }
  }
  while (m < m1) {
    FloatTile<Ld, 1, R>(x, ldx, w + static_cast<size_t>(m) * row_bytes, row_bytes, K, s);
    put(1);
  }
}

// Float weights [M, K], any number of activation rows: tiles of 4 weight rows x 3 activation rows
// (12 accumulators; per 2N elements 8 weight vectors built, 6 activation vectors loaded, 24 fused
// multiply-adds), the last 1 or 2 activation rows against 8 or 4 weight rows. Decode (one row) thus
// runs 8 independent accumulator chains over the weights, read once (16-bit weights prefetch the
// next 8 rows).
// Prefill (rows > 3) walks the weights in panels of ~kPanelBytes that stay in L2 while every
// activation tile passes over them (a tile's 3 x K floats stay in L1 for K = 1536; for K = 6144
// they stream from L2, as fast). BF16 activations are first packed in the loader's even/odd
// order (PackEvenOdd, rows x K floats, once per call). No BF16 -> f32 panel is converted: F32
// weights, which need no conversion, run no faster than BF16.
// x_reordered: x is already in the loader's order (ReorderActivationsHwy), shared by the caller's
// threads and by the matmuls of one input: a copy per thread and call would have each thread
// stream its own rows x K floats (25 MB for 512 x 12288, beyond a typical L3) through every
// weight panel.
template <class Ld>
HWY_INLINE bool ReordersActivations(int K) {
  if constexpr (Ld::kEvenOdd) return static_cast<size_t>(K) >= 2 * hn::Lanes(DFF());
  return false;
}

template <class Ld>
void MatMulFloat(const float* x, int rows, int K, const uint8_t* w, int M, float scale, float* y, int ldy,
                 bool x_reordered) {
  constexpr size_t kPanelBytes = 192 << 10;
  const size_t row_bytes = static_cast<size_t>(K) * Ld::kSize;
  const size_t ldx = static_cast<size_t>(K);
  const size_t ly = static_cast<size_t>(ldy);
  if constexpr (Ld::kEvenOdd) {
    if (!x_reordered && ReordersActivations<Ld>(K)) {
      thread_local std::vector<float> packed;
      const size_t need = static_cast<size_t>(rows) * ldx;
      if (packed.size() < need) packed.resize(need);
      PackEvenOdd(x, rows, ldx, packed.data());
      x = packed.data();
    }
  }
  const int panel = rows <= 3 ? M : std::max(8, static_cast<int>(kPanelBytes / row_bytes) / 8 * 8);
  for (int m0 = 0; m0 < M; m0 += panel) {
    const int m1 = std::min(M, m0 + panel);
    for (int r0 = 0; r0 < rows;) {
      const int R = std::min(3, rows - r0);
      const float* xr = x + static_cast<size_t>(r0) * ldx;
      float* yr = y + static_cast<size_t>(r0) * ly;
      switch (R) {
        case 3: FloatTiles<Ld, 4, 3>(xr, ldx, K, w, row_bytes, m0, m1, yr, ly); break;
        case 2: FloatTiles<Ld, 4, 2>(xr, ldx, K, w, row_bytes, m0, m1, yr, ly); break;
        default: FloatTiles<Ld, 8, 1>(xr, ldx, K, w, row_bytes, m0, m1, yr, ly); break;
      }
      r0 += R;
    }
  }
  if (scale != 1.0f) {
    for (int r = 0; r < rows; ++r)
      for (int m = 0; m < M; ++m) y[static_cast<size_t>(r) * ly + m] *= scale;
  }
}
