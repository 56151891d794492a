// `gemma4rt bench --quality` and `--quality-cache`: see bench_quality.h.
#include "cli/bench_quality.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "tokenizer/tokenizer.h"

namespace g4::cli {
namespace {

// The fixed text of the quality measurement (any English prose works; this one is ours).
constexpr const char* kQualityText =
    "The old lighthouse stood at the end of a narrow spit of rock, and for more than a century its lamp had "
    "turned every night without fail. Ships coming up the coast in bad weather looked for it the way a tired "
    "walker looks for the lights of home. When the keeper retired, the town argued for a whole winter about "
    "whether to replace him with an automatic lamp. In the end the council voted to keep a keeper, partly "
    "out of habit and partly because nobody wanted to be the one who had switched off the last human light "
    "on that stretch of sea. The new keeper was a young woman who had studied engineering, and in her first "
    "year she rebuilt the clockwork, repainted the tower and wrote down, every evening, the wind, the sea and "
    "the names of the ships that passed.";

// --quality's loads of the model as stored (for its fixed text's ids, and the reference logits):
// one pass each, used from the file mapping rather than copied (LoadOptions::mmap).
LoadOptions MappedOnly() {
  LoadOptions lo;
  lo.mmap = true;
  return lo;
}

// All-position logits of `path` loaded with `lo` for `ids`, with a KV cache of kv_type.
StatusOr<std::vector<float>> QualityLogits(const std::string& path, const LoadOptions& lo, int threads, int ubatch,
                                           const std::vector<int32_t>& ids, bool f32_activations,
                                           DType kv_type = DType::kF32) {
  G4_ASSIGN_OR_RETURN(std::unique_ptr<LoadedModel> m, LoadModel(path, lo));
  EngineOptions o;
  o.max_seqs = 1;
  o.max_context = static_cast<int>(ids.size());
  o.prefill_chunk = ubatch;
  o.kv_type = kv_type;
  G4_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::Create(std::move(m), MakeCpuBackend(threads, CpuBackendOptionsFor(f32_activations)), o));
  std::vector<float> logits;
  G4_RETURN_IF_ERROR(e->Prefill(0, ids, /*all_logits=*/true, &logits));
  return logits;
}

// log-softmax of one row in f64.
void LogSoftmax(const float* x, int n, std::vector<double>* out) {
  out->resize(n);
  double mx = -INFINITY;
  for (int i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
  const double lse = mx + std::log(sum);
  for (int i = 0; i < n; ++i) (*out)[i] = static_cast<double>(x[i]) - lse;
}

// The fixed text's ids (or, without a tokenizer, `max_tokens` fixed pseudo-random ids after BOS),
// at most max_tokens and the model's positions; source: "text" or "ids".
StatusOr<std::vector<int32_t>> QualityIds(const std::string& path, int max_tokens, std::string* source, int* vocab_out) {
  std::vector<int32_t> ids;
  int vocab = 0;
  {
    G4_ASSIGN_OR_RETURN(std::unique_ptr<LoadedModel> m, LoadModel(path, MappedOnly()));
    const ModelConfig& c = m->config;
    vocab = c.vocab;
    max_tokens = std::min(max_tokens, c.max_position);
    auto tok = LoadTokenizerFor(*m);
    if (tok.ok()) {
      ids = (*tok)->Encode(kQualityText, /*add_bos=*/true, /*parse_special=*/false);
      *source = "text";
    } else {
      const int limit = c.ple_dim > 0 ? std::min(c.vocab, c.ple_vocab) : c.vocab;
      std::mt19937_64 rng(1234);
      std::uniform_int_distribution<int32_t> dist(std::min(4, limit - 1), limit - 1);
      ids.push_back(c.bos_id);
      while (static_cast<int>(ids.size()) < max_tokens) ids.push_back(dist(rng));
      *source = "ids";
    }
    if (static_cast<int>(ids.size()) > max_tokens) ids.resize(max_tokens);
  }
  if (ids.size() < 2) return InvalidArgument("--quality: fewer than 2 tokens to compare");
  *vocab_out = vocab;
  return ids;
}

// ref against q (all-position logits of ids, [ids, vocab] each): see QualityResult.
QualityResult CompareLogits(const std::vector<float>& ref, const std::vector<float>& q, const std::vector<int32_t>& ids,
                            int vocab) {
  QualityResult r;
  const int T = static_cast<int>(ids.size()) - 1;
  std::vector<double> lp, lq;
  double kl_sum = 0, nll_ref = 0, nll_q = 0;
  int agree = 0;
  for (int t = 0; t < T; ++t) {
    const float* a = ref.data() + static_cast<size_t>(t) * vocab;
    const float* b = q.data() + static_cast<size_t>(t) * vocab;
    LogSoftmax(a, vocab, &lp);
    LogSoftmax(b, vocab, &lq);
    double kl = 0;
    for (int i = 0; i < vocab; ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
    kl = std::max(kl, 0.0);
    kl_sum += kl;
    r.max_kl = std::max(r.max_kl, kl);
    agree += (std::max_element(a, a + vocab) - a) == (std::max_element(b, b + vocab) - b);
    nll_ref -= lp[ids[t + 1]];
    nll_q -= lq[ids[t + 1]];
  }
  r.tokens = T;
  r.mean_kl = kl_sum / T;
  r.top1_agreement = static_cast<double>(agree) / T;
  r.ppl_ref = std::exp(nll_ref / T);
  r.ppl_quant = std::exp(nll_q / T);
  return r;
}

}  // namespace

StatusOr<QualityResult> MeasureQuality(const std::string& path, const LoadOptions& quantized, int threads, int ubatch,
                                       int max_tokens, bool f32_activations) {
  std::string source;
  int vocab = 0;
  G4_ASSIGN_OR_RETURN(std::vector<int32_t> ids, QualityIds(path, max_tokens, &source, &vocab));
  G4_ASSIGN_OR_RETURN(std::vector<float> ref, QualityLogits(path, MappedOnly(), threads, ubatch, ids, /*f32_activations=*/true));
  G4_ASSIGN_OR_RETURN(std::vector<float> q, QualityLogits(path, quantized, threads, ubatch, ids, f32_activations));
  QualityResult r = CompareLogits(ref, q, ids, vocab);
  r.token_source = source;
  return r;
}

StatusOr<std::vector<QualityResult>> MeasureCacheQuality(const std::string& path, int threads, int ubatch, int max_tokens,
                                                         const std::vector<DType>& types) {
  std::string source;
  int vocab = 0;
  G4_ASSIGN_OR_RETURN(std::vector<int32_t> ids, QualityIds(path, max_tokens, &source, &vocab));
  G4_ASSIGN_OR_RETURN(std::vector<float> ref, QualityLogits(path, MappedOnly(), threads, ubatch, ids, true, DType::kF32));
  std::vector<QualityResult> out;
  for (DType type : types) {
    G4_ASSIGN_OR_RETURN(std::vector<float> q, QualityLogits(path, MappedOnly(), threads, ubatch, ids, true, type));
    out.push_back(CompareLogits(ref, q, ids, vocab));
    out.back().token_source = source;
  }
  return out;
}

}  // namespace g4::cli
