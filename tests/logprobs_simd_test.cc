// runtime/logprobs_simd.h on every SIMD target this machine runs (hwy::SetSupportedTargetsForTest,
// as KernelsTest), against scalar definitions: the row maximum with NaN/+inf detection at any
// position, the sum of exponentials, and the top k with ties by index.
#include "backends/cpu/simd_cap.h"
#include "runtime/logprobs_simd.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "hwy/highway.h"
#include "hwy/targets.h"

namespace g4 {
namespace {

class LogprobsSimdTest : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { hwy::SetSupportedTargetsForTest(GetParam()); }
  void TearDown() override { cpu::ResetSimdTargetsForTest(); }
};

INSTANTIATE_TEST_SUITE_P(Targets, LogprobsSimdTest, ::testing::ValuesIn(hwy::SupportedAndGeneratedTargets()),
                         [](const ::testing::TestParamInfo<int64_t>& info) { return std::string(hwy::TargetName(info.param)); });

// Rows of every length up to 70 and a few long ones; values on a coarse grid (many ties), some
// -inf.
std::vector<std::vector<float>> Rows() {
  std::mt19937 rng(7);
  std::vector<std::vector<float>> rows;
  std::vector<size_t> sizes(70);
  std::iota(sizes.begin(), sizes.end(), 1);
  for (size_t n : {4095, 4096, 4097, 8193, 70001}) sizes.push_back(n);
  for (size_t n : sizes) {
    std::vector<float> r(n);
    for (float& x : r) {
      const int u = static_cast<int>(rng() % 64);
      x = u == 0 ? -std::numeric_limits<float>::infinity() : static_cast<float>(u % 17) * 0.5f - 3.0f;
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

TEST_P(LogprobsSimdTest, MatchesTheScalarDefinitions) {
  for (const std::vector<float>& r : Rows()) {
    const size_t n = r.size();
    float mx = 0.0f;
    ASSERT_TRUE(LogitsMax(r.data(), n, &mx)) << n;
    EXPECT_EQ(mx, *std::max_element(r.begin(), r.end())) << n;
    double sum = 0;
    for (float x : r) sum += std::exp(static_cast<double>(x) - mx);
    EXPECT_NEAR(SumExpShifted(r.data(), n, mx), sum, 2e-5 * sum) << n;
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return r[a] > r[b]; });
    for (size_t k : {size_t{0}, size_t{1}, size_t{2}, size_t{5}, size_t{20}}) {
      if (k > n) continue;
      const auto top = TopLogits(r.data(), n, k);
      ASSERT_EQ(top.size(), k) << n;
      for (size_t i = 0; i < k; ++i) {
        EXPECT_EQ(top[i].second, order[i]) << n << " k " << k << " rank " << i;
        EXPECT_EQ(top[i].first, r[order[i]]);
      }
    }
  }
}

TEST_P(LogprobsSimdTest, ANanOrPlusInfAnywhereIsFound) {
  for (size_t n : {1, 3, 16, 17, 33, 64, 100, 4097}) {
    for (size_t at : {size_t{0}, n / 2, n - 1}) {
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        std::vector<float> r(n, 1.0f);
        r[at] = bad;
        float mx = 0.0f;
        EXPECT_FALSE(LogitsMax(r.data(), n, &mx)) << n << " at " << at << " " << bad;
      }
    }
  }
}

}  // namespace
}  // namespace g4
