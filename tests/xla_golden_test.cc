// The golden fixtures (tests/golden/, see golden_test.cc) on the XLA backend through XLA's CPU
// plugin (GEMMA4RT_PJRT_PLUGIN; skipped without it), against the same transformers references at
// the CPU f32 path's tolerance (1e-4 of the largest value per tensor): one-shot prefill at every
// layer, chunked prefill (chunks across the window edge) and token-by-token decode, and batched
// decode of two sequences against each alone; the q8 cache against the CPU backend's q8 cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "backends/cpu/cpu_backend.h"
#include "backends/xla/lower.h"
#include "backends/xla/xla_backend.h"
#include "model/gemma.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "runtime/engine.h"
#include "golden_check.h"
#include "golden_reference.h"
#include "xla/xla_test_util.h"

namespace g4 {
namespace {

using namespace golden;

std::unique_ptr<Engine> MakeXlaEngine(const std::string& fixture, int chunk, int max_seqs = 1,
                                      DType kv_type = DType::kF32, bool cpu = false) {
  EngineOptions o;
  o.prefill_chunk = chunk;
  o.max_seqs = max_seqs;
  o.max_context = 64;
  o.kv_type = kv_type;
  // f32 compute on every plugin: the references are transformers' f32 arithmetic. An fp8 cache
  // through the tests-only switch (XLA's CPU plugin converts f8E4M3FN, the policy refuses it there).
  XlaBackendOptions xo{xla::testing_util::PluginPath(), xla::testing_util::ClientOptions(1), 0, "f32"};
  xo.fp8_cache_for_tests = kv_type == DType::kF8E4M3;
  return MakeEngineOn(ModelPath(fixture),
                      cpu ? StatusOr<std::unique_ptr<Backend>>(MakeCpuBackend(1, CpuBackendOptionsFor(true))) : MakeXlaBackend(xo),
                      o);
}

class XlaGoldenTest : public ::testing::TestWithParam<std::string> {};

// One-shot prefill: embeddings, PLE, every layer's output and the logits at every position.
TEST_P(XlaGoldenTest, OneShotPrefillMatchesTransformersAtEveryLayer) {
  G4_REQUIRE_PJRT_PLUGIN();
  Reference ref = LoadReference(GetParam());
  ASSERT_GE(ref.ids.size(), 25u);
  auto engine = MakeXlaEngine(GetParam(), 1 << 20);
  ASSERT_NE(engine, nullptr);
  // The W4A16 fixtures' references hold the logits only (tools/make_w4a16_fixture.py).
  const bool layers = !ref.Get("embeddings").empty();
  EXPECT_TRUE(layers || GetParam().find("w4a16") != std::string::npos) << "reference without intermediates";
  ExpectOneShotPrefillMatches(*engine, ref, layers);
}

TEST_P(XlaGoldenTest, ChunkedPrefillAndDecodeMatchOneShot) {
  G4_REQUIRE_PJRT_PLUGIN();
  Reference ref = LoadReference(GetParam());
  // Across the window of 8; 9: a bucket of 16 with 7 padding rows.
  ExpectChunkedPrefillMatches([&](int chunk) { return MakeXlaEngine(GetParam(), chunk); }, ref, {3, 9}, kRelTol);
  auto engine = MakeXlaEngine(GetParam(), 512);
  ASSERT_NE(engine, nullptr);
  ExpectDecodeMatches(*engine, ref, 5, kRelTol);
}

TEST_P(XlaGoldenTest, BatchedDecodeOfThreeSequencesMatchesEachAlone) {
  G4_REQUIRE_PJRT_PLUGIN();
  Reference ref = LoadReference(GetParam());
  auto engine = MakeXlaEngine(GetParam(), 4, /*max_seqs=*/3);
  ASSERT_NE(engine, nullptr);
  // Different positions mod the window of 8; 3 rows: a bucket of 4.
  ExpectBatchedDecodeMatches(*engine, ref, {11, 4, 17}, {1, 2, 0}, kRelTol);
}

// Prefill in chunks across the window, then decode, with the q8 cache (int8 K/V, a scale per token
// and KV head) on both backends: both quantise the same way (lower_kv.h, cpu::QuantizeKvRow), so
// they store the same bytes wherever their K and V rows agree to the bit; the rows differ in the
// last bits (other summation orders), which can move an int8 by one step (max|x| / 127) where a
// value lies near a rounding midpoint. The logits within 1e-2 of the largest (relative, as
// kRelTol; measured 1.8e-7, 2.9e-6 and 2.5e-3, where the q8 cache itself is 1.8e-3 to 4.9e-2 from
// transformers' f32) and the same top token at every position.
TEST(XlaQ8CacheTest, MatchesTheCpuBackendsQ8Cache) {
  G4_REQUIRE_PJRT_PLUGIN();
  for (const char* fixture : {"gemma3-tiny", "gemma4-e2b-tiny", "gemma4-31b-tiny"}) {
    SCOPED_TRACE(fixture);
    Reference ref = LoadReference(fixture);
    const std::vector<float> want = ref.Get("logits");
    const int V = static_cast<int>(want.size() / ref.ids.size());
    std::vector<float> got[2];  // XLA, CPU
    for (int cpu = 0; cpu < 2; ++cpu) {
      auto engine = MakeXlaEngine(fixture, 7, 1, DType::kI8, cpu == 1);
      ASSERT_NE(engine, nullptr);
      EXPECT_EQ(engine->cache().type(), DType::kI8);
      got[cpu] = PrefillThenDecode(*engine, ref.ids, 20);
    }
    const double diff = RelErr(got[0], got[1]);
    std::printf("%s: q8 cache, XLA against CPU %.3g, XLA against transformers (f32) %.3g, CPU against it %.3g\n", fixture,
                diff, RelErr(got[0], want), RelErr(got[1], want));
    EXPECT_LT(diff, 1e-2);
    EXPECT_EQ(ArgmaxRows(got[0], V), ArgmaxRows(got[1], V));
  }
}

// The KV cache's device bytes: K and V of every cache-owning layer in the cache's type, and with
// q8 and fp8 their f32 scales, the bytes the host cache and `info` (KvCache::BytesPerSequence) and
// the memory plan count.
TEST(XlaQ8CacheTest, DeviceCacheBytesCountTheScales) {
  G4_REQUIRE_PJRT_PLUGIN();
  for (DType t : {DType::kF16, DType::kI8, DType::kF8E4M3}) {
    auto engine = MakeXlaEngine("gemma4-e2b-tiny", 8, /*max_seqs=*/3, t);
    ASSERT_NE(engine, nullptr);
    const ModelConfig& c = engine->config();
    size_t want = 0;
    for (const LayerPlan& lp : c.layers) {
      if (lp.kv_donor >= 0) continue;
      const size_t slots = lp.window ? std::min(lp.window, 64) : 64;
      want += 3 * 2 * slots * lp.num_kv_heads * (lp.head_dim * (t == DType::kF16 ? 2 : 1) + (t == DType::kF16 ? 0 : 4));
    }
    EXPECT_EQ(engine->cache().bytes(), want) << DTypeName(t);
    EXPECT_EQ(engine->cache().bytes(), 3 * KvCache::BytesPerSequence(c, 64, t)) << DTypeName(t);
    const xla::MemoryPlan* plan = XlaPlan(engine->backend());
    ASSERT_NE(plan, nullptr);
    EXPECT_EQ(plan->kv, static_cast<int64_t>(want)) << DTypeName(t);
  }
}

// fp8 on XLA's CPU plugin: refused with the reason (no fp8 arithmetic); through the tests-only
// switch it runs end to end (the lowering is every device's): finite logits over the reference
// prompt, off the f32 cache's by more than q8's and by less than e4m3's bits allow.
TEST(XlaFp8CacheTest, RefusedOnTheCpuPluginAndRunsThroughTheTestSwitch) {
  G4_REQUIRE_PJRT_PLUGIN();
  auto m = LoadModel(ModelPath("gemma4-e2b-tiny"));
  ASSERT_TRUE(m.ok());
  auto backend = MakeXlaBackend({xla::testing_util::PluginPath(), xla::testing_util::ClientOptions(1), 0, "f32"});
  ASSERT_TRUE(backend.ok());
  const Status st = (*backend)->CheckKvCacheType(DType::kF8E4M3);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message().rfind("--cache-type fp8: XLA's CPU plugin has no fp8 arithmetic", 0), 0u) << st.message();
  EngineOptions o;
  o.max_context = 64;
  o.kv_type = DType::kF8E4M3;
  auto refused = Engine::Create(std::move(*m), std::move(*backend), o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(), st.message());

