// `serve --backend xla` end to end over HTTP on the tiny E2B-like golden checkpoint (token-id
// prompts: it has no tokenizer), through XLA's CPU plugin (GEMMA4RT_PJRT_PLUGIN; skipped without
// it): greedy completions give the token ids of a CPU-backend server with the same f32 arithmetic,
// streamed and not; concurrent requests (continuous batching) each give their solo ids; a client
// that hangs up mid-stream frees its slot and leaves a concurrent request's ids as they are alone;
// chat completions on the real Gemma 3 270M (it has a chat template) give the CPU-backend
// server's text, streamed and not. And the CLI: generate and info on --backend xla, and
// the plugin errors as a non-zero exit with the reason.
#include <gtest/gtest.h>

#include <httplib.h>

#include <future>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/model.h"
#include "server/serve.h"
#include "xla/xla_serve_util.h"
#include "xla/xla_test_util.h"

namespace g4::server {
namespace {

using namespace xla_serve_test;

TEST(XlaServeTest, CompletionsMatchTheCpuBackendStreamedAndConcurrent) {
  G4_REQUIRE_PJRT_PLUGIN();
  auto cpu = StartServer("cpu", 2);
  auto on_xla = StartServer("xla", 2);
  ASSERT_TRUE(cpu && on_xla);
  const std::vector<int32_t> a = {2, 17, 300, 41}, b = {2, 9, 8, 7, 6, 5, 4, 3, 250, 11, 12};
  const json want_a = Complete(cpu->port(), a, 12), want_b = Complete(cpu->port(), b, 12);
  ASSERT_EQ(want_a.size(), 12u);
  ASSERT_EQ(want_b.size(), 12u);
  EXPECT_EQ(Complete(on_xla->port(), a, 12), want_a);
  EXPECT_EQ(Complete(on_xla->port(), b, 12, /*stream=*/true), want_b);
  // Two at once: batched decode steps of both sequences give each its solo ids.
  auto fa = std::async(std::launch::async, [&] { return Complete(on_xla->port(), a, 12, true); });
  auto fb = std::async(std::launch::async, [&] { return Complete(on_xla->port(), b, 12); });
  EXPECT_EQ(fa.get(), want_a);
  EXPECT_EQ(fb.get(), want_b);
}

TEST(XlaServeTest, AClientThatHangsUpMidStreamFreesItsSlot) {
  G4_REQUIRE_PJRT_PLUGIN();
  auto cpu = StartServer("cpu", 1);
  auto on_xla = StartServer("xla", 2);
  ASSERT_TRUE(cpu && on_xla);
  const std::vector<int32_t> b = {2, 9, 8, 7, 6, 5, 4, 3, 250, 11, 12};
  const json want_b = Complete(cpu->port(), b, 24);
  ASSERT_EQ(want_b.size(), 24u);
  // Another request in the other slot while the stream is cancelled: its ids are its solo ids.
  auto other = std::async(std::launch::async, [&] { return Complete(on_xla->port(), b, 24); });
  httplib::Client c("127.0.0.1", on_xla->port());
  c.set_read_timeout(300, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = json({{"prompt", {2, 5, 6}}, {"max_tokens", 60}, {"ignore_eos", true}, {"stream", true},
                   {"return_token_ids", true}}).dump();
  req.set_header("Content-Type", "application/json");
  std::string got;
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    got.append(d, n);
    return got.find("\"token_ids\"") == std::string::npos;  // hang up after the first token's event
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  c.send(req, res, err);
  EXPECT_NE(got.find("\"token_ids\""), std::string::npos) << got;
  EXPECT_EQ(got.find("[DONE]"), std::string::npos) << "the stream ended before the hang-up";
  EXPECT_EQ(other.get(), want_b);
  // The slot is free again: two new requests complete at once.
  auto again = std::async(std::launch::async, [&] { return Complete(on_xla->port(), b, 24, true); });
  EXPECT_EQ(Complete(on_xla->port(), {2, 17, 300}, 4).size(), 4u);
  EXPECT_EQ(again.get(), want_b);
}

// Chat completions on the real Gemma 3 270M GGUF: the chat template, the tokenizer and the
// detokenised deltas around the XLA steps give the CPU-backend server's reply (same f32
// arithmetic), whole and streamed.
TEST(XlaServeTest, ChatOnTheRealModelIsTheCpuBackendsReplyStreamedAndNot) {
  G4_REQUIRE_PJRT_PLUGIN();
  auto cpu = StartServer("cpu", 1, DefaultModelFile(), 128);
  auto on_xla = StartServer("xla", 1, DefaultModelFile(), 128);
  ASSERT_TRUE(cpu && on_xla);
  const json req = {{"messages", {{{"role", "user"}, {"content", "What is the capital of France?"}}}},
                    {"max_tokens", 8}, {"temperature", 0}};
  auto post = [](int port, const json& body) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(300, 0);
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no reply");
    return r ? r->body : std::string();
  };
  const json want = json::parse(post(cpu->port(), req), nullptr, false);
  ASSERT_TRUE(want.is_object());
  const std::string text = want["choices"][0]["message"]["content"];
  ASSERT_FALSE(text.empty());
  const json got = json::parse(post(on_xla->port(), req), nullptr, false);
  ASSERT_TRUE(got.is_object());
  EXPECT_EQ(got["choices"][0]["message"]["content"], text);
  EXPECT_EQ(got["choices"][0]["finish_reason"], want["choices"][0]["finish_reason"]);
  EXPECT_EQ(got["usage"], want["usage"]);
  json sreq = req;
  sreq["stream"] = true;
  std::stringstream ss(post(on_xla->port(), sreq));
  std::string line, streamed, finish;
  bool done = false;
  while (std::getline(ss, line)) {
    if (line == "data: [DONE]") done = true;
    if (line.rfind("data: {", 0) != 0) continue;
    const json j = json::parse(line.substr(6), nullptr, false);
    ASSERT_EQ(j["object"], "chat.completion.chunk") << line;
    const json& c = j["choices"][0];
    if (c["delta"].contains("content") && c["delta"]["content"].is_string()) streamed += c["delta"]["content"].get<std::string>();
    if (c["finish_reason"].is_string()) finish = c["finish_reason"];
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(finish, want["choices"][0]["finish_reason"]);
}

// `generate` of the tiny model, greedy, with --cache-type `cache_type` on the CPU backend and on
// XLA: both exit 0 with the same ids. Returns XLA's output.
std::string ExpectXlaGeneratesTheCpuIds(const std::string& cache_type) {
  const std::string common = "generate -m " + TinyModel() + " --tokens 2,17,300,41 -n 10 --temp 0 --ignore-eos --show-ids "
                             "--cache-type " + cache_type + " --f32-activations";
  CliResult cpu = RunCli(common);
  CliResult on_xla = RunCli(common + " --backend xla --pjrt-plugin " + xla::testing_util::PluginPath());
  EXPECT_EQ(cpu.status, 0) << cpu.out;
  EXPECT_EQ(on_xla.status, 0) << on_xla.out;
  EXPECT_FALSE(IdsLine(cpu.out).empty()) << cpu.out;
  EXPECT_EQ(IdsLine(on_xla.out), IdsLine(cpu.out));
  return on_xla.out;
}

TEST(XlaCliTest, GenerateLogitsBenchAndInfoRunOnXla) {
  G4_REQUIRE_PJRT_PLUGIN();
  const std::string on_xla = ExpectXlaGeneratesTheCpuIds("f32");
  EXPECT_NE(on_xla.find("device policy: backend=xla plugin=" + xla::testing_util::PluginPath() + " api=0."),
            std::string::npos)
      << on_xla;
  EXPECT_NE(on_xla.find("platform=cpu"), std::string::npos) << on_xla;
  CliResult logits = RunCli("logits -m " + TinyModel() + " --tokens 2,17,300 --top 2 --json --backend xla --pjrt-plugin " +
                            xla::testing_util::PluginPath());
  EXPECT_EQ(logits.status, 0) << logits.out;
  EXPECT_NE(logits.out.find("\"positions\""), std::string::npos) << logits.out;
  CliResult bench = RunCli("bench -m " + TinyModel() + " -p 16 -n 4 -r 1 --json --backend xla --pjrt-plugin " +
                           xla::testing_util::PluginPath());
  EXPECT_EQ(bench.status, 0) << bench.out;
  const json bj = test_util::BenchJson(bench);
  ASSERT_TRUE(bj.is_object()) << bench.out;
  EXPECT_EQ(bj["backend"], "xla");
  CliResult info = RunCli("info -m " + TinyModel() + " --backend xla --pjrt-plugin " + xla::testing_util::PluginPath());
  EXPECT_EQ(info.status, 0) << info.out;
  EXPECT_NE(info.out.find("device policy: backend=xla"), std::string::npos) << info.out;
}

// `--cache-type q8` on XLA: int8 K/V with their scales on the device, the same greedy ids as the
// CPU backend's q8 cache (both store the same bytes: lower_kv.h), and `info` counts the scales.
TEST(XlaCliTest, Q8CacheGivesTheCpuBackendsGreedyIds) {
  G4_REQUIRE_PJRT_PLUGIN();
  const std::string on_xla = ExpectXlaGeneratesTheCpuIds("q8");
  EXPECT_NE(on_xla.find("device policy: backend=xla"), std::string::npos) << on_xla;
  EXPECT_NE(on_xla.find(" kv=q8 "), std::string::npos) << on_xla;
  // K and V of 5 sliding layers (8 slots, D 16) and a full one (128 slots, D 32), one KV head, D + 4
  // bytes a slot: 2 (5 * 8 * 20 + 128 * 36) = 10816 bytes, 0.0103 MiB (without the scales 0.0090).
  CliResult info = RunCli("info -m " + TinyModel() + " -c 128 --cache-type q8 --backend xla --pjrt-plugin " +
                          xla::testing_util::PluginPath());
  EXPECT_EQ(info.status, 0) << info.out;
  EXPECT_NE(info.out.find("kv cache: 0.010 MiB per sequence at 128 tokens (q8), 6 cache-owning layers"), std::string::npos)
      << info.out;
}

// fp8 on XLA's CPU plugin: refused by the device policy with the reason, by info and generate.
TEST(XlaCliTest, Fp8CacheIsRefusedOnTheCpuPluginWithTheReason) {
  G4_REQUIRE_PJRT_PLUGIN();
  const std::string xla = " --cache-type fp8 --backend xla --pjrt-plugin " + xla::testing_util::PluginPath();
  for (const std::string cmd : {"info -m " + TinyModel() + " -c 128", "generate -m " + TinyModel() + " --tokens 2,17 -n 1"}) {
    CliResult r = RunCli(cmd + xla);
    EXPECT_EQ(r.status, 1) << cmd << ": " << r.out;
    EXPECT_NE(r.out.find("--cache-type fp8: XLA's CPU plugin has no fp8 arithmetic (use --cache-type q8"), std::string::npos)
        << cmd << ": " << r.out;
  }
}

// The real Gemma 3 270M (Q4_K_M GGUF: Q8_0 embeddings on the device as blocks, the k-quants as
// f32): greedy ids equal the CPU backend's with f32 activations.
TEST(XlaCliTest, RealModelGreedyIdsAreTheCpuBackendsWithF32Activations) {
  G4_REQUIRE_PJRT_PLUGIN();
  const std::string common = "generate -m " + DefaultModelFile() + " -p 'The capital of France is' -n 8 --temp 0 "
                             "--show-ids -c 256 --cache-type f32 --f32-activations";
  CliResult cpu = RunCli(common);
  CliResult on_xla = RunCli(common + " --backend xla --pjrt-plugin " + xla::testing_util::PluginPath());
  ASSERT_EQ(cpu.status, 0) << cpu.out;
  ASSERT_EQ(on_xla.status, 0) << on_xla.out;
  const std::string ids = IdsLine(cpu.out);
  ASSERT_FALSE(ids.empty()) << cpu.out;
  EXPECT_NE(on_xla.out.find(ids), std::string::npos) << "cpu " << ids << "\nxla: " << on_xla.out;
}

TEST(XlaCliTest, PluginErrorsAreAClearErrorAndANonZeroExit) {
  const std::string gen = "generate -m " + TinyModel() + " --tokens 2,17 -n 2 --backend xla --pjrt-plugin ";
  CliResult missing = RunCli(gen + "/nonexistent/plugin.so");
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.out.find("PJRT plugin '/nonexistent/plugin.so': no such file"), std::string::npos) << missing.out;
  CliResult not_plugin = RunCli(gen + TinyModel() + "/config.json");
  EXPECT_NE(not_plugin.status, 0);
  EXPECT_NE(not_plugin.out.find("could not be loaded as a shared library"), std::string::npos) << not_plugin.out;
  CliResult major = RunCli(gen + GEMMA4RT_FAKE_PJRT_MAJOR1);
  EXPECT_NE(major.status, 0);
  EXPECT_NE(major.out.find("this build speaks major version 0"), std::string::npos) << major.out;
  CliResult serve = RunCli("serve -m " + TinyModel() + " --port 0 --backend xla --pjrt-plugin /nonexistent/plugin.so");
  EXPECT_NE(serve.status, 0);
  EXPECT_NE(serve.out.find("no such file"), std::string::npos) << serve.out;
}

}  // namespace
}  // namespace g4::server
