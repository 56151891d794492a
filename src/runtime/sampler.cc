// Sampler implementation; the order of operations and the RNG contract are in sampler.h.
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>

#include "base/check.h"
#include "runtime/logprobs_simd.h"

namespace g4 {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::string Num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// Rank order for filters: higher (scaled) logit first, then lower token id.
bool RanksBefore(const Sampler::Cand& a, const Sampler::Cand& b) {
  return a.s > b.s || (a.s == b.s && a.id < b.id);
}

}  // namespace

Status SamplingParams::Validate() const {
  if (!(std::isfinite(temperature) && temperature >= 0.0f)) {
    return InvalidArgument("temperature must be a finite number >= 0 (0 = greedy), got " + Num(temperature));
  }
  if (top_k < -1) {
    return InvalidArgument("top_k must be -1 or 0 (disabled) or >= 1, got " + std::to_string(top_k));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return InvalidArgument("top_p must be in (0, 1], got " + Num(top_p));
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return InvalidArgument("min_p must be in [0, 1], got " + Num(min_p));
  }
  if (repetition_window < -1) {
    return InvalidArgument("repeat_last_n must be -1 (the whole prompt and output) or >= 0, got " +
                           std::to_string(repetition_window));
  }
  if (!(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f)) {
    return InvalidArgument("repetition_penalty must be a finite number > 0 (1 = disabled), got " +
                           Num(repetition_penalty));
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return InvalidArgument("presence_penalty must be in [-2, 2], got " + Num(presence_penalty));
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return InvalidArgument("frequency_penalty must be in [-2, 2], got " + Num(frequency_penalty));
  }
  for (size_t i = 0; i < suppress_tokens.size(); ++i) {
    if (suppress_tokens[i] < 0) {
      return InvalidArgument("suppress_tokens[" + std::to_string(i) + "] must be a token id >= 0, got " +
                             std::to_string(suppress_tokens[i]));
    }
  }
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) {
      return InvalidArgument("logit_bias: token id must be >= 0, got " + std::to_string(id));
    }
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return InvalidArgument("logit_bias[" + std::to_string(id) + "] must be in [-100, 100], got " + Num(bias));
    }
  }
  return OkStatus();
}

