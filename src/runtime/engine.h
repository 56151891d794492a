// Engine: runs a loaded model on a backend with a KV cache. Knows nothing about HTTP; the CLI,
// tests and (later) the server drive it.
//
// Prefill feeds a sequence's prompt in chunks of at most `prefill_chunk` tokens; Decode feeds one
// token for each of B sequences in one step. Both continue from the sequence's cache length, so
// one-shot prefill, chunked prefill and token-by-token decode compute the same logits.
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "base/status.h"
#include "model/gemma.h"
#include "model/model.h"
#include "runtime/backend.h"
#include "runtime/kv_cache.h"

namespace g4 {

struct EngineOptions {
  int max_seqs = 1;        // sequences the KV cache holds at once
  int max_context = 0;     // tokens per sequence; 0 = DefaultContextSize (min(max_position_embeddings, 4096))
  int prefill_chunk = 512; // tokens per prefill step
  DType kv_type = DType::kF32;  // KV cache elements: kF32, kF16 or kBF16 (half the bytes; K/V rounded to f16 or
                                // bf16), or kI8 (a quarter plus per-token scales)
};

// The KV cache element type of the commands' --cache-type flag: "f32", "f16", "bf16" or "q8"
// (also "q8_0", llama.cpp's spelling; DType::kI8: kv_cache.h) or "fp8" (DType::kF8E4M3, e4m3 with
// one f32 scale per token and KV head; held only where the device computes with it, a TPU or a
// CUDA GPU of compute capability >= 8.9: Backend::CheckKvCacheType refuses it elsewhere with the
// reason), InvalidArgument otherwise. The commands default to f16, as
// llama.cpp's -ctk/-ctv do (half the cache's memory and of decode's KV reads; K and V rounded to
// f16). bf16 rounds them to bf16 and computes attention with the queries and softmax weights in
// bf16 too, on the CPU's bf16 dot-product instruction where it has one (attention_bf16.h). f32
// keeps transformers' f32 arithmetic (EngineOptions' default). q8 stores int8 with one f32 scale
// per token and KV head (about half of f16's bytes), each element within half a scale step
// (max|x| / 254) of its value, and computes attention in f32 on the integers widened in registers.
// Their accuracy: docs/NUMERICS.md.
inline constexpr const char* kDefaultCacheType = "f16";
inline const std::vector<std::string> kCacheTypeNames = {"f32", "f16", "bf16", "q8", "q8_0", "fp8"};
inline constexpr const char* kCacheTypeHelp =
    "KV cache element type for K and V: f16 (default), bf16, f32, q8 (int8) or fp8 (e4m3, where the device has it); -ctk/-ctv too";
StatusOr<DType> ParseCacheType(const std::string& name);
// The --cache-type spelling of a KV cache type: "f32", "f16", "bf16", "q8" or "fp8".
const char* CacheTypeName(DType type);
// llama.cpp's spellings of the cache type, for every command: `-ctk T`, `-ctv T`, `--cache-type-k T`,
// `--cache-type-v T` (also `=T`) become one `--cache-type T`. gemma4rt keeps K and V in one type:
// InvalidArgument when they name different types (naming each spelling and value), or when an
// alias names no type gemma4rt has. Where an alias is given, or `--cache-type` more than once,
// every `--cache-type T` joins the check (one flag is emitted). Other arguments are returned
// unchanged, and so is the argument after one for which takes_value says true (an option that
// consumes the next argument as its value: `-p -ctk` keeps the prompt "-ctk"); without
// takes_value every argument is looked at. Without lists a value holding a comma is refused (a
// list is bench's), and so is one spelling given twice with different types. lists (bench): a
// value may be a comma-separated list of types (`-ctk f16,bf16`, a sweep as in llama-bench), each
// checked (--cache-type's too); a spelling given again appends its types (as llama-bench's
// repeats); K and V must then name the same list (compared as written), which is emitted as one
// `--cache-type f16,bf16`.
StatusOr<std::vector<std::string>> RewriteCacheTypeAliases(
    std::vector<std::string> args, const std::function<bool(const std::string&)>& takes_value = {}, bool lists = false);

// The context every command uses when -c is 0 or not given: the model's max_position_embeddings,
// capped at kDefaultContextCap tokens (the KV cache is allocated for it up front).
inline constexpr int kDefaultContextCap = 4096;
int DefaultContextSize(const ModelConfig& config);
// `requested` tokens (-c), or DefaultContextSize when it is 0. Errors: InvalidArgument when it is
// negative or exceeds the model's max_position_embeddings.
StatusOr<int> ResolveContextSize(const ModelConfig& config, int requested);

class Engine {
 public:
  // Errors: InvalidArgument for options out of range (named); the backend's when the KV cache cannot
  // be created (Backend::CreateKvCache).
  static StatusOr<std::unique_ptr<Engine>> Create(std::unique_ptr<LoadedModel> model, std::unique_ptr<Backend> backend,
                                                  const EngineOptions& options);