  Reference ref = LoadReference("gemma4-e2b-tiny");
  auto f32 = MakeXlaEngine("gemma4-e2b-tiny", 8, 1, DType::kF32);
  auto fp8 = MakeXlaEngine("gemma4-e2b-tiny", 8, 1, DType::kF8E4M3);
  ASSERT_NE(f32, nullptr);
  ASSERT_NE(fp8, nullptr);
  std::vector<float> a, b;
  ASSERT_TRUE(f32->Prefill(0, ref.ids, true, &a).ok());
  ASSERT_TRUE(fp8->Prefill(0, ref.ids, true, &b).ok());
  ASSERT_EQ(a.size(), b.size());
  for (float x : b) ASSERT_TRUE(std::isfinite(x));
  auto q8 = MakeXlaEngine("gemma4-e2b-tiny", 8, 1, DType::kI8);
  ASSERT_NE(q8, nullptr);
  std::vector<float> c;
  ASSERT_TRUE(q8->Prefill(0, ref.ids, true, &c).ok());
  // Against the f32 cache's logits: fp8 above q8's error (fewer bits: the cache was fp8) and below
  // 16x q8's (an element's worst error: 2^-4 |x| <= 2^-4 max|x| for fp8, max|x| / 254 for q8).
  const double e_fp8 = RelErr(b, a), e_q8 = RelErr(c, a);
  EXPECT_GT(e_fp8, e_q8);
  EXPECT_LT(e_fp8, 16 * e_q8);
}

// Warm-up runs every prefill and decode shape a server uses, leaves the cache empty and changes
// no result; it needs an empty cache.
TEST(XlaWarmupTest, RunsEveryShapeAndLeavesTheCacheEmpty) {
  G4_REQUIRE_PJRT_PLUGIN();
  Reference ref = LoadReference("gemma4-e2b-tiny");
  auto engine = MakeXlaEngine("gemma4-e2b-tiny", 8, /*max_seqs=*/3);
  ASSERT_NE(engine, nullptr);
  EXPECT_TRUE(engine->backend().CompilesPerShape());
  auto steps = engine->Warmup(8);
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  EXPECT_EQ(*steps, 4 + 3);  // prefill 1, 2, 4, 8; decode 1, 2, 3
  for (int s = 0; s < 3; ++s) EXPECT_EQ(engine->SequenceLength(s), 0);
  std::vector<float> logits;
  ASSERT_TRUE(engine->Prefill(1, ref.ids, true, &logits).ok());
  EXPECT_LT(RelErr(logits, ref.Get("logits")), kRelTol);
  auto again = engine->Warmup(8);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
}

// A plan that does not fit the device is refused at start-up with the arithmetic.
TEST(XlaMemoryPlanTest, AModelThatDoesNotFitIsRefusedWithTheArithmetic) {
  G4_REQUIRE_PJRT_PLUGIN();
  auto m = LoadModel(ModelPath("gemma4-e2b-tiny"));
  ASSERT_TRUE(m.ok());
  const size_t kv_bytes = 2 * KvCache::BytesPerSequence((*m)->config, 64, DType::kF32);
  size_t weight_bytes = 0;  // every tensor the graph reads (all F32: as stored)
  for (const Tensor* t : xla::GraphWeights(BuildGemmaGraph((*m)->config, (*m)->weights, GraphOptions{true})))
    weight_bytes += t->nbytes;
  ASSERT_GT(weight_bytes, 1000000u);
  XlaBackendOptions xo{xla::testing_util::PluginPath(), xla::testing_util::ClientOptions(1), 100000, "f32"};
  auto backend = MakeXlaBackend(xo);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  EngineOptions o;
  o.max_seqs = 2;
  o.max_context = 64;
  auto e = Engine::Create(std::move(*m), std::move(*backend), o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(e.status().message().find("weights " + std::to_string(weight_bytes) + " bytes + KV cache " +
                                      std::to_string(kv_bytes) + " bytes (2 sequences x 64 tokens) = " +
                                      std::to_string(weight_bytes + kv_bytes) + " bytes"),
            std::string::npos)
      << e.status().message();
  EXPECT_NE(e.status().message().find("(2 sequences x 64 tokens)"), std::string::npos) << e.status().message();
  EXPECT_NE(e.status().message().find("> 100000 bytes of device memory (the limit given, --device-memory), before the "
                                      "steps' working memory"),
            std::string::npos)
      << e.status().message();
  // The same model with room enough starts.
  auto m2 = LoadModel(ModelPath("gemma4-e2b-tiny"));
  ASSERT_TRUE(m2.ok());
  xo.device_memory_bytes = 64 << 20;
  auto roomy = MakeXlaBackend(xo);
  ASSERT_TRUE(roomy.ok());
  EXPECT_TRUE(Engine::Create(std::move(*m2), std::move(*roomy), o).ok());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, XlaGoldenTest, ::testing::ValuesIn(AllFixtureParams()), [](const auto& info) {
  std::string s = info.param;
  std::replace(s.begin(), s.end(), '-', '_');
  std::replace(s.begin(), s.end(), '+', '_');
  return s;
});

}  // namespace
}  // namespace g4
