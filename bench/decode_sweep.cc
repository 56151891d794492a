// gemma4rt_sweep: the int8-activation matmuls of a Gemma 4 E2B-shaped decode (or prefill) step on
// the thread pool, against a plain streaming read of the same weight bytes, interleaved in one
// process (a VM's memory bandwidth can move from minute to minute, so figures from separate runs
// cannot be compared; within one run each "token" of the kernel is timed next to one of the
// read).
//
//   gemma4rt_sweep [--dtype q4_k|q6_k|q4_0x4|q4_0|q8_0] [--rows 1] [--layers 35] [--tokens 100]
//                  [--threads 2]
//
// Per layer: q 2048 x 1536, k and v 256 x 1536, o 1536 x 2048, gate and up 6144 x 1536, down
// 1536 x 6144 (E2B's shapes; 35 layers of Q4_K are 697 MB, more than any cache). Each matrix is
// one ParallelFor over its weight rows, as the CPU backend runs it, with activations quantised
// (group 256 for K-quants) and, where cpu::MatMulQ8UsesSuperblocks, rearranged once per matrix.
// The read: 512-bit loads summed, prefetched 4 KiB ahead, over each matrix's bytes in 32 chunks.
// Prints the median time per token of each and the median of the per-token ratios.
#include <immintrin.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/kernels_q8.h"
#include "base/thread_pool.h"
#include "tensor/dtype.h"
#include "tensor/quantize.h"

