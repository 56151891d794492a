// `gemma4rt bench`: see bench.h. Flag names follow llama-bench (-m -t -p -n -d -r -ub -o).
#include "backends/backend_flags.h"
#include "backends/cpu/kernels.h"
#include "cli/bench.h"
#include "cli/bench_quality.h"
#include "cli/parse_error.h"
#include "cli/progress.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backends/cpu/cpu_backend.h"
#include "base/thread_pool.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/kv_cache.h"
#include "tokenizer/tokenizer.h"

namespace g4::cli {
namespace {

using Clock = std::chrono::steady_clock;

int Fail(const Status& s) {
  std::fprintf(stderr, "gemma4rt: error: %s\n", s.ToString().c_str());
  return 1;
}

// Every bound weight tensor once (the tied LM head is the embedding).
std::vector<const Tensor*> BoundTensors(const ModelWeights& w) {
  std::vector<const Tensor*> out;
  std::set<const Tensor*> seen;
  auto add = [&](const Tensor* t) {
    if (t && seen.insert(t).second) out.push_back(t);
  };
  for (const Tensor* t : {w.embed, w.lm_head, w.final_norm, w.ple_embed, w.ple_model_proj, w.ple_proj_norm}) add(t);
  for (const LayerWeights& l : w.layers)
    for (const Tensor* t : {l.input_norm, l.q_proj, l.k_proj, l.v_proj, l.q_norm, l.k_norm, l.o_proj, l.post_attn_norm,
                            l.pre_ffn_norm, l.gate_proj, l.up_proj, l.down_proj, l.post_ffn_norm, l.ple_gate, l.ple_proj,
                            l.ple_post_norm, l.router_proj, l.router_scale, l.per_expert_scale, l.experts_gate_up,
                            l.experts_down, l.pre_ffn_norm_2, l.post_ffn_norm_1, l.post_ffn_norm_2})
      add(t);
  return out;
}

// Weight bytes one decoded token reads: ModelWeights::total_bytes (tied head counted once), less
// the rows of lookup tables that are not read (an untied embedding table and the PLE table are
// read one row per token) and the experts not routed to (MoE reads top_k of num_experts).
size_t WeightBytesPerToken(const LoadedModel& m) {
  const ModelWeights& w = m.weights;
  const ModelConfig& c = m.config;
  double bytes = static_cast<double>(w.total_bytes);
  auto one_row_only = [&](const Tensor* t) {
    if (!t || t->shape.empty() || t->shape[0] <= 0) return;
    bytes -= static_cast<double>(t->nbytes) - static_cast<double>(t->nbytes) / t->shape[0];
  };
  if (w.embed && w.lm_head && w.embed != w.lm_head) one_row_only(w.embed);
  one_row_only(w.ple_embed);
  if (c.num_experts > 0 && c.top_k_experts > 0) {
    const double unused = 1.0 - static_cast<double>(c.top_k_experts) / c.num_experts;
    for (const LayerWeights& l : w.layers)
      for (const Tensor* t : {l.experts_gate_up, l.experts_down})
        if (t) bytes -= unused * static_cast<double>(t->nbytes);
  }
  return static_cast<size_t>(std::max(0.0, bytes));
}

// KV bytes one decode step reads when the sequence holds `context` positions after the step:
// every layer (KV-shared ones read their donor's cache) reads K and V (rows of KvHeadRowBytes: 4
// bytes an element f32, 2 f16 and bf16, 1 q8 plus its scale) of the positions it attends to.
size_t KvBytesRead(const ModelConfig& c, int64_t context, DType type) {
  size_t b = 0;
  for (const LayerPlan& lp : c.layers) {
    const int64_t n = lp.window ? std::min<int64_t>(lp.window, context) : context;
    b += 2 * static_cast<size_t>(n) * lp.num_kv_heads * KvHeadRowBytes(type, lp.head_dim);
  }
  return b;
}

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

// Peak resident set (VmHWM) in bytes; 0 when /proc is unavailable.
size_t PeakRssBytes() { return ProcKibField("/proc/self/status", "VmHWM"); }

// One sample of the machine's memory bandwidth with `threads` threads, both tests on the same two
// `bytes` buffers (anonymous memory in 2 MiB pages where the kernel gives them, MADV_HUGEPAGE, as
// the copied weights are; written before timing so that page faults are not timed; unmapped on
// return), each the best of `iterations`:
//   copy: memcpy of one buffer into the other, split over the threads; GB/s counting the bytes
//     read + the bytes written (STREAM's accounting of a copy);
//   read: the threads sum the source buffer's 64-bit words (8 chains, which the compiler
//     vectorises; each line prefetched 4 KiB ahead, as the matmul kernels prefetch their next
//     tile); GB/s of bytes read: what a decode, which only reads its weights, can get.
// On the 2-core Zen 4 VM of docs/PERFORMANCE.md the copy figure is 39-48 GB/s while this read test
// gives 31-53 GB/s, both moving from minute to minute; AVX-512 read loops with 1-16 streams per
// thread measured no more than it, but BF16 decode has read up to 12% faster (not a hard
// ceiling). Zero bytes: nothing measured (all zero).
struct BandwidthSample {
  double copy_gbps = 0, read_gbps = 0;
  double copy_seconds = 0, read_seconds = 0;  // best times
};

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

// All zero (not measured) when the buffers cannot be mapped.
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

// MemAvailable from /proc/meminfo in bytes; 0 when unknown.
size_t MemAvailableBytes() { return ProcKibField("/proc/meminfo", "MemAvailable"); }

// Resets the peak resident set (VmHWM) to the current resident set: Linux >= 4.0's
// /proc/self/clear_refs "5". False where that is refused (then VmHWM keeps counting everything).
// Process-wide: getrusage's ru_maxrss (what `/usr/bin/time -v` prints) is reset with it, so
// outside tools see bench's peak without the bandwidth tests too.
bool ResetPeakRss() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

// The median of the finite values of v (NaN marks a sample not measured); 0 when there are none.
double Median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t k = v.size();
  return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

// Decode's fraction of a bandwidth: bytes read per token * tokens/s / (gbps * 1e9); NaN when the
// bandwidth was not measured (gbps <= 0).
double BandwidthFraction(double bytes_per_token, double tokens_per_s, double gbps) {
  return gbps > 0 ? bytes_per_token * tokens_per_s / (gbps * 1e9) : NAN;
}

struct TestResult {
  std::string test;  // "pp512", "tg128", "tg128x8" (8 sequences decoded together)
  bool prompt = true;
  int n = 0;
  int depth = 0;
  int batch = 1;  // tg: sequences decoded in each step; tokens/s counts every sequence's tokens
  std::vector<double> samples_ns, samples_ts;
  double median_ts = 0, avg_ts = 0, stddev_ts = 0;
  // tg only
  size_t weight_bytes = 0, kv_bytes = 0;  // per token (KV: mean over the run's steps)
  // The bandwidth samples taken right after each repetition (empty when they are taken once at
  // the end), and the fractions: bytes per token * tokens/s / copy (read) bandwidth, per
  // repetition against its own sample and their median, else the median tokens/s against the
  // one sample; -1 = not measured.
  std::vector<BandwidthSample> bw_samples;
  std::vector<double> fraction_samples, read_fraction_samples;
  double bandwidth_fraction = -1;
  double read_bandwidth_fraction = -1;
};

void Summarize(TestResult* r) {
  const std::vector<double>& s = r->samples_ts;
  const size_t k = s.size();
  r->median_ts = Median(s);
  double sum = 0, sq = 0;
  for (double v : s) sum += v;
  r->avg_ts = k ? sum / k : 0;
  for (double v : s) sq += (v - r->avg_ts) * (v - r->avg_ts);
  r->stddev_ts = k > 1 ? std::sqrt(sq / (k - 1)) : 0;
}

// GGUF general.file_type (llama.cpp's llama_ftype numbering) as the usual short name; `fallback`
// for values not listed.
std::string GgufFileTypeName(int64_t ftype, const std::string& fallback) {
  static const std::map<int64_t, std::string> kNames = {
      {0, "F32"},     {1, "F16"},     {2, "Q4_0"},    {3, "Q4_1"},    {7, "Q8_0"},    {8, "Q5_0"},
      {9, "Q5_1"},    {10, "Q2_K"},   {11, "Q3_K_S"}, {12, "Q3_K_M"}, {13, "Q3_K_L"}, {14, "Q4_K_S"},
      {15, "Q4_K_M"}, {16, "Q5_K_S"}, {17, "Q5_K_M"}, {18, "Q6_K"},   {32, "BF16"}};
  auto it = kNames.find(ftype);
  return it == kNames.end() ? fallback : it->second;
}

// Adds to *spent what each op of `now` took beyond `before` (an earlier Backend::Profile snapshot).
void AddProfileSince(const std::vector<OpProfile>& before, const std::vector<OpProfile>& now, std::vector<OpProfile>* spent) {
  for (const OpProfile& p : now) {
    OpProfile d = p;
    for (const OpProfile& b : before)
      if (b.op == p.op && b.step_tokens == p.step_tokens) d.calls -= b.calls, d.seconds -= b.seconds;
    if (d.calls == 0) continue;
    auto it = std::find_if(spent->begin(), spent->end(),
                           [&](const OpProfile& s) { return s.op == d.op && s.step_tokens == d.step_tokens; });
    if (it == spent->end()) {
      spent->push_back(d);
    } else {
      it->calls += d.calls;
      it->seconds += d.seconds;
    }
  }
}

// Prints (stderr) where a test's time went, per op kind and step size (`tokens`: the step's
// tokens, 1 for decode; a prefill chunk otherwise), largest first: ms per token over `tokens`
// tokens, the share of the ops' summed time, calls in all, µs per call, and the GB/s (1e9 bytes)
// of weights an op that reads weights read while it ran (in prefill steps the matmuls are bound by
// arithmetic, not by this figure).
void PrintProfile(const std::string& test, std::vector<OpProfile> spent, double tokens) {
  std::sort(spent.begin(), spent.end(), [](const OpProfile& a, const OpProfile& b) { return a.seconds > b.seconds; });
  double total = 0;
  for (const OpProfile& p : spent) total += p.seconds;
  std::fprintf(stderr, "gemma4rt: profile of %s: %.3f ms per token in ops over %.0f tokens\n", test.c_str(),
               total * 1e3 / tokens, tokens);
  std::fprintf(stderr, "  %-40s %6s %9s %6s %8s %9s %7s\n", "op", "tokens", "ms/token", "share", "calls", "us/call", "GB/s");
  for (const OpProfile& p : spent) {
    char gbps[16] = "";
    if (p.weight_bytes > 0 && p.seconds > 0) std::snprintf(gbps, sizeof gbps, "%.1f", p.weight_bytes * p.calls / p.seconds / 1e9);
    std::fprintf(stderr, "  %-40s %6d %9.3f %5.1f%% %8lld %9.1f %7s\n", p.op.c_str(), p.step_tokens,
                 p.seconds * 1e3 / tokens, 100 * p.seconds / total, static_cast<long long>(p.calls),
                 p.seconds * 1e6 / p.calls, gbps);
  }
}

std::string TestName(const TestResult& r) {
  return r.test + (r.depth > 0 ? " @ d" + std::to_string(r.depth) : "");
}

std::string HumanCount(double n) {
  char buf[64];
  if (n >= 1e9) std::snprintf(buf, sizeof buf, "%.2f B", n / 1e9);
  else std::snprintf(buf, sizeof buf, "%.2f M", n / 1e6);
  return buf;
}

std::string HumanBytes(double b) {
  char buf[64];
  if (b >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1024.0 * 1024));
  return buf;
}



// Set in RunSweep's children, whose arguments name one cache type and one thread count: a child
// that still asked for a sweep (a flag RunSweep failed to replace) would fork without end.
constexpr const char* kSweepChildEnv = "GEMMA4RT_BENCH_SWEEP_CHILD";

// llama-bench's multi-letter flags that gemma4rt bench does not have, with what they do there:
// CLI11 would read `-ngl 99` as -n "gl" and `-mmp 1` as -m "mp", and name the wrong flag.
// InvalidArgument naming the first one in args (program name first; the values of app's options
// that take one are left alone).
Status CheckLlamaBenchOnlyFlags(const CLI::App& app, const std::vector<std::string>& args) {
  static const std::pair<const char*, const char*> kFlags[] = {
      {"-ngl", "GPU layers; gemma4rt runs on the CPU"},
      {"-pg", "prompt + generation tests; give -p and -n"},
      {"-ts", "tensor split across GPUs"},
      {"-ot", "tensor buffer overrides"},
      {"-oe", "second output format on stderr"},
      {"-nkvo", "KV cache kept off the GPU"},
      {"-dev", "devices; gemma4rt runs on the CPU"},
      {"-mmp", "mmap 0/1; gemma4rt has --mmap and --no-mmap"},
      {"-sm", "GPU split mode"},
      {"-mg", "main GPU"},
      {"-fa", "flash attention; gemma4rt's attention is always one fused pass over the cache"},
      {"-embd", "embeddings mode"},
      {"-nopo", "op offload to the GPU"},
  };
  for (size_t i = 1; i < args.size(); ++i) {
    for (const auto& [flag, what] : kFlags)
      if (args[i] == flag || args[i].rfind(std::string(flag) + "=", 0) == 0)
        return InvalidArgument(std::string(flag) + " is llama-bench's (" + what + "), not a gemma4rt bench flag; "
                               "gemma4rt bench takes -m -t -p -n -d -r -ub -ctk/-ctv -o/--json (see --help)");
    if (i + 1 < args.size() && TakesValue(app, args[i])) ++i;  // its value, as given
  }
  return OkStatus();
}

// `bench ARGS` once per prefill chunk of `ubatches`, KV cache type of `types` and thread count of
// `counts` (llama-bench's order: the thread count varies fastest, the chunk slowest), each in a
// child process (`/proc/self/exe bench ... --ubatch-size U --cache-type C -t T`), so that each
// loads the model itself and reports its own peak RSS, sharing this process's stderr, and its
// stdout (a table per run) unless `json`: then the children's objects are printed as one JSON
// array, as llama-bench's `-o json`.
// args: the command line as parsed (after RewriteLlamaSpellings; program name first); its
// -t/--threads, --cache-type and --ubatch-size options are replaced, the values of app's other
// options kept as given. Returns the first failing child's exit status (the rest are not run;
// with json the finished runs still print, as one array), else 0.
int RunSweep(const CLI::App& app, const std::vector<std::string>& args, const std::vector<int>& counts,
             const std::vector<std::string>& types, const std::vector<int>& ubatches, bool json) {
  std::vector<std::string> rest;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-t" || a == "--threads" || a == "--cache-type" || a == "--ubatch-size") {
      ++i;  // and its value
      continue;
    }
    if (a.rfind("--threads=", 0) == 0 || a.rfind("--cache-type=", 0) == 0 || a.rfind("--ubatch-size=", 0) == 0 ||
        (a.size() > 2 && a.rfind("-t", 0) == 0 && a[2] != '-'))
      continue;  // -t1,2, --threads=1,2, --cache-type=f16,bf16, --ubatch-size=256,512 (-ub's rewrite)
    rest.push_back(a);
    if (i + 1 < args.size() && cli::TakesValue(app, a)) rest.push_back(args[++i]);  // its value, as given
  }
  std::vector<std::tuple<int, std::string, int>> runs;
  for (int ub : ubatches)
    for (const std::string& type : types)
      for (int t : counts) runs.emplace_back(ub, type, t);
  std::vector<std::string> objects;
  auto print_objects = [&] {
    if (!json) return;
    std::printf("[\n");
    for (size_t i = 0; i < objects.size(); ++i) std::printf("%s%s\n", objects[i].c_str(), i + 1 < objects.size() ? "," : "");
    std::printf("]\n");
    std::fflush(stdout);
  };
  for (const auto& [ub, type, t] : runs) {
    std::vector<std::string> child{"gemma4rt", "bench"};
    child.insert(child.end(), rest.begin(), rest.end());
    child.insert(child.end(), {"--ubatch-size", std::to_string(ub), "--cache-type", type, "-t", std::to_string(t)});
    std::vector<char*> cargs;
    for (std::string& a : child) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    std::fflush(nullptr);
    int out[2] = {-1, -1};
    if (json && pipe(out) != 0) return Fail(Internal(std::string("pipe: ") + std::strerror(errno)));
    const pid_t pid = fork();
    if (pid < 0) return Fail(Internal(std::string("fork: ") + std::strerror(errno)));
    if (pid == 0) {
      setenv(kSweepChildEnv, "1", 1);  // a child that would sweep again is refused (BenchMain)
      if (json) {
        dup2(out[1], STDOUT_FILENO);
        close(out[0]);
        close(out[1]);
      }
      execv("/proc/self/exe", cargs.data());
      std::fprintf(stderr, "gemma4rt bench: cannot run /proc/self/exe: %s\n", std::strerror(errno));
      _exit(127);
    }
    std::string text;
    if (json) {
      close(out[1]);
      char buf[65536];
      for (ssize_t n; (n = read(out[0], buf, sizeof buf)) != 0;) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        text.append(buf, static_cast<size_t>(n));
      }
      close(out[0]);
      while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    if (code != 0) {  // the runs that finished still print, as one valid array
      print_objects();
      return code;
    }
    if (json) objects.push_back(std::move(text));
  }
  print_objects();
  return 0;
}

}  // namespace

