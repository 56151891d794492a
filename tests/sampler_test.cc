// Sampler: exact token ids on hand-made logits for greedy, each filter, each penalty and
// suppression; seed reproducibility; the drawn frequencies against the distribution; Validate()
// errors naming the parameter.
#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

namespace g4 {
namespace {

using Ids = std::vector<int32_t>;

Sampler Make(const SamplingParams& p) {
  auto s = Sampler::Create(p);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

int32_t SampleOnce(const SamplingParams& p, const std::vector<float>& logits, const Ids& prompt = {},
                   const Ids& output = {}) {
  Sampler s = Make(p);
  auto t = s.Sample(logits, prompt, output);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? *t : -1;
}

// Logits whose softmax is exactly proportional to `probs`.
std::vector<float> LogitsOf(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

// The set of tokens drawn in `n` draws (fixed seed).
std::set<int32_t> Support(SamplingParams p, const std::vector<float>& logits, int n = 2000) {
  p.seed = 7;
  Sampler s = Make(p);
  std::set<int32_t> seen;
  for (int i = 0; i < n; ++i) {
    auto t = s.Sample(logits, {}, {});
    EXPECT_TRUE(t.ok());
    seen.insert(*t);
  }
  return seen;
}

SamplingParams Greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

TEST(SamplerTest, LogprobsAreTheLogSoftmaxOfTheRawLogits) {
  // logits 1, 2, 3, 2, -inf: the sum of exponentials e + 2e^2 + e^3.
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 2.0f, -inf};
  const double lse = std::log(std::exp(1.0) + 2 * std::exp(2.0) + std::exp(3.0));
  auto lp = ComputeLogprobs(logits, 1, 3);
  ASSERT_TRUE(lp.ok()) << lp.status().ToString();
  EXPECT_EQ(lp->id, 1);
  EXPECT_NEAR(lp->logprob, 2.0 - lse, 1e-6);
  // The best three: id 2, then the tie at 2.0 with the lower id first (1 before 3).
  ASSERT_EQ(lp->top.size(), 3u);
  EXPECT_EQ(lp->top[0].first, 2);
  EXPECT_EQ(lp->top[1].first, 1);
  EXPECT_EQ(lp->top[2].first, 3);
  EXPECT_NEAR(lp->top[0].second, 3.0 - lse, 1e-6);
  EXPECT_EQ(lp->top[1].second, lp->logprob);
  EXPECT_EQ(lp->top[2].second, lp->logprob);
  // More than the finite logits: the -inf one last, at -inf; none asked: no list.
  auto all = ComputeLogprobs(logits, 4, 5);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->logprob, -inf);
  ASSERT_EQ(all->top.size(), 5u);
  EXPECT_EQ(all->top[4].first, 4);
  EXPECT_EQ(all->top[3].first, 0);
  EXPECT_TRUE(ComputeLogprobs(logits, 0, 0)->top.empty());
  // Probabilities sum to 1; a large vocabulary of large logits stays exact (the max shift).
  double mass = 0;
  for (int32_t i = 0; i < 5; ++i) mass += std::exp(static_cast<double>(ComputeLogprobs(logits, i, 0)->logprob));
  EXPECT_NEAR(mass, 1.0, 1e-6);
  std::vector<float> big(262144);
  double big_sum = 0;
  for (size_t i = 0; i < big.size(); ++i) {
    big[i] = 80.0f + static_cast<float>(i % 97) * 0.25f;
    big_sum += std::exp(static_cast<double>(big[i]) - 104.0);
  }
  auto b = ComputeLogprobs(big, 96, 20);
  ASSERT_TRUE(b.ok());
  EXPECT_NEAR(b->logprob, -std::log(big_sum), 1e-5);
  EXPECT_EQ(b->top[0].first, 96);  // the first id at the highest logit, 80 + 96 * 0.25
  EXPECT_EQ(b->top[1].first, 96 + 97);
  EXPECT_EQ(b->top[0].second, b->logprob);
  // Errors: empty row, id or count out of range, NaN and +inf logits.
  EXPECT_EQ(ComputeLogprobs({}, 0, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeLogprobs(logits, 5, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeLogprobs(logits, -1, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeLogprobs(logits, 0, kMaxTopLogprobs + 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeLogprobs(logits, 0, -1).status().code(), StatusCode::kInvalidArgument);
  std::vector<float> bad = logits;
  bad[1] = std::nanf("");
  EXPECT_EQ(ComputeLogprobs(bad, 0, 0).status().code(), StatusCode::kInternal);
  bad[1] = inf;
  EXPECT_EQ(ComputeLogprobs(bad, 0, 0).status().code(), StatusCode::kInternal);
  EXPECT_EQ(ComputeLogprobs(std::vector<float>{-inf, -inf}, 0, 1).status().code(), StatusCode::kInvalidArgument);
}

TEST(SamplerTest, GreedyIsArgmaxWithTiesToLowestId) {
  EXPECT_EQ(SampleOnce(Greedy(), {1.0f, 3.0f, 2.0f}), 1);
  EXPECT_EQ(SampleOnce(Greedy(), {1.0f, 3.0f, 2.0f, 3.0f}), 1);
  EXPECT_EQ(SampleOnce(Greedy(), {-5.0f, -5.0f}), 0);
  Sampler s = Make(Greedy());
  EXPECT_TRUE(s.greedy());
  // A temperature so small that 1/T overflows behaves as its limit, greedy.
  SamplingParams tiny;
  tiny.temperature = 1e-45f;
  EXPECT_EQ(SampleOnce(tiny, {1.0f, 3.0f, 2.0f}), 1);
}

TEST(SamplerTest, GreedyIgnoresSeedAndFilters) {
  SamplingParams p = Greedy();
  p.top_k = 2;
  p.top_p = 0.1f;
  p.min_p = 0.9f;
  p.seed = 1;
  EXPECT_EQ(SampleOnce(p, {0.5f, 0.1f, 2.5f}), 2);
}

TEST(SamplerTest, SuppressTokensAppliesToGreedyAndSampling) {
  SamplingParams p = Greedy();
  p.suppress_tokens = {1, 3};
  EXPECT_EQ(SampleOnce(p, {1.0f, 9.0f, 2.0f, 9.0f}), 2);
  SamplingParams q;
  q.suppress_tokens = {0};
  EXPECT_EQ(Support(q, {10.0f, 0.0f, 0.0f}), (std::set<int32_t>{1, 2}));
}

TEST(SamplerTest, LogitBiasAddsAndCannotRevive) {
  SamplingParams p = Greedy();
  p.logit_bias = {{0, 5.0f}};
  EXPECT_EQ(SampleOnce(p, {1.0f, 3.0f, 2.0f}), 0);  // 1 + 5 > 3
  p.logit_bias = {{1, -100.0f}};
  EXPECT_EQ(SampleOnce(p, {1.0f, 3.0f, 2.0f}), 2);
  p.logit_bias = {{1, 100.0f}};
  p.suppress_tokens = {1};
  EXPECT_EQ(SampleOnce(p, {1.0f, 3.0f, 2.0f}), 2);  // suppression wins over a positive bias
}

TEST(SamplerTest, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  SamplingParams p = Greedy();
  p.repetition_penalty = 1.1f;
  // Positive: 2.0 / 1.1 = 1.818 < 1.9.
  EXPECT_EQ(SampleOnce(p, {2.0f, 1.9f}, /*prompt=*/{0}), 1);
  // Negative: -1.0 * 1.1 = -1.1 < -1.05.
  EXPECT_EQ(SampleOnce(p, {-1.0f, -1.05f}, {}, /*output=*/{0}), 1);
  // Applied once per distinct id: three occurrences still give 1.818 > 1.7 (not 2/1.1^3 = 1.503).
  EXPECT_EQ(SampleOnce(p, {2.0f, 1.7f}, {0, 0}, {0}), 0);
  // Unpenalised without history.
  EXPECT_EQ(SampleOnce(p, {2.0f, 1.9f}), 0);
  // A penalty < 1 rewards repetition: 1.0 / 0.5 = 2 > 1.5.
  p.repetition_penalty = 0.5f;
  EXPECT_EQ(SampleOnce(p, {1.0f, 1.5f}, {0}), 0);
}

// repetition_window (llama-server's repeat_last_n): only the last N tokens of prompt + output
// are penalised; -1 = all; 0 = none. Frequency/presence penalties still count every output token.
TEST(SamplerTest, RepetitionWindowPenalisesOnlyTheLastTokens) {
  SamplingParams p = Greedy();
  p.repetition_penalty = 2.0f;
  // logits {2.0, 1.5, 1.2}; penalised: {1.0, 0.75, 0.6}.
  const std::vector<float> logits = {2.0f, 1.5f, 1.2f};
  // Prompt {0}, output {1}: with all of it (and a window of 2), 0 and 1 are penalised -> 2 wins.
  EXPECT_EQ(SampleOnce(p, logits, {0}, {1}), 2);
  p.repetition_window = 2;
  EXPECT_EQ(SampleOnce(p, logits, {0}, {1}), 2);
  // The last token only (output 1): 0 keeps 2.0 and wins.
  p.repetition_window = 1;
  EXPECT_EQ(SampleOnce(p, logits, {0}, {1}), 0);
  EXPECT_EQ(SampleOnce(p, logits, {1}, {0}), 1) << "output 0 is the last token: 0 -> 1.0 < 1.5";
  EXPECT_EQ(SampleOnce(p, logits, {1, 0}, {}), 1) << "prompt only: its last token (0) is penalised";
  EXPECT_EQ(SampleOnce(p, logits, {0, 1}, {}), 0) << "prompt only: 0 is outside the window";
  // 0: no token penalised.
  p.repetition_window = 0;
  EXPECT_EQ(SampleOnce(p, logits, {0, 1, 2}, {0}), 0);
  // Frequency penalty over an output token before the window still counts: 2.0 - 1.0 = 1.0 < 1.5.
  p.repetition_penalty = 1.0f;
  p.frequency_penalty = 1.0f;
  EXPECT_EQ(SampleOnce(p, logits, {}, {0, 2}), 1);
  // Both penalties, window 1, output {0, 2}: 0 is before the window (frequency only: 2.0 - 1 =
  // 1.0), 2 in it (both: 1.2 / 2 - 1 = -0.4), 1 untouched (1.5) wins; with the whole history, 1
  // still wins and 0 has 2.0 / 2 - 1 = 0.
  p.repetition_penalty = 2.0f;
  p.repetition_window = 1;
  EXPECT_EQ(SampleOnce(p, logits, {}, {0, 2}), 1);
  p.frequency_penalty = 0.6f;  // 0: 2.0 - 0.6 = 1.4 (frequency only) < 1.5; penalised too it would be 0.4
  EXPECT_EQ(SampleOnce(p, {2.0f, 1.3f, 1.2f}, {}, {0, 2}), 0) << "0 before the window keeps 1.4 > 1.3";
  p.repetition_window = -1;
  EXPECT_EQ(SampleOnce(p, {2.0f, 1.3f, 1.2f}, {}, {0, 2}), 1) << "in the window 0 falls to 0.4 < 1.3";
  p.repetition_window = -2;
  EXPECT_EQ(p.Validate().message(), "repeat_last_n must be -1 (the whole prompt and output) or >= 0, got -2");
}

TEST(SamplerTest, FrequencyPenaltyCountsGeneratedTokensOnly) {
  SamplingParams p = Greedy();
  p.frequency_penalty = 0.3f;
  EXPECT_EQ(SampleOnce(p, {2.0f, 1.5f}, {}, /*output=*/{0}), 0);     // 2 - 0.3 = 1.7 > 1.5
  EXPECT_EQ(SampleOnce(p, {2.0f, 1.5f}, {}, /*output=*/{0, 0}), 1);  // 2 - 0.6 = 1.4 < 1.5
  EXPECT_EQ(SampleOnce(p, {2.0f, 1.5f}, /*prompt=*/{0, 0, 0, 0}, {}), 0);  // prompt is not counted
}

TEST(SamplerTest, PresencePenaltyIsFlatOnGeneratedTokens) {
  SamplingParams p = Greedy();
  p.presence_penalty = 0.6f;
  EXPECT_EQ(SampleOnce(p, {2.0f, 1.5f}, {}, {0}), 1);              // 2 - 0.6 = 1.4
  EXPECT_EQ(SampleOnce(p, {2.0f, 1.5f}, {0}, {}), 0);              // prompt is not counted
  p.presence_penalty = 0.4f;
  EXPECT_EQ(SampleOnce(p, {2.0f, 1.5f}, {}, {0, 0, 0, 0, 0}), 0);  // 1.6: independent of count
  p.presence_penalty = -1.0f;
  EXPECT_EQ(SampleOnce(p, {1.5f, 2.0f}, {}, {0}), 0);              // negative encourages: 2.5
}

TEST(SamplerTest, PenaltyScratchIsResetBetweenCalls) {
  SamplingParams p = Greedy();
  p.frequency_penalty = 2.0f;
  Sampler s = Make(p);
  auto a = s.Sample(std::vector<float>{2.0f, 1.0f}, {}, Ids{0});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, 1);
  auto b = s.Sample(std::vector<float>{2.0f, 1.0f}, {}, {});  // no history now
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, 0);
}

TEST(SamplerTest, TopKKeepsTheKBest) {
  SamplingParams p;
  p.top_k = 1;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    p.seed = seed;
    EXPECT_EQ(SampleOnce(p, {1.0f, 5.0f, 4.0f, 3.0f, 2.0f}), 1);
  }
  p.top_k = 2;
  EXPECT_EQ(Support(p, {1.0f, 5.0f, 4.5f, 3.0f, 2.0f}), (std::set<int32_t>{1, 2}));
  // Ties at the edge go to the lower id.
  p.top_k = 2;
  EXPECT_EQ(Support(p, {3.0f, 5.0f, 3.0f, 3.0f}), (std::set<int32_t>{0, 1}));
  // k larger than the vocabulary filters nothing.
  p.top_k = 100;
  EXPECT_EQ(Support(p, {0.0f, 0.0f, 0.0f}), (std::set<int32_t>{0, 1, 2}));
}

TEST(SamplerTest, TopPKeepsSmallestPrefixReachingTheMass) {
  const auto logits = LogitsOf({0.5, 0.3, 0.15, 0.05});
  SamplingParams p;
  p.top_p = 0.45f;  // 0.5 >= 0.45 after the first token
  for (uint64_t seed = 0; seed < 20; ++seed) {
    p.seed = seed;
    EXPECT_EQ(SampleOnce(p, logits), 0);
  }
  p.top_p = 0.7f;  // 0.5 < 0.7, 0.8 >= 0.7
  EXPECT_EQ(Support(p, logits), (std::set<int32_t>{0, 1}));
  p.top_p = 0.85f;  // 0.8 < 0.85, 0.95 >= 0.85
  EXPECT_EQ(Support(p, logits), (std::set<int32_t>{0, 1, 2}));
  p.top_p = 1.0f;
  EXPECT_EQ(Support(p, logits, 5000), (std::set<int32_t>{0, 1, 2, 3}));
}

TEST(SamplerTest, TopPOnLargeVocabulary) {
  // 200000 tokens: 3 strong ones hold ~90% of the mass, the rest share ~10%.
  std::vector<float> logits(200000, 0.0f);
  const float strong = std::log(0.3f * 199997.0f / 0.1f);  // each strong token: 30% of the mass
  logits[123456] = strong;
  logits[7] = strong;
  logits[199999] = strong;
  SamplingParams p;
  p.top_p = 0.85f;
  EXPECT_EQ(Support(p, logits, 100), (std::set<int32_t>{7, 123456, 199999}));
  p.top_p = 0.95f;  // also needs the lower-id half of the flat tail (one bucket of equal logits)
  int flat = 0;
  for (int32_t id : Support(p, logits, 200)) {
    if (id == 7 || id == 123456 || id == 199999) continue;
    ++flat;
    EXPECT_LT(id, 100010) << "flat tokens are ranked by id; only ~the first 100000 reach the mass";
  }
  EXPECT_GT(flat, 0);
}

// The bucketed top-p (no top_k) keeps exactly the set a full sort gives. 300 tokens with logits in
// [0, 2]: every token has p >= e^-2 / 300 ~ 4.5e-4, so in 40000 draws each kept token is expected
// >= 18 times and the drawn support equals the kept set.
TEST(SamplerTest, TopPMatchesFullSortReference) {
  std::vector<float> logits(300);
  uint32_t x = 99;
  for (float& l : logits) {
    x = x * 1664525u + 1013904223u;
    l = static_cast<float>(x >> 8) / static_cast<float>(1u << 24) * 2.0f;
  }
  for (float top_p : {0.3f, 0.6f, 0.9f}) {
    std::vector<int32_t> order(logits.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    double total = 0.0;
    for (float l : logits) total += std::exp(static_cast<double>(l));
    std::set<int32_t> expected;
    double cum = 0.0;
    for (int32_t id : order) {
      if (cum >= top_p * total) break;
      cum += std::exp(static_cast<double>(logits[id]));
      expected.insert(id);
    }
    SamplingParams p;
    p.top_p = top_p;
    EXPECT_EQ(Support(p, logits, 40000), expected) << "top_p " << top_p;
  }
}

TEST(SamplerTest, MinPKeepsTokensAboveFractionOfMax) {
  const auto logits = LogitsOf({0.5, 0.3, 0.15, 0.05});
  SamplingParams p;
  p.min_p = 0.9f;  // threshold 0.45
  for (uint64_t seed = 0; seed < 20; ++seed) {
    p.seed = seed;
    EXPECT_EQ(SampleOnce(p, logits), 0);
  }
  p.min_p = 0.5f;  // threshold 0.25
  EXPECT_EQ(Support(p, logits), (std::set<int32_t>{0, 1}));
  p.min_p = 0.2f;  // threshold 0.10
  EXPECT_EQ(Support(p, logits), (std::set<int32_t>{0, 1, 2}));
}

TEST(SamplerTest, TopPIsComputedAfterTopKRenormalisation) {
  // Raw: cumulative 0.4, 0.7, 0.9. After top_k=3 renormalisation: 0.444, 0.778 -> top_p 0.75 keeps 2.
  const auto logits = LogitsOf({0.4, 0.3, 0.2, 0.1});
  SamplingParams p;
  p.top_k = 3;
  p.top_p = 0.75f;
  EXPECT_EQ(Support(p, logits), (std::set<int32_t>{0, 1}));
  p.top_k = 0;  // on the raw distribution 0.7 < 0.75, so token 2 stays
  EXPECT_EQ(Support(p, logits), (std::set<int32_t>{0, 1, 2}));
}

TEST(SamplerTest, SameSeedSameSequenceDifferentSeedDiffers) {
  // 1000 tokens with a fixed pseudo-random spread of logits.
  std::vector<float> logits(1000);
  uint32_t x = 1;
  for (float& l : logits) {
    x = x * 1664525u + 1013904223u;
    l = static_cast<float>(x >> 8) / static_cast<float>(1u << 24) * 4.0f;
  }
  auto draw = [&](uint64_t seed) {
    SamplingParams p;
    p.seed = seed;
    p.temperature = 0.8f;
    p.top_k = 64;
    p.top_p = 0.95f;
    Sampler s = Make(p);
    EXPECT_EQ(s.seed(), seed);
    Ids out;
    for (int i = 0; i < 100; ++i) {
      auto t = s.Sample(logits, {}, out);
      EXPECT_TRUE(t.ok());
      out.push_back(*t);
    }
    return out;
  };
  const Ids a = draw(42), b = draw(42), c = draw(43);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 10u);  // it really samples
}

TEST(SamplerTest, UnseededSamplersWork) {
  SamplingParams p;
  Sampler s = Make(p);
  auto t = s.Sample(std::vector<float>{0.0f, 0.0f}, {}, {});
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(*t == 0 || *t == 1);
}

// Draw frequencies at temperature T match softmax(logits / T).
// N = 200000 draws; each frequency has standard deviation sqrt(p(1-p)/N) <= 0.0011, so a 5-sigma
// band (false-failure probability ~6e-7 per token for a correct sampler) still catches an error of
// 0.6 percentage points, far smaller than any plausible bug (wrong temperature, off-by-one bucket,
// unnormalised weights). A Pearson chi-square with 2 degrees of freedom must stay below 13.8
// (p = 0.001). The seed is fixed, so the test is deterministic.
void CheckFrequencies(float temperature, const std::vector<double>& probs, const std::vector<double>& expected) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = 2024;
  Sampler s = Make(p);
  const auto logits = LogitsOf(probs);
  const int n = 200000;
  std::vector<int> count(probs.size(), 0);
  for (int i = 0; i < n; ++i) {
    auto t = s.Sample(logits, {}, {});
    ASSERT_TRUE(t.ok());
    ++count[*t];
  }
  double chi2 = 0.0;
  for (size_t k = 0; k < probs.size(); ++k) {
    const double freq = static_cast<double>(count[k]) / n;
    const double sigma = std::sqrt(expected[k] * (1.0 - expected[k]) / n);
    EXPECT_NEAR(freq, expected[k], 5.0 * sigma) << "token " << k << " at T=" << temperature;
    const double e = expected[k] * n;
    chi2 += (count[k] - e) * (count[k] - e) / e;
  }
  EXPECT_LT(chi2, 13.8) << "T=" << temperature;
}

TEST(SamplerTest, FrequenciesMatchDistributionAtTemperatureOne) {
  CheckFrequencies(1.0f, {0.2, 0.3, 0.5}, {0.2, 0.3, 0.5});
}

TEST(SamplerTest, FrequenciesMatchTemperatureScaledDistribution) {
  // T = 0.5 squares the probabilities: {0.04, 0.09, 0.25} / 0.38.
  CheckFrequencies(0.5f, {0.2, 0.3, 0.5}, {0.04 / 0.38, 0.09 / 0.38, 0.25 / 0.38});
}

// SampleInPlace chooses what Sample chooses (same RNG draws) for every filter and penalty, and
// leaves the adjusted logits in the row: suppressed ids at -inf, biases added, penalties applied.
TEST(SamplerTest, SampleInPlaceChoosesAsSampleAndLeavesTheAdjustedRow) {
  std::vector<float> logits(300);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(0.37f * static_cast<float>(i)) * 3.0f;
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.9f;
  p.seed = 11;
  p.repetition_penalty = 1.3f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  p.suppress_tokens = {4, 17};
  p.logit_bias = {{5, 2.0f}, {40, -3.0f}};
  for (int top_k : {0, 20}) {
    p.top_k = top_k;
    Sampler a = Make(p), b = Make(p);
    Ids out;
    const Ids prompt = {3, 5, 9};
    for (int step = 0; step < 50; ++step) {
      std::vector<float> row = logits;
      auto x = a.Sample(logits, prompt, out);
      auto y = b.SampleInPlace(row, prompt, out);
      ASSERT_TRUE(x.ok() && y.ok());
      ASSERT_EQ(*x, *y) << "top_k " << top_k << " step " << step;
      EXPECT_EQ(row[4], -std::numeric_limits<float>::infinity());
      EXPECT_EQ(row[17], -std::numeric_limits<float>::infinity());
      if (std::find(out.begin(), out.end(), 40) == out.end()) {
        EXPECT_EQ(row[40], logits[40] - 3.0f);
      }
      // id 9 while it is in the prompt only: the repetition penalty alone.
      if (std::find(out.begin(), out.end(), 9) == out.end()) {
        EXPECT_EQ(row[9], logits[9] > 0 ? logits[9] / 1.3f : logits[9] * 1.3f);
      }
      out.push_back(*x);
    }
  }
}

TEST(SamplerTest, SampleErrors) {
  Sampler s = Make(SamplingParams{});
  EXPECT_EQ(s.Sample(std::vector<float>{}, {}, {}).status().code(), StatusCode::kInvalidArgument);
  auto bad_hist = s.Sample(std::vector<float>{1.0f, 2.0f}, Ids{5}, {});
  ASSERT_FALSE(bad_hist.ok());
  EXPECT_NE(bad_hist.status().message().find("prompt_tokens[0]"), std::string::npos);
  auto bad_out = s.Sample(std::vector<float>{1.0f, 2.0f}, {}, Ids{0, -1});
  ASSERT_FALSE(bad_out.ok());
  EXPECT_NE(bad_out.status().message().find("output_tokens[1]"), std::string::npos);
  auto nan = s.Sample(std::vector<float>{1.0f, std::nanf("")}, {}, {});
  ASSERT_FALSE(nan.ok());
  EXPECT_EQ(nan.status().code(), StatusCode::kInternal);
  EXPECT_NE(nan.status().message().find("logits[1]"), std::string::npos);

  SamplingParams all = Greedy();
  all.suppress_tokens = {0, 1};
  Sampler g = Make(all);
  auto none = g.Sample(std::vector<float>{1.0f, 2.0f}, {}, {});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);

