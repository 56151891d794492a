// Weight formats of the int8-activation matmul (kernels_q8_hwy.cc): how each block's units decode.
// Included by kernels_q8_hwy.cc inside namespace g4::cpu::HWY_NAMESPACE, once per Highway target
// (not a standalone header).

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
  // of sub-blocks (j, j + 4) spreads each row's field into its own 32-bit lane (half the
  // operations of decoding each row on its own and transposing the f32 results).
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
  // reductions and conversions per unit, and the 128-bit inserts of the paired decode. (Q4_K/Q5_K
  // have one scale per unit, nothing to share: they keep the paired tile.)
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
