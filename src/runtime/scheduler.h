// Scheduler: one thread owns the engine and serves many requests with continuous batching.
//
// Each loop iteration: (1) admit queued requests into free slots (one engine sequence each),
// (2) run at most one prefill chunk of one admitted request, (3) run ONE decode step for every
// slot that is generating (a batched Decode over all of them), sample each slot's next token,
// stream its text, and finish slots that hit a stop token/string, max_tokens, a degenerate loop or
// cancellation. A request thus joins between decode steps and its prefill is interleaved with the
// others' decode. Greedy results do not depend on what else runs: every op is row-independent.
//
// Admission: a request whose prompt + max_tokens exceeds the context size is refused at Submit
// (InvalidArgument, code context_length_exceeded) — it could never fit; a full queue is
// ResourceExhausted (HTTP 429). Each slot owns a whole sequence of the KV cache, so an admitted
// request can never run out of KV memory mid-way.
//
// Prefix reuse (SchedulerOptions::cache_prompt): a slot keeps the sequence of its last request in
// the KV cache (prompt and generated tokens), and a request goes to the free slot whose sequence
// shares the longest reusable prefix with its prompt (ReusablePrefix, runtime/prefix_cache.h;
// with none, the least recently used free slot), which it then does not prefill. The logits are
// the same bits as a whole prefill's (every prefill chunking gives the same), so reuse changes
// no greedy output.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

namespace g4 {

// Detects token loops in a generation: the same token repeated `max_same_token` times in a row,
// or the last `min_repeats` * p tokens being one period-p pattern repeated (p <= max_period).
// Defaults catch "The The The ..." and "word doubling" loops and leave normal text alone.
struct DegeneracyOptions {
  bool enabled = true;
  int max_same_token = 32;  // a run this long of one token id is a loop
  int max_period = 16;      // patterns up to this many tokens
  int min_repeats = 8;      // repeated this many times back to back
};

// Returns a description ("token 506 repeated 32 times", "a 3-token pattern repeated 8 times") if
// `tokens` (the generated ids so far) ends in a loop, else "".
std::string DetectLoop(const std::vector<int32_t>& tokens, const DegeneracyOptions& options);

struct CompletionRequest {
  std::vector<int32_t> prompt;         // token ids, BOS included
  int max_tokens = 128;                // >= 0; 0: the prompt is prefilled and nothing generated (echo)
  SamplingParams sampling;
  std::vector<std::string> stop;       // stop strings
  std::vector<int32_t> stop_ids;       // extra stop token ids (the tokenizer's end-of-generation ids always stop)
  bool ignore_eos = false;             // true: neither end-of-generation ids nor stop_ids end it
  // The request's own stop token ids (vLLM's stop_token_ids): generating one ends the request
  // with "stop" even with ignore_eos; the token is part of the output (its text too, unless it is
  // a special token, which the text never shows), as in vLLM. Each in [0, vocab).
  std::vector<int32_t> stop_token_ids;
  // -1: no log-probabilities; N in [0, kMaxTopLogprobs]: each generated token's log-probability
  // and the N most likely tokens' (ComputeLogprobs: the raw logits' softmax), in the events.
  int logprobs = -1;
  // With logprobs >= 0: also each prompt token's log-probability given the tokens before it (and
  // the logprobs most likely tokens' there), for prompt[1..]: the prefill then runs in chunks of
  // at most kPromptLogprobsChunk tokens with every row's logits (16 MiB of step memory at V =
  // 262144). Sent in one event (prompt_logprobs) after the prompt's prefill, before any token.
  bool prompt_logprobs = false;
  // Reuse a prefix of the prompt that a slot's KV cache holds (llama-server's cache_prompt), where
  // the scheduler's cache_prompt is on. Never with prompt_logprobs (every prompt row's logits).
  bool cache_prompt = true;
};
inline constexpr int kPromptLogprobsChunk = 16;

// One event per call of the request's callback, on the scheduler thread. Text deltas come in
// order; exactly one final event (done == true) ends every accepted request.
// Every generated token id comes exactly once in `tokens` over the request's events, in order,
// the final event's included (completion_tokens = their count): an id whose text is still held
// back (part of a UTF-8 character, or of what may become a stop string) comes with the next event
// that has text, or with the final event, as does a token that ended the generation (an
// end-of-generation id or one of stop_ids: no text).
struct CompletionEvent {
  std::string text;                    // new text (UTF-8 complete), may be empty
  std::vector<int32_t> tokens;         // token ids behind this delta (see above)
  std::vector<TokenLogprobs> logprobs; // with CompletionRequest::logprobs >= 0: one per id of `tokens`, same order
  // With CompletionRequest::prompt_logprobs: prompt[1..]'s entries (prompt.size() - 1 of them),
  // in the one event that carries them (no text, no tokens), sent before any token's.
  std::vector<TokenLogprobs> prompt_logprobs;
  bool prompt = false;                 // this is that event (prompt_logprobs may be empty: a 1-token prompt)
  bool done = false;
  std::string finish_reason;           // final: "stop", "length", or "cancelled"
  std::string degenerate;              // final: non-empty if the degeneracy guard ended it (why)
  int prompt_tokens = 0;               // final
  int completion_tokens = 0;           // final
  int cached_tokens = 0;               // final: prompt tokens reused from the KV cache (not prefilled)
  double prompt_ms = 0;                // final: queue exit to first token (prefill)
  double predicted_ms = 0;             // final: first token to end
  double queue_ms = 0;                 // final: waiting for a slot
  Status error;                        // final: non-OK if an internal error ended it
};

class RequestHandle {
 public:
  // Asks the scheduler to stop this request and free its slot at the next step (or drop it from
  // the queue). Safe from any thread; idempotent.
  void Cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  std::atomic<bool> cancelled_{false};
};

struct SchedulerOptions {
  int max_queue = 64;                  // requests waiting beyond the slots: with N slots, up to N running
                                       // plus max_queue waiting are accepted; more -> ResourceExhausted
  int prefill_chunk = 256;             // tokens of one prefill step
  bool cache_prompt = true;            // prefix reuse (above); false: every prompt is prefilled whole
  DegeneracyOptions degeneracy;
};

// Counters and gauges for /metrics. Histogram buckets are in seconds.
struct SchedulerStats {
  uint64_t requests_total = 0, requests_finished = 0, requests_rejected = 0, requests_cancelled = 0;
  uint64_t requests_degenerate = 0, requests_failed = 0;
  // prompt_tokens_total: prefilled; prompt_tokens_cached_total: reused from the KV cache instead.
  uint64_t prompt_tokens_total = 0, prompt_tokens_cached_total = 0, generated_tokens_total = 0;
  int queue_depth = 0, busy_slots = 0, slots = 0;  // queue_depth: made by Stats() (waiting, not cancelled)
  int64_t kv_tokens_used = 0, kv_tokens_capacity = 0;
  static constexpr double kBuckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  static constexpr int kNumBuckets = 12;
  uint64_t ttft_bucket[kNumBuckets] = {}, ttft_count = 0;  // time to first token, cumulative buckets
  double ttft_sum = 0;
  uint64_t tpot_bucket[kNumBuckets] = {}, tpot_count = 0;  // per-token latency (decode)
  double tpot_sum = 0;
};

class Scheduler {
 public:
  // The engine's max_seqs is the number of slots. tokenizer may be null (ids only, no stop strings).
  Scheduler(Engine& engine, const Tokenizer* tokenizer, const SchedulerOptions& options);
  ~Scheduler();  // cancels everything still running and joins the thread
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. on_event is called on the scheduler thread (keep it short and non-blocking).
  // Errors (nothing is queued, no event is sent): InvalidArgument (bad sampling params, empty prompt,
  // token ids outside the vocabulary, max_tokens < 0, stop strings without a tokenizer; prompt +
  // max_tokens beyond the context: message starts with "context_length_exceeded:"),
  // ResourceExhausted (queue full), FailedPrecondition (shutting down).
  StatusOr<std::shared_ptr<RequestHandle>> Submit(CompletionRequest request,
                                                  std::function<void(const CompletionEvent&)> on_event);

