// The checks every backend's golden tests make (tests/golden/, golden_reference.h): an engine of a
// fixture on a given backend, one-shot prefill against the reference at every layer, chunked
// prefill, token-by-token decode and batched decode against the reference logits.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "golden_reference.h"
#include "model/model.h"
#include "runtime/engine.h"

namespace g4::golden {

// Engine::Create of the model at `path` on `backend`: its error where the engine is refused, and
// a test failure (with that error) where the model does not load or the backend did not start.
inline StatusOr<std::unique_ptr<Engine>> CreateEngine(const std::string& path, StatusOr<std::unique_ptr<Backend>> backend,
                                                      const EngineOptions& options) {
  auto m = LoadModel(path);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return m.status();
  EXPECT_TRUE(backend.ok()) << backend.status().ToString();
  if (!backend.ok()) return backend.status();
  return Engine::Create(std::move(m).value(), std::move(backend).value(), options);
}

// An engine of the model at `path` on `backend`; nullptr (and a test failure) where the model,
// the backend or the engine fails.
inline std::unique_ptr<Engine> MakeEngineOn(const std::string& path, StatusOr<std::unique_ptr<Backend>> backend,
                                            const EngineOptions& options) {
  auto e = CreateEngine(path, std::move(backend), options);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

// Every golden fixture present, as test parameters: the safetensors fixtures (bf16 shards and
// W4G32 blocks included), then the GGUF conversions ("<fixture>+gguf").
inline std::vector<std::string> AllFixtureParams() {
  std::vector<std::string> out;
  for (const char* name : {"gemma3-tiny", "gemma4-e2b-tiny", "gemma4-31b-tiny", "gemma4-26b-a4b-tiny",
                           "gemma4-e2b-tiny-bf16-sharded", "gemma4-e2b-tiny-w4a16", "gemma4-31b-tiny-w4a16"})
    if (std::filesystem::exists(FixtureDir(name) + "/reference.safetensors")) out.push_back(name);
  for (const char* name : {"gemma4-e2b-tiny", "gemma4-31b-tiny", "gemma4-26b-a4b-tiny"})
    if (std::filesystem::exists(FixtureDir(name) + "/model-f32.gguf")) out.push_back(std::string(name) + "+gguf");
  return out;
}

// The vocabulary size of the reference's logits [ids, V].
inline int RefVocab(const Reference& ref) {
  return ref.ids.empty() ? 0 : static_cast<int>(ref.Get("logits").size() / ref.ids.size());
}

// One-shot prefill of all the reference's ids into sequence 0: the logits at every position within
// kRelTol of the reference, with the same top token at each. With `layers`, also the embeddings,
// the PLE (where the model has it) and every layer's output; without, the engine is not asked for
// them.
inline void ExpectOneShotPrefillMatches(Engine& engine, const Reference& ref, bool layers) {
  std::vector<float> logits;
  std::map<std::string, std::vector<float>> got;
  ASSERT_TRUE(engine.Prefill(0, ref.ids, true, &logits, layers ? &got : nullptr).ok());
  if (layers) {
    EXPECT_LT(RelErr(got["embeddings"], ref.Get("embeddings")), kRelTol) << "embeddings";
    if (engine.config().ple_dim > 0) {
      const std::vector<float> ple = ref.Get("ple");
      EXPECT_FALSE(ple.empty()) << "reference has no 'ple'";
      EXPECT_LT(RelErr(got["ple"], ple), kRelTol) << "ple";
    }
    for (int l = 0; l < engine.config().num_layers; ++l) {
      const std::string name = "hidden." + std::to_string(l);
      EXPECT_LT(RelErr(got[name], ref.Get(name)), kRelTol) << name;
    }
  }
  const std::vector<float> want = ref.Get("logits");
  EXPECT_LT(RelErr(logits, want), kRelTol) << "one-shot";
  EXPECT_EQ(ArgmaxRows(logits, engine.config().vocab), ArgmaxRows(want, engine.config().vocab)) << "one-shot";
}

// Prefill of ids[0, prefill) into `seq`, then token-by-token decode of the rest: the logits at
// every position [ids, V]; empty (and a test failure) where a step fails.
inline std::vector<float> PrefillThenDecode(Engine& engine, std::span<const int32_t> ids, size_t prefill,
                                            int32_t seq = 0) {
  std::vector<float> logits, row;
  const bool ok = engine.Prefill(seq, ids.first(prefill), true, &logits).ok();
  EXPECT_TRUE(ok) << "prefill of " << prefill << " tokens";
  if (!ok) return {};
  for (size_t t = prefill; t < ids.size(); ++t) {
    const bool step = engine.Decode(std::span<const int32_t>(&seq, 1), ids.subspan(t, 1), &row).ok();
    EXPECT_TRUE(step) << "decode at position " << t;
    if (!step) return {};
    logits.insert(logits.end(), row.begin(), row.end());
  }
  return logits;
}

// For each chunk size, prefill of all the reference's ids in chunks of it on the engine
// `make(chunk)` gives: the logits within `tol` of the reference.
inline void ExpectChunkedPrefillMatches(const std::function<std::unique_ptr<Engine>(int chunk)>& make,
                                        const Reference& ref, std::initializer_list<int> chunks, double tol) {
  const std::vector<float> want = ref.Get("logits");
  for (int chunk : chunks) {
    auto engine = make(chunk);
    ASSERT_NE(engine, nullptr) << "chunk " << chunk;
    std::vector<float> logits;
    ASSERT_TRUE(engine->Prefill(0, ref.ids, true, &logits).ok()) << "chunk " << chunk;
    EXPECT_LT(RelErr(logits, want), tol) << "chunk " << chunk;
  }
}

// Prefill of the first `prefill` ids into `seq`, then token-by-token decode of the rest: the
// sequence holds every id after, and the logits at every position are within `tol` of the
// reference; with `argmax`, with the same top token at each.
inline void ExpectDecodeMatches(Engine& engine, const Reference& ref, size_t prefill, double tol, bool argmax = true,
                                int32_t seq = 0) {
  const std::vector<float> want = ref.Get("logits");
  const std::vector<float> logits = PrefillThenDecode(engine, ref.ids, prefill, seq);
  EXPECT_EQ(engine.SequenceLength(seq), static_cast<int>(ref.ids.size()));
  EXPECT_LT(RelErr(logits, want), tol) << "prefill of " << prefill << " + decode";
  if (argmax) {
    EXPECT_EQ(ArgmaxRows(logits, RefVocab(ref)), ArgmaxRows(want, RefVocab(ref))) << "prefill + decode";
  }
}

// Sequence s prefilled with the first start[s] ids, then the sequences decoded together, one row
// each in the order `order`, for `steps` steps (0: until the furthest ahead has decoded the last
// id): each row's logits within `tol` of the reference's at that sequence's position.
inline void ExpectBatchedDecodeMatches(Engine& engine, const Reference& ref, std::vector<int> start,
                                       const std::vector<int32_t>& order, double tol, int steps = 0) {
  const std::vector<float> want = ref.Get("logits");
  const int V = RefVocab(ref);
  const int n = static_cast<int>(ref.ids.size());
  std::vector<float> unused, lg;
  for (size_t s = 0; s < start.size(); ++s)
    ASSERT_TRUE(engine.Prefill(static_cast<int>(s), std::span<const int32_t>(ref.ids).first(start[s]), false, &unused).ok())
        << "prefill of seq " << s;
  if (steps == 0) steps = n - *std::max_element(start.begin(), start.end());
  std::vector<int32_t> toks(order.size());
  for (int step = 0; step < steps; ++step) {
    for (size_t b = 0; b < order.size(); ++b) toks[b] = ref.ids[start[order[b]]];
    ASSERT_TRUE(engine.Decode(order, toks, &lg).ok()) << "decode step " << step;
    for (size_t b = 0; b < order.size(); ++b) {
      const int s = order[b], p = start[s];
      const std::vector<float> got(lg.begin() + b * V, lg.begin() + (b + 1) * V);
      EXPECT_LT(RelErr(got, std::vector<float>(want.begin() + p * V, want.begin() + (p + 1) * V)), tol)
          << "seq " << s << " position " << p;
    }
    for (int& p : start) ++p;
  }
}

}  // namespace g4::golden
