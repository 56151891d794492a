// Experiment (not built by CMake; x86-64 with AVX-512): how fast two threads can read memory with
// different access patterns, next to the two-thread memcpy that `gemma4rt bench` takes as the
// bandwidth limit, in one process: whether any read pattern beats the kernels' (memcpy counts bytes
// read + bytes written). Run it on a new CPU kind whose decode reads well below its memcpy rate: if
// a pattern reads faster, the kernels' prefetch distances and hints could depend on the CPU.
//
// Build and run from the repository root (one command line):
//   g++ -O2 -march=native bench/experiments/read_patterns.cc -lpthread -o /tmp/read_patterns && /tmp/read_patterns
// Options: /tmp/read_patterns [MiB per buffer, default 1400] [rounds, default 8].
//
// Each round runs every pattern once, in a fixed order, over the whole buffer (in 2 MiB pages
// where the kernel gives them; written before timing), each thread over one contiguous half:
//   memcpy       glibc memcpy of one buffer into the other; GB/s of 2 x bytes (read + written).
//   1 stream     512-bit loads summed, no software prefetch (the hardware prefetchers only).
//   pf T0 4K     the same with a prefetcht0 4 KiB ahead (bench's read test, the sweep's read).
//   pf T0 1K     prefetcht0 1 KiB ahead.
//   pf T1 8K     prefetcht1 8 KiB ahead (the Q4_K/Q6_K/Q4_0x4 kernels' kRowPrefetchBytes).
//   pf T1 16K    prefetcht1 16 KiB ahead (the BF16 decode kernel's kDecodePrefetchBytes).
//   pf T1 32K    prefetcht1 32 KiB ahead.
//   pf T2 8K     prefetcht2 8 KiB ahead.
//   pf NTA 4K    prefetchnta 4 KiB ahead.
//   S x G        S interleaved streams per thread, G bytes apart (one line of each in turn; after
//                G bytes each, the next S x G block).
//   movsb 4K     rep movsb of 4 KiB at a time into a buffer in L1, then summed from there.
// Prints per pattern the median and the best GB/s over the rounds and the median over rounds of
// its speed relative to "1 stream" in the same round. A VM's memory bandwidth can swing from
// minute to minute: only ratios within a round mean much, and only when they repeat.
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

std::atomic<long long> sink{0};

long long Lanes(__m512i v) {
  alignas(64) long long l[8];
  _mm512_store_si512(l, v);
  return l[0] + l[1] + l[2] + l[3] + l[4] + l[5] + l[6] + l[7];
}

// One stream over [p, p + n), prefetching kAhead bytes ahead with hint kHint (kAhead 0: none).
template <int kAhead, int kHint>
void ReadOne(const uint8_t* p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0;
  for (size_t i = 0; i + 128 <= n; i += 128) {
    if constexpr (kAhead > 0) {
      _mm_prefetch(reinterpret_cast<const char*>(p + i + kAhead), static_cast<_mm_hint>(kHint));
      _mm_prefetch(reinterpret_cast<const char*>(p + i + kAhead + 64), static_cast<_mm_hint>(kHint));
    }
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(p + i + 64));
  }
  sink += Lanes(_mm512_add_epi64(a0, a1));
}

// S streams `gap` bytes apart, one 64-byte line of each in turn.
template <int S>
void ReadInterleaved(const uint8_t* p, size_t n, size_t gap) {
  __m512i a = _mm512_setzero_si512();
  for (size_t block = 0; block + S * gap <= n; block += S * gap)
    for (size_t i = 0; i < gap; i += 64)
      for (int s = 0; s < S; ++s) a = _mm512_add_epi64(a, _mm512_loadu_si512(p + block + s * gap + i));
  sink += Lanes(a);
}

void ReadMovsb(const uint8_t* p, size_t n) {
  alignas(64) static thread_local uint8_t buf[4096];
  __m512i a = _mm512_setzero_si512();
  for (size_t i = 0; i + 4096 <= n; i += 4096) {
    void* d = buf;
    const void* s = p + i;
    size_t c = 4096;
    asm volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(c) : : "memory");
    for (int j = 0; j < 4096; j += 64) a = _mm512_add_epi64(a, _mm512_load_si512(buf + j));
  }
  sink += Lanes(a);
}

