// AVX-512 row kernels of the int8-activation matmul (kernels_q8_hwy.cc): kQ4_0x4, Q4_K and Q6_K.
// Included by kernels_q8_hwy.cc inside namespace g4::cpu::HWY_NAMESPACE, once per Highway target
// (not a standalone header).

#if HWY_TARGET == HWY_AVX3
#pragma GCC push_options
#pragma GCC target("avx512vnni")
// kQ4_0x4 weights (dtype.h: per group of four rows the scales, then the nibbles, block by block)
// on AVX-512. Per block of a group: its four rows' nibbles are one 512-bit load, v = [row 0 |
// row 1 | row 2 | row 3] (16 bytes each), lo = v & 15 (elements 0-15), hi = (v >> 4) & 15
// (elements 16-31), and its four scales one 8-byte load, converted and spread to
// d16 = [d_0 x4 | d_1 x4 | d_2 x4 | d_3 x4]. Per activation row r: i32 lane 4i + j = row i's
// products of elements 4j..4j+3 and 16+4j..19+4j, started at neg = -2 * (the block's sum of q),
// so the four lanes of a row add up to sum (u - 8) q exactly: vpdpbusd twice with VNNI, else
// vpmaddubsw twice, vpaddw (|i16| <= 4 * 15 * 127), vpmaddwd with ones and vpaddd (the same
// integers, so the same bits). Converted and multiplied-added with d16 * dx into one f32
// accumulator per activation row; each row's four lanes are added once, at the end of the row.
// Every row gets the same operations whatever R is and wherever its group is (batch-invariant).
// Against PairTile on Q4_0 this saves four 128-bit loads and inserts, four 2-byte scale loads
// and inserts, a vphaddd and a float offset per unit.
// Q4_0x4Rows prefetches this many bytes ahead of the group it reads (a group of four rows is
// 4 * 18 * K / 32 bytes, contiguous, so a matrix or a thread's chunk of it is one stream): a fixed
// distance in bytes rather than in groups, which at large K would leave the start of each
// thread's chunk without software prefetch.
constexpr size_t kQ4_0x4PrefetchBytes = 8192;

template <int R, bool kVnni>
HWY_NOINLINE void Q4_0x4Rows(const ActBlockQ8* xq, const int32_t* neg, size_t nb, int m0, int m1, const uint8_t* w,
                             size_t row_bytes, float scale, float* y, size_t ldy) {
  const __m512i m15 = _mm512_set1_epi8(15);
  const __m512i ones = _mm512_set1_epi16(1);
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  for (int m = m0; m < m1; m += 4) {
    const uint8_t* sc = w + static_cast<size_t>(m) * row_bytes;
    const uint8_t* qs = sc + 8 * nb;
    // kQ4_0x4PrefetchBytes ahead in the matrix's one stream, into L2, as many bytes per block as
    // are read.
    const char* next = reinterpret_cast<const char*>(sc) + kQ4_0x4PrefetchBytes;
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (size_t b = 0; b < nb; ++b) {
      for (size_t q = 72 * b; q < 72 * (b + 1); q += 64) _mm_prefetch(next + q, _MM_HINT_T1);
      const __m512i v = _mm512_loadu_si512(qs + 64 * b);
      const __m512i lo = _mm512_and_si512(v, m15), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m15);
      const __m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 8 * b)));
      const __m512 d16 = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(d4));
      for (int r = 0; r < R; ++r) {
        const ActBlockQ8& xb = xq[r * nb + b];
        const __m512i xl = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.q)));
        const __m512i xh = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.q + 16)));
        const __m512i n = _mm512_set1_epi32(neg[r * nb + b]);
        __m512i p;
        if constexpr (kVnni) {
          p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(n, lo, xl), hi, xh);
        } else {
          p = _mm512_add_epi32(
              _mm512_madd_epi16(_mm512_add_epi16(_mm512_maddubs_epi16(lo, xl), _mm512_maddubs_epi16(hi, xh)), ones), n);
        }
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(d16, _mm512_set1_ps(xb.d)), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      HWY_ALIGN float t[16];
      _mm512_store_ps(t, acc[r]);
      for (int i = 0; i < 4; ++i) {
        y[r * ldy + m + i] = ((t[4 * i] + t[4 * i + 1]) + (t[4 * i + 2] + t[4 * i + 3])) * scale;
      }
    }
  }
}

