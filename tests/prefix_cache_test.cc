// Prefix reuse: ReusablePrefix's sliding-window condition, checked both ways against the logits a
// fresh prefill gives; multi-turn conversations through the scheduler give the same greedy ids with
// reuse as without (tiny Gemma 3 and Gemma 4 fixtures of window 8, KV-shared layers included, and
// the real 270M across its 512-token window), with the cached token counts and slot choice.
#include <gtest/gtest.h>

#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/prefix_cache.h"
#include "runtime/scheduler.h"
#include "server/api.h"
#include "server/metrics.h"
#include "server/serve.h"

namespace g4 {
namespace {

std::string Fixture(const std::string& name) { return std::string(GEMMA4RT_TEST_DATA_DIR) + "/golden/" + name; }

std::unique_ptr<Engine> MakeEngine(const std::string& path, int slots, int ctx, int chunk, DType kv = DType::kF32) {
  auto m = LoadModel(path);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return nullptr;
  EngineOptions o;
  o.max_seqs = slots;
  o.max_context = ctx;
  o.prefill_chunk = chunk;
  o.kv_type = kv;
  auto e = Engine::Create(std::move(m).value(), MakeCpuBackend(2), o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

std::vector<int32_t> Range(int32_t first, int n) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

std::vector<int32_t> Cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<int32_t> Head(const std::vector<int32_t>& a, size_t n) { return {a.begin(), a.begin() + n}; }

// The tiny fixtures: sliding window 8 on a context of 128.
TEST(ReusablePrefixTest, KeepsWhatEverySlidingRingStillHolds) {
  auto m = LoadModel(Fixture("gemma4-e2b-tiny"));
  ASSERT_TRUE(m.ok());
  const ModelConfig& c = (*m)->config;
  auto reuse = [&](const std::vector<int32_t>& held, const std::vector<int32_t>& prompt) {
    return ReusablePrefix(c, 128, held, prompt);
  };
  const std::vector<int32_t> h6 = Range(10, 6), h8 = Range(10, 8), h9 = Range(10, 9), h20 = Range(10, 20);
  // Within the window every common prefix is kept.
  EXPECT_EQ(reuse(h6, Cat(Head(h6, 4), {99, 98})), 4);
  EXPECT_EQ(reuse(h8, Cat(Head(h8, 3), {99})), 3);
  EXPECT_EQ(reuse(h8, Cat(h8, {99})), 8);
  // The last prompt token is always run (its logits), even where the whole prompt is held.
  EXPECT_EQ(reuse(h6, h6), 5);
  EXPECT_EQ(reuse(h6, Head(h6, 1)), 0);
  EXPECT_EQ(reuse(h6, {}), 0);
  EXPECT_EQ(reuse({}, h6), 0);
  // Past the window: only the whole sequence or all but its last token.
  EXPECT_EQ(reuse(h9, Cat(h9, {99})), 9);
  EXPECT_EQ(reuse(h9, Cat(Head(h9, 8), {99})), 8);
  EXPECT_EQ(reuse(h9, Cat(Head(h9, 7), {99})), 0);
  EXPECT_EQ(reuse(h20, Cat(h20, {99, 98})), 20);
  EXPECT_EQ(reuse(h20, h20), 19);
  EXPECT_EQ(reuse(h20, Cat(Head(h20, 19), {99})), 19);
  EXPECT_EQ(reuse(h20, Cat(Head(h20, 18), {99})), 0);
  EXPECT_EQ(reuse(h20, Cat(Head(h20, 4), {99})), 0);
  // A context shorter than the window: the ring never wraps.
  EXPECT_EQ(ReusablePrefix(c, 6, h6, Cat(Head(h6, 2), {99})), 2);
}

// The condition is exact: a sequence cut back to R tokens and continued gives the same logit bits
// as a fresh prefill of the whole prompt exactly where ReusablePrefix keeps R, for every R of held
// sequences inside and past the window, on Gemma 3 and on Gemma 4 with KV-shared layers, f32 and
// f16 caches; where it refuses, the ring has lost a position the prompt needs and they differ.
TEST(PrefixReuseTest, TruncatedSequencesMatchAFreshPrefillExactlyWhereReusable) {
  struct Case {
    const char* fixture;
    DType kv;
  };
  for (const Case& k : {Case{"gemma3-tiny", DType::kF32}, Case{"gemma4-e2b-tiny", DType::kF16}}) {
    auto e = MakeEngine(Fixture(k.fixture), 2, 64, 5, k.kv);
    ASSERT_TRUE(e);
    const int V = e->config().vocab;
    const std::vector<int32_t> tail = Range(300, 6);
    int kept = 0, refused = 0;
    for (int L : {6, 8, 9, 10, 17, 20}) {
      const std::vector<int32_t> held = Cat({2}, Range(10, L - 1));
      for (int R = 1; R <= L; ++R) {
        SCOPED_TRACE(std::string(k.fixture) + " L=" + std::to_string(L) + " R=" + std::to_string(R));
        const std::vector<int32_t> prompt = Cat(Head(held, R), tail);
        e->ResetSequence(0);
        ASSERT_TRUE(e->Prefill(0, held, false, nullptr).ok());
        const bool reusable = ReusablePrefix(e->config(), e->cache().max_context(), held, prompt) == R;
        e->TruncateSequence(0, R);
        ASSERT_EQ(e->SequenceLength(0), R);
        std::vector<float> continued, fresh;
        ASSERT_TRUE(e->Prefill(0, tail, true, &continued).ok());
        e->ResetSequence(1);
        ASSERT_TRUE(e->Prefill(1, prompt, true, &fresh).ok());
        fresh.erase(fresh.begin(), fresh.end() - static_cast<ptrdiff_t>(tail.size()) * V);
        EXPECT_EQ(continued == fresh, reusable);
        (reusable ? kept : refused) += 1;
      }
    }
    EXPECT_EQ(kept, 6 + 8 + 2 + 2 + 2 + 2);  // every R within the window, R >= L - 1 past it
    EXPECT_EQ(refused, 7 + 8 + 15 + 18);
  }
}

struct Outcome {
  std::vector<int32_t> tokens;
  CompletionEvent final_event;
};

Outcome Complete(Scheduler& s, const std::vector<int32_t>& prompt, int max_tokens, bool cache_prompt = true) {
  CompletionRequest r;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  r.cache_prompt = cache_prompt;
  auto out = std::make_shared<Outcome>();
  auto done = std::make_shared<std::promise<void>>();
  auto fut = done->get_future();
  auto h = s.Submit(std::move(r), [out, done](const CompletionEvent& ev) {
    out->tokens.insert(out->tokens.end(), ev.tokens.begin(), ev.tokens.end());
    if (ev.done) {
      out->final_event = ev;
      done->set_value();
    }
  });
  EXPECT_TRUE(h.ok()) << h.status().ToString();
  if (h.ok()) fut.wait();
  return *out;
}

// A conversation on one slot (window 8): each turn's prompt, its expected cached tokens, and the
// greedy ids it gives without reuse. Turns continue the history (kept whole, across the window
// edge), edit it (kept within the window only), regenerate a turn (the held sequence is longer
// than the prompt: kept only within the window), or continue all but the last held token.
void ExpectConversationMatches(const std::string& fixture, DType kv) {
  SCOPED_TRACE(fixture);
  auto engine = MakeEngine(Fixture(fixture), 1, 128, 5, kv);
  ASSERT_TRUE(engine);
  SchedulerOptions so;
  so.prefill_chunk = 3;  // steps that straddle the engine's chunks and the reused prefix's end
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> max_tokens;
  std::vector<Outcome> got;
  {
    Scheduler s(*engine, nullptr, so);
    auto turn = [&](std::vector<int32_t> prompt, int n, bool cache_prompt = true) {
      prompts.push_back(prompt);
      max_tokens.push_back(n);
      got.push_back(Complete(s, prompt, n, cache_prompt));
      return got.back().tokens;
    };
    const std::vector<int32_t> p1 = {2, 300, 301, 302};
    const auto g1 = turn(p1, 3);                              // held: 4 + 3 - 1 = 6
    const auto p2 = Cat(Cat(p1, g1), {303});
    const auto g2 = turn(p2, 3);                              // 6 of 8 kept (within the window); held 10
    const auto p3 = Cat(Head(p2, 5), {304, 305});
    const auto g3 = turn(p3, 3);                              // 5 shared, held 10 > 8: none; held 9
    const auto p4 = Cat(Cat(p3, g3), Range(306, 10));
    const auto g4 = turn(p4, 4);                              // all 9 held, across the edge; held 23
    const auto p5 = Cat(Cat(p4, g4), {316});
    const auto g5 = turn(p5, 4);                              // 23; held 28
    turn(p5, 4);                                              // regenerate: 24 of 28 shared: none; held 28
    const auto g6 = got.back().tokens;
    const auto p7 = Cat(Cat(p5, Head(g6, 2)), {317});
    turn(p7, 3);                                              // 27 = 28 - 1 kept; held 30
    turn(Cat(p7, {318}), 2, /*cache_prompt=*/false);          // asked not to: none
    const SchedulerStats st = s.Stats();
    EXPECT_EQ(st.prompt_tokens_cached_total, 6u + 9 + 23 + 27);
    uint64_t prompt_tokens = 0;
    for (const auto& p : prompts) prompt_tokens += p.size();
    EXPECT_EQ(st.prompt_tokens_total, prompt_tokens - st.prompt_tokens_cached_total);
  }
  const std::vector<int> want_cached = {0, 6, 0, 9, 23, 0, 27, 0};
  ASSERT_EQ(got.size(), want_cached.size());
  so.cache_prompt = false;
  Scheduler plain(*engine, nullptr, so);
  for (size_t t = 0; t < got.size(); ++t) {
    SCOPED_TRACE("turn " + std::to_string(t + 1));
    EXPECT_EQ(got[t].final_event.cached_tokens, want_cached[t]);
    EXPECT_EQ(got[t].final_event.prompt_tokens, static_cast<int>(prompts[t].size()));
    const Outcome want = Complete(plain, prompts[t], max_tokens[t]);
    EXPECT_EQ(want.final_event.cached_tokens, 0);
    EXPECT_EQ(got[t].tokens, want.tokens);
    EXPECT_EQ(static_cast<int>(got[t].tokens.size()), max_tokens[t]);
  }
}

TEST(PrefixReuseTest, ConversationGreedyIdsEqualWithoutReuseGemma3) { ExpectConversationMatches("gemma3-tiny", DType::kF32); }

TEST(PrefixReuseTest, ConversationGreedyIdsEqualWithoutReuseGemma4KvShared) {
  ExpectConversationMatches("gemma4-e2b-tiny", DType::kF16);
}

TEST(PrefixReuseTest, ConversationGreedyIdsEqualWithoutReuseGemma4Moe) {
  ExpectConversationMatches("gemma4-26b-a4b-tiny", DType::kF32);
}

// Two slots, two conversations: each next turn goes to the slot holding its history; an unrelated
// request takes the least recently used slot; prompt log-probabilities never reuse.
TEST(PrefixReuseTest, ARequestGoesToTheSlotHoldingItsPrefix) {
  auto engine = MakeEngine(Fixture("gemma4-e2b-tiny"), 2, 128, 5);
  ASSERT_TRUE(engine);
  Scheduler s(*engine, nullptr, SchedulerOptions{});
  const std::vector<int32_t> a1 = Cat({2}, Range(20, 10)), b1 = Cat({2}, Range(40, 10));
  const Outcome ra1 = Complete(s, a1, 2), rb1 = Complete(s, b1, 2);
  EXPECT_EQ(ra1.final_event.cached_tokens, 0);
  EXPECT_EQ(rb1.final_event.cached_tokens, 0);  // the empty slot, not A's (only the BOS shared)
  const auto a2 = Cat(Cat(a1, ra1.tokens), {30}), b2 = Cat(Cat(b1, rb1.tokens), {50});
  const Outcome ra2 = Complete(s, a2, 2), rb2 = Complete(s, b2, 2);
  EXPECT_EQ(ra2.final_event.cached_tokens, 12);
  EXPECT_EQ(rb2.final_event.cached_tokens, 12);
  EXPECT_EQ(Complete(s, Cat({2}, Range(60, 10)), 2).final_event.cached_tokens, 0);  // takes A's slot (least recent)
  const auto b3 = Cat(Cat(b2, rb2.tokens), {51});
  EXPECT_EQ(Complete(s, b3, 2).final_event.cached_tokens, 15);  // B's history is still there
  const auto a3 = Cat(Cat(a2, ra2.tokens), {31});
  EXPECT_EQ(Complete(s, a3, 2).final_event.cached_tokens, 0);  // A's is gone
  CompletionRequest r;
  r.prompt = Cat(a3, {32});
  r.max_tokens = 1;
  r.logprobs = 0;
  r.prompt_logprobs = true;
  std::promise<CompletionEvent> done;
  ASSERT_TRUE(s.Submit(r, [&](const CompletionEvent& ev) {
                 if (ev.done) done.set_value(ev);
               }).ok());
  EXPECT_EQ(done.get_future().get().cached_tokens, 0);
}

// The real 270M (sliding window 512, f16 cache as served): a conversation whose second turn reuses
// a 519-token sequence that has wrapped the window's ring, an edit past the window (no reuse), and
// a shared prefix within it; each turn's greedy ids equal a run without reuse.
TEST(PrefixReuseTest, DefaultModelGreedyIdsEqualWithoutReuseAcrossTheWindowEdge) {
  const std::string path = DefaultModelFile();
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing: run scripts/fetch-default-model.sh";
  auto engine = MakeEngine(path, 1, 1024, 512, DType::kF16);
  ASSERT_TRUE(engine);
  ASSERT_EQ(engine->config().layers[0].window, 512);
  // "Question: What is the capital of France?\nAnswer: Paris\n", repeated.
  const std::vector<int32_t> shot = {14977, 236787, 2900, 563, 506, 5279, 529, 9405, 236881, 107, 7925, 236787, 15687, 107};
  std::vector<int32_t> p1 = {2};
  while (p1.size() < 490) p1 = Cat(p1, shot);  // 491 tokens
  std::vector<std::vector<int32_t>> prompts;
  std::vector<Outcome> got;
  {
    Scheduler s(*engine, nullptr, SchedulerOptions{});
    auto turn = [&](const std::vector<int32_t>& prompt, int n) {
      prompts.push_back(prompt);
      got.push_back(Complete(s, prompt, n));
      return got.back().tokens;
    };
    const auto g1 = turn(p1, 30);                    // held 520 > 512
    const auto p2 = Cat(Cat(p1, g1), shot);
    turn(p2, 30);                                    // all 520 kept; held 564
    turn(Cat(Head(p2, 500), shot), 20);              // 500 of 564 shared: none; held 533
    turn(Cat(Head(p1, 100), shot), 10);              // 100 of 533: none; held 123
    turn(Cat(Head(p1, 60), Head(shot, 5)), 10);      // 60 of 123, within the window
  }
  const std::vector<int> want_cached = {0, 520, 0, 0, 60};
  SchedulerOptions off;
  off.cache_prompt = false;
  Scheduler plain(*engine, nullptr, off);
  for (size_t t = 0; t < got.size(); ++t) {
    SCOPED_TRACE("turn " + std::to_string(t + 1));
    EXPECT_EQ(got[t].final_event.cached_tokens, want_cached[t]);
    EXPECT_EQ(got[t].tokens, Complete(plain, prompts[t], static_cast<int>(got[t].tokens.size())).tokens);
  }
}

}  // namespace
}  // namespace g4

namespace g4::server {
namespace {

// cache_prompt (llama-server's request field) reaches the scheduler; the usage reports OpenAI's
// prompt_tokens_details.cached_tokens, and the timings llama-server's prompt_n (prefilled) and
// cache_n (reused).
TEST(PrefixReuseApiTest, CachePromptFieldAndCachedTokensInUsage) {
  ModelInfo info;
  info.id = "tiny";
  info.accepted_ids = {"tiny"};
  info.context_size = 128;
  info.vocab_size = 512;
  const nlohmann::json base = {{"prompt", {2, 3, 4}}, {"max_tokens", 2}};
  auto parsed = ParseRequestJson(base, Endpoint::kCompletion, info);
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_TRUE(parsed->completion.cache_prompt);
  nlohmann::json off = base;
  off["cache_prompt"] = false;
  parsed = ParseRequestJson(off, Endpoint::kCompletion, info);
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_FALSE(parsed->completion.cache_prompt);
  off["cache_prompt"] = "no";
  parsed = ParseRequestJson(off, Endpoint::kCompletion, info);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.error().status, 400);
  EXPECT_EQ(parsed.error().param, "cache_prompt");
  CompletionEvent e;
  e.done = true;
  e.prompt_tokens = 10;
  e.cached_tokens = 6;
  e.completion_tokens = 2;
  e.prompt_ms = 8;
  EXPECT_EQ(UsageJson(e), nlohmann::json({{"prompt_tokens", 10}, {"completion_tokens", 2}, {"total_tokens", 12},
                                          {"prompt_tokens_details", {{"cached_tokens", 6}}}}));
  const nlohmann::json t = TimingsJson(e);
  EXPECT_EQ(t["prompt_n"], 4);
  EXPECT_EQ(t["cache_n"], 6);
  EXPECT_DOUBLE_EQ(t["prompt_per_token_ms"].get<double>(), 2.0);
}

TEST(PrefixReuseApiTest, MetricsCountReusedPromptTokens) {
  SchedulerStats s;
  s.prompt_tokens_total = 100;
  s.prompt_tokens_cached_total = 520;
  const std::string m = RenderMetrics(s, nullptr);
  for (const char* line : {"# TYPE gemma4rt_prompt_tokens_cached_total counter\n", "gemma4rt_prompt_tokens_cached_total 520\n",
                           "gemma4rt_prompt_tokens_total 100\n"})
    EXPECT_NE(m.find(line), std::string::npos) << line << "\n" << m;
}

// On by default; off with llama-server's --no-cache-prompt or vLLM's --no-enable-prefix-caching.
TEST(PrefixReuseApiTest, ServeFlagsTurnItOff) {
  for (const auto& [args, on] : std::vector<std::pair<std::vector<std::string>, bool>>{
           {{}, true}, {{"--no-cache-prompt"}, false}, {{"--cache-prompt"}, true}, {{"--no-enable-prefix-caching"}, false},
           {{"--enable-prefix-caching"}, true}}) {
    ParsedFlags f = ParseServeFlags(args);
    ASSERT_TRUE(f.options.has_value()) << (args.empty() ? "" : args[0]);
    EXPECT_EQ(f.options->cache_prompt, on) << (args.empty() ? "" : args[0]);
  }
}

}  // namespace
}  // namespace g4::server
