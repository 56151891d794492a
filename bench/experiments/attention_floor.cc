// Experiment (not built by CMake; x86-64 with AVX-512): the arithmetic floor of decode attention
// at depth against the time its K and V reads take, in one process: how far an f16 cache's
// attention can fall toward its reads' time on these cores.
//
// Build and run from the repository root (one command line):
//   g++ -std=c++20 -O3 -march=native bench/experiments/attention_floor.cc -lpthread -o /tmp/attention_floor && /tmp/attention_floor
// (-O3: at -O2 GCC 12 keeps the 12 accumulators in memory and the rates come out ~3x too low.)
// Options: /tmp/attention_floor [threads 1-1024, default 2] [keys, default 4000] [read MiB per thread, default 512].
//
// What it measures, each on `threads` threads started together, as the work of all of them over
// the time from the first start to the last end (best of 5 rounds):
//   fma     512-bit vfmadd231ps, 12 independent accumulators per thread: f32 multiply-adds per
//           second (16 per instruction). The f16 and f32 caches' attention runs on these.
//   bf16    512-bit vdpbf16ps likewise (32 bf16 products summed in f32 per instruction), where the
//           CPU has AVX512_BF16: the bf16 cache's kernels (src/backends/cpu/attention_bf16.cc).
//   read    512-bit loads summed over a private buffer per thread (2 MiB pages where the kernel
//           gives them), prefetcht1 8 KiB ahead as the weight kernels do: GB/s of bytes read.
// Then, for one full layer of Gemma 4 E2B (8 query heads on one KV head, head_dim 512) over `keys`
// cached keys: multiply-adds = keys x 8 x 512 x 2 (scores and the weighted V sum), bytes = keys x
// 512 x 2 x 2 (K and V, 2-byte elements), and the time of each at the rates above. With 2-byte
// elements that is G / 2 = 4 multiply-adds per byte: when 4 x the read rate exceeds the f32
// multiply-add rate, no kernel computing in f32 can keep attention at its reads' time.
#include <immintrin.h>
#include <sys/mman.h>
#include <unistd.h>

// GCC 12's _mm512_reduce_add_ps leaves an "undefined" operand that -Wuninitialized reports.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr long kInstructions = 200'000'000;  // per thread and round

// Runs 12 independent chains of kInstructions / 12 instructions each on this thread (the asm
// keeps the compiler from folding or reordering them away); returns the instructions run. Both
// kinds are compiled with AVX512_BF16 allowed; main runs the bf16 one only where the CPU has it.
template <bool kBf16>
__attribute__((target("avx512f,avx512bf16"))) double Chains() {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(1e-3f * static_cast<float>(i));
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-7f);
  const __m512bh bx = (__m512bh)_mm512_set1_epi16(0x3f80), by = (__m512bh)_mm512_set1_epi16(0x3380);
  for (long n = 0; n < kInstructions / 12; ++n) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = kBf16 ? _mm512_dpbf16_ps(a[i], bx, by) : _mm512_fmadd_ps(a[i], x, y);
    asm volatile("" : "+v"(a[0]), "+v"(a[1]), "+v"(a[2]), "+v"(a[3]), "+v"(a[4]), "+v"(a[5]), "+v"(a[6]),
                 "+v"(a[7]), "+v"(a[8]), "+v"(a[9]), "+v"(a[10]), "+v"(a[11]));
  }
  return static_cast<double>(kInstructions / 12 * 12);
}

// Reads buf[0, bytes) once (the sum goes to *sink); returns the bytes read. The prefetch address
// is formed as an integer (it may lie past the buffer; a prefetch never faults).
__attribute__((target("avx512f"))) double Read(const char* buf, size_t bytes, float* sink) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  const uintptr_t base = reinterpret_cast<uintptr_t>(buf);
  for (size_t i = 0; i < bytes; i += 128) {
    _mm_prefetch(reinterpret_cast<const char*>(base + i + 8192), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(base + i + 8192 + 64), _MM_HINT_T1);
    s0 = _mm512_add_ps(s0, _mm512_load_ps(reinterpret_cast<const float*>(buf + i)));
    s1 = _mm512_add_ps(s1, _mm512_load_ps(reinterpret_cast<const float*>(buf + i + 64)));
  }
  *sink += _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
  return static_cast<double>(bytes);
}