  SchedulerStats Stats() const;
  int context_size() const { return engine_.options().max_context; }

 private:
  struct Slot;
  struct Pending;
  // The scheduler thread: RunSteps until stopped; a step that throws ends the slots' requests with
  // the error (StatusFromCurrentException) and the steps go on.
  void Loop();
  void RunSteps();
  // Samples slot's next token from `logits` ([V], the engine's step memory, overwritten), sends it
  // and applies the stop rules. Returns true when the slot goes on (its token, the last of
  // slot.generated, is then fed to the next decode step); false when it finished.
  bool SampleNext(Slot& slot, std::span<float> logits);
  void Finish(Slot& slot, const std::string& reason, const Status& error = OkStatus());
  // Requests in queue_ not cancelled (mu_ held): the ones that count against max_queue.
  int LiveQueued() const;
  // The free slot for `p` (one must exist): the longest reusable prefix, else one in the slot
  // group (Backend::SlotGroups) with the fewest busy slots, else the least recently used; sets its
  // `cached`.
  Slot& PickSlot(const Pending& p);

  Engine& engine_;
  const Tokenizer* tokenizer_;
  SchedulerOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Pending>> queue_;
  std::vector<std::unique_ptr<Slot>> slots_;
  SchedulerStats stats_;
  bool stop_ = false;
  uint64_t uses_ = 0;  // slots' last_used clock
  std::thread thread_;
};

}  // namespace g4
