// The XLA device policy (src/backends/xla/device_policy.h): the compute dtype chosen per platform
// and compute capability, and refused overrides; the StableHLO a bf16/f16 policy emits (dot
// operands of that type with f32 results, no bf16 at all under f16); the golden fixtures' logits
// in bf16 and f16 on XLA's CPU plugin within a stated bound of the transformers f32 reference;
// the device index; the memory plan with the compiled steps' working memory.
#include <gtest/gtest.h>

#include <map>

#include "backends/xla/device_policy.h"
#include "backends/xla/lower.h"
#include "backends/xla/memory_plan.h"
#include "backends/xla/xla_backend.h"
#include "golden_check.h"
#include "golden_reference.h"
#include "model/gemma.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "xla/xla_test_util.h"

namespace g4 {
namespace {

using namespace golden;
using xla::ChooseComputeDtype;

TEST(XlaDevicePolicyTest, AutoPicksByPlatformAndComputeCapability) {
  struct Case {
    const char* platform;
    const char* cc;
    DType want;
    const char* reason;
  };
  for (const Case& c : {Case{"cpu", "", DType::kF32, "auto: XLA's CPU plugin computes in f32"},
                        Case{"tpu", "", DType::kBF16, "auto: TPUs compute in bf16"},
                        Case{"cuda", "9.0", DType::kBF16, "auto: cuda compute capability 9.0 >= 8.0"},
                        Case{"cuda", "8.0", DType::kBF16, "auto: cuda compute capability 8.0 >= 8.0"},
                        Case{"cuda", "7.5", DType::kF16, "auto: cuda compute capability 7.5 < 8.0 has no bf16 arithmetic"},
                        Case{"cuda", "", DType::kF32, "auto: the CUDA device reports no compute capability"},
                        Case{"rocm", "", DType::kF32, "auto: no compute policy for platform 'rocm'"}}) {
    auto p = ChooseComputeDtype(c.platform, c.cc, "auto");
    ASSERT_TRUE(p.ok()) << c.platform << " " << c.cc << ": " << p.status().ToString();
    EXPECT_EQ(p->dtype, c.want) << c.platform << " " << c.cc;
    EXPECT_EQ(p->reason, c.reason);
  }
}

TEST(XlaDevicePolicyTest, OverridesAreHonouredOrRefusedWithTheReason) {
  auto ok = [](const char* platform, const char* cc, const char* req, DType want) {
    auto p = ChooseComputeDtype(platform, cc, req);
    ASSERT_TRUE(p.ok()) << platform << " " << cc << " " << req << ": " << p.status().ToString();
    EXPECT_EQ(p->dtype, want);
    EXPECT_EQ(p->reason.rfind(std::string("--compute-dtype ") + req + ": ", 0), 0u) << p->reason;
  };
  ok("cpu", "", "bf16", DType::kBF16);
  ok("cpu", "", "f16", DType::kF16);
  ok("cpu", "", "f32", DType::kF32);
  ok("cuda", "9.0", "f16", DType::kF16);
  ok("cuda", "9.0", "f32", DType::kF32);
  ok("cuda", "7.0", "f16", DType::kF16);
  ok("cuda", "7.0", "f32", DType::kF32);
  ok("tpu", "", "f32", DType::kF32);
  auto refused = [](const char* platform, const char* cc, const char* req, const std::string& why) {
    auto p = ChooseComputeDtype(platform, cc, req);
    ASSERT_FALSE(p.ok()) << platform << " " << cc << " " << req;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(p.status().message(), why);
  };
  refused("cuda", "7.5", "bf16", "--compute-dtype bf16: cuda compute capability 7.5 < 8.0 has no bf16 arithmetic (use f16 or f32)");
  refused("cuda", "", "bf16", "--compute-dtype bf16: the CUDA device reports no compute capability (bf16 needs 8.0 or newer)");
  refused("tpu", "", "f16", "--compute-dtype f16: TPUs have no f16 arithmetic (use bf16 or f32)");
  refused("rocm", "", "bf16",
          "--compute-dtype bf16: gemma4rt has no compute policy for platform 'rocm' (only f32 is known to work there)");
  refused("cpu", "", "f8", "--compute-dtype must be auto, f32, bf16 or f16, got 'f8'");
  refused("cuda", "sm90", "auto", "the CUDA device's compute capability 'sm90' is not a number");
}

// fp8 (e4m3) KV cache: where the device computes with fp8, refused with the reason elsewhere.
TEST(XlaDevicePolicyTest, Fp8KvCacheOnTpusAndCudaFrom8_9) {
  for (const auto& [platform, cc] : std::vector<std::pair<std::string, std::string>>{
           {"tpu", ""}, {"cuda", "8.9"}, {"cuda", "9.0"}, {"cuda", "10.0"}, {"cuda", "12.1"}})
    EXPECT_TRUE(xla::CheckFp8KvCache(platform, cc).ok()) << platform << " " << cc;
  struct Refused {
    const char* platform;
    const char* cc;
    const char* reason;
  };
  for (const Refused& r :
       {Refused{"cpu", "", "--cache-type fp8: XLA's CPU plugin has no fp8 arithmetic (use --cache-type q8"},
        Refused{"cuda", "8.6", "--cache-type fp8: cuda compute capability 8.6 < 8.9 has no fp8 arithmetic"},
        Refused{"cuda", "8.0", "--cache-type fp8: cuda compute capability 8.0 < 8.9 has no fp8 arithmetic"},
        Refused{"cuda", "7.5", "--cache-type fp8: cuda compute capability 7.5 < 8.9 has no fp8 arithmetic"},
        Refused{"cuda", "", "--cache-type fp8: the CUDA device reports no compute capability (fp8 needs 8.9 or newer)"},
        Refused{"cuda", "nine", "the CUDA device's compute capability 'nine' is not major.minor"},
        Refused{"rocm", "", "--cache-type fp8: gemma4rt has no fp8 policy for platform 'rocm'"}}) {
    const Status st = xla::CheckFp8KvCache(r.platform, r.cc);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << r.platform << " " << r.cc;
    EXPECT_EQ(st.message().rfind(r.reason, 0), 0u) << st.message();
  }
}

TEST(XlaDevicePolicyTest, WeightDeviceTypes) {
  Tensor m, v, q;
  m.shape = {4, 32};
  m.dtype = DType::kBF16;
  v.shape = {32};
  v.dtype = DType::kBF16;
  q.shape = {4, 32};
  q.dtype = DType::kW4G32;
  EXPECT_EQ(xla::WeightDeviceType(m, DType::kF32), DType::kBF16);  // as stored
  EXPECT_EQ(xla::WeightDeviceType(v, DType::kF32), DType::kBF16);
  EXPECT_EQ(xla::WeightDeviceType(m, DType::kF16), DType::kF16);  // converted at load: no bf16 buffer
  EXPECT_EQ(xla::WeightDeviceType(v, DType::kF16), DType::kF32);
  EXPECT_EQ(xla::WeightDeviceType(q, DType::kF16), DType::kW4G32);  // blocks as stored
  m.dtype = DType::kQ4_K;                                            // another block type
  EXPECT_EQ(xla::WeightDeviceType(m, DType::kF32), DType::kF32);
  EXPECT_EQ(xla::WeightDeviceType(m, DType::kBF16), DType::kBF16);
  EXPECT_EQ(xla::WeightDeviceBytes(m, DType::kBF16), 4u * 32 * 2);
}

// The step of a golden fixture lowered under `compute`.
std::string LowerFixture(const std::string& fixture, DType compute, DType kv = DType::kF32) {
  auto m = LoadModel(ModelPath(fixture));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return "";
  const ModelConfig& c = (*m)->config;
  Graph g = BuildGemmaGraph(c, (*m)->weights, GraphOptions{false});
  xla::StepShape sh;
  sh.tokens = 4;
  sh.output_rows = 1;
  sh.compute = compute;
  sh.kv_type = kv;
  sh.quantised_as_f32 = true;
  for (int l = 0; l < c.num_layers; ++l)
    if (c.layers[l].kv_donor < 0)
      sh.caches.push_back({l, c.layers[l].window ? c.layers[l].window : 64, c.layers[l].window,
                           c.layers[l].num_kv_heads * c.layers[l].head_dim, c.layers[l].num_kv_heads});
  auto low = xla::LowerGraph(g, sh);
  EXPECT_TRUE(low.ok()) << low.status().ToString();
  if (!low.ok()) return "";
  for (size_t i = 0; i < low->weights.size(); ++i)
    EXPECT_EQ(low->weight_types[i], xla::WeightDeviceType(*low->weights[i], compute)) << low->weights[i]->name;
  return low->module;
}

size_t Count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(XlaLoweringDtypeTest, Bf16ComputeDotsTakeBf16AndReturnF32) {
  const std::string f32 = LowerFixture("gemma4-e2b-tiny", DType::kF32);
  const std::string bf16 = LowerFixture("gemma4-e2b-tiny", DType::kBF16);
  ASSERT_FALSE(f32.empty());
  ASSERT_FALSE(bf16.empty());
  // f32: every dot true f32; no bf16 anywhere (the fixture's weights are F32).
  EXPECT_EQ(Count(f32, "bf16"), 0u);
  EXPECT_EQ(Count(f32, "\"stablehlo.dot_general\""), Count(f32, "precision HIGHEST>, #stablehlo<precision HIGHEST>"));
  // bf16: every dot's operands are bf16 and its result f32 (no f32 dot left: the router's is the
  // only one that stays f32, and this fixture has no MoE).
  const size_t dots = Count(bf16, "\"stablehlo.dot_general\"");
  EXPECT_GT(dots, 10u);
  size_t mixed = 0;
  for (size_t p = bf16.find("\"stablehlo.dot_general\""); p != std::string::npos; p = bf16.find("\"stablehlo.dot_general\"", p + 1)) {
    const std::string line = bf16.substr(p, bf16.find('\n', p) - p);
    const size_t sig = line.rfind(" : (");
    ASSERT_NE(sig, std::string::npos) << line;
    const std::string types = line.substr(sig);
    const size_t arrow = types.find("->");
    if (types.substr(0, arrow).find("f32") == std::string::npos && types.find("xbf16>, tensor<") != std::string::npos &&
        types.substr(arrow).find("xf32>") != std::string::npos)
      ++mixed;
    else
      ADD_FAILURE() << "not a bf16 x bf16 -> f32 dot: " << line;
  }
  EXPECT_EQ(mixed, dots);
  EXPECT_EQ(Count(bf16, "precision HIGHEST"), 0u);
  // The matrices are bf16 parameters; the norms' weights stay f32.
  const size_t head = bf16.find("func.func public @main(");
  const std::string params = bf16.substr(head, bf16.find('\n', head) - head);
  EXPECT_GT(Count(params, "xbf16>"), 10u);
}

// f16 (a CUDA device below compute capability 8.0): no bf16 type anywhere in the step, even for
// BF16 checkpoints and W4G32's bf16 scales.
TEST(XlaLoweringDtypeTest, F16ComputeHasNoBf16Anywhere) {
  for (const char* fixture : {"gemma4-e2b-tiny-bf16-sharded", "gemma4-e2b-tiny-w4a16", "gemma4-26b-a4b-tiny"}) {
    const std::string f16 = LowerFixture(fixture, DType::kF16, DType::kF16);
    ASSERT_FALSE(f16.empty()) << fixture;
    EXPECT_EQ(Count(f16, "bf16"), 0u) << fixture;
    EXPECT_GT(Count(f16, "xf16>, tensor<"), 10u) << fixture;
  }
  // The f32 lowering of the bf16 checkpoint keeps its weights as stored.
  EXPECT_GT(Count(LowerFixture("gemma4-e2b-tiny-bf16-sharded", DType::kF32), "xbf16>"), 10u);
}

// The fp8 cache's StableHLO: K and V f8E4M3FN [S, slots, Nkv*D] parameters aliased to results,
// each followed by their f32 scales [S, slots, Nkv]; f8 values only converted to f32 (read) and from
// f32 (written), never an operand of arithmetic.
TEST(XlaLoweringDtypeTest, Fp8CacheIsF8E4M3FNWithF32Scales) {
  const std::string fp8 = LowerFixture("gemma4-e2b-tiny", DType::kF32, DType::kF8E4M3);
  ASSERT_FALSE(fp8.empty());
  auto m = LoadModel(ModelPath("gemma4-e2b-tiny"));
  ASSERT_TRUE(m.ok());
  const ModelConfig& c = (*m)->config;
  const size_t head = fp8.find("func.func public @main(");
  const std::string params = fp8.substr(head, fp8.find('\n', head) - head);
  EXPECT_EQ(Count(params, "xf8E4M3FN>"), 2u * c.NumCacheOwners() * 2);  // K, V: parameters and results
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerPlan& lp = c.layers[l];
    if (lp.kv_donor >= 0) continue;
    const std::string slots = std::to_string(lp.window ? lp.window : 64);
    EXPECT_NE(params.find("tensor<1x" + slots + "x" + std::to_string(lp.num_kv_heads * lp.head_dim) + "xf8E4M3FN>"),
              std::string::npos) << "layer " << l;
    EXPECT_NE(params.find("tensor<1x" + slots + "x" + std::to_string(lp.num_kv_heads) + "xf32>"), std::string::npos)
        << "layer " << l;
  }
  size_t lines = 0;
  for (size_t p = fp8.find("f8E4M3FN"); p != std::string::npos; p = fp8.find("f8E4M3FN", p + 1)) {
    const size_t start = fp8.rfind('\n', p) + 1;
    const std::string line = fp8.substr(start, fp8.find('\n', p) - start);
    ++lines;
    for (const char* op : {"add", "subtract", "multiply", "divide", "maximum", "minimum", "dot_general", "reduce",
                           "select", "compare", "exponential"})
      EXPECT_EQ(line.find("\"stablehlo." + std::string(op) + "\""), std::string::npos) << "f8E4M3FN in arithmetic: " << line;
  }
  EXPECT_GT(lines, 4u * c.NumCacheOwners());
}

std::unique_ptr<Engine> MakeEngine(const std::string& fixture, const std::string& compute, int chunk, int device = 0,
                                   int devices = 1) {
  XlaBackendOptions xo;
  xo.plugin_path = xla::testing_util::PluginPath();
  xo.client_options = xla::testing_util::ClientOptions(devices);
  xo.compute_dtype = compute;
  xo.device = device;
  EngineOptions o;
  o.prefill_chunk = chunk;
  o.max_context = 64;
  o.kv_type = DType::kF32;
  return MakeEngineOn(ModelPath(fixture), MakeXlaBackend(xo), o);
}

// bf16 and f16 compute on XLA's CPU plugin against the transformers f32 reference. Rounding each
// dot operand to the compute dtype (unit roundoff u = 2^-8 for bf16, 2^-11 for f16) perturbs each
// projection by about u of its scale; the errors of a few dozen dots per layer add up through the
// fixtures' layers (with the residual stream, norms and softmax in f32) to some ten u of the
// largest logit (the random fixtures: 7-20u). Bound: 32u of max|logit| (0.125 bf16, 0.0156 f16).
// Rounding scales with u, a lowering bug does not: f16's error must also be below half of bf16's
// (u is 8x smaller). The lower bound (> 1e-6) shows the compute dtype was used at all.
TEST(XlaComputeDtypeTest, Bf16AndF16LogitsAreWithinTheirBoundOfF32) {
  G4_REQUIRE_PJRT_PLUGIN();
  for (const char* fixture : {"gemma4-e2b-tiny", "gemma4-e2b-tiny-w4a16", "gemma4-26b-a4b-tiny"}) {
    Reference ref = LoadReference(fixture);
    const std::vector<float> want = ref.Get("logits");
    ASSERT_FALSE(want.empty()) << fixture;
    std::map<std::string, double> errs;
    for (auto [compute, bound] : {std::pair<const char*, double>{"bf16", 32.0 / 256}, {"f16", 32.0 / 2048}}) {
      auto e = MakeEngine(fixture, compute, 16);
      ASSERT_NE(e, nullptr);
      EXPECT_EQ(XlaInfo(e->backend())->compute_dtype, compute);
      const double err = RelErr(PrefillThenDecode(*e, ref.ids, 12), want);
      EXPECT_LT(err, bound) << fixture << " " << compute;
      EXPECT_GT(err, 1e-6) << fixture << " " << compute << ": the logits equal f32's";
      std::printf("[ compute ] %s %s: max|logits - f32 reference| / max|reference| = %.3g (bound %.3g)\n", fixture, compute,
                  err, bound);
      errs[compute] = err;
    }
    EXPECT_LT(errs["f16"], errs["bf16"] / 2) << fixture;
  }
}

// The second of two CPU devices gives the first's logits (bit-equal: the same program).
TEST(XlaDeviceTest, TheSecondDeviceGivesTheFirstsLogits) {
  G4_REQUIRE_PJRT_PLUGIN();
  if (xla::testing_util::PluginPath().find("cpu") == std::string::npos)
    GTEST_SKIP() << "needs XLA's CPU plugin (cpu_device_count: two devices)";
  Reference ref = LoadReference("gemma4-e2b-tiny");
  auto first = MakeEngine("gemma4-e2b-tiny", "auto", 16, 0, 2);
  auto second = MakeEngine("gemma4-e2b-tiny", "auto", 16, 1, 2);
  ASSERT_TRUE(first && second);
  EXPECT_EQ(XlaInfo(second->backend())->device, 1);
  EXPECT_EQ(XlaInfo(second->backend())->num_devices, 2);
  const std::vector<float> a = PrefillThenDecode(*first, ref.ids, 12), b = PrefillThenDecode(*second, ref.ids, 12);
  EXPECT_EQ(a, b);
  EXPECT_LT(RelErr(b, ref.Get("logits")), kRelTol);
  XlaBackendOptions xo;
  xo.plugin_path = xla::testing_util::PluginPath();
  xo.client_options = xla::testing_util::ClientOptions(2);
  xo.device = 2;
  auto bad = MakeXlaBackend(xo);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "--device 2: the cpu plugin has 2 addressable device(s), 0 to 1");
}

