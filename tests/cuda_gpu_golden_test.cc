// The golden fixtures (tests/golden/, see golden_test.cc) on the CUDA backend against the same
// transformers references: one-shot prefill (the cuBLAS path), chunked prefill across the window
// edge and token-by-token decode (the matrix-vector path), batched decode of three sequences, and
// decode with the int8 cache (against the CPU backend's int8-cache error) and the fp8 cache (where
// the device holds it: within 2^-4, e4m3's relative rounding, plus the dtype's tolerance).
// The fixtures are f32 models the GPU runs with weights in its compute dtype, so the tolerance is
// that dtype's (max |got - want| / max |want|): 5e-3 in f16, 3e-2 in bf16. Skipped where the
// machine has no CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "cuda/cuda_test_util.h"
#include "golden_check.h"
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
  EngineOptions o;
  o.prefill_chunk = chunk;
  o.max_seqs = max_seqs;
  o.max_context = 64;
  o.kv_type = kv;
  StatusOr<std::unique_ptr<Backend>> backend =
      cpu ? StatusOr<std::unique_ptr<Backend>>(MakeCpuBackend(1, CpuBackendOptionsFor(true))) : MakeCudaBackend({0, c.dtype});
  return MakeEngineOn(ModelPath(c.fixture), std::move(backend), o);
}

class CudaGoldenTest : public ::testing::TestWithParam<Case> {};

TEST_P(CudaGoldenTest, PrefillChunksAndDecodeMatchTransformers) {
  G4_REQUIRE_CUDA_DEVICE();
  const Case& c = GetParam();
  Reference ref = LoadReference(c.fixture);
  ExpectChunkedPrefillMatches([&](int chunk) { return MakeCudaEngine(c, chunk); }, ref, {1 << 20, 3, 9}, Tol(c.dtype));
  auto engine = MakeCudaEngine(c, 512);
  ASSERT_NE(engine, nullptr);
  ExpectDecodeMatches(*engine, ref, 5, Tol(c.dtype), /*argmax=*/false);
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
  const double cpu_err = RelErr(PrefillThenDecode(*cpu, ref.ids, 5), want);
  EXPECT_LT(RelErr(PrefillThenDecode(*gpu, ref.ids, 5), want), cpu_err + Tol(c.dtype)) << "CPU int8 error " << cpu_err;
}

// The fp8 cache (--cache-type fp8, compute capability >= 8.9): prefill and decode logits within
// the compute dtype's tolerance plus 2^-4 (each cached K/V element within 2^-4 of its value).
TEST_P(CudaGoldenTest, Fp8CacheWithinE4m3RoundingPlusTheDtypes) {
  G4_REQUIRE_CUDA_DEVICE();
  const Case& c = GetParam();
  auto backend = MakeCudaBackend({0, c.dtype});
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  const Status held = (*backend)->CheckKvCacheType(DType::kF8E4M3);
  if (!held.ok()) GTEST_SKIP() << held.message();
  Reference ref = LoadReference(c.fixture);
  auto gpu = MakeCudaEngine(c, 512, 1, DType::kF8E4M3);
  ASSERT_NE(gpu, nullptr);
  EXPECT_LT(RelErr(PrefillThenDecode(*gpu, ref.ids, 5), ref.Get("logits")), Tol(c.dtype) + 0.0625);
}

TEST_P(CudaGoldenTest, BatchedDecodeOfThreeSequences) {
  G4_REQUIRE_CUDA_DEVICE();
  const Case& c = GetParam();
  Reference ref = LoadReference(c.fixture);
  auto engine = MakeCudaEngine(c, 4, /*max_seqs=*/3);
  ASSERT_NE(engine, nullptr);
  // Different positions mod the window of 8.
  ExpectBatchedDecodeMatches(*engine, ref, {11, 4, 17}, {1, 2, 0}, Tol(c.dtype));
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
