// Peak resident memory (/proc) and the machine's memory bandwidth, for `gemma4rt bench`.

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <thread>
#include <utility>

#include <sys/mman.h>

#include "cli/bench_internal.h"

namespace g4::cli::bench_internal {

namespace {

// The "<key>: N kB" line of a /proc file (/proc/self/status, /proc/meminfo) in bytes; 0 when the
// file or the key is missing.
size_t ProcKibField(const char* path, const std::string& key) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key + ":", 0) == 0)
      return static_cast<size_t>(std::strtoull(line.c_str() + key.size() + 1, nullptr, 10)) * 1024;
  return 0;
}

// Runs part(0) .. part(threads - 1) at once (part(0) on the calling thread), `iterations` times;
// returns the shortest wall time of one round, in seconds.
double BestParallelSeconds(int threads, int iterations, const std::function<void(int)>& part) {
  double best = 1e30;
  for (int it = 0; it < iterations; ++it) {
    const auto t0 = Clock::now();
    std::vector<std::thread> pool;
    for (int i = 1; i < threads; ++i) pool.emplace_back(part, i);
    part(0);
    for (std::thread& t : pool) t.join();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

// Thread t's share [begin, end) of n items split over `threads`, each share a multiple of `align`.
std::pair<size_t, size_t> ThreadSlice(size_t n, int threads, size_t align, int t) {
  const size_t slice = (n / threads + align - 1) / align * align;
  const size_t begin = std::min(n, t * slice);
  return {begin, std::min(n, begin + slice)};
}

// Anonymous read-write memory of `bytes` bytes, asked for in 2 MiB pages; unmapped on destruction.
// data() == nullptr when the memory cannot be mapped.
class TestBuffer {
 public:
  explicit TestBuffer(size_t bytes) : bytes_(bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    p_ = static_cast<char*>(p);
    ::madvise(p_, bytes, MADV_HUGEPAGE);  // a hint: without it the pages are 4 KiB
  }
  ~TestBuffer() {
    if (p_ != nullptr) ::munmap(p_, bytes_);
  }
  TestBuffer(const TestBuffer&) = delete;
  TestBuffer& operator=(const TestBuffer&) = delete;
  char* data() { return p_; }

 private:
  size_t bytes_;
  char* p_ = nullptr;
};

}  // namespace

size_t PeakRssBytes() { return ProcKibField("/proc/self/status", "VmHWM"); }

BandwidthSample MeasureBandwidth(size_t bytes, int threads, int iterations) {
  BandwidthSample r;
  const size_t words = bytes / 8;
  if (words == 0) return r;
  bytes = words * 8;
  TestBuffer src_buf(bytes), dst_buf(bytes);
  char* src = src_buf.data();
  char* dst = dst_buf.data();
  if (src == nullptr || dst == nullptr) return r;
  uint64_t* w = reinterpret_cast<uint64_t*>(src);
  for (size_t i = 0; i < words; ++i) w[i] = i;
  std::memset(dst, 0, bytes);
  r.copy_seconds = BestParallelSeconds(threads, iterations, [&](int t) {
    const auto [begin, end] = ThreadSlice(bytes, threads, 64, t);
    std::memcpy(dst + begin, src + begin, end - begin);
  });
  volatile char sink = dst[bytes / 2];
  (void)sink;
  std::vector<uint64_t> sums(threads, 0);
  r.read_seconds = BestParallelSeconds(threads, iterations, [&](int t) {
    const auto [begin, end] = ThreadSlice(words, threads, 8, t);
    uint64_t s[8] = {};
    size_t i = begin;
    for (; i + 8 <= end; i += 8) {
      __builtin_prefetch(w + i + 512);  // a hint: past the end it is ignored
      for (int k = 0; k < 8; ++k) s[k] += w[i + k];
    }
    for (; i < end; ++i) s[0] += w[i];
    sums[t] = s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
  });
  volatile uint64_t sum_sink = std::accumulate(sums.begin(), sums.end(), uint64_t{0});
  (void)sum_sink;
  r.copy_gbps = 2.0 * static_cast<double>(bytes) / r.copy_seconds / 1e9;
  r.read_gbps = static_cast<double>(bytes) / r.read_seconds / 1e9;
  return r;
}

size_t MemAvailableBytes() { return ProcKibField("/proc/meminfo", "MemAvailable"); }

bool ResetPeakRss() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

}  // namespace g4::cli::bench_internal
