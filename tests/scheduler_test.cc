// Scheduler: continuous batching gives each request exactly what it gets alone; cancellation,
// queue limits, context admission and the degeneracy guard.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/scheduler.h"

namespace g4 {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<Engine> TinyEngine(int slots, int ctx = 128) {
  auto m = LoadModel(std::string(GEMMA4RT_TEST_DATA_DIR) + "/golden/gemma4-e2b-tiny");
  EXPECT_TRUE(m.ok());
  EngineOptions o;
  o.max_seqs = slots;
  o.max_context = ctx;
  o.prefill_chunk = 5;
  auto e = Engine::Create(std::move(m).value(), MakeCpuBackend(2), o);
  EXPECT_TRUE(e.ok());
  return std::move(e).value();
}

CompletionRequest Greedy(std::vector<int32_t> prompt, int max_tokens) {
  CompletionRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  return r;
}

struct Collected {
  std::promise<CompletionEvent> final_event;
  std::vector<int32_t> tokens;
};

// Submits and returns a future of (tokens, final event).
std::shared_future<std::pair<std::vector<int32_t>, CompletionEvent>> SubmitAndCollect(Scheduler& s, CompletionRequest r,
                                                                         std::shared_ptr<RequestHandle>* handle = nullptr) {
  auto tokens = std::make_shared<std::vector<int32_t>>();
  auto done = std::make_shared<std::promise<std::pair<std::vector<int32_t>, CompletionEvent>>>();
  auto fut = done->get_future().share();
  auto h = s.Submit(std::move(r), [tokens, done](const CompletionEvent& ev) {
    tokens->insert(tokens->end(), ev.tokens.begin(), ev.tokens.end());
    if (ev.done) done->set_value({*tokens, ev});
  });
  EXPECT_TRUE(h.ok()) << h.status().ToString();
  if (handle && h.ok()) *handle = *h;
  return fut;
}

TEST(DetectLoopTest, CatchesRepeatsAndLeavesNormalTextAlone) {
  DegeneracyOptions o;
  std::vector<int32_t> same(32, 7);
  EXPECT_EQ(DetectLoop(same, o), "token 7 repeated 32 times");
  same.pop_back();
  EXPECT_EQ(DetectLoop(same, o), "");
  std::vector<int32_t> pattern;
  for (int i = 0; i < 8; ++i) pattern.insert(pattern.end(), {1, 2, 3});
  EXPECT_EQ(DetectLoop(pattern, o), "a 3-token pattern repeated 8 times");
  pattern.back() = 9;
  EXPECT_EQ(DetectLoop(pattern, o), "");
  std::vector<int32_t> text;
  for (int i = 0; i < 200; ++i) text.push_back((i * 7919) % 263);
  EXPECT_EQ(DetectLoop(text, o), "");
  o.enabled = false;
  EXPECT_EQ(DetectLoop(std::vector<int32_t>(64, 7), o), "");
}

// 8 different prompts, submitted staggered onto 4 slots, each give exactly the ids they give alone.
// An interrupt (generate's Ctrl-C) stops a prefill between its chunks: Cancelled, the sequence
// holding the chunks already run (the first always runs); Generate then ends "interrupted" with
// no token. Unset, the same prompt prefills whole and generates.
TEST(GenerateTest, InterruptStopsThePrefillBetweenChunks) {
  auto engine = TinyEngine(1);
  const std::vector<int32_t> prompt = {2, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45};  // 3 chunks of 5
  std::atomic<bool> stop{true};
  Status st = engine->Prefill(0, prompt, false, nullptr, nullptr, &stop);
  EXPECT_EQ(st.code(), StatusCode::kCancelled) << st.ToString();
  EXPECT_EQ(engine->SequenceLength(0), 5);
  GenerateRequest req;
  req.prompt = prompt;
  req.max_tokens = 4;
  req.sampling.temperature = 0;
  req.ignore_eos = true;
  req.interrupt = &stop;
  GenerateResult r;
  ASSERT_TRUE(Generate(*engine, nullptr, 0, req, nullptr, &r).ok());
  EXPECT_EQ(r.finish_reason, "interrupted");
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_EQ(r.prompt_tokens, 12);
  EXPECT_EQ(r.prefilled_tokens, 5);
  stop = false;
  ASSERT_TRUE(Generate(*engine, nullptr, 0, req, nullptr, &r).ok());
  EXPECT_EQ(r.finish_reason, "length");
  EXPECT_EQ(r.tokens.size(), 4u);
  EXPECT_EQ(r.prefilled_tokens, 12);
  EXPECT_EQ(engine->SequenceLength(0), static_cast<int>(prompt.size()) + 3);
}

TEST(SchedulerTest, ConcurrentRequestsMatchTheirSoloRuns) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> p = {2};
    for (int j = 0; j < 3 + 4 * i; ++j) p.push_back(4 + (i * 37 + j * 11) % 500);
    prompts.push_back(p);
  }
  std::vector<std::vector<int32_t>> solo;
  {
    auto engine = TinyEngine(1);
    Scheduler s(*engine, nullptr, SchedulerOptions{});
    for (const auto& p : prompts) solo.push_back(SubmitAndCollect(s, Greedy(p, 20)).get().first);
  }
  auto engine = TinyEngine(4);
  Scheduler s(*engine, nullptr, SchedulerOptions{});
  std::vector<std::shared_future<std::pair<std::vector<int32_t>, CompletionEvent>>> futures;
  for (const auto& p : prompts) {
    futures.push_back(SubmitAndCollect(s, Greedy(p, 20)));
    std::this_thread::sleep_for(3ms);  // staggered: later requests join running batches
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto [tokens, ev] = futures[i].get();
    EXPECT_EQ(tokens, solo[i]) << "request " << i;
    EXPECT_EQ(ev.finish_reason, "length");
    EXPECT_EQ(ev.completion_tokens, 20);
    EXPECT_EQ(ev.prompt_tokens, static_cast<int>(prompts[i].size()));
  }
  const SchedulerStats st = s.Stats();
  EXPECT_EQ(st.requests_total, 8u);
  EXPECT_EQ(st.requests_finished, 8u);
  EXPECT_EQ(st.generated_tokens_total, 160u);
  EXPECT_EQ(st.busy_slots, 0);
  EXPECT_EQ(st.ttft_count, 8u);
}