template <bool kVnni>
void MatMulQ4_0x4Native(const ActBlockQ8* xq, int rows, int K, const uint8_t* w, int M, float scale, float* y,
                        int ldy) {
  const size_t nb = static_cast<size_t>(K) / 32;
  const size_t row_bytes = DTypeRowBytes(DType::kQ4_0x4, K);
  // neg[r * nb + b] = -2 * (sum of block b's 32 q of activation row r): each of a row's four
  // lanes starts at it, so the four add the -8 offset's -8 * sum q.
  thread_local std::vector<int32_t> neg;
  if (neg.size() < static_cast<size_t>(rows) * nb) neg.resize(static_cast<size_t>(rows) * nb);
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  for (size_t i = 0; i < static_cast<size_t>(rows) * nb; ++i) {
    // 1 x q summed in pairs (i16), then in fours (i32), then across the eight lanes: exact.
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[i].q));
    const __m256i s8 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
    const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
    const __m128i s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
    neg[i] = -2 * _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, _MM_SHUFFLE(2, 3, 0, 1))));
  }
  // Weight-row groups as MatMulFmt's (WeightRowGroup, whole groups of four rows) against tiles
  // of eight activation rows (then 4, 3, 2, 1).
  const int group = WeightRowGroup(rows, M, row_bytes, 4);
  for (int m0 = 0; m0 < M; m0 += group) {
    const int m1 = std::min(M, m0 + group);
    for (int r0 = 0; r0 < rows;) {
      const int R = rows - r0 >= 8 ? 8 : std::min(4, rows - r0);
      const ActBlockQ8* xr = xq + static_cast<size_t>(r0) * nb;
      const int32_t* nr = neg.data() + static_cast<size_t>(r0) * nb;
      float* yr = y + static_cast<size_t>(r0) * ldy;
      switch (R) {
        case 8: Q4_0x4Rows<8, kVnni>(xr, nr, nb, m0, m1, w, row_bytes, scale, yr, ldy); break;
        case 4: Q4_0x4Rows<4, kVnni>(xr, nr, nb, m0, m1, w, row_bytes, scale, yr, ldy); break;
        case 3: Q4_0x4Rows<3, kVnni>(xr, nr, nb, m0, m1, w, row_bytes, scale, yr, ldy); break;
        case 2: Q4_0x4Rows<2, kVnni>(xr, nr, nb, m0, m1, w, row_bytes, scale, yr, ldy); break;
        default: Q4_0x4Rows<1, kVnni>(xr, nr, nb, m0, m1, w, row_bytes, scale, yr, ldy); break;
      }
      r0 += R;
    }
  }
}
// K-quant weight rows on AVX-512 (Q4_K and Q6_K with activations quantised per 256, act_group
// 256): one weight row at a time, so each thread reads one sequential stream (the four-row tiles
// read four interleaved ones), prefetched kRowPrefetchBytes ahead into L2. The activations are
// read as ActSuperblockQ8 (kernels_q8.h: two 32-element units per 512-bit register in the order
// of the format's loads, integer sums per 16 elements, dx), prepared once per matmul by the
// caller. Every activation row gets the same operations whatever R is and wherever the weight range starts
// (batch-invariant); VNNI or not, the integers and so the bits are the same.
constexpr size_t kRowPrefetchBytes = 8192;

// The first `bytes` of [begin, end) into L2 at once: a row kernel's range of weight rows (a
// thread's chunk of a matmul, a fused MLP's block of columns) may start where no earlier prefetch
// reached.
HWY_INLINE void PrefetchRangeStart(const uint8_t* begin, const uint8_t* end, size_t bytes) {
  const uint8_t* stop = begin + std::min(bytes, static_cast<size_t>(end - begin));
  for (const uint8_t* p = begin; p < stop; p += 64) _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
}

