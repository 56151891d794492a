#include "runtime/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include "runtime/prefix_cache.h"
#include "runtime/stop.h"
#include "tokenizer/detokenizer.h"

namespace g4 {
namespace {

using Clock = std::chrono::steady_clock;
double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

void Observe(uint64_t* buckets, uint64_t* count, double* sum, double seconds) {
  for (int i = 0; i < SchedulerStats::kNumBuckets; ++i)
    if (seconds <= SchedulerStats::kBuckets[i]) ++buckets[i];
  ++*count;
  *sum += seconds;
}

}  // namespace

std::string DetectLoop(const std::vector<int32_t>& t, const DegeneracyOptions& o) {
  if (!o.enabled) return "";
  const int n = static_cast<int>(t.size());
  if (o.max_same_token > 1 && n >= o.max_same_token) {
    bool same = true;
    for (int i = n - o.max_same_token; i < n && same; ++i) same = t[i] == t[n - 1];
    if (same) return "token " + std::to_string(t[n - 1]) + " repeated " + std::to_string(o.max_same_token) + " times";
  }
  for (int p = 2; p <= o.max_period; ++p) {
    const int span = p * o.min_repeats;
    if (n < span) break;
    bool loop = false;  // a one-token run is left to max_same_token
    for (int i = n - p + 1; i < n && !loop; ++i) loop = t[i] != t[n - p];
    for (int i = n - span + p; i < n && loop; ++i) loop = t[i] == t[i - p];
    if (loop) return "a " + std::to_string(p) + "-token pattern repeated " + std::to_string(o.min_repeats) + " times";
  }
  return "";
}

struct Scheduler::Pending {
  CompletionRequest req;
  std::function<void(const CompletionEvent&)> cb;
  std::shared_ptr<RequestHandle> handle;
  Clock::time_point enqueued;
};

struct Scheduler::Slot {
  int seq = 0;
  std::unique_ptr<Pending> p;            // null: free
  std::optional<Sampler> sampler;
  std::optional<StopMatcher> stops;
  std::optional<IncrementalDetokenizer> detok;
  int prefilled = 0;                     // prompt tokens already in the cache
  int cached = 0;                        // of those, reused from the slot's last sequence
  // Free slot: the tokens its sequence holds (positions 0..length-1), for prefix reuse; and when
  // its last request ended (Scheduler::uses_).
  std::vector<int32_t> held;
  uint64_t last_used = 0;
  bool has_token = false;                // generated.back() is sampled and waits for a decode step
  std::vector<int32_t> generated;
  // Generated ids (and their log-probabilities, when asked) not yet sent: their text is held back
  // (CompletionEvent); the next event with text, or the final one, carries them.
  std::vector<int32_t> unsent;
  std::vector<TokenLogprobs> unsent_logprobs;
  std::vector<TokenLogprobs> prompt_logprobs;  // with prompt_logprobs: filled chunk by chunk during the prefill
  std::string degenerate;
  Clock::time_point admitted, first_token, last_token;
};

Scheduler::Scheduler(Engine& engine, const Tokenizer* tokenizer, const SchedulerOptions& options)
    : engine_(engine), tokenizer_(tokenizer), options_(options) {
  const int n = engine.cache().max_seqs();
  for (int i = 0; i < n; ++i) {
    slots_.push_back(std::make_unique<Slot>());
    slots_.back()->seq = i;
  }
  stats_.slots = n;
  stats_.kv_tokens_capacity = static_cast<int64_t>(n) * engine.options().max_context;
  thread_ = std::thread([this] { Loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

StatusOr<std::shared_ptr<RequestHandle>> Scheduler::Submit(CompletionRequest req,
                                                          std::function<void(const CompletionEvent&)> on_event) {
  const ModelConfig& c = engine_.config();
  if (req.prompt.empty()) return InvalidArgument("prompt: no tokens");
  if (req.max_tokens < 0) return InvalidArgument("max_tokens must be >= 0");
  const int vocab_limit = c.ple_dim > 0 ? std::min(c.vocab, c.ple_vocab) : c.vocab;
  for (size_t i = 0; i < req.prompt.size(); ++i)
    if (req.prompt[i] < 0 || req.prompt[i] >= vocab_limit)
      return InvalidArgument("prompt: token id " + std::to_string(req.prompt[i]) + " at index " + std::to_string(i) +
                             " is outside the vocabulary [0, " + std::to_string(vocab_limit) + ")");
  const int ctx = engine_.options().max_context;
  if (static_cast<int64_t>(req.prompt.size()) + req.max_tokens > ctx)
    return InvalidArgument("context_length_exceeded: the prompt has " + std::to_string(req.prompt.size()) +
                           " tokens and max_tokens is " + std::to_string(req.max_tokens) +
                           "; together they exceed the context size of " + std::to_string(ctx) + " tokens");
  for (size_t i = 0; i < req.stop_token_ids.size(); ++i)
    if (req.stop_token_ids[i] < 0 || req.stop_token_ids[i] >= c.vocab)
      return InvalidArgument("stop_token_ids[" + std::to_string(i) + "]: token id " + std::to_string(req.stop_token_ids[i]) +
                             " is outside the vocabulary [0, " + std::to_string(c.vocab) + ")");
  if (req.prompt_logprobs && req.logprobs < 0) return InvalidArgument("logprobs: prompt log-probabilities need logprobs >= 0");
  if (req.logprobs < -1 || req.logprobs > kMaxTopLogprobs)
    return InvalidArgument("logprobs: " + std::to_string(req.logprobs) + " top tokens asked, at most " +
                           std::to_string(kMaxTopLogprobs));
  G4_RETURN_IF_ERROR(req.sampling.ValidateForVocab(c.vocab));
  if (tokenizer_ == nullptr && !req.stop.empty()) return InvalidArgument("stop: stop strings need a tokenizer");
  G4_RETURN_IF_ERROR(StopMatcher::Create(req.stop).status());
  auto pending = std::make_unique<Pending>();
  pending->req = std::move(req);
  pending->cb = std::move(on_event);
  pending->handle = std::make_shared<RequestHandle>();
  pending->enqueued = Clock::now();
  std::shared_ptr<RequestHandle> handle = pending->handle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return FailedPrecondition("the server is shutting down");
    // Every accepted request not yet finished is either running (busy_slots) or not yet given a
    // slot (queue_, including arrivals the loop has not admitted yet, although a slot is free).
    // Counting both against slots + max_queue accepts up to N running + Q waiting, however
    // simultaneously they arrive; both counters only change under mu_.
    // A waiting request whose client has gone (cancelled) no longer counts: the loop drops it at
    // its next step, but a place is free for a new request at once.
    const int slots = static_cast<int>(slots_.size());
    if (LiveQueued() + stats_.busy_slots >= slots + options_.max_queue) {
      ++stats_.requests_rejected;
      return ResourceExhausted("the request queue is full (slots: " + std::to_string(slots) + ", max queue: " +
                               std::to_string(options_.max_queue) + ")");
    }
    ++stats_.requests_total;
    queue_.push_back(std::move(pending));
  }
  cv_.notify_all();
  return handle;
}

int Scheduler::LiveQueued() const {
  int n = 0;
  for (const auto& p : queue_) n += !p->handle->cancelled();
  return n;
}

SchedulerStats Scheduler::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulerStats s = stats_;
  s.queue_depth = LiveQueued();  // made here only: a cancelled request still in queue_ is not waiting
  return s;
}

void Scheduler::Finish(Slot& s, const std::string& reason, const Status& error) {
  CompletionEvent ev;
  ev.done = true;
  ev.finish_reason = reason;
  ev.error = error;
  ev.degenerate = s.degenerate;
  ev.tokens = std::move(s.unsent);
  ev.logprobs = std::move(s.unsent_logprobs);
  if (error.ok() && reason != "cancelled" && s.stops && !s.stops->stopped()) {
    StopMatcher::Result r = s.stops->Feed(s.detok ? s.detok->Flush() : std::string());
    ev.text = r.text;
    if (!r.stopped) ev.text += s.stops->Flush().text;
  }
  const auto now = Clock::now();
  ev.prompt_tokens = static_cast<int>(s.p->req.prompt.size());
  ev.completion_tokens = static_cast<int>(s.generated.size());
  const int cached = std::min(s.cached, s.prefilled);  // 0 where the request never started
  ev.cached_tokens = cached;
  ev.queue_ms = Ms(s.p->enqueued, s.admitted);
  ev.prompt_ms = s.generated.empty() ? Ms(s.admitted, now) : Ms(s.admitted, s.first_token);
  ev.predicted_ms = s.generated.empty() ? 0 : Ms(s.first_token, now);
  {  // stats first, so a client that saw its final event also sees it counted
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.requests_finished;
    stats_.requests_cancelled += reason == "cancelled";
    stats_.requests_failed += !error.ok();
    stats_.requests_degenerate += !s.degenerate.empty();
    stats_.prompt_tokens_total += s.prefilled - cached;
    stats_.prompt_tokens_cached_total += cached;
    stats_.generated_tokens_total += s.generated.size();
    --stats_.busy_slots;
  }
  if (s.p->cb) s.p->cb(ev);
  if (!s.degenerate.empty())
    std::fprintf(stderr, "gemma4rt: degeneracy guard ended a generation after %zu tokens: %s\n", s.generated.size(),
                 s.degenerate.c_str());
  // A request that ran leaves its sequence for the next where it is whole: its prompt and generated
  // tokens up to the sequence's length (the last sampled token was never fed); after an error it
  // may be half-written. One that never started (no sampler yet) leaves the slot's last sequence.
  if (s.sampler) {
    s.held.clear();
    const int length = engine_.SequenceLength(s.seq);
    if (options_.cache_prompt && error.ok()) {
      const std::vector<int32_t>& prompt = s.p->req.prompt;
      s.held.assign(prompt.begin(), prompt.begin() + std::min<size_t>(length, prompt.size()));
      for (size_t i = 0; static_cast<int>(s.held.size()) < length && i < s.generated.size(); ++i)
        s.held.push_back(s.generated[i]);
    }
    if (static_cast<int>(s.held.size()) != length) {
      s.held.clear();
      engine_.ResetSequence(s.seq);
    }
    s.last_used = ++uses_;
  }
  s.p.reset();
  s.sampler.reset();
  s.stops.reset();
  s.detok.reset();
  s.generated.clear();
  s.unsent.clear();
  s.unsent_logprobs.clear();
  s.prompt_logprobs.clear();
  s.degenerate.clear();
  s.has_token = false;
  s.prefilled = 0;
  s.cached = 0;
}

Scheduler::Slot& Scheduler::PickSlot(const Pending& p) {
  const bool reuse = options_.cache_prompt && p.req.cache_prompt && !p.req.prompt_logprobs;
  // Busy slots per slot group (Backend::SlotGroups): among equal reuse, the least busy group first,
  // so a batched decode step's rows spread over the groups' devices.
  const int groups = std::max(1, engine_.backend().SlotGroups());
  const int per_group = std::max(1, static_cast<int>(slots_.size()) / groups);
  std::vector<int> busy(groups, 0);
  auto group = [&](const Slot& s) { return std::min(groups - 1, s.seq / per_group); };
  for (const auto& sp : slots_)
    if (sp->p) ++busy[group(*sp)];
  Slot* best = nullptr;
  int best_reuse = -1;
  for (auto& sp : slots_) {
    if (sp->p) continue;
    const int r = reuse ? ReusablePrefix(engine_.config(), engine_.cache().max_context(), sp->held, p.req.prompt) : 0;
    const bool better =
        r > best_reuse ||
        (r == best_reuse && (busy[group(*sp)] < busy[group(*best)] ||
                             (busy[group(*sp)] == busy[group(*best)] && sp->last_used < best->last_used)));
    if (better) {
      best = sp.get();
      best_reuse = r;
    }
  }
  best->cached = best_reuse;
  return *best;
}

bool Scheduler::SampleNext(Slot& s, std::span<float> logits) {
  const int top_n = s.p->req.logprobs;
  // With logprobs the row must stay raw for ComputeLogprobs: Sample adjusts a copy (1 MiB at V =
  // 262144, only for such requests).
  StatusOr<int32_t> next = top_n >= 0 ? s.sampler->Sample(logits, s.p->req.prompt, s.generated)
                                      : s.sampler->SampleInPlace(logits, s.p->req.prompt, s.generated);
  if (!next.ok()) {
    Finish(s, "stop", next.status());
    return false;
  }
  std::optional<TokenLogprobs> lp_next;
  if (top_n >= 0) {
    StatusOr<TokenLogprobs> lp = ComputeLogprobs(logits, *next, top_n);
    if (!lp.ok()) {
      Finish(s, "stop", lp.status());
      return false;
    }
    lp_next = std::move(lp).value();
  }
  const auto now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (s.generated.empty()) {
      s.first_token = now;
      Observe(stats_.ttft_bucket, &stats_.ttft_count, &stats_.ttft_sum, Ms(s.p->enqueued, now) / 1000);
    } else {
      Observe(stats_.tpot_bucket, &stats_.tpot_count, &stats_.tpot_sum, Ms(s.last_token, now) / 1000);
    }
  }
  s.last_token = now;
  const int32_t tok = *next;
  s.generated.push_back(tok);
  s.unsent.push_back(tok);
  if (lp_next) s.unsent_logprobs.push_back(std::move(*lp_next));
  const CompletionRequest& r = s.p->req;
  const bool stop_token = !r.ignore_eos && ((tokenizer_ && tokenizer_->IsEndOfGeneration(tok)) ||
                                            std::find(r.stop_ids.begin(), r.stop_ids.end(), tok) != r.stop_ids.end());
  if (stop_token) {
    Finish(s, "stop");
    return false;
  }
  StopMatcher::Result sr = s.stops->Feed(s.detok ? s.detok->Push(tok) : std::string());
  if (!sr.text.empty() || !tokenizer_) {  // else the ids wait for text (CompletionEvent)
    CompletionEvent ev;
    ev.text = std::move(sr.text);
    ev.tokens = std::move(s.unsent);
    ev.logprobs = std::move(s.unsent_logprobs);
    s.unsent.clear();
    s.unsent_logprobs.clear();
    if (s.p->cb) s.p->cb(ev);
  }
  if (sr.stopped) {
    Finish(s, "stop");
    return false;
  }
  if (std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), tok) != r.stop_token_ids.end()) {
    Finish(s, "stop");  // after its text went out
    return false;
  }
  if (static_cast<int>(s.generated.size()) >= r.max_tokens) {
    Finish(s, "length");
    return false;
  }
  s.degenerate = DetectLoop(s.generated, options_.degeneracy);
  if (!s.degenerate.empty()) {
    Finish(s, "stop");
    return false;
  }
  return true;
}

