// Four-weight-row tiles of the int8-activation matmul on AVX2 and AVX-512 (kernels_q8_hwy.cc).
// Included by kernels_q8_hwy.cc inside namespace g4::cpu::HWY_NAMESPACE, once per Highway target
// (not a standalone header).

#if G4_Q8_AVX2
// AVX-512 VNNI (Ice Lake, Zen 4 and later; cpu::HasInt8Vnni): on the AVX3 target PairTile and
// PairRowsTile are compiled with avx512vnni enabled and instantiated twice, kVnni = true using
// vpdpbusd (u8 x i8 products summed in fours straight into i32 lanes) in place of vpmaddubsw +
// vpmaddwd (+ vphaddw); MatMulFmt picks the instantiation at run time. Each i32 lane then holds the
// same products as in the AVX2 sequence and integer sums are exact: the outputs are the same bits
// (the tests run both). Not Highway's AVX3_DL target: Highway 1.0.3 builds that one for
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
  TileRows<R>(xq, sums, units, x, s);
  const float* us[R];
  for (int r = 0; r < R; ++r) us[r] = usums + r * units;
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
#if G4_Q8_VNNI
#pragma GCC pop_options
#endif
#endif  // G4_Q8_AVX2
