// The golden fixtures (tests/golden/, see golden_test.cc) on the CUDA backend against the same
// transformers references: one-shot prefill (the cuBLAS path), chunked prefill across the window
// edge and token-by-token decode (the matrix-vector path), batched decode of three sequences, and
// decode with the int8 cache (against the CPU backend's int8-cache error).
// The fixtures are f32 models the GPU runs with weights in its compute dtype, so the tolerance is
// that dtype's (max |got - want| / max |want|): 5e-3 in f16, 3e-2 in bf16. Skipped where the
// machine has no CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <span>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "cuda/cuda_test_util.h"
#include "golden_reference.h"
#include "model/model.h"
#include "runtime/engine.h"

namespace g4 {
namespace {

using namespace golden;

struct Case {
  std::string fixture, dtype;
};

double Tol(const std::string& dtype) { return dtype == "f16" ? 5e-3 : 3e-2; }

// cpu: the CPU backend instead (the int8 cache's reference).
std::unique_ptr<Engine> MakeCudaEngine(const Case& c, int chunk, int max_seqs = 1, DType kv = DType::kF32,
                                       bool cpu = false) {
  auto m = LoadModel(ModelPath(c.fixture));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return nullptr;
  StatusOr<std::unique_ptr<Backend>> backend = cpu ? StatusOr<std::unique_ptr<Backend>>(MakeCpuBackend(1, CpuBackendOptionsFor(true)))
                                                    : MakeCudaBackend({0, c.dtype});
  EXPECT_TRUE(backend.ok()) << backend.status().ToString();
  if (!backend.ok()) return nullptr;
  EngineOptions o;
  o.prefill_chunk = chunk;
  o.max_seqs = max_seqs;
  o.max_context = 64;
  o.kv_type = kv;
  auto e = Engine::Create(std::move(m).value(), std::move(backend).value(), o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

class CudaGoldenTest : public ::testing::TestWithParam<Case> {};

TEST_P(CudaGoldenTest, PrefillChunksAndDecodeMatchTransformers) {
  G4_REQUIRE_CUDA_DEVICE();
  const Case& c = GetParam();
  Reference ref = LoadReference(c.fixture);
  const std::vector<float> want = ref.Get("logits");
  for (int chunk : {1 << 20, 3, 9}) {
    auto engine = MakeCudaEngine(c, chunk);
    ASSERT_NE(engine, nullptr);
    std::vector<float> logits;
    ASSERT_TRUE(engine->Prefill(0, ref.ids, true, &logits).ok());
    EXPECT_LT(RelErr(logits, want), Tol(c.dtype)) << "chunk " << chunk;
  }
  auto engine = MakeCudaEngine(c, 512);
  ASSERT_NE(engine, nullptr);
  std::vector<float> logits, row;
  ASSERT_TRUE(engine->Prefill(0, std::span<const int32_t>(ref.ids).first(5), true, &logits).ok());
  for (size_t t = 5; t < ref.ids.size(); ++t) {
    const int32_t seq = 0;
    ASSERT_TRUE(engine->Decode(std::span<const int32_t>(&seq, 1), std::span<const int32_t>(&ref.ids[t], 1), &row).ok());
    logits.insert(logits.end(), row.begin(), row.end());
  }
  EXPECT_LT(RelErr(logits, want), Tol(c.dtype));
}

// Logits of a 5-token prefill then token-by-token decode.
std::vector<float> PrefillThenDecode(Engine& engine, const std::vector<int32_t>& ids) {
  std::vector<float> logits, row;
  EXPECT_TRUE(engine.Prefill(0, std::span<const int32_t>(ids).first(5), true, &logits).ok());
  for (size_t t = 5; t < ids.size(); ++t) {
    const int32_t seq = 0;
    EXPECT_TRUE(engine.Decode(std::span<const int32_t>(&seq, 1), std::span<const int32_t>(&ids[t], 1), &row).ok());
    logits.insert(logits.end(), row.begin(), row.end());
  }
  return logits;
}

// The int8 cache (--cache-type q8): against transformers within the CPU backend's own int8-cache
// error on the same tokens plus the compute dtype's tolerance.
TEST_P(CudaGoldenTest, Int8CacheWithinTheCpuInt8ErrorPlusTheDtypes) {
  G4_REQUIRE_CUDA_DEVICE();
  const Case& c = GetParam();
  Reference ref = LoadReference(c.fixture);
  const std::vector<float> want = ref.Get("logits");
  auto cpu = MakeCudaEngine(c, 512, 1, DType::kI8, /*cpu=*/true);
  auto gpu = MakeCudaEngine(c, 512, 1, DType::kI8);
  ASSERT_TRUE(cpu != nullptr && gpu != nullptr);
  const double cpu_err = RelErr(PrefillThenDecode(*cpu, ref.ids), want);
  EXPECT_LT(RelErr(PrefillThenDecode(*gpu, ref.ids), want), cpu_err + Tol(c.dtype)) << "CPU int8 error " << cpu_err;
}

TEST_P(CudaGoldenTest, BatchedDecodeOfThreeSequences) {
  G4_REQUIRE_CUDA_DEVICE();
  const Case& c = GetParam();
  Reference ref = LoadReference(c.fixture);
  const std::vector<float> want = ref.Get("logits");
  const int V = static_cast<int>(want.size() / ref.ids.size());
  auto engine = MakeCudaEngine(c, 4, /*max_seqs=*/3);
  ASSERT_NE(engine, nullptr);
  std::vector<float> unused, lg;
  int p[3] = {11, 4, 17};  // different positions mod the window of 8
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(engine->Prefill(s, std::span<const int32_t>(ref.ids).first(p[s]), false, &unused).ok());
  while (p[2] < static_cast<int>(ref.ids.size())) {
    const int32_t seqs[3] = {1, 2, 0};
    const int32_t toks[3] = {ref.ids[p[1]], ref.ids[p[2]], ref.ids[p[0]]};
    ASSERT_TRUE(engine->Decode(seqs, toks, &lg).ok());
    for (int b = 0; b < 3; ++b) {
      const int s = seqs[b];
      const std::vector<float> got(lg.begin() + b * V, lg.begin() + (b + 1) * V);
      EXPECT_LT(RelErr(got, std::vector<float>(want.begin() + p[s] * V, want.begin() + (p[s] + 1) * V)), Tol(c.dtype))
          << "seq " << s << " position " << p[s];
    }
    for (int s = 0; s < 3; ++s) ++p[s];
  }
}

std::vector<Case> Cases() {
  std::vector<Case> out;
  for (const char* name : {"gemma3-tiny", "gemma4-e2b-tiny", "gemma4-31b-tiny", "gemma4-26b-a4b-tiny",
                           "gemma4-e2b-tiny-w4a16", "gemma4-31b-tiny-w4a16"})
    if (std::filesystem::exists(FixtureDir(name) + "/reference.safetensors"))
      for (const char* dt : {"f16", "bf16"}) out.push_back({name, dt});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGoldenTest, ::testing::ValuesIn(Cases()), [](const auto& info) {
  std::string s = info.param.fixture + "_" + info.param.dtype;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
});

}  // namespace
}  // namespace g4