// The plan's step part: the compiled programs' working memory, checked before a step first runs.
TEST(XlaMemoryPlanTest, TheLargestStepIsPartOfThePlan) {
  G4_REQUIRE_PJRT_PLUGIN();
  auto e = MakeEngine("gemma4-e2b-tiny", "auto", 8);
  ASSERT_NE(e, nullptr);
  const xla::MemoryPlan* plan = XlaPlan(e->backend());
  ASSERT_NE(plan, nullptr);
  EXPECT_GT(plan->weights, 1000000);
  EXPECT_EQ(plan->kv, static_cast<int64_t>(KvCache::BytesPerSequence(e->config(), 64, DType::kF32)));
  EXPECT_EQ(plan->step, 0);  // nothing compiled yet
  auto steps = e->Warmup(8);
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  // XLA's CPU plugin reports its programs' memory: the largest step has temporaries and logits.
  EXPECT_GT(plan->step, 0);
  EXPECT_FALSE(plan->step_name.empty());
  const int64_t weights = plan->weights, kv = plan->kv, step = plan->step;

  // Room for the weights and the cache but not the step: Engine::Create passes, the first step is
  // refused before it runs, naming the parts.
  auto m = LoadModel(ModelPath("gemma4-e2b-tiny"));
  ASSERT_TRUE(m.ok());
  XlaBackendOptions xo;
  xo.plugin_path = xla::testing_util::PluginPath();
  xo.client_options = xla::testing_util::ClientOptions(1);
  xo.device_memory_bytes = weights + kv + 100;
  auto backend = MakeXlaBackend(xo);
  ASSERT_TRUE(backend.ok());
  EngineOptions o;
  o.prefill_chunk = 8;
  o.max_context = 64;
  o.kv_type = DType::kF32;
  auto tight = Engine::Create(std::move(*m), std::move(*backend), o);
  ASSERT_TRUE(tight.ok()) << tight.status().ToString();
  auto w = (*tight)->Warmup(8);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted);
  const std::string& msg = w.status().message();
  EXPECT_NE(msg.find("the model does not fit on the device: weights " + std::to_string(weights) + " bytes + KV cache " +
                     std::to_string(kv) + " bytes (1 sequences x 64 tokens) + prefill step of 1 tokens "),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find(" bytes > " + std::to_string(weights + kv + 100) + " bytes of device memory (the limit given, --device-memory)"),
            std::string::npos)
      << msg;
  EXPECT_EQ((*tight)->SequenceLength(0), 0);
  (void)step;
}