// stop_token_ids (vLLM's): the first generated id among them ends the request with "stop", even
// with ignore_eos, and is part of the output; ids outside the vocabulary are refused.
TEST(SchedulerTest, StopTokenIdsEndTheRequestAfterTheirToken) {
  auto engine = TinyEngine(1);
  Scheduler s(*engine, nullptr, SchedulerOptions{});
  auto [free_run, ev0] = SubmitAndCollect(s, Greedy({2, 10, 20}, 12)).get();
  ASSERT_EQ(free_run.size(), 12u);
  ASSERT_EQ(ev0.finish_reason, "length");
  // The first position k >= 2 whose id did not occur before it: stopping on that id ends at k.
  size_t k = 2;
  while (k < free_run.size() && std::find(free_run.begin(), free_run.begin() + k, free_run[k]) != free_run.begin() + k) ++k;
  ASSERT_LT(k, free_run.size()) << "the tiny model's greedy run repeats from its start";
  CompletionRequest r = Greedy({2, 10, 20}, 12);  // Greedy sets ignore_eos
  r.stop_token_ids = {free_run[k]};
  auto [stopped, ev] = SubmitAndCollect(s, r).get();
  EXPECT_EQ(ev.finish_reason, "stop");
  EXPECT_EQ(stopped, std::vector<int32_t>(free_run.begin(), free_run.begin() + k + 1));
  EXPECT_EQ(ev.completion_tokens, static_cast<int>(k + 1));
  CompletionRequest bad = Greedy({2, 10, 20}, 4);
  bad.stop_token_ids = {5, engine->config().vocab};
  auto refused = s.Submit(bad, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(), "stop_token_ids[1]: token id " + std::to_string(engine->config().vocab) +
                                            " is outside the vocabulary [0, " + std::to_string(engine->config().vocab) + ")");
}