Status SamplingParams::ValidateForVocab(int vocab_size) const {
  G4_RETURN_IF_ERROR(Validate());
  if (vocab_size <= 0) return InvalidArgument("vocab_size must be > 0, got " + std::to_string(vocab_size));
  for (size_t i = 0; i < suppress_tokens.size(); ++i) {
    if (suppress_tokens[i] >= vocab_size) {
      return InvalidArgument("suppress_tokens[" + std::to_string(i) + "] = " + std::to_string(suppress_tokens[i]) +
                             " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    }
  }
  for (const auto& [id, bias] : logit_bias) {
    if (id >= vocab_size) {
      return InvalidArgument("logit_bias: token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                             std::to_string(vocab_size) + ")");
    }
  }
  return OkStatus();
}

StatusOr<Sampler> Sampler::Create(SamplingParams params) {
  G4_RETURN_IF_ERROR(params.Validate());
  uint64_t seed;
  if (params.seed.has_value()) {
    seed = *params.seed;
  } else {
    std::random_device rd;
    seed = (static_cast<uint64_t>(rd()) << 32) ^ static_cast<uint64_t>(rd());
  }
  return Sampler(std::move(params), seed);
}

Sampler::Sampler(SamplingParams params, uint64_t seed) : params_(std::move(params)), seed_(seed), rng_(seed) {}

double Sampler::NextUniform() {
  // 53 high bits of one mt19937_64 output -> [0, 1) with 2^-53 resolution.
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

Status Sampler::ApplyPenaltiesAndMasks(std::span<float> logits, std::span<const int32_t> prompt_tokens,
                                       std::span<const int32_t> output_tokens) {
  const auto vocab = static_cast<int64_t>(logits.size());
  for (size_t i = 0; i < prompt_tokens.size(); ++i) {
    if (prompt_tokens[i] < 0 || prompt_tokens[i] >= vocab) {
      return InvalidArgument("prompt_tokens[" + std::to_string(i) + "] = " + std::to_string(prompt_tokens[i]) +
                             " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  for (size_t i = 0; i < output_tokens.size(); ++i) {
    if (output_tokens[i] < 0 || output_tokens[i] >= vocab) {
      return InvalidArgument("output_tokens[" + std::to_string(i) + "] = " + std::to_string(output_tokens[i]) +
                             " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  const float rep = params_.repetition_penalty;
  const float freq = params_.frequency_penalty;
  const float pres = params_.presence_penalty;
  if (rep != 1.0f || freq != 0.0f || pres != 0.0f) {
    if (seen_.size() != logits.size()) {
      seen_.assign(logits.size(), 0);
      output_count_.assign(logits.size(), 0);
      touched_.clear();
    }
    // seen_[t]: bit 0 = t is among the tokens the repetition penalty looks at (the last
    // repetition_window of prompt + output, or all), bit 1 = t was touched for another reason (an
    // output token before the window, counted for step 2).
    const int64_t P = static_cast<int64_t>(prompt_tokens.size());
    const int64_t total = P + static_cast<int64_t>(output_tokens.size());
    const int64_t window = params_.repetition_window;
    const int64_t first = window < 0 ? 0 : std::max<int64_t>(0, total - window);
    auto mark = [&](int32_t t, int bit) {
      if (!seen_[t]) touched_.push_back(t);
      seen_[t] |= bit;
    };
    for (int64_t i = first; i < P; ++i) mark(prompt_tokens[i], 1);
    for (int64_t i = 0; i < total - P; ++i) {
      const int32_t t = output_tokens[i];
      mark(t, P + i >= first ? 1 : 2);
      ++output_count_[t];
    }
    for (int32_t t : touched_) {
      float& l = logits[t];
      if (rep != 1.0f && (seen_[t] & 1)) l = l > 0.0f ? l / rep : l * rep;  // step 1, once per distinct id
      const int32_t count = output_count_[t];
      if (count > 0) l -= static_cast<float>(count) * freq + pres;  // step 2
      seen_[t] = 0;
      output_count_[t] = 0;
    }
    touched_.clear();
  }
  for (int32_t t : params_.suppress_tokens) logits[t] = kNegInf;  // step 3
  for (const auto& [id, bias] : params_.logit_bias) logits[id] += bias;  // step 4
  return OkStatus();
}

StatusOr<int32_t> Sampler::Sample(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                                  std::span<const int32_t> output_tokens) {
  work_.assign(logits.begin(), logits.end());
  return SampleInPlace(work_, prompt_tokens, output_tokens);
}

StatusOr<int32_t> Sampler::SampleInPlace(std::span<float> logits, std::span<const int32_t> prompt_tokens,
                                         std::span<const int32_t> output_tokens) {
  if (logits.empty()) return InvalidArgument("logits: empty row (vocabulary size 0)");
  if (logits.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return InvalidArgument("logits: row of " + std::to_string(logits.size()) + " entries exceeds int32 ids");
  }
  const int vocab = static_cast<int>(logits.size());
  G4_RETURN_IF_ERROR(params_.ValidateForVocab(vocab));
  G4_RETURN_IF_ERROR(ApplyPenaltiesAndMasks(logits, prompt_tokens, output_tokens));

  // Max (greedy answer, lowest id on ties) and the non-finite checks in one pass.
  float best = kNegInf;
  int32_t best_id = -1;
  for (int32_t i = 0; i < vocab; ++i) {
    const float x = logits[i];
    if (std::isnan(x)) return Internal("logits[" + std::to_string(i) + "] is NaN");
    if (x == std::numeric_limits<float>::infinity()) {
      return Internal("logits[" + std::to_string(i) + "] is +inf");
    }
    if (x > best) {
      best = x;
      best_id = i;
    }
  }
  if (best_id < 0) {
    return InvalidArgument("no token has a finite logit after suppress_tokens and logit_bias (" +
                           std::to_string(vocab) + " tokens, all -inf)");
  }
  if (greedy()) return best_id;

  // Candidates with scaled logits s = (l - max) / T <= 0 and weights w = exp(s) (p = w / sum w).
  const float inv_t = 1.0f / params_.temperature;
  if (!std::isfinite(inv_t)) return best_id;  // a denormal temperature: the limit is greedy
  cand_.clear();
  bool ranked = false;  // cand_ sorted by RanksBefore (else in id order)
  if (params_.top_k > 0 && params_.top_k < vocab) {
    // top-k by a bounded heap whose front is the worst kept candidate: O(V) compares plus
    // O(log k) per replacement (few for real logits). Raw logits rank like scaled ones.
    const auto k = static_cast<size_t>(params_.top_k);
    for (int32_t i = 0; i < vocab; ++i) {
      const float x = logits[i];
      if (!(x > kNegInf)) continue;
      if (cand_.size() < k) {
        cand_.push_back({x, i});
        std::push_heap(cand_.begin(), cand_.end(), RanksBefore);
      } else if (x > cand_.front().s) {  // ids ascend, so an equal logit ranks after: skip it
        std::pop_heap(cand_.begin(), cand_.end(), RanksBefore);
        cand_.back() = {x, i};
        std::push_heap(cand_.begin(), cand_.end(), RanksBefore);
      }
    }
    std::sort(cand_.begin(), cand_.end(), RanksBefore);
    for (Cand& c : cand_) c.s = (c.s - best) * inv_t;
    ranked = true;
  } else {
    for (int32_t i = 0; i < vocab; ++i) {
      if (logits[i] > kNegInf) cand_.push_back({(logits[i] - best) * inv_t, i});
    }
  }
  weight_.resize(cand_.size());
  for (size_t i = 0; i < cand_.size(); ++i) weight_[i] = std::exp(cand_[i].s);

  // top-p over the (renormalised) survivors of top-k.
  if (params_.top_p < 1.0f) {
    double total = 0.0;
    for (float w : weight_) total += w;
    const double target = static_cast<double>(params_.top_p) * total;
    if (ranked) {
      // Keep token i while the mass ranked before it is below the target.
      double cum = 0.0;
      size_t keep = 0;
      while (keep < cand_.size() && cum < target) cum += weight_[keep++];
      cand_.resize(keep);
      weight_.resize(keep);
    } else {
      KeepTopP(target);
    }
  }

  // min-p: p >= min_p * p_max  <=>  s >= ln(min_p), since the best token has s = 0 and survives
  // every filter above.
  if (params_.min_p > 0.0f) {
    const float ln_min_p = std::log(params_.min_p);
    size_t out = 0;
    for (size_t i = 0; i < cand_.size(); ++i) {
      if (cand_[i].s >= ln_min_p) {
        cand_[out] = cand_[i];
        weight_[out] = weight_[i];
        ++out;
      }
    }
    cand_.resize(out);
    weight_.resize(out);
  }
  G4_CHECK(!cand_.empty());

  // Draw by inverse CDF over the survivors, walking cand_ in its (deterministic) order.
  double total = 0.0;
  for (float w : weight_) total += w;
  const double u = NextUniform() * total;
  double acc = 0.0;
  for (size_t i = 0; i < cand_.size(); ++i) {
    acc += weight_[i];
    if (u < acc) return cand_[i].id;
  }
  return cand_.back().id;  // u within rounding of the total
}

void Sampler::KeepTopP(double target) {
  // cand_ is in id order with weights in weight_. The kept set is a prefix of the ranking, so it
  // is fixed by its last member (the cutoff). Find the cutoff without sorting V entries: bucket
  // the candidates by s (bucketing is monotone in s, so whole buckets are ranked relative to each
  // other), add bucket masses from the top until the target is crossed, and rank only the
  // crossing bucket.
  constexpr int kBuckets = 2048;
  float s_min = 0.0f;
  for (const Cand& c : cand_) s_min = std::min(s_min, c.s);
  const float scale = s_min < 0.0f ? static_cast<float>(kBuckets) / -s_min : 0.0f;
  auto bucket_of = [&](float s) { return std::min(kBuckets - 1, static_cast<int>(-s * scale)); };
  bucket_mass_.assign(kBuckets, 0.0);
  for (size_t i = 0; i < cand_.size(); ++i) bucket_mass_[bucket_of(cand_[i].s)] += weight_[i];
  double cum = 0.0;
  int crossing = -1;
  for (int b = 0; b < kBuckets; ++b) {
    if (cum + bucket_mass_[b] >= target) {
      crossing = b;
      break;
    }
    cum += bucket_mass_[b];
  }
  if (crossing < 0) return;  // rounding kept the whole mass below the target: keep everything

  bucket_.clear();
  for (size_t i = 0; i < cand_.size(); ++i) {
    if (bucket_of(cand_[i].s) == crossing) bucket_.push_back({cand_[i].s, static_cast<int32_t>(i)});
  }
  // bucket_ holds (s, index into cand_) in index order = id order, so RanksBefore ranks by id too;
  // a bucket of equal s (flat tails) is ranked already.
  const bool all_equal = std::all_of(bucket_.begin(), bucket_.end(),
                                     [&](const Cand& c) { return c.s == bucket_.front().s; });
  if (!all_equal) std::sort(bucket_.begin(), bucket_.end(), RanksBefore);
  Cand cutoff = {0.0f, -1};
  for (const Cand& c : bucket_) {
    if (cum >= target) break;
    cum += weight_[c.id];
    cutoff = {c.s, cand_[c.id].id};
  }
  G4_CHECK(cutoff.id >= 0);
  size_t out = 0;
  for (size_t i = 0; i < cand_.size(); ++i) {
    const Cand& c = cand_[i];
    if (c.s > cutoff.s || (c.s == cutoff.s && c.id <= cutoff.id)) {
      cand_[out] = c;
      weight_[out] = weight_[i];
      ++out;
    }
  }
  cand_.resize(out);
  weight_.resize(out);
}

StatusOr<TokenLogprobs> ComputeLogprobs(std::span<const float> logits, int32_t id, int top_n) {
  if (logits.empty()) return InvalidArgument("logits: empty row (vocabulary size 0)");
  if (id < 0 || static_cast<size_t>(id) >= logits.size())
    return InvalidArgument("logprobs: token id " + std::to_string(id) + " outside the vocabulary [0, " +
                           std::to_string(logits.size()) + ")");
  if (top_n < 0 || top_n > kMaxTopLogprobs)
    return InvalidArgument("top_logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) + "], got " +
                           std::to_string(top_n));
  float mx = 0.0f;
  if (!LogitsMax(logits.data(), logits.size(), &mx)) {
    for (size_t j = 0; j < logits.size(); ++j)
      if (std::isnan(logits[j]) || logits[j] == std::numeric_limits<float>::infinity())
        return Internal("logits: token " + std::to_string(j) + " has a " + (std::isnan(logits[j]) ? "NaN" : "+inf") +
                        " logit");
    return Internal("logits: the SIMD maximum saw a NaN or +inf that a scalar pass does not");
  }
  if (mx == -std::numeric_limits<float>::infinity()) return InvalidArgument("logits: every logit is -inf");
  // >= 1: the maximum's own term.
  const double lse = mx + std::log(SumExpShifted(logits.data(), logits.size(), mx));
  auto logprob = [&](int32_t j) { return static_cast<float>(static_cast<double>(logits[j]) - lse); };
  TokenLogprobs out;
  out.id = id;
  out.logprob = logprob(id);
  const size_t k = std::min(static_cast<size_t>(top_n), logits.size());
  for (const auto& b : TopLogits(logits.data(), logits.size(), k)) out.top.emplace_back(b.second, logprob(b.second));
  return out;
}

}  // namespace g4
