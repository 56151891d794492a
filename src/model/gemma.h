// THE model definition: the Gemma 3 / Gemma 4 text decoder as a step graph.
//
// Reference order (transformers Gemma4TextModel.forward / Gemma4TextDecoderLayer.forward, v5.24;
// Gemma 3 is the same skeleton with config-driven differences):
//   x0 = embed[ids] * round_to_weight_dtype(sqrt(H))
//   [PLE] ple = (rms_P(x0 . W_pleprojᵀ * H^-1/2) * w + ple_embed[ids] * sqrt(P)) * 2^-1/2
//   per layer l:
//     h = norm_in(x);  q = rope(norm_q(h Wqᵀ));  k = rope(norm_k(h Wkᵀ)); v = rms(h Wvᵀ | h Wkᵀ)
//     (KV-shared layers take k, v of their donor instead)
//     x = x + norm_post_attn(attention(q, k, v) Woᵀ)
//     r = x;  f = mlp(norm_pre_ffn(r))             mlp(y) = (gelu(y Wgᵀ) * y Wuᵀ) Wdᵀ
//     [MoE] f = norm_post_ffn1(f) + norm_post_ffn2(moe(norm_pre_ffn2(r), router_in = r))
//     x = r + norm_post_ffn(f)
//     [PLE] x = x + norm_post_ple((gelu(x W_gateᵀ) * ple[:, l]) W_projᵀ)
//     x = x * layer_scalar
//   logits = softcap(norm_final(x) . embedᵀ)
// Each cache-owning layer's KV cache is written (KvWrite) right after the last attention that
// reads it (the owner's own, or that of its last KV-shared reader), so every reader sees the
// pre-step cache plus the step's own k/v, and the step's k/v are freed as early as possible.
#pragma once

#include "graph/graph.h"
#include "model/config.h"
#include "model/weights.h"

namespace g4 {

struct GraphOptions {
  // true: logits for every step token (Rows::kTokens); false: only for the step's output rows
  // (SelectRows before the final norm), as generation needs.
  bool all_logits = false;
  // true: also export the intermediates "embeddings", "hidden.<l>" and "ple" (for tests and
  // Engine::Prefill's `captured`). An exported output lives until the end of the step, so a
  // backend keeps one [tokens, H] buffer per layer: leave this off for generation.
  bool export_intermediates = false;
};

// Builds the forward graph. Exported outputs: "logits" [rows, V]; with export_intermediates
// also "embeddings" [tokens, H], "hidden.<l>" [tokens, H] (output of layer l) and "ple"
// [tokens, L*P] when PLE exists.
Graph BuildGemmaGraph(const ModelConfig& config, const ModelWeights& weights, const GraphOptions& options);

}  // namespace g4