// Prompt log-probabilities (completions' echo) without a model file: each prompt token's entry
// is the log-softmax of the logits at the position before it, as one Prefill with every row's
// logits gives them, across the engine's prefill chunks (5 here: the scheduler's steps must not
// span two, or StepLogits would hold only the last one's rows); one event before any token's,
// with prompt.size() - 1 entries (none for a 1-token prompt).
TEST(SchedulerTest, PromptLogprobsAreTheLogSoftmaxOfEachPrefix) {
  auto engine = TinyEngine(2);
  const std::vector<int32_t> prompt = {2, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49};
  std::vector<float> logits;
  ASSERT_TRUE(engine->Prefill(1, prompt, /*all_logits=*/true, &logits).ok());
  engine->ResetSequence(1);
  const size_t V = static_cast<size_t>(engine->config().vocab);
  ASSERT_EQ(logits.size(), prompt.size() * V);
  Scheduler s(*engine, nullptr, SchedulerOptions{});
  for (size_t len : {prompt.size(), size_t{1}}) {
    CompletionRequest r = Greedy(std::vector<int32_t>(prompt.begin(), prompt.begin() + len), 3);
    r.logprobs = 2;
    r.prompt_logprobs = true;
    auto events = std::make_shared<std::vector<CompletionEvent>>();
    auto done = std::make_shared<std::promise<void>>();
    auto fut = done->get_future();
    ASSERT_TRUE(s.Submit(r, [events, done](const CompletionEvent& ev) {
                   events->push_back(ev);
                   if (ev.done) done->set_value();
                 }).ok());
    fut.get();
    ASSERT_GE(events->size(), 2u);
    const CompletionEvent& first = events->front();
    ASSERT_TRUE(first.prompt);
    EXPECT_TRUE(first.tokens.empty());
    ASSERT_EQ(first.prompt_logprobs.size(), len - 1);
    for (size_t i = 0; i + 1 < len; ++i) {
      const float* row = logits.data() + i * V;
      double mx = row[0], sum = 0;
      for (size_t j = 0; j < V; ++j) mx = std::max(mx, static_cast<double>(row[j]));
      for (size_t j = 0; j < V; ++j) sum += std::exp(row[j] - mx);
      EXPECT_EQ(first.prompt_logprobs[i].id, prompt[i + 1]) << i;
      EXPECT_NEAR(first.prompt_logprobs[i].logprob, row[prompt[i + 1]] - mx - std::log(sum), 1e-4) << i;
      EXPECT_EQ(first.prompt_logprobs[i].top.size(), 2u);
    }
    size_t generated = 0;
    for (size_t e = 1; e < events->size(); ++e) {
      EXPECT_FALSE((*events)[e].prompt);
      generated += (*events)[e].tokens.size();
      EXPECT_EQ((*events)[e].logprobs.size(), (*events)[e].tokens.size());
    }
    EXPECT_EQ(generated, 3u);
  }
  // max_tokens 0: the prompt alone (echo), nothing generated; below 0 refused.
  auto [none, fin] = SubmitAndCollect(s, Greedy(prompt, 0)).get();
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(fin.finish_reason, "length");
  EXPECT_EQ(fin.completion_tokens, 0);
  EXPECT_EQ(fin.prompt_tokens, static_cast<int>(prompt.size()));
  EXPECT_EQ(s.Submit(Greedy(prompt, -1), nullptr).status().code(), StatusCode::kInvalidArgument);
  // Without logprobs the prompt's are refused (nothing to say how many top tokens).
  CompletionRequest bad = Greedy(prompt, 2);
  bad.prompt_logprobs = true;
  EXPECT_EQ(s.Submit(bad, nullptr).status().code(), StatusCode::kInvalidArgument);
}

TEST(SchedulerTest, CancelFreesTheSlotAtOnce) {
  auto engine = TinyEngine(1);
  Scheduler s(*engine, nullptr, SchedulerOptions{});
  std::shared_ptr<RequestHandle> h;
  auto fut = SubmitAndCollect(s, Greedy({2, 10, 20}, 100), &h);
  std::this_thread::sleep_for(5ms);
  h->Cancel();
  auto [tokens, ev] = fut.get();
  EXPECT_EQ(ev.finish_reason, "cancelled");
  EXPECT_LT(tokens.size(), 100u);
  // The single slot is free again: a new request completes.
  auto [t2, ev2] = SubmitAndCollect(s, Greedy({2, 10, 20}, 3)).get();
  EXPECT_EQ(ev2.finish_reason, "length");
  EXPECT_EQ(t2.size(), 3u);
  EXPECT_EQ(s.Stats().requests_cancelled, 1u);
  EXPECT_EQ(s.Stats().busy_slots, 0);
}

TEST(SchedulerTest, AdmissionErrors) {
  auto engine = TinyEngine(1, 32);
  {
    Scheduler s(*engine, nullptr, SchedulerOptions{});
    auto r = s.Submit(Greedy(std::vector<int32_t>(20, 5), 13), nullptr);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message().rfind("context_length_exceeded:", 0), 0u) << r.status().message();
    EXPECT_EQ(s.Submit(Greedy({2, 600}, 1), nullptr).status().code(), StatusCode::kInvalidArgument);
    CompletionRequest bad = Greedy({2, 5}, 1);
    bad.sampling.top_p = 1.5f;
    EXPECT_EQ(s.Submit(bad, nullptr).status().code(), StatusCode::kInvalidArgument);
    CompletionRequest stops = Greedy({2, 5}, 1);
    stops.stop = {"x"};
    EXPECT_EQ(s.Submit(stops, nullptr).status().code(), StatusCode::kInvalidArgument);  // no tokenizer
  }
}