// fn(thread) on `threads` threads started together (a barrier): the work they did in all (fn's
// return values) per second from the first start to the last end, so a thread that finishes
// early and leaves the machine to the others does not count as running at its solo rate.
template <class Fn>
double OnThreads(int threads, const Fn& fn) {
  std::vector<double> work(threads);
  std::vector<Clock::time_point> start(threads), end(threads);
  std::barrier sync(threads);
  auto body = [&](int t) {
    sync.arrive_and_wait();
    start[t] = Clock::now();
    work[t] = fn(t);
    end[t] = Clock::now();
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(body, t);
  body(0);
  for (auto& th : pool) th.join();
  double sum = 0;
  for (double w : work) sum += w;
  const auto first = *std::min_element(start.begin(), start.end());
  const auto last = *std::max_element(end.begin(), end.end());
  return sum / std::chrono::duration<double>(last - first).count();
}

// A decimal argument in [lo, hi], or exits with the usage.
long Arg(const char* s, long lo, long hi, const char* argv0) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
    std::fprintf(stderr, "usage: %s [threads 1-1024] [keys 1-16777216] [read MiB per thread 1-65536]; got '%s'\n", argv0, s);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? static_cast<int>(Arg(argv[1], 1, 1024, argv[0])) : 2;
  const long keys = argc > 2 ? Arg(argv[2], 1, 1 << 24, argv[0]) : 4000;
  const size_t mib = argc > 3 ? static_cast<size_t>(Arg(argv[3], 1, 65536, argv[0])) : 512;
  if (!__builtin_cpu_supports("avx512f")) {
    std::fprintf(stderr, "attention_floor: this CPU has no AVX-512 (the experiment measures 512-bit instructions)\n");
    return 2;
  }
  const bool has_bf16 = __builtin_cpu_supports("avx512bf16");
  const size_t bytes = mib << 20;
  const double phys = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (static_cast<double>(bytes) * threads > phys / 2) {
    std::fprintf(stderr, "attention_floor: %d threads x %zu MiB is more than half of this machine's %.0f MiB\n", threads, mib,
                 phys / (1 << 20));
    return 2;
  }
  std::vector<char*> bufs(threads);
  for (auto& b : bufs) {
    void* p = std::aligned_alloc(2 << 20, bytes);
    if (p == nullptr) {
      std::fprintf(stderr, "attention_floor: cannot allocate %zu MiB per thread\n", mib);
      return 1;
    }
    madvise(p, bytes, MADV_HUGEPAGE);
    std::memset(p, 0, bytes);  // zeros: no subnormal sums
    b = static_cast<char*>(p);
  }
  double fma = 0, bf16 = 0, read = 0;
  float sink = 0;
  for (int round = 0; round < 5; ++round) {
    fma = std::max(fma, OnThreads(threads, [](int) { return Chains<false>(); }) * 16);
    if (has_bf16) bf16 = std::max(bf16, OnThreads(threads, [](int) { return Chains<true>(); }) * 32);
    std::vector<float> sinks(threads);
    read = std::max(read, OnThreads(threads, [&](int t) { return Read(bufs[t], bytes, &sinks[t]); }));
    for (float s : sinks) sink += s;
  }
  const double macs = static_cast<double>(keys) * 8 * 512 * 2, kv = static_cast<double>(keys) * 512 * 2 * 2;
  char bf16_text[64] = "none (no AVX512_BF16)";
  if (has_bf16) std::snprintf(bf16_text, sizeof bf16_text, "%.1f G/s", bf16 / 1e9);
  std::printf("threads %d: f32 multiply-adds %.1f G/s, bf16 products %s, reads %.1f GB/s%s\n", threads, fma / 1e9,
              bf16_text, read / 1e9, sink == 42 ? " " : "");
  std::printf("E2B full layer over %ld keys: %.1f M multiply-adds, %.2f MB of K and V\n", keys, macs / 1e6, kv / 1e6);
  std::printf("  reads at %.1f GB/s: %.0f us\n", read / 1e9, kv / read * 1e6);
  std::printf("  f32 arithmetic (f16/f32 cache) at peak: %.0f us (%.2fx the reads)\n", macs / fma * 1e6,
              macs / fma / (kv / read));
  if (has_bf16)
    std::printf("  bf16 products (bf16 cache) at peak: %.0f us (%.2fx the reads)\n", macs / bf16 * 1e6,
                macs / bf16 / (kv / read));
  // The op profile's excess (bench/compare-e2b.sh) compares attention's growth with its KV bytes
  // at the rate decode reads its weights, R: the f16 cache's floor is 4 x R / (f32 rate).
  std::printf("floor of the f16 cache's attention excess = 4 x R / %.1f, R = the weights' read rate in GB/s "
              "(%.2f at this run's %.1f GB/s of reads; only an idle machine gives the cores' own figures)\n",
              fma / 1e9, 4 * read / fma, read / 1e9);
  for (auto b : bufs) std::free(b);
  return 0;
}
