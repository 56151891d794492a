// `gemma4rt bench --quality` and `--quality-cache`: the model as run against a reference on a
// fixed text, by the all-position logits of one prefill each: mean KL divergence, top-1
// agreement and both perplexities.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "model/model.h"
#include "tensor/dtype.h"

namespace g4::cli {

struct QualityResult {
  int tokens = 0;               // positions compared (prompt length - 1)
  std::string token_source;     // "text" (the fixed text through the tokenizer) or "ids" (fixed pseudo-random ids)
  double mean_kl = 0;           // mean over positions of KL(p_ref || p_quant), nats
  double max_kl = 0;
  double top1_agreement = 0;    // fraction of positions whose argmax agrees
  double ppl_ref = 0, ppl_quant = 0;  // exp(mean NLL of the next token)
};

// The model as stored against the model loaded with `quantized`, on the fixed text (or, without a
// tokenizer, `max_tokens` fixed pseudo-random ids after BOS), one prefill each.
// The reference always runs with f32 activations; the quantised side with the run's activation
// mode, so with int8 activations the figures include their cost (and without --quantize they
// are only that cost). Both sides keep an f32 KV cache whatever --cache-type says: the figures are
// the weights' and activations' cost only.
StatusOr<QualityResult> MeasureQuality(const std::string& path, const LoadOptions& quantized, int threads, int ubatch,
                                       int max_tokens, bool f32_activations);

// The KV cache: per type of `types`, the model as stored with a cache of that type against the
// same with an f32 cache (both in f32 activations, the same text): the cache's cost only.
StatusOr<std::vector<QualityResult>> MeasureCacheQuality(const std::string& path, int threads, int ubatch, int max_tokens,
                                                         const std::vector<DType>& types);

}  // namespace g4::cli
