// Internal to `gemma4rt bench`'s files (bench.cc, bench_memory.cc, bench_report.cc, bench_sweep.cc):
// peak memory and bandwidth measurement, test results and their report, -t/--cache-type/-ub sweeps.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/status.h"
#include "runtime/backend.h"

namespace g4::cli::bench_internal {

using Clock = std::chrono::steady_clock;

// Prints "gemma4rt: error: <s>" on stderr; returns 1, the exit code.
int Fail(const Status& s);

// Peak resident set (VmHWM) in bytes; 0 when /proc is unavailable.
size_t PeakRssBytes();

// One sample of the machine's memory bandwidth with `threads` threads, both tests on the same two
// `bytes` buffers (anonymous memory in 2 MiB pages where the kernel gives them, MADV_HUGEPAGE, as
// the copied weights are; written before timing so that page faults are not timed; unmapped on
// return), each the best of `iterations`:
//   copy: memcpy of one buffer into the other, split over the threads; GB/s counting the bytes
//     read + the bytes written (STREAM's accounting of a copy);
//   read: the threads sum the source buffer's 64-bit words (8 chains, which the compiler
//     vectorises; each line prefetched 4 KiB ahead, as the matmul kernels prefetch their next
//     tile); GB/s of bytes read: what a decode, which only reads its weights, can get.
// Neither is a hard ceiling for decode (its kernels can read faster than the read test). Zero
// bytes: nothing measured (all zero).
struct BandwidthSample {
  double copy_gbps = 0, read_gbps = 0;
  double copy_seconds = 0, read_seconds = 0;  // best times
};

// All zero (not measured) when the buffers cannot be mapped.
BandwidthSample MeasureBandwidth(size_t bytes, int threads, int iterations);

// MemAvailable from /proc/meminfo in bytes; 0 when unknown.
size_t MemAvailableBytes();

// Resets the peak resident set (VmHWM) to the current resident set: Linux >= 4.0's
// /proc/self/clear_refs "5". False where that is refused (then VmHWM keeps counting everything).
// Process-wide: getrusage's ru_maxrss (what `/usr/bin/time -v` prints) is reset with it, so
// outside tools see bench's peak without the bandwidth tests too.
bool ResetPeakRss();

// The median of the finite values of v (NaN marks a sample not measured); 0 when there are none.
double Median(std::vector<double> v);

// Decode's fraction of a bandwidth: bytes read per token * tokens/s / (gbps * 1e9); NaN when the
// bandwidth was not measured (gbps <= 0).
double BandwidthFraction(double bytes_per_token, double tokens_per_s, double gbps);

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

void Summarize(TestResult* r);

// GGUF general.file_type (llama.cpp's llama_ftype numbering) as the usual short name; `fallback`
// for values not listed.
std::string GgufFileTypeName(int64_t ftype, const std::string& fallback);

// Adds to *spent what each op of `now` took beyond `before` (an earlier Backend::Profile snapshot).
void AddProfileSince(const std::vector<OpProfile>& before, const std::vector<OpProfile>& now, std::vector<OpProfile>* spent);

// Prints (stderr) where a test's time went, per op kind and step size (`tokens`: the step's
// tokens, 1 for decode; a prefill chunk otherwise), largest first: ms per token over `tokens`
// tokens, the share of the ops' summed time, calls in all, µs per call, and the GB/s (1e9 bytes)
// of weights an op that reads weights read while it ran (in prefill steps the matmuls are bound by
// arithmetic, not by this figure).
void PrintProfile(const std::string& test, std::vector<OpProfile> spent, double tokens);

std::string TestName(const TestResult& r);

std::string HumanCount(double n);

std::string HumanBytes(double b);

// Set in RunSweep's children, whose arguments name one cache type and one thread count: a child
// that still asked for a sweep (a flag RunSweep failed to replace) would fork without end.
inline constexpr const char* kSweepChildEnv = "GEMMA4RT_BENCH_SWEEP_CHILD";

// llama-bench's multi-letter flags that gemma4rt bench does not have, with what they do there:
// CLI11 would read `-ngl 99` as -n "gl" and `-mmp 1` as -m "mp", and name the wrong flag.
// InvalidArgument naming the first one in args (program name first; the values of app's options
// that take one are left alone).
Status CheckLlamaBenchOnlyFlags(const CLI::App& app, const std::vector<std::string>& args);

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
             const std::vector<std::string>& types, const std::vector<int>& ubatches, bool json);

}  // namespace g4::cli::bench_internal