// The lines of one superblock (kBytes) kRowPrefetchBytes past p into L2, also past the end of
// the range (a prefetch never faults). Past the end lie the thread's next chunk of the same
// matrix (for a chunk claimed from the front of its run; after one taken from the back of
// another's, a chunk already read) or, in a fused MLP, its next block of columns, read after the
// other matrix's block; stopping at the end would leave each 64-row block of a fused MLP to
// start on a burst of demand misses.
template <size_t kBytes>
HWY_INLINE void PrefetchRowsAhead(const uint8_t* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) + kRowPrefetchBytes;  // an integer: may be past the object
  for (size_t o = 0; o < kBytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(a + o), _MM_HINT_T1);
}

// i + t * s in i32 lanes (pairs of i16 products): vpdpwssd, or vpmaddwd + vpaddd (the same sum).
template <bool kVnni>
HWY_INLINE __m512i DotI16(__m512i i, __m512i t, __m512i s) {
  if constexpr (kVnni) {
    return _mm512_dpwssd_epi32(i, t, s);
  } else {
    return _mm512_add_epi32(i, _mm512_madd_epi16(t, s));
  }
}

// The products of u (u8, <= 63) and x (i8, |x| <= 127) summed in fours into i32 lanes (|lane| <=
// 4 * 63 * 127 = 32004): vpdpbusd, or vpmaddubsw (pairs, no saturation) + vpmaddwd with ones.
template <bool kVnni>
HWY_INLINE __m512i Quads(__m512i u, __m512i x) {
  if constexpr (kVnni) {
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x);
  } else {
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, x), _mm512_set1_epi16(1));
  }
}

// The 16 i32 lanes of i added pairwise (lane j + lane j + 8, exact) into 8.
HWY_INLINE __m256i FoldI32(__m512i i) {
  return _mm256_add_epi32(_mm512_castsi512_si256(i), _mm512_extracti64x4_epi64(i, 1));
}

// The 8 lanes of v added in a fixed tree (8 -> 4 -> 2 -> 1).
HWY_INLINE float SumLanes(__m256 v) {
  const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  return _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
}

