// `serve` and the CLI with --backend xla over a device mesh (XLA's CPU plugin exposing the mesh's
// devices; skipped without GEMMA4RT_PJRT_PLUGIN), on the tiny E2B-like golden checkpoint: greedy
// completions on a 2x2 mesh give the CPU backend's ids, alone and four at once (continuous
// batching across both data shards); generate, info --mesh and invalid meshes through the CLI.
#include <gtest/gtest.h>

#include <httplib.h>

#include <future>
#include <nlohmann/json.hpp>

#include "server/serve.h"
#include "xla/xla_serve_util.h"
#include "xla/xla_test_util.h"

namespace g4::server {
namespace {

using namespace xla_serve_test;

TEST(XlaMeshServeTest, ConcurrentGreedyRequestsOnTwoByTwoEqualSoloRuns) {
  G4_REQUIRE_PJRT_PLUGIN();
  auto cpu = StartServer("cpu", 1);
  auto mesh = StartServer("xla", 4, TinyModel(), 64, "data=2,model=2");
  ASSERT_TRUE(cpu && mesh);
  const std::vector<std::vector<int32_t>> prompts = {
      {2, 17, 300, 41}, {2, 9, 8, 7, 6, 5, 4, 3, 250, 11, 12}, {2, 400, 5}, {2, 33, 34, 35, 36, 37, 38}};
  std::vector<json> want;
  for (const auto& p : prompts) {
    want.push_back(Complete(cpu->port(), p, 10));
    ASSERT_EQ(want.back().size(), 10u);
  }
  EXPECT_EQ(Complete(mesh->port(), prompts[0], 10), want[0]);  // solo
  std::vector<std::future<json>> runs;
  for (const auto& p : prompts) runs.push_back(std::async(std::launch::async, [&, p] { return Complete(mesh->port(), p, 10); }));
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(runs[i].get(), want[i]) << "request " << i;
}

TEST(XlaMeshCliTest, GenerateInfoAndInvalidMeshes) {
  G4_REQUIRE_PJRT_PLUGIN();
  const std::string plugin = " --backend xla --pjrt-plugin " + xla::testing_util::PluginPath();
  const std::string gen = "generate -m " + TinyModel() + " --tokens 2,17,300,41 -n 6 --temp 0 --ignore-eos --show-ids "
                          "--cache-type f32 --f32-activations";
  CliResult one = RunCli(gen + plugin);
  CliResult four = RunCli(gen + plugin + " --devices 4");
  ASSERT_EQ(one.status, 0) << one.out;
  ASSERT_EQ(four.status, 0) << four.out;
  const std::string ids = IdsLine(one.out);
  ASSERT_FALSE(ids.empty()) << one.out;
  EXPECT_NE(four.out.find(ids), std::string::npos) << four.out;
  EXPECT_NE(four.out.find("mesh=data=1,model=4"), std::string::npos) << four.out;

  CliResult info = RunCli("info -m " + TinyModel() + plugin + " --mesh data=2,model=2 -c 64");
  EXPECT_EQ(info.status, 0) << info.out;
  EXPECT_NE(info.out.find("mesh plan: mesh data=2,model=2: 4 of 4 cpu device(s)"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("mesh plan: KV cache per device:"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("mesh plan: replicated: "), std::string::npos) << info.out;  // one KV head

  CliResult bad = RunCli(gen + plugin + " --mesh model=3");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("the model axis divides no weight of this model"), std::string::npos) << bad.out;
  CliResult malformed = RunCli(gen + plugin + " --mesh rows=2");
  EXPECT_EQ(malformed.status, 2);  // a usage error
  EXPECT_NE(malformed.out.find("unknown axis 'rows'"), std::string::npos) << malformed.out;
  CliResult cpu = RunCli(gen + " --mesh model=2");
  EXPECT_NE(cpu.status, 0);
  EXPECT_NE(cpu.out.find("--mesh and --devices need --backend xla"), std::string::npos) << cpu.out;
}

}  // namespace
}  // namespace g4::server
