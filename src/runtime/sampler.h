// Sampler: picks the next token id from one row of logits, with the controls users of vLLM,
// llama.cpp's llama-server and the OpenAI API expect.
//
// Order of operations in Sampler::Sample (every step works on a private copy of the logits):
//   1. repetition_penalty (HF RepetitionPenaltyLogitsProcessor / vLLM semantics): for every
//      distinct token id seen in prompt + output, logit > 0 is divided by the penalty, logit <= 0
//      is multiplied by it (applied once per id, however often it occurs). With
//      repetition_window = N >= 0 (llama-server's repeat_last_n) only the last N tokens of
//      prompt + output count (0: none).
//   2. frequency_penalty and presence_penalty (OpenAI semantics, generated tokens only):
//      logit[t] -= count_output(t) * frequency_penalty + (count_output(t) > 0) * presence_penalty.
//      (1 then 2 is vLLM's order.)
//   3. suppress_tokens: logit = -inf (also in greedy mode; generation_config.json's list, e.g.
//      Gemma 4's 258882 and 258883, belongs here; see ../shared/spec/serving.md).
//   4. logit_bias: logit += bias (a suppressed token stays at -inf).
//   5. temperature == 0: greedy = argmax, ties broken towards the lowest token id. Done. (So is a
//      temperature so small that 1/T overflows a float.)
//   6. otherwise scaled logits s = (logit - max) / temperature; p ∝ exp(s). Candidates are ranked
//      by (logit descending, token id ascending), which also breaks ties at a filter's edge.
//        top_k  (> 0): keep the k best (a k above the candidate count keeps all).
//        top_p  (< 1): keep the smallest prefix of the ranking whose probability mass, renormalised
//                      over the survivors of top_k, reaches top_p (HF TopPLogitsWarper; at least
//                      one token is kept).
//        min_p  (> 0): keep tokens with p >= min_p * p_max (HF MinPLogitsWarper / vLLM),
//                      evaluated as s >= ln(min_p) (the best token has s = 0).
//      This is HF's warper order (temperature, top-k, top-p, min-p). The survivors are renormalised
//      and one is drawn by inverse CDF with a uniform double from the sampler's RNG.
//
// RNG: std::mt19937_64 owned by the Sampler (one per request), seeded with `seed` when given,
// else from std::random_device. A draw takes one 64-bit output u and uses (u >> 11) * 2^-53, a
// double in [0, 1) (no std::uniform_real_distribution, whose algorithm differs between standard
// libraries). So the same seed, the same logits and the same history give the same token sequence
// (across platforms too, up to last-bit differences of libm's expf). Greedy steps consume no random
// numbers.
//
// Cost per call: O(V + H) where V = logits.size() and H = history length, one exp per candidate,
// and no O(V log V) sort: top_k keeps a bounded heap while scanning (O(V + k log k) for real
// logits); top_p without top_k buckets the candidates by scaled logit (2048 buckets), finds the
// bucket where the cumulative mass crosses top_p, and ranks only that bucket. Survivors are
// walked for the draw in rank order (top_k set) or id order (otherwise); both are deterministic.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "base/status.h"

namespace g4 {

// Per-request sampling controls. Defaults disable every filter and penalty at temperature 1.
// Ranges follow the OpenAI API and vLLM's SamplingParams; Validate() enforces them.
struct SamplingParams {
  float temperature = 1.0f;         // >= 0, finite; 0 = greedy
  int top_k = 0;                    // 0 or -1 = disabled (vLLM accepts both), else >= 1
  float top_p = 1.0f;               // (0, 1]; 1 = disabled
  float min_p = 0.0f;               // [0, 1]; 0 = disabled
  float repetition_penalty = 1.0f;  // > 0, finite; 1 = disabled (HF/vLLM)
  int repetition_window = -1;       // tokens of prompt + output the penalty looks at: -1 = all (HF/vLLM),
                                    // N >= 0 = the last N (llama-server's repeat_last_n, 64 there)
  float presence_penalty = 0.0f;    // [-2, 2] (OpenAI)
  float frequency_penalty = 0.0f;   // [-2, 2] (OpenAI)
  std::optional<uint64_t> seed;     // per-request RNG seed; nullopt = nondeterministic
  std::vector<int32_t> suppress_tokens;  // ids forced to -inf before any choice; >= 0
  std::map<int32_t, float> logit_bias;   // id -> additive bias in [-100, 100] (OpenAI); id >= 0