// The 16 lanes of v added in a fixed tree (16 -> 8, then as above).
HWY_INLINE float SumLanes(__m512 v) {
  return SumLanes(_mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

// vpshufb control for 16-bit scales: in 128-bit lane L, i16 lanes 0-3 take byte lo[L] and lanes
// 4-7 byte hi[L] of the source lane, zero-extended (kHigh = false) or in the high byte (kHigh:
// for a sign-extending shift right by 8 after).
template <bool kHigh>
HWY_INLINE __m512i ScaleControl(const int (&lo)[4], const int (&hi)[4]) {
  int v[16];
  for (int L = 0; L < 4; ++L) {
    for (int h = 0; h < 2; ++h) {
      const int b = h == 0 ? lo[L] : hi[L];
      const int w = kHigh ? (0x80 | (b << 8)) : (b | 0x8000);
      v[4 * L + 2 * h] = v[4 * L + 2 * h + 1] = w | (w << 16);
    }
  }
  return _mm512_setr_epi32(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12], v[13],
                           v[14], v[15]);
}

// Both formats, per activation row and weight superblock: each of the four weight registers u
// (one byte per element, 0..15 or 0..63) times its activation register by Quads (four products
// per i32 lane); two registers' quads packed to i16 (vpackssdw: 128-bit lane L = [4 quads of the
// first | 4 of the second]; |quad| <= 32004, no saturation) and multiplied-added with the i16
// scales of their elements by vpmaddwd (vpdpwssd): i32 lanes that add up to sum_e scale(e) *
// u_e * q_e, exactly. They are folded to 8 lanes (FoldI32, exact; Q4_K then to 4), converted
// once per superblock and multiplied-added with d * dx into the row's 256-bit f32 accumulator,
// whose lanes are added once, at the end of the weight row (SumLanes).

// One activation row against one weight superblock, before the float tail: the i32 lanes of the
// scaled products (16), the lanes of the format's second term (8: Q4_K's negated mins, Q6_K's
// offset), and the multipliers of the folded lanes (d * dx, and Q4_K's dmin * dx).
struct KQuantPart {
  __m512i i;
  __m256i extra;
  __m256 mul;
};

// The scaled products of one decoded weight superblock u (four registers of unsigned values in
// ActSuperblockQ8's order for the format) with one activation superblock a: the i32 quads of
// units [0 | 1] and [2 | 3] packed to i16 and multiplied-added with their scales sa and sb (the
// i16 lanes of the packed quads), 16 i32 lanes whose sum is sum_e scale(e) * u_e * q_e, exactly
// (each format's bounds: at Q4KKernel and Q6KKernel).
template <bool kVnni>
HWY_INLINE __m512i ScaledQuads(const __m512i (&u)[4], __m512i sa, __m512i sb, const ActSuperblockQ8& a) {
  const auto xv = [&](int k) { return _mm512_load_si512(a.q[k]); };
  const __m512i pa = _mm512_packs_epi32(Quads<kVnni>(u[0], xv(0)), Quads<kVnni>(u[1], xv(1)));
  const __m512i pb = _mm512_packs_epi32(Quads<kVnni>(u[2], xv(2)), Quads<kVnni>(u[3], xv(3)));
  return DotI16<kVnni>(_mm512_madd_epi16(pa, sa), pb, sb);
}

// Q4_K: per superblock, the nibbles of two 512-bit loads (ActSuperblockQ8's Q4_K order); the
// 6-bit scales and mins (ScaleMinK4) unpacked once into 16 bytes [sc_0..7 | mn_0..7], the scales
// spread into the i16 lanes of their quads by vpshufb (|lane| <= 2 * 2 * 7620 * 63 < 2^31). The
// mins' -sum_j mn_j * (sum of unit j's q) is a vpmaddwd of the mins (each twice) with the
// negated 16-element sums of Q4_K's order. Both folded to 4 lanes, [sums | -mins] are converted
// together and multiplied-added with [d * dx x 4 | dmin * dx x 4] (one 256-bit conversion and
// multiply-add per activation row and superblock). The negated sums spare the sign change, so
// [d | dmin] is one vpermps of the converted pair.
//
// Q4_K's kernel: Decode unpacks a weight superblock once (for every activation row of a tile),
// Dot takes one activation row to a KQuantPart, Accumulate adds it into the row's accumulator
// (fold, conversion, multiply-add: the tail). Constants built once per kernel object.
template <bool kVnni>
struct Q4KKernel {
  static constexpr size_t kBytes = FmtQ4K::kBytes;
  struct Superblock {
    __m512i u[4];    // nibbles: [units 0 | 2], [1 | 3], [4 | 6], [5 | 7] (ActSuperblockQ8's Q4_K order)
    __m512i sa, sb;  // the scales of the packed quads' i16 lanes
    __m256i mn;      // mn_j zero-extended into i16 lanes 2j and 2j + 1
    __m256 dm;       // [d x 4 | dmin x 4]
  };
  HWY_INLINE Q4KKernel() {}  // user-provided: the members' initialisers compiled for this target
  const __m512i m15 = _mm512_set1_epi8(15);
  // Packed registers: [units 0 | 1] in 128-bit lanes 0-1, [2 | 3] in lanes 2-3 (then 4-7).
  const __m512i ca = ScaleControl<false>({0, 0, 2, 2}, {1, 1, 3, 3});
  const __m512i cb = ScaleControl<false>({4, 4, 6, 6}, {5, 5, 7, 7});
  const __m256i mins = _mm256_setr_epi8(8, -128, 8, -128, 9, -128, 9, -128, 10, -128, 10, -128, 11, -128, 11, -128,
                                        12, -128, 12, -128, 13, -128, 13, -128, 14, -128, 14, -128, 15, -128, 15, -128);
  const __m128i m6 = _mm_set1_epi8(0x3f), m4 = _mm_set1_epi8(0x0f), m2 = _mm_set1_epi8(0x30);
  const __m128i shift = _mm_setr_epi32(0, 4, 0, 0);
  const __m256i spread_dm = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);

  HWY_INLINE Superblock Decode(const uint8_t* b) const {
    Superblock s;
    const __m512i v0 = _mm512_loadu_si512(b + 16), v1 = _mm512_loadu_si512(b + 80);
    s.u[0] = _mm512_and_si512(v0, m15);
    s.u[1] = _mm512_and_si512(_mm512_srli_epi16(v0, 4), m15);
    s.u[2] = _mm512_and_si512(v1, m15);
    s.u[3] = _mm512_and_si512(_mm512_srli_epi16(v1, 4), m15);
    // ScaleMinK4's fields from the 12 bytes at b + 4 (words w0, w1, w2): sc_0..3 = w0 & 63,
    // mn_0..3 = w1 & 63, sc_4..7 = (w2 & 15) | (w0 >> 6) << 4, mn_4..7 = (w2 >> 4) | (w1 >> 6) << 4.
    const __m128i f = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 4));
    const __m128i lo = _mm_and_si128(f, m6);
    const __m128i hi = _mm_or_si128(_mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(f, 0xAA), shift), m4),
                                    _mm_and_si128(_mm_srli_epi32(f, 2), m2));
    const __m128i sm = _mm_unpacklo_epi32(lo, hi);  // bytes sc_0..7, mn_0..7
    const __m512i sm4 = _mm512_broadcast_i32x4(sm);
    s.sa = _mm512_shuffle_epi8(sm4, ca);
    s.sb = _mm512_shuffle_epi8(sm4, cb);
    s.mn = _mm256_shuffle_epi8(_mm512_castsi512_si256(sm4), mins);
    uint32_t dbits;
    std::memcpy(&dbits, b, 4);
    const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dbits)));  // d, dmin (as HalfQ8)
    s.dm = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(dd), spread_dm);
    return s;
  }
  HWY_INLINE KQuantPart Dot(const Superblock& s, const ActSuperblockQ8& a) const {
    return {ScaledQuads<kVnni>(s.u, s.sa, s.sb, a),
            _mm256_madd_epi16(s.mn, _mm256_load_si256(reinterpret_cast<const __m256i*>(a.s))),
            _mm256_mul_ps(s.dm, _mm256_set1_ps(a.dx))};
  }
  // [sums folded to 4 lanes | mins folded to 4 lanes] (exact), converted and multiplied-added.
  static HWY_INLINE __m256 Accumulate(const KQuantPart& p, __m256 acc) {
    const __m256i i8 = FoldI32(p.i);
    const __m256i both = _mm256_add_epi32(_mm256_permute2x128_si256(i8, p.extra, 0x20),
                                          _mm256_permute2x128_si256(i8, p.extra, 0x31));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(both), p.mul, acc);
  }
};

