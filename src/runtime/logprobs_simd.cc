#include "runtime/logprobs_simd.h"

#include <algorithm>
#include <cmath>
#include <limits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "runtime/logprobs_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace g4 {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

bool LogitsMaxHwy(const float* HWY_RESTRICT x, size_t n, float* max) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  const auto inf = hn::Set(df, std::numeric_limits<float>::infinity());
  auto vmax = hn::Set(df, -std::numeric_limits<float>::infinity());
  auto bad = hn::FirstN(df, 0);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(df, x + i);
    bad = hn::Or(bad, hn::Or(hn::IsNaN(v), hn::Eq(v, inf)));
    vmax = hn::Max(vmax, v);
  }
  float m = hn::GetLane(hn::MaxOfLanes(df, vmax));
  if (!hn::AllFalse(df, bad)) return false;
  for (; i < n; ++i) {
    if (std::isnan(x[i]) || x[i] == std::numeric_limits<float>::infinity()) return false;
    m = std::max(m, x[i]);
  }
  *max = m;
  return true;
}

double SumExpShiftedHwy(const float* HWY_RESTRICT x, size_t n, float shift) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  const auto vshift = hn::Set(df, shift), lowest = hn::Set(df, -87.0f);
  const size_t kBlock = 256 * N;  // f32 sums of 256 terms per lane, then double
  double total = 0;
  size_t i = 0;
  while (i + N <= n) {
    const size_t end = std::min(n, i + kBlock);
    auto acc = hn::Zero(df);
    for (; i + N <= end; i += N)
      acc = hn::Add(acc, hn::Exp(df, hn::Max(hn::Sub(hn::LoadU(df, x + i), vshift), lowest)));
    total += hn::GetLane(hn::SumOfLanes(df, acc));
  }
  for (; i < n; ++i) total += std::exp(std::max(static_cast<double>(x[i]) - shift, -87.0));
  return total;
}

// best: sorted (value descending, index ascending), at most k; x[j] enters when it beats the last.
void Consider(const float* x, size_t j, size_t k, std::vector<std::pair<float, int32_t>>* best) {
  const float v = x[j];
  if (best->size() == k && !(v > best->back().first)) return;
  auto at = std::find_if(best->begin(), best->end(), [v](const auto& b) { return v > b.first; });
  best->insert(at, {v, static_cast<int32_t>(j)});
  if (best->size() > k) best->pop_back();
}

std::vector<std::pair<float, int32_t>> TopLogitsHwy(const float* HWY_RESTRICT x, size_t n, size_t k) {
  std::vector<std::pair<float, int32_t>> best;
  if (k == 0) return best;
  best.reserve(k + 1);
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i < n && best.size() < k; ++i) Consider(x, i, k, &best);
  for (; i + N <= n; i += N) {
    // Indices ascend, so an equal value never displaces an earlier one: only "greater" matters.
    if (hn::AllFalse(df, hn::Gt(hn::LoadU(df, x + i), hn::Set(df, best.back().first)))) continue;
    for (size_t j = i; j < i + N; ++j) Consider(x, j, k, &best);
  }
  for (; i < n; ++i) Consider(x, i, k, &best);
  return best;
}

}  // namespace HWY_NAMESPACE
}  // namespace g4
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace g4 {

HWY_EXPORT(LogitsMaxHwy);
HWY_EXPORT(SumExpShiftedHwy);
HWY_EXPORT(TopLogitsHwy);

bool LogitsMax(const float* x, size_t n, float* max) { return HWY_DYNAMIC_DISPATCH(LogitsMaxHwy)(x, n, max); }
double SumExpShifted(const float* x, size_t n, float shift) { return HWY_DYNAMIC_DISPATCH(SumExpShiftedHwy)(x, n, shift); }
std::vector<std::pair<float, int32_t>> TopLogits(const float* x, size_t n, size_t k) {
  return HWY_DYNAMIC_DISPATCH(TopLogitsHwy)(x, n, k);
}

}  // namespace g4
#endif  // HWY_ONCE
