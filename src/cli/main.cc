// gemma4rt: one binary, subcommands. The CLI only parses flags and prints; the engine does the work.
//   gemma4rt info     -m MODEL
//   gemma4rt logits   -m MODEL --tokens 2,105,... [--top K] [--json] [--chunk N]
//   gemma4rt generate -m MODEL --tokens 2,105,... [-n N]          (greedy)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backends/cpu/cpu_backend.h"
#include "model/model.h"
#include "runtime/engine.h"

namespace {

using g4::Status;

int Fail(const Status& s) {
  std::fprintf(stderr, "gemma4rt: error: %s\n", s.ToString().c_str());
  return 1;
}

// Parses "2,105,2364" into ids. Errors name the bad element.
g4::StatusOr<std::vector<int32_t>> ParseTokens(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t pos = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &pos);
    } catch (...) {
      pos = 0;
    }
    if (item.empty() || pos != item.size() || v < 0 || v > INT32_MAX)
      return g4::InvalidArgument("--tokens: '" + item + "' is not a token id (expected non-negative integers separated by commas)");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return g4::InvalidArgument("--tokens: no token ids given");
  return ids;
}

void LogPolicy(const g4::Engine& e, int threads) {
  std::fprintf(stderr, "gemma4rt: device policy: backend=%s simd=scalar compute=f32 weights=%s threads=%d context=%d\n",
               e.backend().Name().c_str(), std::string(g4::DTypeName(e.model().weights.embed->dtype)).c_str(), threads,
               e.options().max_context);
}

g4::StatusOr<std::unique_ptr<g4::Engine>> Open(const std::string& model, int ctx, int chunk, int threads) {
  G4_ASSIGN_OR_RETURN(auto loaded, g4::LoadModel(model));
  g4::EngineOptions o;
  o.max_context = ctx;
  o.prefill_chunk = chunk;
  G4_ASSIGN_OR_RETURN(auto engine, g4::Engine::Create(std::move(loaded), g4::MakeCpuBackend(threads), o));
  LogPolicy(*engine, threads);
  return engine;
}