// Q6_K: per half of a superblock (128 elements), ql's 64 bytes are one load whose low nibbles
// are units [0 | 1] and high nibbles [2 | 3] of the half; qh's 32 bytes, broadcast to both
// 256-bit halves, give each its two bits (bits 0-1 | 2-3 for the low nibbles, 4-5 | 6-7 for the
// high) by a per-half shift into bits 4-5: u = ql nibble | qh bits << 4 in 0..63. Register k's
// 128-bit lane L holds the 16 elements of scale group 4k + L, so the packed registers' lanes
// take scales[L] | scales[4 + L] and scales[8 + L] | scales[12 + L] (vpshufb into the high byte,
// sign-extending shift right by 8; |lane| <= 2 * 2 * 32004 * 128 < 2^25). The -32 offset is
// taken once per superblock: 32 * sum_g scales[g] * (sum of q over the 16 elements g), one
// 256-bit vpmaddwd, subtracted from the folded sums (|lane| < 2^26: converted with rounding
// beyond 2^24, the same way every time).
template <bool kVnni>
struct Q6KKernel {
  static constexpr size_t kBytes = FmtQ6K::kBytes;
  struct Superblock {
    __m512i u[4];   // 6-bit values: [units 0 | 1], [2 | 3] of each half (ActSuperblockQ8's Q6_K order)
    __m512i sa, sb; // the scales of the packed quads' i16 lanes (sign-extended)
    __m256i sc16;   // the 16 scales as i16
    __m256 d8;      // d x 8
  };
  HWY_INLINE Q6KKernel() {}  // user-provided: the members' initialisers compiled for this target
  const __m512i m15 = _mm512_set1_epi8(15), m48 = _mm512_set1_epi8(0x30);
  const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
  const __m512i shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
  const __m512i ca = ScaleControl<true>({0, 1, 2, 3}, {4, 5, 6, 7});
  const __m512i cb = ScaleControl<true>({8, 9, 10, 11}, {12, 13, 14, 15});