int BenchMain(int argc, char** argv) {

  CLI::App app{"gemma4rt bench: prompt-processing (pp) and generation (tg) throughput, llama-bench style"};
  std::string model = DefaultModelPath(), output = "md";
  int threads = 0;
  std::vector<int> n_prompt{512}, n_gen{128}, depths{0};
  int reps = 3, bw_mib = 1024, bw_iters = 5;
  std::vector<int> ubatches{512};
  uint64_t seed = 1234;
  bool json_flag = false, no_warmup = false, quality = false, f32_activations = false;
  std::string quantize;
  std::vector<std::string> cache_types{kDefaultCacheType};
  int ple_bits = 8, quality_tokens = 256;
  app.add_option("--quantize", quantize, "quantise an F32/F16/BF16 checkpoint at load: q8_0, q4_0 or w4a16")
      ->check(CLI::IsMember({"q8_0", "q4_0", "w4a16"}));
  bool mmap = false;
  app.add_flag("--mmap,!--no-mmap", mmap, kMmapFlagHelp);
  bool no_repack = false;
  app.add_flag("--no-repack", no_repack, kNoRepackFlagHelp);
  BackendOptions backend_choice;
  AddBackendFlags(&app, &backend_choice);
  app.add_option("--ple-bits", ple_bits, "with --quantize: bits of the embedding and PLE tables (8 = Q8_0, 16 = as stored)")
      ->check(CLI::IsMember({8, 16}));
  app.add_flag("--quality", quality, "compare the model as run (with --quantize, and int8 activations unless "
               "--f32-activations) with the model as stored in f32 activations on a fixed text (fixed token ids "
               "without a tokenizer): mean KL divergence, top-1 agreement, both perplexities (both with an f32 KV cache)");
  app.add_flag("--f32-activations", f32_activations, "multiply quantised and BF16 weights with f32 activations (transformers' "
               "arithmetic; slower) instead of int8 activation blocks and, where the CPU has a bf16 dot product, bf16 "
               "activations (llama.cpp's)");
  app.add_option("--quality-tokens", quality_tokens, "most tokens of the quality text")->check(CLI::Range(2, 1 << 16));
  std::vector<std::string> quality_cache;
  app.add_option("--quality-cache", quality_cache, "compare KV cache types (comma-separated, e.g. f16,bf16,q8) with an "
                 "f32 cache on --quality's text, the model as stored in f32 activations on both sides (the cache's "
                 "cost alone): mean KL, top-1 agreement and perplexities, one line (--json: object) per type; runs "
                 "alone (no pp/tg tests)")
      ->delimiter(',')->check(CLI::IsMember(kCacheTypeNames));
  app.add_option("-m,--model", model, "GGUF file or Hugging Face checkpoint directory (default: $GEMMA4RT_MODEL or the fetched Gemma 3 270M)");
  // llama-bench's -t takes a comma-separated list too (a fresh user's `-t 1,2` got CLI11's "Value
  // 1,2 not in range 0 to 1024"), and so do its -ctk/-ctv: RunSweep.
  std::vector<int> thread_list;
  app.add_option("-t,--threads", thread_list, "CPU threads (0 = all cores, the default); a comma-separated list runs "
                 "the whole bench once per count, each in its own process (--json: an array of their objects)")
      ->delimiter(',')->check(CLI::Range(0, 1024));
  app.add_option("--cache-type", cache_types, std::string(kCacheTypeHelp) + "; a comma-separated list (or -ctk f16,bf16) "
                 "runs the whole bench once per type, each in its own process, as -t lists do")
      ->delimiter(',')->check(CLI::IsMember(kCacheTypeNames));
  app.add_option("-p,--n-prompt", n_prompt, "prompt tokens per pp test, comma-separated list (0 = no pp test)")
      ->delimiter(',')->check(CLI::Range(0, 1 << 20));
  app.add_option("-n,--n-gen", n_gen, "generated tokens per tg test, comma-separated list (0 = no tg test)")
      ->delimiter(',')->check(CLI::Range(0, 1 << 20));
  app.add_option("-d,--depth,--n-depth", depths, "tokens already in the KV cache before measuring, comma-separated list "
                 "(clamped to the model's context)")->delimiter(',')->check(CLI::Range(0, 1 << 24));
  std::vector<int> batches{1};
  app.add_option("--decode-batch", batches, "sequences decoded together in each tg test (batched decode steps), "
                 "comma-separated list; tokens/s counts every sequence's tokens")
      ->delimiter(',')->check(CLI::Range(1, 4096));
  app.add_option("-r,--repetitions", reps, "repetitions of each test; the median is reported")->check(CLI::Range(1, 1000));
  app.add_option("--ubatch-size", ubatches, "prefill chunk in tokens (Engine prefill_chunk; -ub works too); a "
                 "comma-separated list runs the whole bench once per size, each in its own process")
      ->delimiter(',')->check(CLI::Range(1, 1 << 20));
  app.add_option("-o,--output", output, "output format: md (table) or json")->check(CLI::IsMember({"md", "json"}));
  app.add_flag("--json", json_flag, "same as -o json: one JSON object on stdout");
  app.add_option("--seed", seed, "seed of the random token ids");
  app.add_flag("--no-warmup", no_warmup, "skip the warm-up run");
  bool profile = false;
  app.add_flag("--profile", profile, "time every op of every step and print, after each test, where its time went, on "
               "stderr: per op kind and step size (tokens per step), ms per token, share, calls, us per call and the GB/s "
               "of weights read; costs two clock reads per op");
  app.add_option("--bw-mib", bw_mib, "buffer size of the memory-bandwidth tests (copy and read) in MiB, run after each "
                 "tg repetition with two such buffers; the peak RSS (VmHWM, and getrusage's ru_maxrss with it) is reset "
                 "around them so that they are not counted (0 = skip)")->check(CLI::Range(0, 1 << 20));
  app.add_option("--bw-iterations", bw_iters, "passes of each bandwidth test (the best is kept)")->check(CLI::Range(1, 100));
  // llama-bench's two-letter short options are not CLI11 short options: rename them (-ub, and
  // -ctk/-ctv with llama.cpp's other cache-type spellings), leaving option values as given.
  std::vector<std::string> args{"gemma4rt bench"};
  args.insert(args.end(), argv, argv + argc);
  auto rewritten = RewriteLlamaSpellings(app, args, "-ub", "--ubatch-size", /*cache_type_lists=*/true);
  if (!rewritten.ok()) return FailUsage(rewritten.status());
  if (Status st = CheckLlamaBenchOnlyFlags(app, *rewritten); !st.ok()) return FailUsage(st);
  std::vector<char*> cargv;
  for (std::string& a : *rewritten) cargv.push_back(a.data());
  try {
    app.parse(static_cast<int>(cargv.size()), cargv.data());
  } catch (const CLI::ParseError& e) {
    return ExitOnParseError(app, e);
  }
  if (thread_list.size() > 1 || cache_types.size() > 1 || ubatches.size() > 1) {
    if (std::getenv(kSweepChildEnv) != nullptr)
      return Fail(Internal("a bench child of a -t, cache-type or -ub list asked for another list; refusing to fork again"));
    if (thread_list.empty()) thread_list.push_back(0);
    return RunSweep(app, *rewritten, thread_list, cache_types, ubatches, json_flag || output == "json");
  }
  const int ubatch = ubatches.empty() ? 512 : ubatches[0];
  if (!thread_list.empty()) threads = thread_list[0];
  const std::string cache_type = cache_types.empty() ? kDefaultCacheType : cache_types[0];
  threads = ResolveThreadCount(threads);
  const bool json = json_flag || output == "json";
  // The bandwidth tests run right after each tg repetition, so that each repetition's fraction is
  // taken against the bandwidth of the same moment (this VM's moves by a third from minute to
  // minute), when their buffers can be left out of the peak RSS: VmHWM is read before each test
  // and reset after it. Where the reset is refused, they run once, after the tests.
  const size_t bw_bytes = static_cast<size_t>(bw_mib) << 20;
  if (const size_t avail = MemAvailableBytes(); bw_bytes > 0 && avail > 0 && 2 * bw_bytes > avail) {
    return Fail(InvalidArgument("--bw-mib " + std::to_string(bw_mib) + " needs two buffers of " + std::to_string(bw_mib) +
                                " MiB, more than the " + std::to_string(avail >> 20) +
                                " MiB of memory available (MemAvailable); 1024, the default, or 0 to skip"));
  }
  if (bw_mib > 0 && bw_mib < 256) {
    std::fprintf(stderr, "gemma4rt: note: --bw-mib %d: buffers this small are partly served from the caches, so the "
                 "bandwidth figures overstate memory's (256 or more measure memory)\n", bw_mib);
  }
  const bool bw_each_rep = bw_bytes > 0 && ResetPeakRss();
  size_t peak_rss_seen = 0;  // the largest VmHWM read before a reset

  auto dedupe = [](std::vector<int>& v) {
    std::vector<int> out;
    for (int x : v)
      if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
    v = out;
  };
  n_prompt.erase(std::remove(n_prompt.begin(), n_prompt.end(), 0), n_prompt.end());
  n_gen.erase(std::remove(n_gen.begin(), n_gen.end(), 0), n_gen.end());
  dedupe(n_prompt);
  dedupe(n_gen);
  if (n_prompt.empty() && n_gen.empty() && !quality && quality_cache.empty())
    return FailUsage(InvalidArgument("nothing to measure: -p and -n are both 0"));
  LoadOptions load_options;
  load_options.ple_bits = ple_bits;
  load_options.mmap = mmap;
  load_options.copy_progress = TerminalCopyProgress("gemma4rt");
  if (auto q = ParseQuantizeFlag(quantize); q.ok()) load_options.quantize = *q;
  else return FailUsage(q.status());
  backend_choice.f32_activations = f32_activations;
  load_options.pack_q4_0 = PackQ4_0For(backend_choice, no_repack);
  if (quality && !load_options.quantize && f32_activations)
    return FailUsage(InvalidArgument("--quality compares with the model as stored in f32 activations: give --quantize "
                                     "q8_0|q4_0|w4a16, or leave out --f32-activations to measure int8 activations alone"));
  if (quantize.empty()) quantize = f32_activations ? "none" : "none+int8-activations";

  if (!std::filesystem::exists(model))
    return Fail(NotFound("model '" + model + "' does not exist" +
                         (model == DefaultModelFile() ? " (run scripts/fetch-default-model.sh to get the default model)" : "")));
  if (!quality_cache.empty()) {
    std::vector<DType> types;
    for (const std::string& t : quality_cache) {
      auto type = ParseCacheType(t);
      if (!type.ok()) return Fail(type.status());
      types.push_back(*type);
    }
    auto results = MeasureCacheQuality(model, threads, ubatch, quality_tokens, types);
    if (!results.ok()) return Fail(results.status());
    nlohmann::json arr = nlohmann::json::array();
    for (size_t i = 0; i < types.size(); ++i) {
      const QualityResult& q = (*results)[i];
      if (json) {
        arr.push_back({{"cache_type", quality_cache[i]}, {"reference", "f32"}, {"positions", q.tokens},
                       {"tokens", q.token_source}, {"mean_kl", q.mean_kl}, {"max_kl", q.max_kl},
                       {"top1_agreement", q.top1_agreement}, {"perplexity_reference", q.ppl_ref},
                       {"perplexity_cache", q.ppl_quant}});
      } else {
        std::printf("cache quality (%s vs f32 cache, model as stored, f32 activations; %d positions of the fixed %s): "
                    "mean KL %.6g nats/token (max %.4g), top-1 agreement %.2f%%, perplexity %.4f -> %.4f\n",
                    quality_cache[i].c_str(), q.tokens, q.token_source == "text" ? "text" : "token ids", q.mean_kl,
                    q.max_kl, 100 * q.top1_agreement, q.ppl_ref, q.ppl_quant);
      }
    }
    if (json) std::printf("%s\n", nlohmann::json{{"model", model}, {"cache_quality", arr}}.dump(1).c_str());
    return 0;
  }
  std::optional<QualityResult> quality_result;
  // What the compared side is: the model quantised at load, or (no --quantize) only its activations.
  const char* quality_label = load_options.quantize ? "quantised" : "with int8 activations";
  if (quality) {
    auto qr = MeasureQuality(model, load_options, threads, ubatch, quality_tokens, f32_activations);
    if (!qr.ok()) return Fail(qr.status());
    quality_result = *qr;
    std::fprintf(stderr, "gemma4rt: bench quality (%s, %d positions of %s): mean KL %.6g nats, top-1 agreement %.4f, "
                 "perplexity %.4f as stored, %.4f %s\n", quantize.c_str(), qr->tokens, qr->token_source.c_str(),
                 qr->mean_kl, qr->top1_agreement, qr->ppl_ref, qr->ppl_quant, quality_label);
  }
  auto print_quality = [&] {
    if (!quality_result || json) return;
    const QualityResult& q = *quality_result;
    const std::string ple = quantize.rfind("none", 0) == 0 ? "" : ", ple-bits " + std::to_string(ple_bits);
    std::printf("quality (%s%s, vs as stored; %d positions of the fixed %s): mean KL %.6g nats/token (max %.4g), "
                "top-1 agreement %.2f%%, perplexity %.4f as stored -> %.4f %s\n",
                quantize.c_str(), ple.c_str(), q.tokens, q.token_source == "text" ? "text" : "token ids", q.mean_kl, q.max_kl,
                100 * q.top1_agreement, q.ppl_ref, q.ppl_quant, quality_label);
  };
  auto quality_json = [&]() -> nlohmann::json {
    if (!quality_result) return nullptr;
    const QualityResult& q = *quality_result;
    return {{"quantize", quantize}, {"ple_bits", ple_bits}, {"positions", q.tokens}, {"tokens", q.token_source},
            {"mean_kl", q.mean_kl}, {"max_kl", q.max_kl}, {"top1_agreement", q.top1_agreement},
            {"perplexity_reference", q.ppl_ref}, {"perplexity_quantized", q.ppl_quant}};
  };
  if (n_prompt.empty() && n_gen.empty()) {  // --quality only
    if (json) {
      nlohmann::json out;
      out["model"] = model;
      out["quality"] = quality_json();
      std::printf("%s\n", out.dump(1).c_str());
    } else {
      print_quality();
    }
    return 0;
  }
  auto loaded_or = LoadModel(model, load_options);
  if (!loaded_or.ok()) return Fail(loaded_or.status());
  std::unique_ptr<LoadedModel> loaded = std::move(loaded_or).value();
  const ModelConfig config = loaded->config;
  const auto kv_type_or = ParseCacheType(cache_type);
  if (!kv_type_or.ok()) return Fail(kv_type_or.status());
  const DType kv_type = *kv_type_or;

  // Context: the deepest test plus its longest run, within the model's positions.
  const int longest = std::max(n_prompt.empty() ? 0 : *std::max_element(n_prompt.begin(), n_prompt.end()),
                               n_gen.empty() ? 0 : *std::max_element(n_gen.begin(), n_gen.end()));
  if (longest > config.max_position)
    return Fail(InvalidArgument("a test of " + std::to_string(longest) + " tokens exceeds the model's context (" +
                                std::to_string(config.max_position) + " positions)"));
  std::vector<std::string> clamp_notes;
  const int depth_limit = config.max_position - longest;
  for (int& d : depths) {
    if (d > depth_limit) {
      clamp_notes.push_back("depth " + std::to_string(d) + " clamped to " + std::to_string(depth_limit) +
                            " (model context " + std::to_string(config.max_position) + ")");
      d = depth_limit;
    }
  }
  dedupe(depths);
  const int max_depth = *std::max_element(depths.begin(), depths.end());
  const int context = max_depth + longest;

  const std::string weights_dtype = WeightsDescription(*loaded);
  backend_choice.threads = threads;
  backend_choice.profile = profile;
  auto backend = MakeBackend(backend_choice);
  if (!backend.ok()) return Fail(backend.status());
  char policy[1024];
  std::snprintf(policy, sizeof policy, "%s weights=%s memory=%s kv=%s threads=%d context=%d",
                DevicePolicyFields(**backend, backend_choice).c_str(), weights_dtype.c_str(), WeightsMemory(*loaded),
                cache_type.c_str(), threads, context);
  std::fprintf(stderr, "gemma4rt: device policy: %s\n", policy);
  for (const std::string& n : clamp_notes) std::fprintf(stderr, "gemma4rt: bench: %s\n", n.c_str());

  // Model description, like llama-bench's "gemma3 270M Q4_K".
  const std::vector<const Tensor*> tensors = BoundTensors(loaded->weights);
  double n_params = 0;
  std::map<std::string, size_t> bytes_by_dtype;
  for (const Tensor* t : tensors) {
    n_params += static_cast<double>(t->numel());
    bytes_by_dtype[std::string(DTypeName(t->dtype))] += t->nbytes;
  }
  std::string main_dtype =
      std::max_element(bytes_by_dtype.begin(), bytes_by_dtype.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
  if (loaded->gguf) main_dtype = GgufFileTypeName(loaded->gguf->GetInt("general.file_type", -1), main_dtype);
  char desc[128];
  std::snprintf(desc, sizeof desc, "%s %.0fM %s", config.family == ModelFamily::kGemma4 ? "gemma4" : "gemma3", n_params / 1e6,
                main_dtype.c_str());
  const size_t size_bytes = loaded->weights.total_bytes;
  const size_t weight_read = WeightBytesPerToken(*loaded);

  // Mapped weights (--mmap): read every page once so that no test pays for the first touch, with
  // progress on a terminal (no \r lines in logs); copied weights are in memory already.
  int last_pct = -1;
  const bool show_progress = size_bytes > (size_t{128} << 20) && !loaded->weights_copied && isatty(STDERR_FILENO);
  PrefaultWeights(*loaded, [&](double f) {
    const int pct = static_cast<int>(f * 100);
    if (!show_progress || pct == last_pct) return;
    last_pct = pct;
    std::fprintf(stderr, "\rgemma4rt: loading weights %3d%% of %.1f MiB", pct, size_bytes / 1048576.0);
    if (pct == 100) std::fprintf(stderr, "\n");
  });

  dedupe(batches);
  EngineOptions opts;
  opts.max_seqs = *std::max_element(batches.begin(), batches.end());
  opts.max_context = context;
  opts.prefill_chunk = ubatch;
  opts.kv_type = kv_type;
  auto engine_or = Engine::Create(std::move(loaded), std::move(*backend), opts);
  if (!engine_or.ok()) return Fail(engine_or.status());
  Engine& engine = **engine_or;

  const int vocab_limit = config.ple_dim > 0 ? std::min(config.vocab, config.ple_vocab) : config.vocab;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab_limit - 1);
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = dist(rng);
    return t;
  };
  std::vector<float> logits;
  const int32_t seq = 0;
  auto fill = [&](int depth, int batch = 1) -> Status {  // sequences 0 .. batch-1
    for (int s = 0; s < batch; ++s) {
      engine.ResetSequence(s);
      if (depth == 0) continue;
      const std::vector<int32_t> t = random_tokens(depth);
      G4_RETURN_IF_ERROR(engine.Prefill(s, t, /*all_logits=*/false, &logits));
    }
    return OkStatus();
  };
  auto decode_steps = [&](int n, int batch = 1) -> Status {  // n steps of sequences 0 .. batch-1
    std::vector<int32_t> seqs(batch), toks(batch);
    for (int s = 0; s < batch; ++s) seqs[s] = s;
    for (int i = 0; i < n; ++i) {
      for (int32_t& t : toks) t = dist(rng);
      G4_RETURN_IF_ERROR(engine.Decode(seqs, toks, &logits));
    }
    return OkStatus();
  };

  // Warm-up: compiles every step shape the timed runs use (prefill chunks, one-token decode).
  if (!no_warmup) {
    for (int p : n_prompt) {
      Status st = fill(0);
      if (st.ok()) st = engine.Prefill(seq, random_tokens(p), false, &logits);
      if (!st.ok()) return Fail(st);
    }
    if (!n_gen.empty()) {
      // Two steps, or as many as the longest tg test when that is shorter (the context is sized
      // for the longest test: `-n 1` has room for one).
      const int warm = std::min(2, *std::max_element(n_gen.begin(), n_gen.end()));
      for (int b : batches) {
        Status st = fill(0, b);
        if (st.ok()) st = decode_steps(warm, b);
        if (!st.ok()) return Fail(st);
      }
    }
  }

  // As llama-bench: an n_ubatch column where the prefill chunk is not its default 512, type_k and
  // type_v columns where the cache is not its default f16.
  std::string extra_head, extra_sep, extra_cells;
  if (ubatch != 512) {
    char cell[32];
    std::snprintf(cell, sizeof cell, " %8d |", ubatch);
    extra_head += " n_ubatch |", extra_sep += " -------: |", extra_cells += cell;
  }
  if (cache_type != "f16") {
    char cells[64];
    std::snprintf(cells, sizeof cells, " %6s | %6s |", cache_type.c_str(), cache_type.c_str());
    extra_head += " type_k | type_v |", extra_sep += " -----: | -----: |", extra_cells += cells;
  }
  if (!json) {
    std::printf("| %-24s | %10s | %10s | %-7s | %7s |%s %16s | %20s |\n", "model", "size", "params", "backend", "threads",
                extra_head.c_str(), "test", "t/s (median)");
    std::printf("| %s | %s: | %s: | %s | %s: |%s %s: | %s: |\n", std::string(24, '-').c_str(), std::string(9, '-').c_str(),
                std::string(9, '-').c_str(), std::string(7, '-').c_str(), std::string(6, '-').c_str(),
                extra_sep.c_str(), std::string(15, '-').c_str(), std::string(19, '-').c_str());
    std::fflush(stdout);
  }

  std::vector<TestResult> results;
  auto report = [&](const TestResult& r) {
    if (json) {
      std::fprintf(stderr, "gemma4rt: bench %s: %.2f t/s (median of %zu)\n", TestName(r).c_str(), r.median_ts, r.samples_ts.size());
    } else {
      char ts[64];
      std::snprintf(ts, sizeof ts, "%.2f ± %.2f", r.median_ts, r.stddev_ts);  // "±" is 2 bytes, 1 column
      std::printf("| %-24s | %10s | %10s | %-7s | %7d |%s %16s | %21s |\n", desc, HumanBytes(static_cast<double>(size_bytes)).c_str(),
                  HumanCount(n_params).c_str(), backend_choice.backend == "cpu" ? "CPU" : "XLA", threads, extra_cells.c_str(),
                  TestName(r).c_str(), ts);
      std::fflush(stdout);
    }
  };

  // --profile: the op times of the current test's timed steps only (not the depth fills).
  std::vector<OpProfile> profile_spent, profile_snap;
  auto profile_start = [&] {
    if (profile) profile_snap = engine.backend().Profile();
  };
  auto profile_stop = [&] {
    if (profile) AddProfileSince(profile_snap, engine.backend().Profile(), &profile_spent);
  };
  for (int depth : depths) {
    for (int p : n_prompt) {
      profile_spent.clear();
      TestResult r;
      r.test = "pp" + std::to_string(p);
      r.prompt = true;
      r.n = p;
      r.depth = depth;
      for (int rep = 0; rep < reps; ++rep) {
        Status st = fill(depth);
        if (!st.ok()) return Fail(st);
        const std::vector<int32_t> tokens = random_tokens(p);
        profile_start();
        const auto t0 = Clock::now();
        st = engine.Prefill(seq, tokens, /*all_logits=*/false, &logits);
        const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
        profile_stop();
        if (!st.ok()) return Fail(st);
        r.samples_ns.push_back(ns);
        r.samples_ts.push_back(p / (ns * 1e-9));
      }
      Summarize(&r);
      report(r);
      if (profile) PrintProfile(TestName(r), profile_spent, static_cast<double>(p) * reps);
      results.push_back(r);
    }
    for (int n : n_gen) for (int batch : batches) {
      profile_spent.clear();
      TestResult r;
      r.test = "tg" + std::to_string(n) + (batch > 1 ? "x" + std::to_string(batch) : "");
      r.prompt = false;
      r.n = n;
      r.depth = depth;
      r.batch = batch;
      for (int rep = 0; rep < reps; ++rep) {
        Status st = fill(depth, batch);
        if (!st.ok()) return Fail(st);
        profile_start();
        const auto t0 = Clock::now();
        st = decode_steps(n, batch);
        const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
        profile_stop();
        if (!st.ok()) return Fail(st);
        r.samples_ns.push_back(ns);
        r.samples_ts.push_back(static_cast<double>(n) * batch / (ns * 1e-9));
        if (bw_each_rep) {
          peak_rss_seen = std::max(peak_rss_seen, PeakRssBytes());
          r.bw_samples.push_back(MeasureBandwidth(bw_bytes, threads, bw_iters));
          ResetPeakRss();
        }
      }
      Summarize(&r);
      r.weight_bytes = weight_read / batch;  // one read of the weights per step, shared by its tokens
      double kv = 0;
      for (int i = 0; i < n; ++i) kv += static_cast<double>(KvBytesRead(config, static_cast<int64_t>(depth) + i + 1, kv_type));
      r.kv_bytes = static_cast<size_t>(kv / n);
      const double bytes_per_token = static_cast<double>(r.weight_bytes + r.kv_bytes);
      for (size_t i = 0; i < r.bw_samples.size(); ++i) {  // NaN (null in --json): the test could not run
        r.fraction_samples.push_back(BandwidthFraction(bytes_per_token, r.samples_ts[i], r.bw_samples[i].copy_gbps));
        r.read_fraction_samples.push_back(BandwidthFraction(bytes_per_token, r.samples_ts[i], r.bw_samples[i].read_gbps));
      }
      if (const double f = Median(r.fraction_samples); f > 0) {
        r.bandwidth_fraction = f;
        r.read_bandwidth_fraction = Median(r.read_fraction_samples);
      }
      report(r);
      if (profile) PrintProfile(TestName(r), profile_spent, static_cast<double>(n) * batch * reps);
      results.push_back(r);
    }
  }
  for (int s = 0; s < opts.max_seqs; ++s) engine.ResetSequence(s);

  // Peak memory of the benchmark itself, without the bandwidth tests' buffers, and the budget it is
  // held to: the weights as stored plus the KV cache this run allocated, plus 10%.
  const size_t peak_rss = std::max(peak_rss_seen, PeakRssBytes());
  const size_t kv_cache_bytes = engine.cache().bytes();
  const size_t rss_budget = static_cast<size_t>(static_cast<double>(size_bytes + kv_cache_bytes) * 1.1);
  // The machine's bandwidth: the median of the samples taken after the tg repetitions, or one
  // sample now (no tg test, or no VmHWM reset), against which every tg test's median is taken.
  std::vector<BandwidthSample> all_samples;
  for (const TestResult& r : results) all_samples.insert(all_samples.end(), r.bw_samples.begin(), r.bw_samples.end());
  const bool bw_at_end = bw_bytes > 0 && all_samples.empty();
  if (bw_at_end) all_samples.push_back(MeasureBandwidth(bw_bytes, threads, bw_iters));
  std::vector<double> copy_gbps, read_gbps;
  for (const BandwidthSample& b : all_samples) {
    copy_gbps.push_back(b.copy_gbps > 0 ? b.copy_gbps : NAN);
    read_gbps.push_back(b.read_gbps > 0 ? b.read_gbps : NAN);
  }
  const double bw_gbps = Median(copy_gbps), read_bw_gbps = Median(read_gbps);
  if (bw_at_end) {
    for (TestResult& r : results) {
      if (r.prompt || r.median_ts <= 0) continue;
      const double bytes_per_token = static_cast<double>(r.weight_bytes + r.kv_bytes);
      if (bw_gbps > 0) r.bandwidth_fraction = BandwidthFraction(bytes_per_token, r.median_ts, bw_gbps);
      if (read_bw_gbps > 0) r.read_bandwidth_fraction = BandwidthFraction(bytes_per_token, r.median_ts, read_bw_gbps);
    }
  }

  // The headline fraction: the first tg test at depth 0, else the first tg test.
  const TestResult* tg0 = nullptr;
  for (const TestResult& r : results)
    if (!r.prompt && (!tg0 || (tg0->depth != 0 && r.depth == 0))) tg0 = &r;

  if (json) {
    nlohmann::json out;
    out["model"] = model;
    out["model_desc"] = desc;
    out["size_bytes"] = size_bytes;
    out["n_params"] = static_cast<int64_t>(n_params);
    out["backend"] = backend_choice.backend;
    out["device_policy"] = policy;
    out["threads"] = threads;
    out["ubatch"] = ubatch;
    out["n_ubatch"] = ubatch;  // llama-bench's names
    out["cache_type"] = cache_type;
    out["type_k"] = cache_type;
    out["type_v"] = cache_type;
    out["repetitions"] = reps;
    out["seed"] = seed;
    out["context"] = context;
    out["results"] = nlohmann::json::array();
    out["depths"] = nlohmann::json::object();
    for (const TestResult& r : results) {
      nlohmann::json j;
      j["test"] = r.test;
      j["depth"] = r.depth;
      j["n_prompt"] = r.prompt ? r.n : 0;
      j["n_gen"] = r.prompt ? 0 : r.n;
      j["batch"] = r.prompt ? 1 : r.batch;
      j["tokens_per_second"] = r.median_ts;
      j["avg_ts"] = r.avg_ts;
      j["stddev_ts"] = r.stddev_ts;
      j["samples_ts"] = r.samples_ts;
      j["samples_ns"] = r.samples_ns;
      if (!r.prompt) {
        j["weight_bytes_per_token"] = r.weight_bytes;
        j["kv_bytes_per_token"] = r.kv_bytes;
        j["bandwidth_fraction"] = r.bandwidth_fraction >= 0 ? nlohmann::json(r.bandwidth_fraction) : nlohmann::json(nullptr);
        j["read_bandwidth_fraction"] =
            r.read_bandwidth_fraction >= 0 ? nlohmann::json(r.read_bandwidth_fraction) : nlohmann::json(nullptr);
        if (!r.bw_samples.empty()) {
          std::vector<double> c, rd;
          for (const BandwidthSample& b : r.bw_samples) {
            c.push_back(b.copy_gbps);
            rd.push_back(b.read_gbps);
          }
          j["bandwidth_gbps_samples"] = c;
          j["read_bandwidth_gbps_samples"] = rd;
          j["bandwidth_fraction_samples"] = r.fraction_samples;
          j["read_bandwidth_fraction_samples"] = r.read_fraction_samples;
        }
      }
      out["results"].push_back(j);
      out["depths"][std::to_string(r.depth)][r.test] = r.median_ts;
      if (r.depth == 0) out[r.test] = r.median_ts;
    }
    out["peak_rss_bytes"] = peak_rss;
    out["weights_bytes"] = size_bytes;
    out["kv_cache_bytes"] = kv_cache_bytes;
    out["peak_rss_budget_bytes"] = rss_budget;
    out["peak_rss_within_budget"] = peak_rss > 0 && peak_rss <= rss_budget;
    // null where the tests did not run (--bw-mib 0), as the fractions.
    const auto gbps_json = [](double g) { return g > 0 ? nlohmann::json(g) : nlohmann::json(nullptr); };
    out["bandwidth_gbps"] = gbps_json(bw_gbps);
    // How a bandwidth figure was measured.
    const char* when = all_samples.empty() ? "not run" : bw_at_end ? "once, after the tests" : "after each tg repetition";
    const auto test_json = [&](const char* method) -> nlohmann::json {
      return {{"method", method}, {"buffer_bytes", bw_bytes}, {"threads", threads}, {"iterations", bw_iters},
              {"samples", all_samples.size()}, {"when", when}, {"figure", "median of the samples, each the best pass"}};
    };
    out["bandwidth_test"] = test_json("memcpy, (read + written bytes) / best time");
    out["bandwidth_fraction"] = tg0 && tg0->bandwidth_fraction >= 0 ? nlohmann::json(tg0->bandwidth_fraction) : nlohmann::json(nullptr);
    out["read_bandwidth_gbps"] = gbps_json(read_bw_gbps);
    out["read_bandwidth_test"] = test_json("sum of 64-bit words, prefetched 4 KiB ahead, bytes read / best time");
    out["read_bandwidth_fraction"] = tg0 && tg0->read_bandwidth_fraction >= 0
                                         ? nlohmann::json(tg0->read_bandwidth_fraction)
                                         : nlohmann::json(nullptr);
    if (!clamp_notes.empty()) out["notes"] = clamp_notes;
    if (quality_result) out["quality"] = quality_json();
    std::printf("%s\n", out.dump(1).c_str());
  } else {
    std::printf("\npeak RSS %s (VmHWM); weights %s + KV cache %s (context %d) + 10%% = %s: %s",
                HumanBytes(static_cast<double>(peak_rss)).c_str(), HumanBytes(static_cast<double>(size_bytes)).c_str(),
                HumanBytes(static_cast<double>(kv_cache_bytes)).c_str(), context,
                HumanBytes(static_cast<double>(rss_budget)).c_str(),
                peak_rss == 0 ? "not measured" : peak_rss <= rss_budget ? "within" : "OVER");
    if (bw_gbps > 0) {
      std::printf("; memcpy bandwidth %.2f GB/s (%d thread%s, %s buffers, read + written bytes", bw_gbps, threads,
                  threads == 1 ? "" : "s", HumanBytes(static_cast<double>(bw_bytes)).c_str());
      if (all_samples.size() > 1) std::printf("; median of %zu tests, one after each tg repetition", all_samples.size());
      std::printf(")");
    }
    if (read_bw_gbps > 0) std::printf("; read bandwidth %.2f GB/s (same threads and buffers)", read_bw_gbps);
    std::printf("\n");
    for (const TestResult& r : results) {
      if (r.prompt) continue;
      std::printf("%s: %.2f MiB read per token (weights %.2f + KV %.2f)", TestName(r).c_str(),
                  (r.weight_bytes + r.kv_bytes) / 1048576.0, r.weight_bytes / 1048576.0, r.kv_bytes / 1048576.0);
      if (r.bandwidth_fraction >= 0) std::printf(", %.1f%% of the bandwidth limit", 100 * r.bandwidth_fraction);
      if (r.read_bandwidth_fraction >= 0) std::printf(" (%.1f%% of the read bandwidth)", 100 * r.read_bandwidth_fraction);
      if (r.bw_samples.size() > 1) std::printf(", each repetition against the bandwidth measured right after it, median");
      std::printf("\n");
    }
    print_quality();
  }
  return 0;
}

}  // namespace g4::cli