  // Range checks that need no vocabulary. Errors: InvalidArgument whose message starts with the
  // parameter's API name (e.g. "top_p must be in (0, 1], got 0").
  Status Validate() const;
  // Validate() plus token ids in suppress_tokens/logit_bias below `vocab_size`.
  Status ValidateForVocab(int vocab_size) const;
};

// Log-probabilities of one generated token for the API's logprobs (OpenAI chat `logprobs` /
// `top_logprobs`, completions `logprobs`): natural logs under the softmax of the raw logits, the
// model's own distribution before penalties, suppress_tokens, logit_bias, temperature and the
// top-k/top-p/min-p filters (vLLM's default, logprobs_mode "raw_logprobs"), so the figures do
// not depend on how the token was chosen.
struct TokenLogprobs {
  int32_t id = 0;         // the generated token
  float logprob = 0.0f;   // log p(id) <= 0
  // The `top_n` most likely tokens, most likely first (equal logits: lower id first); the
  // generated token is among them only if it ranks there.
  std::vector<std::pair<int32_t, float>> top;
};
inline constexpr int kMaxTopLogprobs = 20;  // OpenAI's and vLLM's default limit of top_logprobs

// logprob = logits[id] - log(sum_j exp(logits[j] - max)) - max (the terms in f32, summed in
// double: runtime/logprobs_simd.h); top: the top_n best by logit. Three SIMD passes over the row
// (~0.1 ms at V = 262144 on AVX-512), O(V * top_n) at worst for the top list, ~O(V) on real
// logits. logits: [V] f32, V >= 1; id in [0, V); top_n in [0, kMaxTopLogprobs].
// Errors: InvalidArgument for an empty row, id or top_n out of range; Internal for a NaN or +inf
// logit (a bug upstream, as in Sampler::Sample). -inf logits have probability 0 (logprob -inf).
StatusOr<TokenLogprobs> ComputeLogprobs(std::span<const float> logits, int32_t id, int top_n);

class Sampler {
 public:
  // Validates `params` (SamplingParams::Validate) and seeds the RNG.
  static StatusOr<Sampler> Create(SamplingParams params);

  // Chooses the next token.
  //   logits: [V] f32, raw model output for the position being generated (V = vocabulary size).
  //   prompt_tokens: the sequence's prompt ids; output_tokens: ids generated so far. Both in [0, V).
  // Returns a token id in [0, V). Advances the RNG by one draw unless greedy.
  // Errors: InvalidArgument for an empty logits row, a history/suppress/logit_bias id outside
  // [0, V), or when no token has a finite logit after steps 1-4 (e.g. everything suppressed);
  // Internal for a NaN or +inf logit (a bug upstream; the id is named).
  StatusOr<int32_t> Sample(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                           std::span<const int32_t> output_tokens);
  // Sample without a copy: the same choice (same RNG draw) as Sample, but steps 1-4 (penalties,
  // suppress_tokens, logit_bias) are applied to `logits` itself, which holds the adjusted values
  // afterwards (also after an error). For callers that need the row only to sample it (the
  // scheduler, Generate): it spares a [V] f32 copy (1 MiB at V = 262144) per sampler.
  StatusOr<int32_t> SampleInPlace(std::span<float> logits, std::span<const int32_t> prompt_tokens,
                                  std::span<const int32_t> output_tokens);

  const SamplingParams& params() const { return params_; }
  // A sampling candidate: (scaled) logit and token id. Public for the ranking helper only.
  struct Cand {
    float s;
    int32_t id;
  };
  bool greedy() const { return params_.temperature == 0.0f; }
  // The seed actually used (params.seed, or the one drawn from std::random_device).
  uint64_t seed() const { return seed_; }

 private:
  Sampler(SamplingParams params, uint64_t seed);

  // Steps 1-4 on `logits` in place. Returns InvalidArgument on an out-of-range id, before any change.
  Status ApplyPenaltiesAndMasks(std::span<float> logits, std::span<const int32_t> prompt_tokens,
                                std::span<const int32_t> output_tokens);
  // Uniform double in [0, 1) from rng_ (one 64-bit draw).
  double NextUniform();
  // top-p on cand_/weight_ in id order: keeps the ranking prefix whose preceding mass is below
  // `target` (= top_p * total weight), preserving id order. O(n + b log b), b = one bucket.
  void KeepTopP(double target);

  SamplingParams params_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  // Scratch, reused between calls (sized to V on first use).
  std::vector<float> work_;             // Sample's copy of the row (SampleInPlace needs none)
  std::vector<int32_t> output_count_;  // per id, zero between calls
  std::vector<uint8_t> seen_;          // per id, zero between calls
  std::vector<int32_t> touched_;       // ids whose count/seen entry is non-zero
  std::vector<Cand> cand_;       // candidates (see Sample)
  std::vector<float> weight_;    // exp(cand_[i].s)
  std::vector<double> bucket_mass_;
  std::vector<Cand> bucket_;     // (s, index into cand_) of top-p's crossing bucket
};

}  // namespace g4