  HWY_INLINE Superblock Decode(const uint8_t* b) const {
    Superblock s;
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(b + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h)));
      // (ql & 15) | (qh shifted & 0x30): vpternlogd A | (B & C) = 0xF8.
      s.u[2 * h] = _mm512_ternarylogic_epi32(_mm512_and_si512(ql, m15), _mm512_sllv_epi16(qh, shl), m48, 0xF8);
      s.u[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m15),
                                                 _mm512_srlv_epi16(qh, shr), m48, 0xF8);
    }
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
    const __m512i sc4 = _mm512_broadcast_i32x4(sc);
    s.sa = _mm512_srai_epi16(_mm512_shuffle_epi8(sc4, ca), 8);
    s.sb = _mm512_srai_epi16(_mm512_shuffle_epi8(sc4, cb), 8);
    s.sc16 = _mm256_cvtepi8_epi16(sc);
    s.d8 = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(b[208] | (b[209] << 8))));  // as HalfQ8
    return s;
  }
  HWY_INLINE KQuantPart Dot(const Superblock& s, const ActSuperblockQ8& a) const {
    return {ScaledQuads<kVnni>(s.u, s.sa, s.sb, a),
            _mm256_slli_epi32(_mm256_madd_epi16(s.sc16, _mm256_load_si256(reinterpret_cast<const __m256i*>(a.s))), 5),
            _mm256_mul_ps(s.d8, _mm256_set1_ps(a.dx))};
  }
  // The sums folded to 8 lanes less the offset's, converted and multiplied-added.
  static HWY_INLINE __m256 Accumulate(const KQuantPart& p, __m256 acc) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(FoldI32(p.i), p.extra)), p.mul, acc);
  }
};

// Weight rows [m0, m1) of a K-quant Kernel against R >= 2 activation rows (one row goes to
// KQuantRowPipelined): per superblock the weights decoded once, then each row's Dot and
// Accumulate. Shapes: nsb = K / 256 superblocks per row; weight row m at w + m * row_bytes
// (row_bytes = nsb * Kernel::kBytes); activation row r's superblock ib at xa[2 * (r * nsb + ib)]
// (every second ActSuperblockQ8; for Q4_K the caller has already offset xa by one); output
// y[r * ldy + m] = scale * (row r . weight row m) for m in [m0, m1) only. nsb >= 1.
template <int R, class Kernel>
HWY_NOINLINE void KQuantRows(const ActSuperblockQ8* xa, size_t nsb, int m0, int m1, const uint8_t* w,
                             size_t row_bytes, float scale, float* y, size_t ldy) {
  const Kernel k;
  const uint8_t* end = w + static_cast<size_t>(m1) * row_bytes;
  PrefetchRangeStart(w + static_cast<size_t>(m0) * row_bytes, end, kRowPrefetchBytes);
  for (int m = m0; m < m1; ++m) {
    const uint8_t* row = w + static_cast<size_t>(m) * row_bytes;
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (size_t ib = 0; ib < nsb; ++ib) {
      const uint8_t* b = row + ib * Kernel::kBytes;
      PrefetchRowsAhead<Kernel::kBytes>(b);
      const typename Kernel::Superblock s = k.Decode(b);
      for (int r = 0; r < R; ++r) acc[r] = Kernel::Accumulate(k.Dot(s, xa[2 * (static_cast<size_t>(r) * nsb + ib)]), acc[r]);
    }
    for (int r = 0; r < R; ++r) y[r * ldy + m] = SumLanes(acc[r]) * scale;
  }
}

