// Experiment (not built by CMake; x86-64 with AVX-512 VNNI only): how fast Q4_0 matrix-vector
// products stream from memory with the weights in three layouts, next to the engine's own kernel
// (cpu::MatMulQ8 on Q4_0 as stored) in the same process. Its "packed" layout is the origin of
// kQ4_0x4 (tensor/dtype.h), the layout the loader repacks Q4_0 weights into (whose kernel adds a
// prefetch).
//
//   stored   : GGUF's layout, rows of 18-byte blocks [f16 d | 16 bytes of nibbles]; a 512-bit tile
//              of four rows per block (one load and three inserts, scales gathered), prefetching
//              the tile four tiles ahead as one sequential range (as the engine does).
//   blocks4  : the same blocks, the four rows of a tile interleaved block by block (row 0 block b,
//              row 1 block b, ...), one sequential stream; the same kernel with another stride.
//   packed   : per group of four rows, all their scales (4 x f16 per block) then all nibbles
//              (64 bytes per block: row i's 16 bytes at 16 i), so a block of four rows is one
//              512-bit load (64-byte aligned only if the buffer is; std::vector's here is not)
//              and one 8-byte scale load. No software prefetch.
// Every kernel: i32 lane 4i + j = row i's products of elements 4j..4j+3 and 16+4j..19+4j
// (vpdpbusd twice), the -8 offset folded into the integer sum (lanes start at -2 * sum of the
// activation block), then f32 lanes scaled by d_row * d_x and reduced once per row.
//
// Build and run from the repository root after scripts/build.sh:
//   g++ -O2 -march=x86-64-v3 -Isrc bench/experiments/q4_0_layouts.cc build/libgemma4rt_core.a -lhwy -lpthread
//     -o /tmp/q4_0_layouts && /tmp/q4_0_layouts   (one command line)
// Prints each kernel's largest relative error against a double-precision reference, the best
// time (and GB/s of weights) of 2000 single-threaded runs on a 6144 x 1536 matrix (5.3 MB: in the caches), then four
// rounds of 2-thread streaming over a 393216 x 1536 matrix (340 MB) with a 2-thread memcpy of
// the same size (bytes read + written) for scale.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "backends/cpu/kernels_q8.h"
#include "tensor/dtype.h"

namespace {

constexpr int K = 1536, NB = K / 32, kBlock = 18;
constexpr size_t kRowBytes = static_cast<size_t>(NB) * kBlock;
using Act = g4::cpu::ActBlockQ8;

#define G4_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,f16c,fma")))

// y[m] for m < M, in double precision (the check).
void Reference(const uint8_t* w, int M, const Act* x, float* y) {
  for (int m = 0; m < M; ++m) {
    double s = 0;
    for (int b = 0; b < NB; ++b) {
      const uint8_t* blk = w + m * kRowBytes + b * kBlock;
      uint16_t h;
      std::memcpy(&h, blk, 2);
      int dot = 0;
      for (int k = 0; k < 16; ++k) dot += ((blk[2 + k] & 15) - 8) * x[b].q[k] + ((blk[2 + k] >> 4) - 8) * x[b].q[16 + k];
      s += static_cast<double>(g4::F16ToF32(h)) * x[b].d * dot;
    }
    y[m] = static_cast<float>(s);
  }
}

G4_AVX512 inline void Finish(__m512 acc, float* y) {
  alignas(64) float t[16];
  _mm512_store_ps(t, acc);
  for (int i = 0; i < 4; ++i) y[i] = (t[4 * i] + t[4 * i + 1]) + (t[4 * i + 2] + t[4 * i + 3]);
}

// stored (kStride = kBlock, rows kRowBytes apart) or blocks4 (kStride = 4 * kBlock, rows kBlock apart).
template <bool kBlocks4>
G4_AVX512 void TileKernel(const uint8_t* w, int M, const Act* x, const int32_t* neg, float* y) {
  const size_t row = kBlocks4 ? kBlock : kRowBytes, stride = kBlocks4 ? 4 * kBlock : kBlock;
  const __m512i m15 = _mm512_set1_epi8(15);
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  for (int g = 0; g < M / 4; ++g) {
    const uint8_t* t0 = w + 4 * g * kRowBytes;
    const char* next = reinterpret_cast<const char*>(t0 + 16 * kRowBytes);  // four tiles ahead
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < NB; ++b) {
      for (size_t q = size_t{4} * kBlock * b; q < size_t{4} * kBlock * (b + 1); q += 64) _mm_prefetch(next + q, _MM_HINT_T1);
      const uint8_t* p = t0 + b * stride;
      const auto qs = [&](int i) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i * row + 2)); };
      __m512i v = _mm512_castsi128_si512(qs(0));
      v = _mm512_inserti32x4(v, qs(1), 1);
      v = _mm512_inserti32x4(v, qs(2), 2);
      v = _mm512_inserti32x4(v, qs(3), 3);
      const __m512i lo = _mm512_and_si512(v, m15), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m15);
      const __m512i xl = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].q)));
      const __m512i xh = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].q + 16)));
      const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_set1_epi32(neg[b]), lo, xl), hi, xh);
      uint16_t h[4];
      for (int i = 0; i < 4; ++i) std::memcpy(&h[i], p + i * row, 2);
      uint64_t h64;
      std::memcpy(&h64, h, 8);
      const __m128 d4 = _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(h64)));
      const __m512 d16 = _mm512_mul_ps(_mm512_permutexvar_ps(spread, _mm512_castps128_ps512(d4)), _mm512_set1_ps(x[b].d));
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d16, acc);
    }
    Finish(acc, y + 4 * g);
  }
}

