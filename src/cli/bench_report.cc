// `gemma4rt bench`'s test results: medians, bandwidth fractions, names and units, op profiles.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "cli/bench_internal.h"

namespace g4::cli::bench_internal {

double Median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t k = v.size();
  return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

double BandwidthFraction(double bytes_per_token, double tokens_per_s, double gbps) {
  return gbps > 0 ? bytes_per_token * tokens_per_s / (gbps * 1e9) : NAN;
}

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

std::string GgufFileTypeName(int64_t ftype, const std::string& fallback) {
  static const std::map<int64_t, std::string> kNames = {
      {0, "F32"},     {1, "F16"},     {2, "Q4_0"},    {3, "Q4_1"},    {7, "Q8_0"},    {8, "Q5_0"},
      {9, "Q5_1"},    {10, "Q2_K"},   {11, "Q3_K_S"}, {12, "Q3_K_M"}, {13, "Q3_K_L"}, {14, "Q4_K_S"},
      {15, "Q4_K_M"}, {16, "Q5_K_S"}, {17, "Q5_K_M"}, {18, "Q6_K"},   {32, "BF16"}};
  auto it = kNames.find(ftype);
  return it == kNames.end() ? fallback : it->second;
}

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

}  // namespace g4::cli::bench_internal
