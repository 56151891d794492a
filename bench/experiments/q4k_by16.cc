// Experiment (not built by CMake; x86-64 with AVX-512 VNNI only): Q4_K weights packed 16 rows at a
// time so that each i32 lane of a 512-bit register is one weight row ("lanes = rows"), against the
// engine's Q4_K row kernel (cpu::MatMulQ8 on Q4_K as stored, activations per 256) in the same
// process. The layout is not used by the engine: where its row kernel already outruns memory,
// it gains nothing.
//
// Packed layout, per group of 16 rows and superblock (2304 bytes = 16 x 144, the same size):
//   [0, 32) the 16 rows' d (f16), [32, 64) their dmin, [64, 192) per sub-block j and row r the
//   byte 64 (j / 4) + 16 (j % 4) + r = scale | (min & 3) << 6, [192, 256) the byte 16 (j % 4) + r
//   holding min >> 2 (low nibble for j < 4, high for j >= 4), then for nibble-pair p (elements
//   64 p .. 64 p + 63) and t < 8 the 64 bytes [row 0's qs[32 p + 4 t .. + 3] | row 1's | ...].
// Kernel: per (p, t) one 512-bit load; low nibbles (sub-block 2 p) and high (2 p + 1) times the
// activation's four bytes broadcast to all lanes (vpdpbusd, two accumulators per sub-block so a
// lane's sum stays within i16), scaled per lane by vpdpwssd with the rows' scales; mins by
// vpdpwssd with the activation's 32-element sums; one f32 multiply-add per superblock with the
// rows' d * dx and dmin * dx; 16 results stored at once, no horizontal sums.
//
// Build and run from the repository root after scripts/build.sh (one command line):
//   g++ -O2 -march=native -std=c++20 -Isrc bench/experiments/q4k_by16.cc build/libgemma4rt_core.a -lhwy
//     -lpthread -o /tmp/q4k_by16 && /tmp/q4k_by16 [M 512] [K 1536] [reps 2000] [threads 1] [rows 1]
// rows: activation rows (1, or a multiple of 4: the new kernel then takes tiles of four rows, each
// over the whole matrix; the engine's kernel its own tiles and weight-row groups).
// Prints both kernels' largest error against cpu::MatMulQ8Reference, then five rounds of the two
// kernels one after the other (each `reps` calls over the whole matrix, the rows split between
// `threads` threads): microseconds per call, GB/s of weights, and old / new time.
#include <immintrin.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "backends/cpu/kernels_q8.h"
#include "tensor/block_fields.h"
#include "tensor/dtype.h"
using namespace g4;
uint16_t F2H(float f) { return _cvtss_sh(f, 0); }

// Pack one group of 16 Q4_K rows (each nsb superblocks of 144 B) into out (16*144*nsb bytes).
void PackGroup(const uint8_t* rows, size_t row_bytes, size_t nsb, uint8_t* out) {
  for (size_t ib = 0; ib < nsb; ++ib) {
    uint8_t* o = out + ib * 2304;
    for (int r = 0; r < 16; ++r) {
      const uint8_t* b = rows + r * row_bytes + ib * 144;
      std::memcpy(o + 2 * r, b, 2);
      std::memcpy(o + 32 + 2 * r, b + 2, 2);
      for (int j = 0; j < 8; ++j) {
        int sc, mn;
        ScaleMinK4(b + 4, j, &sc, &mn);
        const int k = 16 * (j % 4) + r;  // position in A0 / A1 and B
        o[64 + 64 * (j / 4) + k] = static_cast<uint8_t>(sc | (mn & 3) << 6);
        uint8_t& bb = o[192 + k];
        if (j < 4)
          bb = (bb & 0xF0) | (mn >> 2);
        else
          bb = (bb & 0x0F) | (mn >> 2) << 4;
      }
      for (int p = 0; p < 4; ++p)
        for (int t = 0; t < 8; ++t) std::memcpy(o + 256 + (8 * p + t) * 64 + 4 * r, b + 16 + 32 * p + 4 * t, 4);
    }
  }
}