G4_AVX512 void PackedKernel(const uint8_t* w, int M, const Act* x, const int32_t* neg, float* y) {
  const __m512i m15 = _mm512_set1_epi8(15);
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  for (int g = 0; g < M / 4; ++g) {
    const uint8_t* sc = w + 4 * g * kRowBytes;
    const uint8_t* qs = sc + NB * 8;
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < NB; ++b) {
      const __m512i v = _mm512_loadu_si512(qs + b * 64);
      const __m512i lo = _mm512_and_si512(v, m15), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m15);
      const __m512i xl = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].q)));
      const __m512i xh = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].q + 16)));
      const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_set1_epi32(neg[b]), lo, xl), hi, xh);
      const __m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + b * 8)));
      const __m512 d16 = _mm512_mul_ps(_mm512_permutexvar_ps(spread, _mm512_castps128_ps512(d4)), _mm512_set1_ps(x[b].d));
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d16, acc);
    }
    Finish(acc, y + 4 * g);
  }
}

std::vector<uint8_t> Blocks4(const std::vector<uint8_t>& w, int M) {
  std::vector<uint8_t> o(w.size());
  for (int g = 0; g < M / 4; ++g)
    for (int b = 0; b < NB; ++b)
      for (int i = 0; i < 4; ++i)
        std::memcpy(&o[4 * g * kRowBytes + (4 * b + i) * kBlock], &w[(4 * g + i) * kRowBytes + b * kBlock], kBlock);
  return o;
}

std::vector<uint8_t> Packed(const std::vector<uint8_t>& w, int M) {
  std::vector<uint8_t> o(w.size());
  for (int g = 0; g < M / 4; ++g)
    for (int b = 0; b < NB; ++b)
      for (int i = 0; i < 4; ++i) {
        const uint8_t* blk = &w[(4 * g + i) * kRowBytes + b * kBlock];
        std::memcpy(&o[4 * g * kRowBytes + b * 8 + i * 2], blk, 2);
        std::memcpy(&o[4 * g * kRowBytes + NB * 8 + b * 64 + i * 16], blk + 2, 16);
      }
  return o;
}

struct Case {
  const char* name;
  const uint8_t* w;
  void (*fn)(const uint8_t*, int, const Act*, const int32_t*, float*);
};

}  // namespace

