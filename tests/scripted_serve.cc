// Test-only server: the real HTTP server, request layer and scheduler over an engine whose backend
// replays scripted replies instead of running a model (the default model is a base model and does
// not call tools). Built as gemma4rt_scripted_serve, never installed; run by scripts/test-clients.sh
// for tests/clients/test_tools.py.
//
//   gemma4rt_scripted_serve MODEL TOKENIZER_DIR SCRIPT_JSON PORT
//
// MODEL: a Gemma 4 fixture (its config, KV cache shapes; its weights are never read).
// TOKENIZER_DIR: a Hugging Face tokenizer directory; the model's vocabulary is widened to it.
// SCRIPT_JSON: {"replies": ["text", ...]}: the n-th request that reaches the engine gets the n-th
// reply's tokens (the tokenizer's encoding, special tokens parsed) then <turn|>; a request gets
// <turn|> once the script is spent. One slot (-np 1). Prints "listening on PORT" and serves
// until SIGINT or SIGTERM.
#include <pthread.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "runtime/backend.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "server/api.h"
#include "server/http_server.h"
#include "tokenizer/tokenizer.h"

namespace {

// The replies and where the replay stands; shared by every executable of the backend.
struct Script {
  std::vector<std::vector<int32_t>> replies;
  int32_t end_id = 0;
  int reply = -1;
  size_t cursor = 0;
  int32_t last_emitted = -1;
  int32_t last_position = -1;
};

class ScriptedExecutable : public g4::Executable {
 public:
  ScriptedExecutable(Script* script, int rows, int vocab) : script_(script), vocab_(vocab), logits_(static_cast<size_t>(rows) * vocab) {}

  // A step with output rows either continues the current reply (one token: the one emitted last,
  // at the next position) or starts the next reply.
  g4::Status Run(const g4::StepInput& in, g4::KvCacheBase&) override {
    rows_ = static_cast<int>(in.output_rows.size());
    if (rows_ == 0) return g4::OkStatus();
    Script& s = *script_;
    const bool continues = in.tokens.size() == 1 && in.tokens[0] == s.last_emitted && in.positions[0] == s.last_position + 1;
    if (!continues) ++s.reply, s.cursor = 0;
    const bool have = s.reply >= 0 && s.reply < static_cast<int>(s.replies.size()) && s.cursor < s.replies[s.reply].size();
    const int32_t next = have ? s.replies[s.reply][s.cursor++] : s.end_id;
    std::fill(logits_.begin(), logits_.end(), 0.0f);
    for (int r = 0; r < rows_; ++r) logits_[static_cast<size_t>(r) * vocab_ + next] = 1000.0f;
    s.last_emitted = next;
    s.last_position = in.positions[in.output_rows[rows_ - 1]];
    return g4::OkStatus();
  }
  g4::OutputView Output(const std::string& name) const override {
    if (name != "logits") return {};
    return {const_cast<float*>(logits_.data()), rows_, vocab_};
  }

 private:
  Script* script_;
  int vocab_;
  int rows_ = 0;
  std::vector<float> logits_;
};

class ScriptedBackend : public g4::Backend {
 public:
  ScriptedBackend(Script* script, int vocab) : script_(script), vocab_(vocab) {}
  std::string Name() const override { return "scripted"; }
  g4::StatusOr<std::unique_ptr<g4::Executable>> Compile(const g4::Graph&, int, int num_output_rows) override {
    return std::unique_ptr<g4::Executable>(new ScriptedExecutable(script_, std::max(num_output_rows, 1), vocab_));
  }

 private:
  Script* script_;
  int vocab_;
};

int Fail(const std::string& what) {
  std::fprintf(stderr, "gemma4rt_scripted_serve: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) return Fail("usage: gemma4rt_scripted_serve MODEL TOKENIZER_DIR SCRIPT_JSON PORT");
  // SIGINT and SIGTERM are taken by sigwait below: blocked before any thread starts.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  auto tok = g4::Tokenizer::FromHfDirectory(argv[2]);
  if (!tok.ok()) return Fail(tok.status().ToString());
  std::unique_ptr<g4::Tokenizer> tokenizer = std::move(tok).value();
  std::ifstream f(argv[3]);
  std::stringstream ss;
  ss << f.rdbuf();
  const nlohmann::json script_json = nlohmann::json::parse(ss.str(), nullptr, false);
  if (!script_json.is_object() || !script_json.contains("replies")) return Fail("bad script " + std::string(argv[3]));
  Script script;
  const std::vector<int32_t> end = tokenizer->Encode("<turn|>", false, true);
  if (end.size() != 1) return Fail("<turn|> is not one token");
  script.end_id = end[0];
  for (const auto& r : script_json["replies"]) {
    std::vector<int32_t> ids = tokenizer->Encode(r.get<std::string>(), false, true);
    ids.push_back(script.end_id);
    script.replies.push_back(std::move(ids));
  }

  auto loaded = g4::LoadModel(argv[1]);
  if (!loaded.ok()) return Fail(loaded.status().ToString());
  std::unique_ptr<g4::LoadedModel> model = std::move(loaded).value();
  const int vocab = tokenizer->vocab_size();
  model->config.vocab = vocab;  // the graph is never run: only the ids' range and the logits' width
  if (model->config.ple_dim > 0) model->config.ple_vocab = vocab;
  model->config.max_position = std::max(model->config.max_position, 2048);  // room for tool declarations
  g4::EngineOptions eo;
  eo.max_seqs = 1;
  eo.max_context = 2048;
  auto engine = g4::Engine::Create(std::move(model), std::make_unique<ScriptedBackend>(&script, vocab), eo);
  if (!engine.ok()) return Fail(engine.status().ToString());
  g4::Scheduler scheduler(**engine, tokenizer.get(), g4::SchedulerOptions{});

  g4::server::ModelInfo info;
  info.id = "scripted-gemma4";
  info.accepted_ids = {info.id};
  info.template_kind = g4::ChatTemplateKind::kGemma4;
  info.tokenizer = tokenizer.get();
  info.context_size = scheduler.context_size();
  info.vocab_size = vocab;
  info.bos_id = tokenizer->bos_id();
  info.default_sampling.temperature = 0;
  info.default_stop_ids = {script.end_id};
  info.created = g4::server::UnixNow();

  g4::server::HttpOptions h;
  h.port = std::atoi(argv[4]);
  h.log_requests = false;
  g4::server::HttpServer http(h);
  if (g4::Status st = http.Start(); !st.ok()) return Fail(st.ToString());
  http.SetReady(std::move(info), &scheduler);
  std::printf("listening on %d\n", http.port());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&set, &sig);
  http.Stop();
  return 0;
}