// Holds the scheduler thread inside the first token event of one request (the thread calls
// on_event), so that nothing is admitted until Release(): arrivals pile up exactly as when many
// come at once.
struct SchedulerHold {
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  bool once = false;
  std::function<void(const CompletionEvent&)> Callback() {
    return [this](const CompletionEvent& ev) {
      if (ev.done || once) return;
      once = true;
      entered.set_value();
      released.wait();
    };
  }
  void Release() { release.set_value(); }
};

// N slots and max_queue Q accept N running + Q waiting, also when the requests arrive together
// (before the scheduler thread has given the free slots out), and reject only beyond that.
TEST(SchedulerTest, QueueLimitCountsWaitingRequestsNotUnadmittedOnes) {
  auto engine = TinyEngine(2, 32);
  SchedulerOptions o;
  o.max_queue = 1;
  Scheduler s(*engine, nullptr, o);
  SchedulerHold hold;
  auto a = s.Submit(Greedy({2, 5}, 4), hold.Callback());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  hold.entered.get_future().wait();  // A runs in slot 0; the scheduler thread is held, slot 1 is free
  std::vector<std::shared_future<std::pair<std::vector<int32_t>, CompletionEvent>>> accepted;
  accepted.push_back(SubmitAndCollect(s, Greedy({2, 6}, 3)));  // gets slot 1 (not yet admitted)
  accepted.push_back(SubmitAndCollect(s, Greedy({2, 7}, 3)));  // the one waiting request
  auto d = s.Submit(Greedy({2, 8}, 3), nullptr);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(d.status().message(), "the request queue is full (slots: 2, max queue: 1)");
  EXPECT_EQ(s.Stats().requests_rejected, 1u);
  EXPECT_EQ(s.Stats().requests_total, 3u);
  hold.Release();
  for (auto& f : accepted) {
    auto [tokens, ev] = f.get();
    EXPECT_EQ(ev.finish_reason, "length");
    EXPECT_EQ(tokens.size(), 3u);
  }
  // The slots are free again.
  EXPECT_TRUE(s.Submit(Greedy({2, 9}, 1), nullptr).ok());
}

// Found by a fresh user: clients that hung up while waiting for a slot kept their places until a
// slot freed, so new requests got 429 (queue full) although nobody was waiting, and their log
// lines said queue=0.0ms. A cancelled waiting request stops counting at once and leaves the queue
// at the scheduler's next step, with the time it waited.
TEST(SchedulerTest, CancelledWaitingRequestsLeaveTheQueueAtOnce) {
  auto engine = TinyEngine(1, 32);
  SchedulerOptions o;
  o.max_queue = 2;
  Scheduler s(*engine, nullptr, o);
  SchedulerHold hold;
  auto a = s.Submit(Greedy({2, 5}, 4), hold.Callback());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  hold.entered.get_future().wait();  // A runs in the only slot; the scheduler thread is held
  std::shared_ptr<RequestHandle> hb, hc;
  auto b = SubmitAndCollect(s, Greedy({2, 6}, 3), &hb);
  auto c = SubmitAndCollect(s, Greedy({2, 7}, 3), &hc);
  EXPECT_EQ(s.Stats().queue_depth, 2);
  EXPECT_EQ(s.Submit(Greedy({2, 8}, 3), nullptr).status().code(), StatusCode::kResourceExhausted);
  std::this_thread::sleep_for(30ms);
  hb->Cancel();
  hc->Cancel();
  // Still held: nothing has left queue_, yet the two places are free.
  EXPECT_EQ(s.Stats().queue_depth, 0);
  auto d = SubmitAndCollect(s, Greedy({2, 9}, 3));
  auto e = SubmitAndCollect(s, Greedy({2, 10}, 3));
  EXPECT_EQ(s.Stats().queue_depth, 2);
  EXPECT_EQ(s.Submit(Greedy({2, 11}, 3), nullptr).status().code(), StatusCode::kResourceExhausted);
  hold.Release();
  for (auto* f : {&b, &c}) {
    auto [tokens, ev] = f->get();
    EXPECT_EQ(ev.finish_reason, "cancelled");
    EXPECT_TRUE(tokens.empty());
    EXPECT_EQ(ev.completion_tokens, 0);
    EXPECT_GE(ev.queue_ms, 30.0) << "the time it waited before its client hung up";
  }
  for (auto* f : {&d, &e}) {
    auto [tokens, ev] = f->get();
    EXPECT_EQ(ev.finish_reason, "length");
    EXPECT_EQ(tokens.size(), 3u);
  }
  const SchedulerStats st = s.Stats();
  EXPECT_EQ(st.requests_cancelled, 2u);
  EXPECT_EQ(st.requests_rejected, 2u);
  EXPECT_EQ(st.queue_depth, 0);
}

