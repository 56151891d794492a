// Prefix reuse: how many of a new prompt's tokens a KV cache sequence already holds, so that the
// scheduler prefills only the rest (llama-server's cache_prompt, vLLM's prefix caching).
//
// A sequence that held `held` (positions 0..L-1, L = held.size()) and is cut back to R tokens
// gives the next prompt tokens exactly the keys and values a fresh prefill would, as long as every
// position they attend to below R is still in the cache. Full layers keep every position. A
// sliding layer of window W keeps a ring of S = min(W, context) slots, slot = pos % S, holding the
// last position written there: position p < R survives iff no p + k*S < L (k >= 1), i.e.
// p >= L - S. Position R attends to max(0, R - W + 1) .. R - 1 (later positions to a subset of
// those below R), so reuse is exact iff max(0, R - W + 1) >= L - S on every sliding layer: always
// where L <= S, else only when R >= L - 1 (the prompt continues the whole held sequence).
#pragma once

#include <cstdint>
#include <span>

#include "model/config.h"

namespace g4 {

// The number of leading tokens of `prompt` to keep from a KV cache sequence (of a cache for
// `config` with `max_context` positions per sequence) holding `held`:
// the common prefix of the two, at most prompt.size() - 1 (the last prompt token is always run:
// its logits give the first generated token), or 0 where a sliding layer's ring no longer holds
// what that prefix needs (above). held.size() <= max_context.
int ReusablePrefix(const ModelConfig& config, int max_context, std::span<const int32_t> held,
                   std::span<const int32_t> prompt);

}  // namespace g4