template <int R>
__attribute__((noinline)) void Kx16(const cpu::ActSuperblockQ8* xa, const int32_t* S /*[R][nsb][8]*/, size_t nsb,
                                    int g0, int g1, const uint8_t* w, float scale, float* y, size_t ldy) {
  const __m512i m15 = _mm512_set1_epi8(15), m63 = _mm512_set1_epi8(63), m3 = _mm512_set1_epi8(3),
                m3c = _mm512_set1_epi8(0x3c);
  const size_t gbytes = nsb * 2304;
  for (int g = g0; g < g1; ++g) {
    const uint8_t* grp = w + g * gbytes;
    __m512 f[R];
    for (int r = 0; r < R; ++r) f[r] = _mm512_setzero_ps();
    for (size_t ib = 0; ib < nsb; ++ib) {
      const uint8_t* b = grp + ib * 2304;
      for (int o = 0; o < 2304; o += 64) _mm_prefetch((const char*)(b + 8192 + o), _MM_HINT_T1);
      const __m512i A0 = _mm512_loadu_si512(b + 64), A1 = _mm512_loadu_si512(b + 128), B = _mm512_loadu_si512(b + 192);
      const __m512i SC0 = _mm512_and_si512(A0, m63), SC1 = _mm512_and_si512(A1, m63);
      const __m512i MN0 =
          _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_slli_epi16(B, 2), m3c), _mm512_srli_epi16(A0, 6), m3, 0xF8);
      const __m512i MN1 =
          _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(B, 2), m3c), _mm512_srli_epi16(A1, 6), m3, 0xF8);
      __m512i isc[R], imn[R];
      for (int r = 0; r < R; ++r) {
        isc[r] = _mm512_setzero_si512();
        imn[r] = _mm512_setzero_si512();
      }
      const auto lane = [](__m512i v, int L) {
        switch (L) {
          case 0:
            return _mm512_castsi512_si128(v);
          case 1:
            return _mm512_extracti32x4_epi32(v, 1);
          case 2:
            return _mm512_extracti32x4_epi32(v, 2);
          default:
            return _mm512_extracti32x4_epi32(v, 3);
        }
      };
      for (int j = 0; j < 8; ++j) {
        const __m512i mj = _mm512_cvtepu8_epi32(lane(j < 4 ? MN0 : MN1, j % 4));
        for (int r = 0; r < R; ++r)
          imn[r] = _mm512_dpwssd_epi32(imn[r], mj, _mm512_set1_epi32(S[(r * nsb + ib) * 8 + j]));
      }
      for (int p = 0; p < 4; ++p) {
        const __m512i s0 = _mm512_cvtepu8_epi32(lane(p < 2 ? SC0 : SC1, (2 * p) % 4));
        const __m512i s1 = _mm512_cvtepu8_epi32(lane(p < 2 ? SC0 : SC1, (2 * p + 1) % 4));
        for (int h = 0; h < 2; ++h) {
          __m512i al[R], ah[R];
          for (int r = 0; r < R; ++r) {
            al[r] = _mm512_setzero_si512();
            ah[r] = _mm512_setzero_si512();
          }
          for (int t = 4 * h; t < 4 * h + 4; ++t) {
            const __m512i v = _mm512_loadu_si512(b + 256 + (8 * p + t) * 64);
            const __m512i lo = _mm512_and_si512(v, m15), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m15);
            for (int r = 0; r < R; ++r) {
              const int8_t* q = &xa[2 * (r * nsb + ib)].q[0][0];
              int32_t xl, xh;
              std::memcpy(&xl, q + 64 * p + 4 * t, 4);
              std::memcpy(&xh, q + 64 * p + 32 + 4 * t, 4);
              al[r] = _mm512_dpbusd_epi32(al[r], lo, _mm512_set1_epi32(xl));
              ah[r] = _mm512_dpbusd_epi32(ah[r], hi, _mm512_set1_epi32(xh));
            }
          }
          for (int r = 0; r < R; ++r) {
            isc[r] = _mm512_dpwssd_epi32(isc[r], al[r], s0);
            isc[r] = _mm512_dpwssd_epi32(isc[r], ah[r], s1);
          }
        }
      }
      const __m512 dd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)b));
      const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(b + 32)));
      for (int r = 0; r < R; ++r) {
        const __m512 dx = _mm512_set1_ps(xa[2 * (r * nsb + ib)].dx);
        f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isc[r]), _mm512_mul_ps(dd, dx), f[r]);
        f[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(imn[r]), _mm512_mul_ps(dm, dx), f[r]);
      }
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + r * ldy + 16 * g, _mm512_mul_ps(f[r], _mm512_set1_ps(scale)));
  }
}