  SamplingParams big;
  big.suppress_tokens = {2};
  Sampler b = Make(big);
  auto out_of_vocab = b.Sample(std::vector<float>{1.0f, 2.0f}, {}, {});
  ASSERT_FALSE(out_of_vocab.ok());
  EXPECT_NE(out_of_vocab.status().message().find("suppress_tokens[0]"), std::string::npos);
}

// Validate() rejects each out-of-range value with a message that starts with the field's name.
TEST(SamplerTest, ValidateNamesTheField) {
  struct Case {
    const char* field;
    void (*set)(SamplingParams&);
  };
  const Case cases[] = {
      {"temperature", [](SamplingParams& p) { p.temperature = -0.1f; }},
      {"temperature", [](SamplingParams& p) { p.temperature = std::numeric_limits<float>::quiet_NaN(); }},
      {"temperature", [](SamplingParams& p) { p.temperature = std::numeric_limits<float>::infinity(); }},
      {"top_k", [](SamplingParams& p) { p.top_k = -2; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 0.0f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 1.5f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = std::numeric_limits<float>::quiet_NaN(); }},
      {"min_p", [](SamplingParams& p) { p.min_p = -0.01f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = 1.01f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = 0.0f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = -1.0f; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = 2.5f; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = -2.5f; }},
      {"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = -3.0f; }},
      {"suppress_tokens[1]", [](SamplingParams& p) { p.suppress_tokens = {3, -4}; }},
      {"logit_bias", [](SamplingParams& p) { p.logit_bias = {{-1, 1.0f}}; }},
      {"logit_bias[5]", [](SamplingParams& p) { p.logit_bias = {{5, 150.0f}}; }},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    c.set(p);
    const Status st = p.Validate();
    ASSERT_FALSE(st.ok()) << c.field;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message().rfind(c.field, 0), 0u) << st.message();
    EXPECT_FALSE(Sampler::Create(p).ok()) << c.field;
  }
  // Boundary values that are valid.
  SamplingParams ok;
  ok.temperature = 0.0f;
  ok.top_k = -1;
  ok.top_p = 1.0f;
  ok.min_p = 1.0f;
  ok.presence_penalty = -2.0f;
  ok.frequency_penalty = 2.0f;
  ok.logit_bias = {{0, -100.0f}, {1, 100.0f}};
  EXPECT_TRUE(ok.Validate().ok()) << ok.Validate().ToString();
  SamplingParams vocab;
  vocab.logit_bias = {{10, 1.0f}};
  const Status sv = vocab.ValidateForVocab(10);
  ASSERT_FALSE(sv.ok());
  EXPECT_EQ(sv.message().rfind("logit_bias", 0), 0u) << sv.message();
  EXPECT_TRUE(vocab.ValidateForVocab(11).ok());
}

}  // namespace
}  // namespace g4