Status NeedTokens(const std::string& prompt) {
  if (!prompt.empty())
    return g4::Unimplemented("-p/--prompt needs a tokenizer, which this build does not have yet; pass --tokens ID,ID,...");
  return g4::InvalidArgument("give the input as --tokens ID,ID,...");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gemma4rt: Gemma 3 / Gemma 4 inference engine"};
  app.require_subcommand(1);
  std::string model, prompt, tokens_text;
  int top = 5, chunk = 512, ctx = 0, n_predict = 32;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool json_out = false;

  auto* info = app.add_subcommand("info", "print the model's layer plan, parameter and memory counts");
  info->add_option("-m,--model", model, "Hugging Face checkpoint directory")->required();

  auto* logits = app.add_subcommand("logits", "print the top-K logits at every position");
  logits->add_option("-m,--model", model, "Hugging Face checkpoint directory")->required();
  logits->add_option("-p,--prompt", prompt, "prompt text");
  logits->add_option("--tokens", tokens_text, "comma-separated token ids, e.g. 2,105,2364");
  logits->add_option("--top", top, "K for top-K per position")->check(CLI::Range(1, 1000000));
  logits->add_option("--chunk", chunk, "prefill chunk size in tokens")->check(CLI::Range(1, 1 << 20));
  logits->add_option("-c,--ctx-size", ctx, "context size in tokens (0 = model maximum, capped at 8192)")->check(CLI::NonNegativeNumber);
  logits->add_option("-t,--threads", threads, "CPU threads (default: all cores)")->check(CLI::Range(1, 1024));
  logits->add_flag("--json", json_out, "print JSON: {\"tokens\": [...], \"positions\": [{\"ids\": [...], \"logits\": [...]}]}");

  auto* gen = app.add_subcommand("generate", "greedy continuation of a prompt");
  gen->add_option("-m,--model", model, "Hugging Face checkpoint directory")->required();
  gen->add_option("-p,--prompt", prompt, "prompt text");
  gen->add_option("--tokens", tokens_text, "comma-separated prompt token ids");
  gen->add_option("-n,--n-predict", n_predict, "tokens to generate")->check(CLI::Range(1, 1 << 20));
  gen->add_option("--chunk", chunk, "prefill chunk size in tokens")->check(CLI::Range(1, 1 << 20));
  gen->add_option("-c,--ctx-size", ctx, "context size in tokens")->check(CLI::NonNegativeNumber);
  gen->add_option("-t,--threads", threads, "CPU threads (default: all cores)")->check(CLI::Range(1, 1024));

  CLI11_PARSE(app, argc, argv);

  if (info->parsed()) {
    auto loaded = g4::LoadModel(model);
    if (!loaded.ok()) return Fail(loaded.status());
    const g4::ModelConfig& c = (*loaded)->config;
    const g4::ModelWeights& w = (*loaded)->weights;
    std::fprintf(stderr, "gemma4rt: device policy: backend=cpu simd=scalar compute=f32 weights=%s threads=1\n",
                 std::string(g4::DTypeName(w.embed->dtype)).c_str());
    std::printf("model: %s (%s)\n", model.c_str(), c.architecture.c_str());
    std::printf("family: %s  hidden: %d  layers: %d  heads: %d  vocab: %d  window: %d  ple_dim: %d  experts: %d (top %d)\n",
                c.family == g4::ModelFamily::kGemma4 ? "gemma4" : "gemma3", c.hidden, c.num_layers, c.num_heads, c.vocab,
                c.sliding_window, c.ple_dim, c.num_experts, c.top_k_experts);
    std::printf("weights: %.3f MiB as stored (prefix '%s')\n", w.total_bytes / 1048576.0, w.prefix.c_str());
    const int context = std::min(c.max_position, 8192);
    std::printf("kv cache: %.3f MiB per sequence at %d tokens (f32), %d cache-owning layers\n",
                g4::KvCache::BytesPerSequence(c, context) / 1048576.0, context, c.NumCacheOwners());
    std::printf("%s", c.Describe().c_str());
    return 0;
  }

  if (tokens_text.empty()) return Fail(NeedTokens(prompt));
  auto ids = ParseTokens(tokens_text);
  if (!ids.ok()) return Fail(ids.status());
  auto engine_or = Open(model, ctx, chunk, threads);
  if (!engine_or.ok()) return Fail(engine_or.status());
  g4::Engine& engine = **engine_or;
  const int V = engine.config().vocab;

  if (logits->parsed()) {
    std::vector<float> lg;
    Status s = engine.Prefill(0, *ids, /*all_logits=*/true, &lg);
    if (!s.ok()) return Fail(s);
    const int k = std::min(top, V);
    nlohmann::json out;
    out["tokens"] = *ids;
    out["positions"] = nlohmann::json::array();
    std::vector<int> order(V);
    for (size_t t = 0; t < ids->size(); ++t) {
      const float* row = lg.data() + t * V;
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int a, int b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
      if (json_out) {
        nlohmann::json pos;
        pos["ids"] = std::vector<int>(order.begin(), order.begin() + k);
        std::vector<float> vals;
        for (int i = 0; i < k; ++i) vals.push_back(row[order[i]]);
        pos["logits"] = vals;
        out["positions"].push_back(pos);
      } else {
        std::printf("%zu\ttoken %d\t", t, (*ids)[t]);
        for (int i = 0; i < k; ++i) std::printf(" %d:%.6f", order[i], row[order[i]]);
        std::printf("\n");
      }
    }
    if (json_out) std::printf("%s\n", out.dump().c_str());
    return 0;
  }

  // generate: greedy.
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  std::vector<float> lg;
  Status s = engine.Prefill(0, *ids, false, &lg);
  if (!s.ok()) return Fail(s);
  const auto t1 = Clock::now();
  int generated = 0;
  for (; generated < n_predict; ++generated) {
    const int next = static_cast<int>(std::max_element(lg.begin(), lg.end()) - lg.begin());
    std::printf("%d%s", next, generated + 1 < n_predict ? "," : "");
    std::fflush(stdout);
    const auto& stops = engine.config().stop_ids;
    if (std::find(stops.begin(), stops.end(), next) != stops.end()) {
      ++generated;
      break;
    }
    if (generated + 1 == n_predict) { ++generated; break; }
    const int32_t tok = next, seq = 0;
    s = engine.Decode(std::span<const int32_t>(&seq, 1), std::span<const int32_t>(&tok, 1), &lg);
    if (!s.ok()) return Fail(s);
  }
  const auto t2 = Clock::now();
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  std::printf("\n");
  std::fprintf(stderr, "gemma4rt: prefill %zu tokens in %.3f s (%.1f tokens/s), time to first token %.3f s; decode %d tokens in %.3f s (%.1f tokens/s)\n",
               ids->size(), prefill_s, ids->size() / prefill_s, prefill_s, generated, decode_s,
               generated > 1 ? (generated - 1) / decode_s : 0.0);
  return 0;
}