TEST(XlaMemoryPlanTest, StepWorkingBytesCountsTemporariesUnaliasedOutputsAndInputs) {
  xla::CompiledMemory m;
  m.argument_bytes = 1000 + 64;  // resident 1000 + the step's ids
  m.output_bytes = 400 + 40;     // 400 aliased (the KV cache) + logits
  m.alias_bytes = 400;
  m.temp_bytes = 7;
  EXPECT_EQ(xla::StepWorkingBytes(m, 1000), 7 + 40 + 64);
  xla::MemoryPlan p;
  p.limit = 1000;
  p.limit_source = "the device's";
  p.weights = 600;
  p.kv = 300;
  p.step = 101;
  p.step_name = "decode step of 4 sequences";
  Status st = xla::CheckMemoryPlan(p, "(4 sequences x 8 tokens)");
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(st.message(),
            "the model does not fit on the device: weights 600 bytes + KV cache 300 bytes (4 sequences x 8 tokens) + decode "
            "step of 4 sequences 101 bytes = 1001 bytes > 1000 bytes of device memory (the device's)");
  p.step = 100;
  EXPECT_TRUE(xla::CheckMemoryPlan(p, "").ok());
  p.limit = 0;
  p.step = 1 << 30;
  EXPECT_TRUE(xla::CheckMemoryPlan(p, "").ok());  // no limit known: nothing to check
}

}  // namespace
}  // namespace g4