uint8_t* Buffer(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  ::madvise(p, bytes, MADV_HUGEPAGE);
  std::memset(p, 1, bytes);
  return static_cast<uint8_t*>(p);
}

// Wall time of part(0) on this thread and part(1) on another, started together.
double TwoThreads(const std::function<void(int)>& part) {
  const auto t0 = std::chrono::steady_clock::now();
  std::thread other(part, 1);
  part(0);
  other.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (!__builtin_cpu_supports("avx512f")) {
    std::fprintf(stderr, "read_patterns: needs AVX-512 (avx512f)\n");
    return 1;
  }
  const size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 1400;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 8;
  if (mib < 64 || rounds < 1) {
    std::fprintf(stderr, "usage: read_patterns [MiB >= 64] [rounds >= 1]\n");
    return 1;
  }
  const size_t bytes = mib << 20, half = bytes / 2;
  uint8_t* src = Buffer(bytes);
  uint8_t* dst = Buffer(bytes);
  const auto at = [&](int t) { return src + t * half; };
  struct Pattern {
    std::string name;
    std::function<void(int)> run;
    double bytes_factor;  // 2 for memcpy (read + written)
  };
  const std::vector<Pattern> patterns = {
      {"memcpy", [&](int t) { std::memcpy(dst + t * half, src + t * half, half); }, 2.0},
      {"1 stream", [&](int t) { ReadOne<0, 0>(at(t), half); }, 1.0},
      {"pf T0 4K", [&](int t) { ReadOne<4096, _MM_HINT_T0>(at(t), half); }, 1.0},
      {"pf T0 1K", [&](int t) { ReadOne<1024, _MM_HINT_T0>(at(t), half); }, 1.0},
      {"pf T1 8K", [&](int t) { ReadOne<8192, _MM_HINT_T1>(at(t), half); }, 1.0},
      {"pf T1 16K", [&](int t) { ReadOne<16384, _MM_HINT_T1>(at(t), half); }, 1.0},
      {"pf T1 32K", [&](int t) { ReadOne<32768, _MM_HINT_T1>(at(t), half); }, 1.0},
      {"pf T2 8K", [&](int t) { ReadOne<8192, _MM_HINT_T2>(at(t), half); }, 1.0},
      {"pf NTA 4K", [&](int t) { ReadOne<4096, _MM_HINT_NTA>(at(t), half); }, 1.0},
      {"2 x 64K", [&](int t) { ReadInterleaved<2>(at(t), half, 64 << 10); }, 1.0},
      {"2 x 1M", [&](int t) { ReadInterleaved<2>(at(t), half, 1 << 20); }, 1.0},
      {"4 x 64K", [&](int t) { ReadInterleaved<4>(at(t), half, 64 << 10); }, 1.0},
      {"4 x 1M", [&](int t) { ReadInterleaved<4>(at(t), half, 1 << 20); }, 1.0},
      {"movsb 4K", [&](int t) { ReadMovsb(at(t), half); }, 1.0},
  };
  std::vector<std::vector<double>> gbps(patterns.size()), rel(patterns.size());
  for (int r = 0; r < rounds; ++r) {
    double one = 0;
    for (size_t k = 0; k < patterns.size(); ++k) {
      const double g = patterns[k].bytes_factor * static_cast<double>(bytes) / TwoThreads(patterns[k].run) / 1e9;
      gbps[k].push_back(g);
      if (patterns[k].name == "1 stream") one = g;
      if (one > 0) rel[k].push_back(g / one);
    }
  }
  std::printf("2 threads, %zu MiB per buffer, %d rounds (GB/s; memcpy counts read + written bytes)\n", mib, rounds);
  for (size_t k = 0; k < patterns.size(); ++k) {
    std::printf("  %-10s median %5.1f  best %5.1f", patterns[k].name.c_str(), Median(gbps[k]),
                *std::max_element(gbps[k].begin(), gbps[k].end()));
    if (!rel[k].empty()) std::printf("  vs 1 stream %.3f", Median(rel[k]));
    std::printf("\n");
  }
  return sink.load() == 42 ? 2 : 0;  // keeps the reads
}