// KQuantRows for one activation row (decode, or a prefill tile's last row), with the same
// operations in another order, so the same bits: each superblock's tail (Accumulate) issued
// after the next superblock's Decode and Dot (software pipelining). Shapes as KQuantRows with
// R = 1: xa[2 * ib] is the row's superblock ib, y[m] its output for m in [m0, m1); nsb >= 1.
// A superblock's tail waits on a dependent chain (the loads, four vpdpbusd, vpackssdw, vpmaddwd,
// vpdpwssd, the fold, the conversion: some 40 cycles by the instruction tables' latencies, an
// estimate); in program order it would hold the scheduler's entries while the next
// superblock's independent work queued behind it, and so it finds its inputs ready. (Two weight
// rows at a time read two interleaved streams, slower from memory: docs/PERFORMANCE.md.)
template <class Kernel>
HWY_NOINLINE void KQuantRowPipelined(const ActSuperblockQ8* xa, size_t nsb, int m0, int m1, const uint8_t* w,
                                     size_t row_bytes, float scale, float* y) {
  const Kernel k;
  const uint8_t* end = w + static_cast<size_t>(m1) * row_bytes;
  PrefetchRangeStart(w + static_cast<size_t>(m0) * row_bytes, end, kRowPrefetchBytes);
  for (int m = m0; m < m1; ++m) {
    const uint8_t* row = w + static_cast<size_t>(m) * row_bytes;
    const auto part = [&](size_t ib) {
      const uint8_t* b = row + ib * Kernel::kBytes;
      PrefetchRowsAhead<Kernel::kBytes>(b);
      return k.Dot(k.Decode(b), xa[2 * ib]);
    };
    __m256 acc = _mm256_setzero_ps();
    KQuantPart prev = part(0);
    for (size_t ib = 1; ib < nsb; ++ib) {
      const KQuantPart cur = part(ib);
      acc = Kernel::Accumulate(prev, acc);
      prev = cur;
    }
    y[m] = SumLanes(Kernel::Accumulate(prev, acc)) * scale;
  }
}

// MatMulQ8 for Q4_K (kQ4K) or Q6_K weights with activations quantised per 256, read as the
// superblocks xs (PrepareActSuperblocks of xq; nullptr: prepared here, into a thread-local
// buffer of 2 rows * K / 256), in WeightRowGroup's groups of weight rows against tiles of eight
// activation rows (then 4, 3, 2; a tile of one row, as in decode, runs KQuantRowPipelined).
// K = 0 gives zeros (an empty sum).
template <bool kQ4K, bool kVnni>
void MatMulKQuantRows(const ActBlockQ8* xq, const ActSuperblockQ8* xs, int rows, int K, const uint8_t* w, int M,
                      float scale, float* y, int ldy) {
  const size_t nsb = static_cast<size_t>(K) / 256;
  const size_t row_bytes = nsb * (kQ4K ? FmtQ4K::kBytes : FmtQ6K::kBytes);
  if (nsb == 0) {  // the kernels read at least one superblock
    for (int r = 0; r < rows; ++r) std::fill_n(y + static_cast<size_t>(r) * ldy, M, 0.0f);
    return;
  }
  if (xs == nullptr) {
    thread_local std::vector<ActSuperblockQ8> own;
    if (own.size() < 2 * static_cast<size_t>(rows) * nsb) own.resize(2 * static_cast<size_t>(rows) * nsb);
    PrepareActSuperblocks(xq, rows, K, own.data());
    xs = own.data();
  }
  if constexpr (kQ4K) ++xs;  // the Q4_K order: every second superblock from xs[1]
  const int group = WeightRowGroup(rows, M, row_bytes, 1);
  for (int m0 = 0; m0 < M; m0 += group) {
    const int m1 = std::min(M, m0 + group);
    for (int r0 = 0; r0 < rows;) {
      const int R = rows - r0 >= 8 ? 8 : std::min(4, rows - r0);
      const ActSuperblockQ8* xr = xs + 2 * static_cast<size_t>(r0) * nsb;
      float* yr = y + static_cast<size_t>(r0) * ldy;
      using Kernel = std::conditional_t<kQ4K, Q4KKernel<kVnni>, Q6KKernel<kVnni>>;
      const auto run = [&](auto r) {
        constexpr int kR = decltype(r)::value;
        if constexpr (kR == 1) {
          KQuantRowPipelined<Kernel>(xr, nsb, m0, m1, w, row_bytes, scale, yr);
        } else {
          KQuantRows<kR, Kernel>(xr, nsb, m0, m1, w, row_bytes, scale, yr, ldy);
        }
      };
      switch (R) {
        case 8: run(std::integral_constant<int, 8>()); break;
        case 4: run(std::integral_constant<int, 4>()); break;
        case 3: run(std::integral_constant<int, 3>()); break;
        case 2: run(std::integral_constant<int, 2>()); break;
        default: run(std::integral_constant<int, 1>()); break;
      }
      r0 += R;
    }
  }
}
#pragma GCC pop_options
#endif  // HWY_TARGET == HWY_AVX3