// max_queue 0: a free slot still takes a request; a second one while it runs is rejected.
TEST(SchedulerTest, MaxQueueZeroAcceptsOneRequestPerSlot) {
  auto engine = TinyEngine(1, 32);
  SchedulerOptions o;
  o.max_queue = 0;
  Scheduler s(*engine, nullptr, o);
  SchedulerHold hold;
  auto a = s.Submit(Greedy({2, 5}, 3), hold.Callback());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = s.Submit(Greedy({2, 6}, 1), nullptr);  // A may or may not be admitted yet: either way full
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(b.status().message(), "the request queue is full (slots: 1, max queue: 0)");
  EXPECT_EQ(s.Stats().requests_rejected, 1u);
  hold.entered.get_future().wait();
  hold.Release();
}

TEST(SchedulerTest, DegeneracyGuardEndsALoopAndSaysSo) {
  auto engine = TinyEngine(1);
  Scheduler s(*engine, nullptr, SchedulerOptions{});
  CompletionRequest r = Greedy({2, 10, 20}, 90);
  r.sampling.logit_bias[42] = 100.0f;  // forces token 42 forever
  auto [tokens, ev] = SubmitAndCollect(s, r).get();
  EXPECT_EQ(tokens.size(), 32u);
  EXPECT_EQ(ev.finish_reason, "stop");
  EXPECT_EQ(ev.degenerate, "token 42 repeated 32 times");
  EXPECT_EQ(s.Stats().requests_degenerate, 1u);
}

}  // namespace
}  // namespace g4

namespace g4 {
namespace {

// The CPU backend with its sequence slots in two groups (as a mesh's data axis of 2).
class TwoSlotGroupsBackend : public Backend {
 public:
  std::string Name() const override { return inner_->Name(); }
  StatusOr<std::unique_ptr<Executable>> Compile(const Graph& graph, int num_tokens, int num_output_rows) override {
    return inner_->Compile(graph, num_tokens, num_output_rows);
  }
  StatusOr<std::unique_ptr<KvCacheBase>> CreateKvCache(const ModelConfig& config, int max_seqs, int max_context,
                                                       DType type) override {
    return inner_->CreateKvCache(config, max_seqs, max_context, type);
  }
  int SlotGroups() const override { return 2; }

 private:
  std::unique_ptr<Backend> inner_ = MakeCpuBackend(2);
};

// Requests spread over the slot groups (slots 0-1 and 2-3 of 4), so that a batched decode step
// has rows on each group's devices; the slots keep their sequences (prefix reuse) afterwards.
TEST(SchedulerTest, RequestsSpreadOverTheBackendsSlotGroups) {
  auto m = LoadModel(std::string(GEMMA4RT_TEST_DATA_DIR) + "/golden/gemma4-e2b-tiny");
  ASSERT_TRUE(m.ok());
  EngineOptions o;
  o.max_seqs = 4;
  o.max_context = 128;
  auto engine = Engine::Create(std::move(m).value(), std::make_unique<TwoSlotGroupsBackend>(), o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Scheduler s(**engine, nullptr, SchedulerOptions{});
  auto a = SubmitAndCollect(s, Greedy({2, 17, 300, 41}, 24));
  auto b = SubmitAndCollect(s, Greedy({2, 9, 8, 7}, 24));
  ASSERT_EQ(a.get().first.size(), 24u);
  ASSERT_EQ(b.get().first.size(), 24u);
  std::vector<int> used;
  for (int seq = 0; seq < 4; ++seq)
    if ((*engine)->cache().length(seq) > 0) used.push_back(seq);
  ASSERT_EQ(used.size(), 2u);
  EXPECT_LT(used[0], 2);
  EXPECT_GE(used[1], 2);
}

}  // namespace
}  // namespace g4
