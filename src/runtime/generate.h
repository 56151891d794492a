// One completion on one engine sequence: prefill the prompt, then sample / decode until a stop
// token, a stop string or max_tokens. Text is streamed through a callback in UTF-8-safe pieces.
// Used by `gemma4rt generate`; the server's scheduler will drive the same pieces per step.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

namespace g4 {

struct GenerateRequest {
  std::vector<int32_t> prompt;        // token ids, BOS included
  int max_tokens = 128;               // generated tokens at most (>= 1)
  SamplingParams sampling;
  std::vector<std::string> stop;      // stop strings (not included in the output)
  std::vector<int32_t> stop_ids;      // extra stop token ids (the tokenizer's end-of-generation ids always stop)
  bool ignore_eos = false;            // true: only max_tokens and stop strings end generation
  // Read between the prompt's prefill chunks and before each decode step: once true, generation
  // ends with finish_reason "interrupted" (`generate`'s Ctrl-C). May be null.
  const std::atomic<bool>* interrupt = nullptr;
};

struct GenerateResult {
  std::vector<int32_t> tokens;        // generated ids (a final stop token included)
  std::string text;                   // the streamed text, concatenated
  std::string finish_reason;          // "stop" (stop token or string), "length" or "interrupted"
  double prefill_seconds = 0;         // prompt processing, i.e. time to first token
  double decode_seconds = 0;          // the remaining tokens
  int prompt_tokens = 0;
  int prefilled_tokens = 0;           // prompt tokens run through the model: prompt_tokens, or fewer when interrupted
  uint64_t seed = 0;                  // the sampler's seed: the request's, or the one drawn without one
};

// The tokenizer that belongs to a loaded model: the GGUF's vocabulary, or tokenizer.json in a
// Hugging Face directory. Errors: NotFound when the checkpoint has none; the tokenizer's errors.
StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerFor(const LoadedModel& model);

// Generation defaults of a model: generation_config.json (temperature, top_k, top_p, min_p,
// repetition_penalty, suppress_tokens, eos_token_id -> stop ids) when the checkpoint directory
// has one, else Gemma's published defaults (temperature 1.0, top_k 64, top_p 0.95; spec 6.3).
// stop_ids receives the extra stop token ids. Errors: InvalidArgument naming a malformed field.
Status ModelGenerationDefaults(const LoadedModel& model, SamplingParams* sampling, std::vector<int32_t>* stop_ids);

// Runs the request on sequence `seq` (reset first). on_text receives each safe-to-show piece.
// tokenizer may be null (a checkpoint without one): then only token ids are produced, the model
// config's stop ids end generation, and stop strings are an InvalidArgument.
// Errors: InvalidArgument (bad sampling params, empty prompt, max_tokens < 1), ResourceExhausted
// (prompt + max_tokens beyond the context), and any engine error.
Status Generate(Engine& engine, const Tokenizer* tokenizer, int seq, const GenerateRequest& request,
                const std::function<void(std::string_view)>& on_text, GenerateResult* result);

}  // namespace g4