int main() {
  if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512bw")) {
    std::printf("needs AVX-512 VNNI\n");
    return 1;
  }
  for (const int M : {6144, 393216}) {
    const bool stream = M > 6144;
    std::mt19937 rng(1);
    std::vector<uint8_t> w(M * kRowBytes);
    for (auto& c : w) c = static_cast<uint8_t>(rng());
    for (size_t i = 0; i < static_cast<size_t>(M) * NB; ++i) {
      const uint16_t h = _cvtss_sh(1e-4f * static_cast<float>(1 + rng() % 100), 0);
      std::memcpy(&w[i * kBlock], &h, 2);
    }
    std::vector<Act> x(NB);
    std::vector<int32_t> neg(NB);
    std::vector<float> half_sums(2 * NB);
    for (int b = 0; b < NB; ++b) {
      x[b].d = 0.02f;
      int s0 = 0, s1 = 0;
      for (int k = 0; k < 32; ++k) {
        x[b].q[k] = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
        (k < 16 ? s0 : s1) += x[b].q[k];
      }
      neg[b] = -2 * (s0 + s1);
      half_sums[2 * b] = x[b].d * s0;
      half_sums[2 * b + 1] = x[b].d * s1;
    }
    const std::vector<uint8_t> b4 = Blocks4(w, M), pk = Packed(w, M);
    const auto engine = [&](const uint8_t* wp, int m, float* y) {
      g4::cpu::MatMulQ8(x.data(), half_sums.data(), 1, K, wp, g4::DType::kQ4_0, m, 1.0f, y, m, 32);
    };
    const Case cases[] = {{"stored", w.data(), TileKernel<false>}, {"blocks4", b4.data(), TileKernel<true>},
                          {"packed", pk.data(), PackedKernel}};
    std::vector<float> ref(M), y(M);
    if (!stream) {
      Reference(w.data(), M, x.data(), ref.data());
      const auto err = [&] {
        double e = 0;
        for (int m = 0; m < M; ++m) e = std::max(e, std::fabs(static_cast<double>(y[m]) - ref[m]) / (std::fabs(ref[m]) + 1e-3));
        return e;
      };
      const auto best = [&](auto f) {
        double t = 1e9;
        for (int it = 0; it < 2000; ++it) {
          const auto t0 = std::chrono::steady_clock::now();
          f();
          t = std::min(t, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        }
        return t;
      };
      std::printf("%d x %d, 1 thread, in cache (best of 2000):\n", M, K);
      const double te = best([&] { engine(w.data(), M, y.data()); });
      std::printf("  %-8s %7.1f us  %5.1f GB/s  err %.1e\n", "engine", te, w.size() / te / 1e3, err());
      for (const Case& c : cases) {
        const double t = best([&] { c.fn(c.w, M, x.data(), neg.data(), y.data()); });
        std::printf("  %-8s %7.1f us  %5.1f GB/s  err %.1e\n", c.name, t, w.size() / t / 1e3, err());
      }
      continue;
    }
    // Two threads, each half of the rows (a multiple of four), best of five per round.
    const size_t half = w.size() / 2;
    const auto two = [&](auto part) {
      double t = 1e9;
      for (int it = 0; it < 5; ++it) {
        const auto t0 = std::chrono::steady_clock::now();
        std::thread th([&] { part(half, M / 2); });
        part(0, 0);
        th.join();
        t = std::min(t, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      return t;
    };
    std::vector<uint8_t> dst(w.size(), 1);
    std::printf("%d x %d (%.0f MB), 2 threads, streamed (GB/s of weights; memcpy: read + written):\n", M, K, w.size() / 1e6);
    for (int round = 0; round < 4; ++round) {
      const double tc = two([&](size_t off, int) { std::memcpy(dst.data() + off, w.data() + off, half); });
      std::printf("  memcpy %5.1f", 2 * w.size() / tc / 1e9);
      const double te = two([&](size_t off, int m0) { engine(w.data() + off, M / 2, y.data() + m0); });
      std::printf("  engine %5.1f", w.size() / te / 1e9);
      for (const Case& c : cases) {
        const double t = two([&](size_t off, int m0) { c.fn(c.w + off, M / 2, x.data(), neg.data(), y.data() + m0); });
        std::printf("  %s %5.1f", c.name, w.size() / t / 1e9);
      }
      std::printf("\n");
    }
  }
}