namespace {

using g4::DType;

// Sum of the 64-byte lines [begin, end) at p, prefetched 4 KiB ahead (AVX-512: main checks).
__attribute__((target("avx512f"))) long long ReadLines(const uint8_t* p, size_t begin, size_t end) {
  const auto* v = reinterpret_cast<const __m512i*>(p);
  __m512i acc = _mm512_setzero_si512();
  for (size_t i = begin; i < end; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(v + i) + 4096, _MM_HINT_T0);
    acc = _mm512_add_epi64(acc, _mm512_loadu_si512(v + i));
  }
  alignas(64) long long lanes[8];
  _mm512_store_si512(lanes, acc);
  long long sum = 0;
  for (long long l : lanes) sum += l;
  return sum;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"E2B-shaped matmul sweep against a plain read of the same bytes"};
  std::string dtype = "q4_k";
  int rows = 1, layers = 35, tokens = 100, threads = 2;
  app.add_option("--dtype", dtype, "weight type")->check(CLI::IsMember({"q4_k", "q6_k", "q4_0x4", "q4_0", "q8_0"}));
  app.add_option("--rows", rows, "activation rows (1: decode)")->check(CLI::Range(1, 512));
  app.add_option("--layers", layers, "layers of E2B's seven matrices")->check(CLI::Range(1, 64));
  app.add_option("--tokens", tokens, "timed steps of each")->check(CLI::Range(3, 100000));
  app.add_option("--threads", threads, "thread pool size")->check(CLI::Range(1, 256));
  CLI11_PARSE(app, argc, argv);
  if (!__builtin_cpu_supports("avx512f")) {
    std::fprintf(stderr, "gemma4rt_sweep: the plain read needs AVX-512 (avx512f), which this CPU lacks\n");
    return 1;
  }
  const DType t = dtype == "q4_k" ? DType::kQ4_K : dtype == "q6_k" ? DType::kQ6_K : dtype == "q4_0x4" ? DType::kQ4_0x4
                  : dtype == "q4_0" ? DType::kQ4_0 : DType::kQ8_0;
  const DType stored = t == DType::kQ4_0x4 ? DType::kQ4_0 : t;
  const int grain = t == DType::kQ4_0x4 ? 4 : 1;
  const int group = g4::cpu::PreferredActGroup(stored, 256);

  struct Mat {
    int M, K;
    std::vector<uint8_t> w;
  };
  std::vector<Mat> mats;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const int shapes[][2] = {{2048, 1536}, {256, 1536}, {256, 1536}, {1536, 2048}, {6144, 1536}, {6144, 1536}, {1536, 6144}};
  size_t total = 0;
  for (int l = 0; l < layers; ++l) {
    for (const auto& s : shapes) {
      Mat m{s[0], s[1], {}};
      const size_t row_bytes = g4::DTypeRowBytes(stored, m.K);
      m.w.resize(row_bytes * m.M);
      std::vector<float> row(m.K);
      for (int r = 0; r < m.M; ++r) {
        for (float& v : row) v = normal(rng);
        g4::QuantizeRow(stored, row.data(), m.w.data() + r * row_bytes, m.K);
      }
      if (t == DType::kQ4_0x4) g4::PackQ4_0x4InPlace(m.w.data(), m.M, m.K);
      total += m.w.size();
      mats.push_back(std::move(m));
    }
  }
  g4::ThreadPool pool(threads);
  const int kmax = 6144;
  std::vector<float> x(static_cast<size_t>(kmax) * rows), y(static_cast<size_t>(kmax) * rows);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  for (float& v : x) v = unit(rng);
  std::vector<g4::cpu::ActBlockQ8> xq(static_cast<size_t>(kmax) / 32 * rows);
  std::vector<float> sums(static_cast<size_t>(kmax) / 16 * rows);
  std::vector<g4::cpu::ActSuperblockQ8> xs(2 * static_cast<size_t>(kmax) / 256 * rows);
  std::atomic<long long> sink{0};

  const auto kernel_step = [&] {
    for (const Mat& m : mats) {
      g4::cpu::QuantizeRowsQ8(x.data(), rows, m.K, xq.data(), sums.data(), group);
      const bool sb = g4::cpu::MatMulQ8UsesSuperblocks(t, m.K, group);
      if (sb) g4::cpu::PrepareActSuperblocks(xq.data(), rows, m.K, xs.data());
      const size_t row_bytes = g4::DTypeRowBytes(stored, m.K);
      pool.ParallelFor(m.M / grain, [&](int, int64_t b, int64_t e) {
        g4::cpu::MatMulQ8(xq.data(), sums.data(), rows, m.K, m.w.data() + b * grain * row_bytes, t,
                          static_cast<int>((e - b) * grain), 1.0f, y.data() + b * grain, m.M, group,
                          sb ? xs.data() : nullptr);
      });
    }
  };
  const auto read_step = [&] {
    for (const Mat& m : mats) {
      const size_t n = m.w.size() / 64;
      pool.ParallelFor(32, [&](int, int64_t b, int64_t e) { sink += ReadLines(m.w.data(), n * b / 32, n * e / 32); });
    }
  };
  std::vector<double> tk, tr, ratio;
  const auto time = [](const auto& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  kernel_step();  // warm-up: first touch of the outputs and scratch
  for (int i = 0; i < tokens; ++i) {
    double a, b;
    if (i % 2 == 0) {
      a = time(kernel_step);
      b = time(read_step);
    } else {
      b = time(read_step);
      a = time(kernel_step);
    }
    tk.push_back(a);
    tr.push_back(b);
    ratio.push_back(b / a);
  }
  std::printf("%s, %d rows, %d layers (%.1f MB of weights), %d threads, %d steps each, interleaved:\n", dtype.c_str(),
              rows, layers, total / 1e6, threads, tokens);
  std::printf("  matmuls      %8.2f ms/step  %6.1f GB/s of weights\n", Median(tk) * 1e3, total / Median(tk) / 1e9);
  std::printf("  plain read   %8.2f ms/step  %6.1f GB/s\n", Median(tr) * 1e3, total / Median(tr) / 1e9);
  std::printf("  matmuls' speed / read's (median of per-step ratios): %.3f\n", Median(ratio));
  return sink.load() == 42 ? 1 : 0;  // keeps the reads
}
