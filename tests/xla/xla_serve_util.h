// Helpers of the XLA server and CLI tests: a `serve` instance on a backend, greedy completions by
// token ids, the CLI runner and the ids `generate --show-ids` prints.
#pragma once

#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../cli_runner.h"
#include "server/serve.h"
#include "xla_test_util.h"

namespace g4::server::xla_serve_test {

using json = nlohmann::json;
using test_util::CliResult;
using test_util::RunCli;

// The tiny E2B-like golden checkpoint (token-id prompts: it has no tokenizer).
inline std::string TinyModel() { return std::string(GEMMA4RT_TEST_DATA_DIR) + "/golden/gemma4-e2b-tiny"; }

// A server of `model` on `backend` (f32 arithmetic, f32 cache, prefill chunks of 8), loaded;
// nullptr (and a test failure) when it does not start. `mesh`: --mesh for --backend xla.
inline std::unique_ptr<ServeInstance> StartServer(const std::string& backend, int parallel,
                                                  const std::string& model = TinyModel(), int ctx = 64,
                                                  const std::string& mesh = "") {
  ServeOptions o;
  o.model = model;
  o.ctx = ctx;
  o.parallel = parallel;
  o.host = "127.0.0.1";
  o.port = 0;
  o.threads = 1;
  o.log_requests = false;
  o.cache_type = "f32";
  o.f32_activations = true;
  o.prefill_chunk = 8;
  o.backend.backend = backend;
  o.backend.mesh = mesh;
  o.backend.pjrt_plugin = xla::testing_util::PluginPath();
  auto s = ServeInstance::Start(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return nullptr;
  Status st = (*s)->WaitLoaded();
  EXPECT_TRUE(st.ok()) << st.ToString();
  return std::move(s).value();
}

// A greedy completion's token ids (streamed: the chunks' ids concatenated); null on an HTTP error.
inline nlohmann::json Complete(int port, const std::vector<int32_t>& prompt, int n, bool stream = false) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(300, 0);
  nlohmann::json req = {{"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}, {"ignore_eos", true},
                        {"return_token_ids", true}, {"stream", stream}};
  auto r = c.Post("/v1/completions", req.dump(), "application/json");
  if (!r || r->status != 200) return nlohmann::json();
  if (!stream) return nlohmann::json::parse(r->body, nullptr, false)["choices"][0]["token_ids"];
  nlohmann::json ids = nlohmann::json::array();  // the streamed token_ids, concatenated
  std::stringstream ss(r->body);
  std::string line;
  while (std::getline(ss, line)) {
    if (line.rfind("data: {", 0) != 0) continue;
    nlohmann::json j = nlohmann::json::parse(line.substr(6), nullptr, false);
    if (j.contains("choices") && !j["choices"].empty() && j["choices"][0].contains("token_ids"))
      for (const auto& id : j["choices"][0]["token_ids"]) ids.push_back(id);
  }
  return ids;
}

// The line `ids: ...` of `generate --show-ids` in `out`; empty where there is none.
inline std::string IdsLine(const std::string& out) {
  const size_t p = out.find("ids: ");
  return p == std::string::npos ? std::string() : out.substr(p, out.find('\n', p) - p);
}

}  // namespace g4::server::xla_serve_test