  const ModelConfig& config() const { return model_->config; }
  const LoadedModel& model() const { return *model_; }
  const EngineOptions& options() const { return options_; }
  const Backend& backend() const { return *backend_; }
  // The KV cache, where the backend keeps it (Backend::CreateKvCache).
  const KvCacheBase& cache() const { return *cache_; }
  int SequenceLength(int seq) const { return cache_->length(seq); }
  // Forgets sequence `seq` (O(1)).
  void ResetSequence(int seq) { cache_->Reset(seq); }
  // Keeps positions 0..length-1 of sequence `seq` (0 <= length <= its length) and forgets the
  // rest (O(1)); the next step continues at `length` (prefix reuse: runtime/prefix_cache.h).
  // Backends read only positions below a sequence's length, so what lies past it is never seen.
  void TruncateSequence(int seq, int length) { cache_->set_length(seq, std::clamp(length, 0, cache_->length(seq))); }

  // Appends `tokens` to sequence `seq`. logits: [tokens, V] when all_logits, else [V] for the last
  // token. captured (optional): every exported graph output with one row per token ("embeddings",
  // "hidden.<l>", "ple", and "logits" when all_logits), [tokens, cols] row-major.
  // Errors: InvalidArgument (bad seq, empty tokens, token id outside [0, vocab)),
  // ResourceExhausted (the sequence would exceed max_context; nothing is written), Cancelled
  // (interrupt, read before each chunk after the first, became true: the sequence holds the
  // chunks already run and no logits).
  Status Prefill(int seq, std::span<const int32_t> tokens, bool all_logits, std::vector<float>* logits,
                 std::map<std::string, std::vector<float>>* captured = nullptr,
                 const std::atomic<bool>* interrupt = nullptr);

  // One token per sequence: tokens[b] is appended to seqs[b] (distinct). logits: [B, V].
  // Errors as Prefill.
  Status Decode(std::span<const int32_t> seqs, std::span<const int32_t> tokens, std::vector<float>* logits);

  // Runs every step shape a server with prefill chunks of at most `chunk` tokens and decode
  // batches of up to max_seqs sequences uses (prefill of 1, 2, 4, ... and `chunk` tokens; decode
  // of 1, 2, 4, ... and max_seqs sequences), so that a backend that compiles per shape
  // (Backend::CompilesPerShape) has compiled them all; the cache is left empty. Returns the number
  // of steps run. Every sequence must be empty (FailedPrecondition otherwise).
  StatusOr<int> Warmup(int chunk);

  // The logits of the last Prefill or Decode call, without a copy: a view into the backend's step
  // memory, [rows, V] row-major with V = config().vocab. Decode: one row per sequence, row b for
  // seqs[b]. Prefill: the last chunk's output rows (all_logits false: one row, the last token's).
  // Empty before the first step and after a failed one. Valid until the next Prefill or Decode on
  // this engine (any sequence); the caller may overwrite it (the scheduler and Generate sample in
  // place, sparing a 1 MiB copy per 262144-entry row).
  std::span<float> StepLogits() const;

 private:
  Engine(std::unique_ptr<LoadedModel> model, std::unique_ptr<Backend> backend, const EngineOptions& options,
         std::unique_ptr<KvCacheBase> cache);
  Status CheckTokens(std::span<const int32_t> tokens) const;
  // The graph for a step: logits for every token or the output rows only; capture: with the
  // intermediates exported (built on first use).
  const Graph& GraphFor(bool all_logits, bool capture);
  StatusOr<Executable*> GetExecutable(int num_tokens, int num_output_rows, bool all_logits, bool capture);

  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<Backend> backend_;
  EngineOptions options_;
  std::unique_ptr<KvCacheBase> cache_;
  Graph graph_last_;  // logits for output rows only
  Graph graph_all_;   // logits for every token
  std::unique_ptr<Graph> graph_capture_[2];  // [all_logits]: also exporting the intermediates
  // By (tokens, output rows, all_logits, capture).
  std::map<std::tuple<int, int, bool, bool>, std::unique_ptr<Executable>> executables_;
  std::vector<int32_t> pos_buf_, seq_buf_, out_buf_;
  Executable* last_exe_ = nullptr;  // the executable of the last successful step (StepLogits)
};

}  // namespace g4
