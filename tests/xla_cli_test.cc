// The XLA device flags through the CLI on XLA's CPU plugin (GEMMA4RT_PJRT_PLUGIN; skipped without
// it): the device policy line says which compute dtype was chosen and why; --compute-dtype,
// --device and --device-memory refused where they cannot apply, each a clear error and a non-zero
// exit; a memory plan that does not fit (weights + KV cache, or with the step's working memory)
// refused before the first token, naming the parts and their bytes. bench's batched decode tests.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "backends/xla/lower.h"
#include "cli_runner.h"
#include "model/gemma.h"
#include "model/model.h"
#include "runtime/kv_cache.h"
#include "xla/xla_test_util.h"

namespace g4 {
namespace {

using test_util::CliResult;
using test_util::RunCli;

std::string TinyModel() { return std::string(GEMMA4RT_TEST_DATA_DIR) + "/golden/gemma4-e2b-tiny"; }
std::string Xla() { return " --backend xla --pjrt-plugin " + xla::testing_util::PluginPath(); }
const char kGen[] = " --tokens 2,17,300,41 -n 3 --temp 0 --ignore-eos --show-ids -c 64 --cache-type f32";

std::string Ids(const std::string& out) {
  const size_t p = out.find("ids: ");
  return p == std::string::npos ? std::string() : out.substr(p, out.find('\n', p) - p);
}

TEST(XlaCliPolicyTest, ThePolicyLineSaysWhichComputeDtypeAndWhy) {
  G4_REQUIRE_PJRT_PLUGIN();
  CliResult automatic = RunCli("generate -m " + TinyModel() + kGen + Xla());
  ASSERT_EQ(automatic.status, 0) << automatic.out;
  EXPECT_NE(automatic.out.find(" compute=f32 compute_policy=\"auto: XLA's CPU plugin computes in f32\" "
                               "weights_on_device=f32/f16/bf16/q8_0/q4_0/w4g32-as-stored,other-quantised-as-f32"),
            std::string::npos)
      << automatic.out;
  EXPECT_NE(automatic.out.find(" device_index=0/"), std::string::npos) << automatic.out;
  CliResult bf16 = RunCli("generate -m " + TinyModel() + kGen + Xla() + " --compute-dtype bf16");
  ASSERT_EQ(bf16.status, 0) << bf16.out;
  EXPECT_NE(bf16.out.find(" compute=bf16 compute_policy=\"--compute-dtype bf16: XLA's CPU plugin runs bf16 dots with f32 "
                          "accumulation\" weights_on_device=matrices-as-bf16,"),
            std::string::npos)
      << bf16.out;
  EXPECT_FALSE(Ids(bf16.out).empty()) << bf16.out;
  CliResult info = RunCli("info -m " + TinyModel() + Xla() + " --compute-dtype f16");
  ASSERT_EQ(info.status, 0) << info.out;
  EXPECT_NE(info.out.find(" compute=f16 compute_policy=\"--compute-dtype f16: "), std::string::npos) << info.out;
}

TEST(XlaCliPolicyTest, DeviceFlagsThatCannotApplyAreRefused) {
  G4_REQUIRE_PJRT_PLUGIN();
  const std::string gen = "generate -m " + TinyModel() + kGen;
  CliResult unknown_device = RunCli(gen + Xla() + " --device 7");
  EXPECT_NE(unknown_device.status, 0);
  EXPECT_NE(unknown_device.out.find("error: INVALID_ARGUMENT: --device 7: the cpu plugin has "), std::string::npos)
      << unknown_device.out;
  EXPECT_NE(unknown_device.out.find(" addressable device(s), 0 to "), std::string::npos) << unknown_device.out;
  CliResult negative = RunCli(gen + Xla() + " --device -1");
  EXPECT_EQ(negative.status, 2) << negative.out;
  CliResult bad_dtype = RunCli(gen + Xla() + " --compute-dtype f8");
  EXPECT_EQ(bad_dtype.status, 2) << bad_dtype.out;
  EXPECT_NE(bad_dtype.out.find("--compute-dtype"), std::string::npos) << bad_dtype.out;
  CliResult bad_size = RunCli(gen + Xla() + " --device-memory 12Q");
  EXPECT_EQ(bad_size.status, 2) << bad_size.out;
  EXPECT_NE(bad_size.out.find("--device-memory"), std::string::npos) << bad_size.out;
  // XLA-only flags on the CPU backend.
  for (const char* flag : {" --device 1", " --device-memory 1G", " --compute-dtype bf16"}) {
    CliResult cpu = RunCli(gen + flag);
    EXPECT_NE(cpu.status, 0) << flag;
    EXPECT_NE(cpu.out.find("applies to --backend xla"), std::string::npos) << flag << ": " << cpu.out;
  }
  CliResult serve = RunCli("serve -m " + TinyModel() + " --port 0" + Xla() + " --device 7");
  EXPECT_NE(serve.status, 0);
  EXPECT_NE(serve.out.find("--device 7: the cpu plugin has "), std::string::npos) << serve.out;
}

TEST(XlaCliPolicyTest, APlanThatDoesNotFitIsRefusedWithTheArithmetic) {
  G4_REQUIRE_PJRT_PLUGIN();
  auto m = LoadModel(TinyModel());
  ASSERT_TRUE(m.ok());
  size_t weights = 0;  // every tensor the graph reads: all F32, as stored under f32 compute
  for (const Tensor* t : xla::GraphWeights(BuildGemmaGraph((*m)->config, (*m)->weights, GraphOptions{true})))
    weights += t->nbytes;
  const size_t kv = KvCache::BytesPerSequence((*m)->config, 64, DType::kF32);
  const std::string gen = "generate -m " + TinyModel() + kGen + Xla();
  // 1M: not even the weights.
  CliResult small = RunCli(gen + " --device-memory 1M");
  EXPECT_NE(small.status, 0);
  EXPECT_NE(small.out.find("the model does not fit on the device: weights " + std::to_string(weights) + " bytes + KV cache " +
                           std::to_string(kv) + " bytes (1 sequences x 64 tokens) = " + std::to_string(weights + kv) +
                           " bytes > 1048576 bytes of device memory (the limit given, --device-memory)"),
            std::string::npos)
      << small.out;
  EXPECT_TRUE(Ids(small.out).empty()) << small.out;
  // Room for the weights and the cache, not for the prompt's step: refused before its first run.
  const size_t limit = weights + kv + 64;
  CliResult step = RunCli(gen + " --device-memory " + std::to_string(limit));
  EXPECT_NE(step.status, 0);
  EXPECT_NE(step.out.find("bytes (1 sequences x 64 tokens) + prefill step of 4 tokens "), std::string::npos) << step.out;
  EXPECT_NE(step.out.find(" bytes > " + std::to_string(limit) + " bytes of device memory"), std::string::npos) << step.out;
  EXPECT_TRUE(Ids(step.out).empty()) << step.out;
  // A server refuses it at start-up (its warm-up compiles every step shape).
  CliResult serve = RunCli("serve -m " + TinyModel() + " --port 0 -np 1 -c 64 --cache-type f32" + Xla() + " --device-memory " +
                           std::to_string(limit));
  EXPECT_NE(serve.status, 0);
  EXPECT_NE(serve.out.find("the model does not fit on the device: weights "), std::string::npos) << serve.out;
  EXPECT_NE(serve.out.find("bytes (1 sequences x 64 tokens) + prefill step of 1 tokens "), std::string::npos) << serve.out;
  // Enough memory: the same command runs.
  CliResult roomy = RunCli(gen + " --device-memory 1G");
  EXPECT_EQ(roomy.status, 0) << roomy.out;
  EXPECT_FALSE(Ids(roomy.out).empty()) << roomy.out;
}

// bench --decode-batch (the device check's batch 8 and 32): one tg test per batch, every
// sequence's tokens counted, one weight read per step shared by its tokens.
TEST(XlaBenchTest, DecodeBatchTestsRunBatchedSteps) {
  G4_REQUIRE_PJRT_PLUGIN();
  CliResult r = RunCli("bench -m " + TinyModel() + " -p 0 -n 3 -r 1 --decode-batch 1,4 --bw-mib 0 --json" + Xla());
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = test_util::BenchJson(r);
  ASSERT_TRUE(j.is_object()) << r.out;
  ASSERT_EQ(j["results"].size(), 2u) << r.out;
  const nlohmann::json& one = j["results"][0];
  const nlohmann::json& four = j["results"][1];
  EXPECT_EQ(one["test"], "tg3");
  EXPECT_EQ(one["batch"], 1);
  EXPECT_EQ(four["test"], "tg3x4");
  EXPECT_EQ(four["batch"], 4);
  EXPECT_EQ(four["weight_bytes_per_token"].get<int64_t>(), one["weight_bytes_per_token"].get<int64_t>() / 4);
  EXPECT_EQ(four["kv_bytes_per_token"], one["kv_bytes_per_token"]);
  EXPECT_GT(four["tokens_per_second"].get<double>(), 0);
  EXPECT_EQ(j["tg3x4"], four["tokens_per_second"]);
}

}  // namespace
}  // namespace g4