void Scheduler::Loop() {
  for (;;) {
    try {
      RunSteps();
      return;  // stopped
    } catch (...) {
      // A step that threw (a failed allocation in the engine, on any of its pool's threads, or in
      // a sampler): the requests in the slots end with the error, and the server goes on with the
      // rest, never std::terminate.
      const Status st = StatusFromCurrentException("a generation step (its requests end here)");
      std::fprintf(stderr, "gemma4rt: error: %s\n", st.ToString().c_str());
      for (auto& sp : slots_)
        if (sp->p) Finish(*sp, "stop", st);
    }
  }
}

void Scheduler::RunSteps() {
  std::vector<int32_t> batch_seqs, batch_tokens;
  std::vector<Slot*> batch_slots;
  for (;;) {
    // ---- admit ----
    std::vector<std::unique_ptr<Pending>> dropped;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        if (stop_ || !queue_.empty()) return true;
        for (const auto& s : slots_)
          if (s->p) return true;
        return false;
      });
      if (stop_) {
        for (auto& p : queue_) dropped.push_back(std::move(p));
        queue_.clear();
      } else {
        // Every waiting request that was cancelled (its client hung up) leaves the queue at each
        // step, wherever it waits, not only when a slot frees and it reaches the front: its
        // client learns at once, and /metrics' queue depth is the requests still waiting.
        for (auto it = queue_.begin(); it != queue_.end();) {
          if ((*it)->handle->cancelled()) {
            dropped.push_back(std::move(*it));
            it = queue_.erase(it);
          } else {
            ++it;
          }
        }
        int free_slots = 0;
        for (const auto& s : slots_) free_slots += !s->p;
        for (; free_slots > 0 && !queue_.empty(); --free_slots) {
          Slot& s = PickSlot(*queue_.front());
          s.p = std::move(queue_.front());
          queue_.pop_front();
          ++stats_.busy_slots;
        }
      }
    }
    const auto dropped_at = Clock::now();
    for (auto& p : dropped) {
      CompletionEvent ev;
      ev.done = true;
      ev.finish_reason = "cancelled";
      ev.prompt_tokens = static_cast<int>(p->req.prompt.size());
      ev.queue_ms = Ms(p->enqueued, dropped_at);  // it waited until now (never admitted)
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.requests_finished;
        ++stats_.requests_cancelled;
      }
      if (p->cb) p->cb(ev);
    }
    bool stopping;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping = stop_;
    }
    for (auto& sp : slots_) {
      Slot& s = *sp;
      if (!s.p) continue;
      if (stopping || s.p->handle->cancelled()) {
        Finish(s, "cancelled");
        continue;
      }
      if (!s.sampler) {  // newly admitted
        s.admitted = Clock::now();
        auto sampler = Sampler::Create(s.p->req.sampling);
        auto stops = StopMatcher::Create(s.p->req.stop);
        if (!sampler.ok() || !stops.ok()) {
          Finish(s, "stop", sampler.ok() ? stops.status() : sampler.status());
          continue;
        }
        s.sampler.emplace(std::move(sampler).value());
        s.stops.emplace(std::move(stops).value());
        if (tokenizer_) s.detok.emplace(*tokenizer_, /*skip_special=*/true);
        engine_.TruncateSequence(s.seq, s.cached);  // PickSlot's reusable prefix, or nothing
        s.prefilled = s.cached;
        s.held.clear();
      }
    }
    if (stopping) return;

    // ---- one batched decode step over every slot with a sampled token, each sampled again ----
    // Sampling reads the engine's step memory in place (Engine::StepLogits) right after the step
    // that made it, so no slot keeps a copy of its logits.
    batch_seqs.clear();
    batch_tokens.clear();
    batch_slots.clear();
    for (auto& sp : slots_) {
      Slot& s = *sp;
      if (!s.p || !s.has_token) continue;
      s.has_token = false;
      batch_seqs.push_back(s.seq);
      batch_tokens.push_back(s.generated.back());
      batch_slots.push_back(&s);
    }
    if (!batch_seqs.empty()) {
      Status st = engine_.Decode(batch_seqs, batch_tokens, nullptr);
      const std::span<float> logits = engine_.StepLogits();
      const size_t V = static_cast<size_t>(engine_.config().vocab);
      for (size_t b = 0; b < batch_slots.size(); ++b) {
        Slot& s = *batch_slots[b];
        if (!st.ok()) {
          Finish(s, "stop", st);
          continue;
        }
        s.has_token = SampleNext(s, logits.subspan(b * V, V));
      }
    }

    // ---- one prefill chunk (oldest admitted request first); its last chunk gives the first token ----
    Slot* pre = nullptr;
    for (auto& sp : slots_)
      if (sp->p && sp->prefilled < static_cast<int>(sp->p->req.prompt.size()) && (!pre || sp->admitted < pre->admitted))
        pre = sp.get();
    if (pre) {
      const CompletionRequest& r = pre->p->req;
      const auto& prompt = r.prompt;
      const int size = static_cast<int>(prompt.size());
      // With prompt_logprobs, one engine chunk at most (Engine::Prefill splits longer steps, and
      // StepLogits then holds only the last piece's rows).
      const int n = std::min<int>(r.prompt_logprobs ? std::min({options_.prefill_chunk, kPromptLogprobsChunk,
                                                                engine_.options().prefill_chunk})
                                                    : options_.prefill_chunk,
                                  size - pre->prefilled);
      Status st = engine_.Prefill(pre->seq, std::span<const int32_t>(prompt).subspan(pre->prefilled, n), r.prompt_logprobs,
                                  nullptr);
      const std::span<float> rows = engine_.StepLogits();  // [n, V] with prompt_logprobs, else [1, V]
      const size_t V = static_cast<size_t>(engine_.config().vocab);
      if (st.ok() && rows.size() != (r.prompt_logprobs ? static_cast<size_t>(n) : 1) * V)
        st = Internal("prefill returned " + std::to_string(rows.size() / V) + " rows of logits for a chunk of " +
                      std::to_string(n) + " tokens");
      // Row i (position prefilled + i) predicts the prompt's next token, where there is one.
      for (int i = 0; st.ok() && r.prompt_logprobs && i < n && pre->prefilled + i + 1 < size; ++i) {
        StatusOr<TokenLogprobs> lp = ComputeLogprobs(rows.subspan(i * V, V), prompt[pre->prefilled + i + 1], r.logprobs);
        if (!lp.ok()) st = lp.status();
        else pre->prompt_logprobs.push_back(std::move(lp).value());
      }
      if (!st.ok()) {
        Finish(*pre, "stop", st);
      } else {
        pre->prefilled += n;
        if (pre->prefilled == size) {
          if (r.prompt_logprobs && pre->p->cb) {
            CompletionEvent ev;
            ev.prompt = true;
            ev.prompt_logprobs = std::move(pre->prompt_logprobs);
            pre->prompt_logprobs.clear();
            pre->p->cb(ev);
          }
          if (r.max_tokens == 0) Finish(*pre, "length");  // the prompt alone (echo)
          else pre->has_token = SampleNext(*pre, rows.subspan(rows.size() - V, V));
        }
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      int64_t used = 0;
      for (const auto& sp : slots_)
        if (sp->p) used += engine_.SequenceLength(sp->seq);
      stats_.kv_tokens_used = used;
    }
  }
}

}  // namespace g4