int main(int argc, char** argv) {
  int M = argc > 1 ? atoi(argv[1]) : 512, K = argc > 2 ? atoi(argv[2]) : 1536, reps = argc > 3 ? atoi(argv[3]) : 2000;
  int threads = argc > 4 ? atoi(argv[4]) : 1;
  const int rows = argc > 5 ? atoi(argv[5]) : 1;  // activation rows: 1, or a multiple of 4 (tiles of 4)
  const size_t nsb = K / 256, row_bytes = nsb * 144;
  std::mt19937 rng(1);
  std::vector<uint8_t> w(row_bytes * M);
  for (auto& b : w) b = rng();
  std::uniform_real_distribution<float> u(-0.03f, 0.03f);
  for (size_t i = 0; i < w.size() / 144; ++i) {
    uint16_t h = F2H(u(rng));
    memcpy(&w[i * 144], &h, 2);
    h = F2H(u(rng));
    memcpy(&w[i * 144 + 2], &h, 2);
  }
  std::vector<uint8_t> pk(w.size());
  for (int g = 0; g < M / 16; ++g)
    PackGroup(w.data() + g * 16 * row_bytes, row_bytes, nsb, pk.data() + g * 16 * row_bytes);
  std::normal_distribution<float> nd;
  std::vector<float> x(rows * K);
  for (auto& v : x) v = nd(rng);
  std::vector<cpu::ActBlockQ8> xq(rows * K / 32);
  std::vector<float> sums(rows * K / 16);
  cpu::QuantizeRowsQ8(x.data(), rows, K, xq.data(), sums.data(), 256);
  std::vector<cpu::ActSuperblockQ8> xs(2 * rows * nsb);
  cpu::PrepareActSuperblocks(xq.data(), rows, K, xs.data());
  std::vector<int32_t> S(rows * nsb * 8);
  for (size_t i = 0; i < rows * nsb; ++i)
    for (int j = 0; j < 8; ++j) S[i * 8 + j] = xs[2 * i].s[2 * j] + xs[2 * i].s[2 * j + 1];
  std::vector<float> y0(static_cast<size_t>(M) * rows), y1(y0.size()), yr(y0.size());
  // The new kernel on activation rows [0, rows) and row groups [g0, g1): tiles of four rows.
  const auto kx16 = [&](int g0, int g1) {
    if (rows == 1) return Kx16<1>(xs.data(), S.data(), nsb, g0, g1, pk.data(), 1.0f, y1.data(), M);
    for (int r0 = 0; r0 < rows; r0 += 4)
      Kx16<4>(xs.data() + 2 * r0 * nsb, S.data() + r0 * nsb * 8, nsb, g0, g1, pk.data(), 1.0f, y1.data() + r0 * M, M);
  };
  cpu::MatMulQ8Reference(xq.data(), rows, K, w.data(), DType::kQ4_K, M, 1.0f, yr.data(), M);
  cpu::MatMulQ8(xq.data(), sums.data(), rows, K, w.data(), DType::kQ4_K, M, 1.0f, y0.data(), M, 256, xs.data());
  kx16(0, M / 16);
  double e0 = 0, e1 = 0, n = 0;
  for (size_t m = 0; m < y0.size(); ++m) {
    e0 = std::max(e0, (double)std::fabs(y0[m] - yr[m]));
    e1 = std::max(e1, (double)std::fabs(y1[m] - yr[m]));
    n = std::max(n, (double)std::fabs(yr[m]));
  }
  printf("max err old %.3g new %.3g (max |y| %.3g)\n", e0, e1, n);
  auto run = [&](bool neu) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> th;
    for (int t = 0; t < threads; ++t)
      th.emplace_back([&, t] {
        int g0 = (M / 16) * t / threads, g1 = (M / 16) * (t + 1) / threads;
        for (int i = 0; i < reps; ++i) {
          if (neu)
            kx16(g0, g1);
          else
            cpu::MatMulQ8(xq.data(), sums.data(), rows, K, w.data() + 16 * g0 * row_bytes, DType::kQ4_K, 16 * (g1 - g0),
                          1.0f, y0.data() + 16 * g0, M, 256, xs.data());
        }
      });
    for (auto& t : th) t.join();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
  };
  for (int round = 0; round < 5; ++round) {
    double a = run(false), b = run(true);
    printf("old %.1f us (%.1f GB/s)  new %.1f us (%.1f GB/s)  ratio %.2f\n", a * 1e6, w.size() / a / 1e9, b * 1e6,
           w.size() / b / 1e9, a / b);
  }
}
