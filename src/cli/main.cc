// gemma4rt: one binary, subcommands. The CLI only parses flags and prints; the engine does the work.
//   gemma4rt info     [-m MODEL] [-c CTX]   (info, logits, generate, serve, bench also take
//                                            --quantize q8_0|q4_0|w4a16 and --ple-bits 8|16)
//   gemma4rt logits   [-m MODEL] (-p TEXT | --tokens 2,105,...) [--top K] [--json] [--chunk N]
//   gemma4rt generate [-m MODEL] (-p TEXT | --tokens ...) [--chat] [-n N] [sampling flags]
//   gemma4rt serve    [-m MODEL] [--host H] [--port P] [-np SLOTS] ...   (src/server/serve.h)
//   gemma4rt bench    [-m MODEL] [-t T] [-p 512] [-n 128] [--depth 0,1024] [--json]  (src/cli/bench.h)
// MODEL defaults to $GEMMA4RT_MODEL, else the default model fetched by
// scripts/fetch-default-model.sh (~/.cache/gemma4rt/gemma-3-270m-q4_k_m.gguf).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cerrno>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <numeric>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backends/cpu/kernels.h"
#include "backends/backend_flags.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/simd_cap.h"
#include "base/parse_int.h"
#include "base/thread_pool.h"
#include "model/gemma.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "cli/bench.h"
#include "cli/parse_error.h"
#include "cli/progress.h"
#include "server/serve.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

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
    const std::optional<long long> v = g4::ParseWholeInteger(item);
    if (!v || *v < 0 || *v > INT32_MAX)
      return g4::InvalidArgument("--tokens: '" + item + "' is not a token id (expected non-negative integers separated by commas)");
    ids.push_back(static_cast<int32_t>(*v));
  }
  if (ids.empty()) return g4::InvalidArgument("--tokens: no token ids given");
  return ids;
}

// -s/--seed: an integer in [0, 2^64) fixes the sampler's RNG; -1 (llama.cpp's "random seed") or no
// flag draws a fresh seed per run. Errors: InvalidArgument for anything else (other negative
// numbers, text, values past 2^64 - 1), with the server's wording.
g4::StatusOr<std::optional<uint64_t>> ParseSeedFlag(const std::string& text) {
  if (text.empty() || text == "-1") return std::optional<uint64_t>();
  auto bad = [&] {
    return g4::InvalidArgument("--seed: seed must be an integer in [0, 2^64), or -1 for a random seed; got " + text);
  };
  if (text.find_first_not_of("0123456789") != std::string::npos) return bad();
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (errno == ERANGE || *end != '\0') return bad();
  return std::optional<uint64_t>(v);
}

// Range-checks the sampling flags given on the command line without the model: each one alone in
// otherwise default SamplingParams, so the error names the flag ("--top-p: top_p must be in (0, 1], got 2").
Status ValidateSamplingFlags(std::optional<float> temp, std::optional<int> top_k, std::optional<float> top_p,
                             std::optional<float> min_p, std::optional<float> repeat_penalty, float presence, float frequency) {
  auto check = [](const char* flag, auto set) -> Status {
    g4::SamplingParams p;
    set(p);
    Status st = p.Validate();
    if (st.ok()) return st;
    return g4::InvalidArgument(std::string(flag) + ": " + st.message());
  };
  std::vector<Status> results;
  if (temp) results.push_back(check("--temp", [&](g4::SamplingParams& p) { p.temperature = *temp; }));
  if (top_k) results.push_back(check("--top-k", [&](g4::SamplingParams& p) { p.top_k = *top_k; }));
  if (top_p) results.push_back(check("--top-p", [&](g4::SamplingParams& p) { p.top_p = *top_p; }));
  if (min_p) results.push_back(check("--min-p", [&](g4::SamplingParams& p) { p.min_p = *min_p; }));
  if (repeat_penalty) results.push_back(check("--repeat-penalty", [&](g4::SamplingParams& p) { p.repetition_penalty = *repeat_penalty; }));
  results.push_back(check("--presence-penalty", [&](g4::SamplingParams& p) { p.presence_penalty = presence; }));
  results.push_back(check("--frequency-penalty", [&](g4::SamplingParams& p) { p.frequency_penalty = frequency; }));
  for (const Status& st : results)
    if (!st.ok()) return st;
  return g4::OkStatus();
}

struct Session {
  std::unique_ptr<g4::Engine> engine;
  std::unique_ptr<g4::Tokenizer> tokenizer;  // null when the checkpoint has none
  g4::Status tokenizer_status;
};

// The prompt text in `path` (generate/logits -f, as llama.cpp's): the file's bytes, less one
// trailing "\n" (what an editor leaves and llama.cpp drops; a CRLF file keeps its "\r", as in
// llama.cpp, so both tokenise the same text). Errors: NOT_FOUND when the file does not exist,
// INVALID_ARGUMENT when it cannot be read (a directory, no permission).
g4::StatusOr<std::string> ReadPromptFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return g4::NotFound("prompt file '" + path + "' does not exist");
  if (std::filesystem::is_directory(path, ec)) return g4::InvalidArgument("prompt file '" + path + "' is a directory");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) return g4::InvalidArgument("cannot read prompt file '" + path + "': " + std::strerror(errno));
  std::string s = text.str();
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// llama.cpp's escape processing of prompts and stop strings (-e/--escape, its default;
// string_process_escapes): \n, \r, \t, \', \", \\ and \xHH become the byte they name (HH: the
// next two characters as strtol reads them in base 16, both consumed, so also " 9" or "-1"); any
// other backslash, and one at the end, stays as written.
std::string ProcessEscapes(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '\\' || i + 1 == in.size()) {
      out.push_back(in[i]);
      continue;
    }
    const char c = in[++i];
    switch (c) {
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case '\'': case '"': case '\\': out.push_back(c); break;
      default:
        if (c == 'x' && i + 2 < in.size()) {  // strtol over the next two characters, as llama.cpp
          const char x[3] = {in[i + 1], in[i + 2], 0};
          char* end = nullptr;
          const long value = std::strtol(x, &end, 16);
          if (end == x + 2) {
            out.push_back(static_cast<char>(value));
            i += 2;
            break;
          }
        }
        out.push_back('\\');
        out.push_back(c);
    }
  }
  return out;
}

// generate's SIGINT: the first asks Generate to stop after the current token (GenerateRequest::
// interrupt); a second exits at once.
std::atomic<bool> g_interrupted{false};
void OnInterrupt(int) {
  if (g_interrupted.exchange(true)) {
    static const char kMsg[] = "\ngemma4rt: second interrupt, exiting now\n";
    [[maybe_unused]] const ssize_t w = write(STDERR_FILENO, kMsg, sizeof kMsg - 1);  // async-signal-safe
    _exit(130);
  }
}

g4::StatusOr<Session> Open(const std::string& model, int ctx, int chunk, const g4::BackendOptions& bo, const g4::LoadOptions& lo,
                           g4::DType kv_type) {
  if (!std::filesystem::exists(model))
    return g4::NotFound("model '" + model + "' does not exist" +
                        (model == g4::DefaultModelFile() ? " (run scripts/fetch-default-model.sh to get the default model)" : ""));
  G4_ASSIGN_OR_RETURN(auto loaded, g4::LoadModel(model, lo));
  G4_ASSIGN_OR_RETURN(const int context, g4::ResolveContextSize(loaded->config, ctx));
  G4_ASSIGN_OR_RETURN(std::unique_ptr<g4::Backend> backend, g4::MakeBackend(bo));
  std::fprintf(stderr, "gemma4rt: device policy: %s weights=%s memory=%s kv=%s threads=%d context=%d\n",
               g4::DevicePolicyFields(*backend, bo).c_str(), g4::WeightsDescription(*loaded).c_str(),
               g4::WeightsMemory(*loaded), g4::CacheTypeName(kv_type), bo.threads, context);
  // Large mapped weights (--mmap) are read once here; copied ones are in memory already (their
  // copy showed its own progress on a terminal). The progress shows once the read has taken half
  // a second: a file in the page cache is read in milliseconds, and would fill a log with lines.
  if (loaded->weights.total_bytes > (size_t{128} << 20) && !loaded->weights_copied) {
    int last = -1;
    const bool tty = isatty(STDERR_FILENO);
    const auto start = std::chrono::steady_clock::now();
    g4::PrefaultWeights(*loaded, [&](double f) {
      const int pct = static_cast<int>(f * 100);
      if (pct == last || (!tty && pct % 25 != 0)) return;  // a line every 25% when not a terminal
      if (last < 0 && std::chrono::steady_clock::now() - start < std::chrono::milliseconds(500)) return;
      last = pct;
      std::fprintf(stderr, "%sgemma4rt: loading weights %3d%% of %.1f MiB%s", tty ? "\r" : "", pct,
                   loaded->weights.total_bytes / 1048576.0, tty && pct < 100 ? "" : "\n");
    });
  }
  Session s;
  auto tok = g4::LoadTokenizerFor(*loaded);
  if (tok.ok()) s.tokenizer = std::move(tok).value();
  else s.tokenizer_status = tok.status();
  g4::EngineOptions o;
  o.max_context = context;
  o.prefill_chunk = chunk;
  o.kv_type = kv_type;
  G4_ASSIGN_OR_RETURN(s.engine, g4::Engine::Create(std::move(loaded), std::move(backend), o));
  return s;
}

// The prompt text (-p, -f) as token ids through the tokenizer (a chat template first with --chat).
// The template text already holds <bos>, so BOS is added only for plain prompts.
g4::StatusOr<std::vector<int32_t>> PromptIds(const Session& s, const std::string& prompt, bool chat, const std::string& system,
                                             bool think) {
  // -p "" is a prompt of BOS alone (as the server's "prompt": "" and llama.cpp).
  if (!s.tokenizer) return g4::Status(s.tokenizer_status.code(), "-p needs a tokenizer: " + s.tokenizer_status.message());
  if (!chat) return s.tokenizer->Encode(prompt, /*add_bos=*/true, /*parse_special=*/true);
  std::vector<g4::ChatMessage> messages;
  if (!system.empty()) messages.push_back({"system", system});
  messages.push_back({"user", prompt});
  g4::ChatTemplateOptions opts;
  opts.enable_thinking = think;
  const auto kind = s.engine->config().family == g4::ModelFamily::kGemma4 ? g4::ChatTemplateKind::kGemma4 : g4::ChatTemplateKind::kGemma3;
  // A flag that would be silently dropped is refused (--think on a Gemma 3 model).
  if (think && kind != g4::ChatTemplateKind::kGemma4)
    return g4::InvalidArgument("--think turns on Gemma 4's thinking mode; this model's chat template (Gemma 3) has none");
  G4_ASSIGN_OR_RETURN(std::string text, g4::RenderChatTemplate(kind, messages, opts));
  return s.tokenizer->Encode(text, /*add_bos=*/false, /*parse_special=*/true);
}

// What `gemma4rt` alone prints (and after an unknown subcommand): the subcommands, one line each.
std::string Usage(const CLI::App& app) {
  std::string out = "usage: gemma4rt SUBCOMMAND [FLAGS]\n\nsubcommands:\n";
  for (const CLI::App* sub : app.get_subcommands(std::function<bool(const CLI::App*)>())) {
    char line[256];
    std::snprintf(line, sizeof line, "  %-9s %s\n", sub->get_name().c_str(), sub->get_description().c_str());
    out += line;
  }
  return out + "\nRun 'gemma4rt SUBCOMMAND --help' for its flags.\n";
}

}  // namespace

namespace {
int Main(int argc, char** argv) {
  // A bad GEMMA4RT_SIMD_MAX stops every command that runs, not the usage or --help.
  const bool help_only = argc < 2 || std::any_of(argv + 1, argv + argc, [](const char* a) {
                           return std::strcmp(a, "-h") == 0 || std::strcmp(a, "--help") == 0;
                         });
  if (g4::Status cap = g4::cpu::SimdCapStatus(); !cap.ok() && !help_only) {
    std::fprintf(stderr, "gemma4rt: error: %s\n", cap.ToString().c_str());
    return 1;
  }
  // `serve` has its own flag set (llama-server's names, also from GEMMA4RT_* environment variables).
  if (argc >= 2 && std::string(argv[1]) == "serve") return g4::server::ServeMain(argc - 2, argv + 2);
  // `bench` takes llama-bench's flags (src/cli/bench.h).
  if (argc >= 2 && std::string(argv[1]) == "bench") return g4::cli::BenchMain(argc - 2, argv + 2);
  CLI::App app{"gemma4rt: Gemma 3 / Gemma 4 inference engine"};
  app.require_subcommand(1);
  app.footer("Also: gemma4rt serve [-m MODEL] [--host 127.0.0.1] [--port 8080] [-c CTX] [-np SLOTS] [-t THREADS] "
             "[--api-key KEY] [--metrics] [--alias NAME]  (gemma4rt serve --help)\n"
             "      gemma4rt bench [-m MODEL] [-t THREADS] [-p 512] [-n 128] [--depth 0,1024,4096] [--json]");
  std::string model = g4::DefaultModelPath(), prompt, tokens_text, system, prompt_file;
  int top = 5, chunk = 512, ctx = 0, n_predict = 128;
  int threads = 0;  // all cores
  bool json_out = false, chat = false, think = false, ignore_eos = false, show_ids = false, escape = true;
  std::optional<float> temp, top_p, min_p, repeat_penalty;
  std::optional<int> top_k;
  std::string seed_flag;  // ParseSeedFlag
  std::optional<uint64_t> seed;
  float presence = 0, frequency = 0;
  std::vector<std::string> stops;

  std::string quantize;
  std::string cache_type = g4::kDefaultCacheType;
  int ple_bits = 8;
  bool f32_activations = false;
  bool mmap = false;
  bool no_repack = false;
  g4::BackendOptions backend_options;
  auto add_model = [&](CLI::App* c, bool runs_model = true) {
    c->add_option("-m,--model", model, "GGUF file or Hugging Face checkpoint directory (default: $GEMMA4RT_MODEL or the fetched Gemma 3 270M)");
    c->add_option("--quantize", quantize, "quantise an F32/F16/BF16 checkpoint at load: q8_0, q4_0 or w4a16")
        ->check(CLI::IsMember({"q8_0", "q4_0", "w4a16"}));
    c->add_option("--ple-bits", ple_bits, "with --quantize: bits of the embedding and PLE tables (8 = Q8_0, 16 = as stored)")
        ->check(CLI::IsMember({8, 16}));
    if (runs_model) c->add_flag("--mmap,!--no-mmap", mmap, g4::kMmapFlagHelp);  // info always maps
    if (runs_model) c->add_flag("--no-repack", no_repack, g4::kNoRepackFlagHelp);
    g4::AddBackendFlags(c, &backend_options);
  };
  struct RunOptions {
    CLI::Option* prompt;
    CLI::Option* tokens;
    CLI::Option* file;
  };
  auto add_run = [&](CLI::App* c) {
    auto* p = c->add_option("-p,--prompt", prompt, "prompt text (\"\" = BOS alone)");
    auto* t = c->add_option("--tokens", tokens_text, "prompt as comma-separated token ids, e.g. 2,105,2364")->excludes(p);
    auto* f = c->add_option("-f,--file", prompt_file, "prompt text from a file (llama.cpp's -f: the whole file, less one trailing newline)")
                  ->excludes(p)
                  ->excludes(t);
    c->add_flag("-e,--escape,!--no-escape", escape,
                "process escapes (\\n, \\r, \\t, \\', \\\", \\\\, \\xHH) in the prompt (-p or -f) and --stop strings, as llama.cpp does by default; --no-escape: take them as written");
    c->add_option("--chunk", chunk, "prefill chunk size in tokens")->check(CLI::Range(1, 1 << 20));
    c->add_option("-c,--ctx-size", ctx, "context size in tokens (0 = model maximum, capped at 4096)")->check(CLI::Range(0, 1 << 24));
    c->add_option("-t,--threads", threads, "CPU threads (0 = all cores, the default)")->check(CLI::Range(0, 1024));
    c->add_option("--cache-type", cache_type, g4::kCacheTypeHelp)->check(CLI::IsMember(g4::kCacheTypeNames));
    c->add_flag("--f32-activations", f32_activations, "multiply quantised and BF16 weights with f32 activations (transformers' arithmetic; slower) instead of int8 or bf16 ones");
    return RunOptions{p, t, f};
  };

  auto* info = app.add_subcommand("info", "print the model's layer plan, parameter and memory counts");
  add_model(info, /*runs_model=*/false);
  info->add_option("-c,--ctx-size", ctx, "context size the KV cache figure is for (0 = model maximum, capped at 4096)")
      ->check(CLI::Range(0, 1 << 24));
  info->add_option("--cache-type", cache_type, "KV cache element type the figure is for: f16 (the default), bf16, f32 or q8")
      ->check(CLI::IsMember(g4::kCacheTypeNames));

  auto* logits = app.add_subcommand("logits", "print the top-K logits at every position");
  add_model(logits);
  const RunOptions logits_run = add_run(logits);
  logits->add_option("--top", top, "K for top-K per position")->check(CLI::Range(1, 1000000));
  logits->add_flag("--json", json_out, "print JSON: {\"tokens\": [...], \"positions\": [{\"ids\": [...], \"logits\": [...]}]}");

  auto* gen = app.add_subcommand("generate", "continue a prompt, streaming text to stdout");
  add_model(gen);
  const RunOptions gen_run = add_run(gen);
  auto* n_opt = gen->add_option("-n,--n-predict", n_predict,
                                "tokens to generate at most (default 128, fewer where the context ends first; an explicit -n must fit)")
                    ->check(CLI::Range(1, 1 << 20));
  auto* chat_flag = gen->add_flag("--chat", chat, "wrap the prompt in the model's chat template (one user turn)")->excludes(gen_run.tokens);
  gen->add_option("--system", system, "system message for --chat")->needs(chat_flag);
  gen->add_flag("--think", think, "Gemma 4 chat: enable thinking")->needs(chat_flag);
  gen->add_option("--temp", temp, "temperature (0 = greedy; default: the model's, Gemma 1.0)");
  gen->add_option("--top-k", top_k, "top-k (0 = off; default 64)");
  gen->add_option("--top-p", top_p, "top-p in (0, 1] (default 0.95)");
  gen->add_option("--min-p", min_p, "min-p in [0, 1]");
  gen->add_option("--repeat-penalty", repeat_penalty, "repetition penalty (1 = off)");
  gen->add_option("--presence-penalty", presence, "presence penalty in [-2, 2]");
  gen->add_option("--frequency-penalty", frequency, "frequency penalty in [-2, 2]");
  gen->add_option("-s,--seed", seed_flag, "sampling seed: same seed, same output; -1 (the default) = a random seed, printed at the end")
      ->type_name("INT");
  gen->add_option("--stop", stops, "stop string (repeatable; empty ones are ignored, as the server does)");
  gen->add_flag("--ignore-eos", ignore_eos, "do not stop at end-of-generation tokens");
  gen->add_flag("--show-ids", show_ids, "print the generated token ids after the text");
  // serve and bench are dispatched above with their own flag sets; listed here for --help only.
  app.add_subcommand("serve", "OpenAI-compatible HTTP server");
  app.add_subcommand("bench", "prefill/decode speed, memory and bandwidth, llama-bench style");

  // No subcommand, or a first argument that is neither a subcommand nor --help: the usage (CLI11
  // would only say that a subcommand is required), after what is wrong with the argument.
  if (argc < 2) {
    std::fputs(Usage(app).c_str(), stderr);
    return g4::cli::kUsageExit;
  }
  const std::string first = argv[1];
  if (first != "-h" && first != "--help" && first != "info" && first != "logits" && first != "generate") {
    std::fprintf(stderr, "gemma4rt: error: %s '%s'\n%s", first.rfind("-", 0) == 0 ? "unknown option" : "unknown subcommand",
                 first.c_str(), Usage(app).c_str());
    return g4::cli::kUsageExit;
  }
  // llama.cpp's -ctk/-ctv (and --cache-type-k/-v) as --cache-type; option values stay as given.
  auto rewritten = g4::cli::RewriteLlamaSpellings(app, std::vector<std::string>(argv, argv + argc));
  if (!rewritten.ok()) return g4::cli::FailUsage(rewritten.status());
  std::vector<char*> argv_storage;
  for (std::string& a : *rewritten) argv_storage.push_back(a.data());
  try {
    app.parse(static_cast<int>(argv_storage.size()), argv_storage.data());
  } catch (const CLI::ParseError& e) {
    return g4::cli::ExitOnParseError(app, e);
  }
  // Sampling flags are checked before the model loads (SamplingParams::Validate, one flag at a time).
  if (gen->parsed()) {
    if (Status st = ValidateSamplingFlags(temp, top_k, top_p, min_p, repeat_penalty, presence, frequency); !st.ok())
      return g4::cli::FailUsage(st);
    if (auto s = ParseSeedFlag(seed_flag); s.ok()) seed = *s;
    else return g4::cli::FailUsage(s.status());
  }
  g4::LoadOptions load_options;
  load_options.ple_bits = ple_bits;
  load_options.mmap = mmap || info->parsed();  // info runs nothing: no copy of the weights
  load_options.copy_progress = g4::cli::TerminalCopyProgress("gemma4rt");
  if (auto q = g4::ParseQuantizeFlag(quantize); q.ok()) load_options.quantize = *q;
  else return g4::cli::FailUsage(q.status());
  backend_options.f32_activations = f32_activations;
  load_options.pack_q4_0 = !info->parsed() && g4::PackQ4_0For(backend_options, no_repack);
  const auto kv_type = g4::ParseCacheType(cache_type);
  if (!kv_type.ok()) return g4::cli::FailUsage(kv_type.status());

  if (info->parsed()) {
    auto loaded = g4::LoadModel(model, load_options);
    if (!loaded.ok()) return Fail(loaded.status());
    const g4::ModelConfig& c = (*loaded)->config;
    const g4::ModelWeights& w = (*loaded)->weights;
    auto context = g4::ResolveContextSize(c, ctx);  // what generate, logits, serve and bench allocate
    if (!context.ok()) return Fail(context.status());
    // generate's fields, for generate's defaults (info takes no -t or --f32-activations, and always
    // maps the weights: memory=mapped) and the --cache-type given.
    auto backend = g4::MakeBackend(backend_options);  // --backend xla: the plugin and device the line names
    if (!backend.ok()) return Fail(backend.status());
    if (auto st = (*backend)->CheckKvCacheType(*kv_type); !st.ok()) return Fail(st);
    std::fprintf(stderr, "gemma4rt: device policy: %s weights=%s memory=%s kv=%s threads=%d context=%d\n",
                 g4::DevicePolicyFields(**backend, backend_options).c_str(), g4::WeightsDescription(**loaded).c_str(),
                 g4::WeightsMemory(**loaded), g4::CacheTypeName(*kv_type), g4::ResolveThreadCount(threads), *context);
    std::printf("model: %s (%s)\n", model.c_str(), c.architecture.c_str());
    std::printf("family: %s  hidden: %d  layers: %d  heads: %d  vocab: %d  window: %d  ple_dim: %d  experts: %d (top %d)\n",
                c.family == g4::ModelFamily::kGemma4 ? "gemma4" : "gemma3", c.hidden, c.num_layers, c.num_heads, c.vocab,
                c.sliding_window, c.ple_dim, c.num_experts, c.top_k_experts);
    std::printf("weights: %.3f MiB as stored (prefix '%s')\n", w.total_bytes / 1048576.0, w.prefix.c_str());
    if (!(*loaded)->quantization.empty()) {
      const g4::QuantizeStats& qs = (*loaded)->quantize_stats;
      std::printf("quantization: %s", (*loaded)->quantization.c_str());
      if (qs.tensors > 0)
        std::printf(" (%d tensors converted at load, %.3f -> %.3f MiB)", qs.tensors, qs.bytes_in / 1048576.0,
                    qs.bytes_out / 1048576.0);
      std::printf("\n");
    }
    std::printf("kv cache: %.3f MiB per sequence at %d tokens (%s), %d cache-owning layers\n",
                g4::KvCache::BytesPerSequence(c, *context, *kv_type) / 1048576.0, *context, cache_type.c_str(),
                c.NumCacheOwners());
    std::printf("%s", c.Describe().c_str());
    // --mesh: the per-device plan for the fewest sequences the mesh takes (its data axis).
    auto plan = g4::MeshPlanLines(**backend, g4::BuildGemmaGraph(c, w, g4::GraphOptions{}), c,
                                  g4::MeshDataAxis(backend_options), *context, *kv_type);
    if (!plan.ok()) return Fail(plan.status());
    for (const std::string& line : *plan) std::printf("mesh plan: %s\n", line.c_str());
    return 0;
  }

  const RunOptions& run = logits->parsed() ? logits_run : gen_run;
  // The prompt's flags are checked before anything loads.
  if (run.prompt->count() == 0 && run.tokens->count() == 0 && run.file->count() == 0)
    return g4::cli::FailUsage(g4::InvalidArgument("give a prompt with -p TEXT, -f FILE or --tokens ID,ID,..."));
  std::vector<int32_t> token_ids;  // --tokens
  if (run.tokens->count() > 0) {
    auto parsed = ParseTokens(tokens_text);
    if (!parsed.ok()) return g4::cli::FailUsage(parsed.status());
    token_ids = std::move(*parsed);
  }
  if (run.file->count() > 0) {
    auto text = ReadPromptFile(prompt_file);
    if (!text.ok()) return Fail(text.status());
    prompt = std::move(*text);
  }
  if (escape) {
    prompt = ProcessEscapes(prompt);
    for (std::string& stop : stops) stop = ProcessEscapes(stop);
  }
  threads = g4::ResolveThreadCount(threads);
  stops.erase(std::remove(stops.begin(), stops.end(), std::string()), stops.end());
  backend_options.threads = threads;
  auto session_or = Open(model, ctx, chunk, backend_options, load_options, *kv_type);
  if (!session_or.ok()) return Fail(session_or.status());
  Session& s = *session_or;
  g4::Engine& engine = *s.engine;
  auto ids = run.tokens->count() > 0 ? g4::StatusOr<std::vector<int32_t>>(std::move(token_ids))
                                     : PromptIds(s, prompt, chat, system, think);
  if (!ids.ok()) return Fail(ids.status());
  const int V = engine.config().vocab;

  if (logits->parsed()) {
    // A prompt longer than the context fails before the first position is printed (not after
    // the positions that fit).
    if (ids->size() > static_cast<size_t>(engine.options().max_context)) {
      return Fail(g4::ResourceExhausted("the prompt has " + std::to_string(ids->size()) + " tokens; the context size is " +
                                        std::to_string(engine.options().max_context) + " (-c to raise it)"));
    }
    // At most 64 positions at a time (--chunk if smaller), so that 64 x V logits are held, twice
    // (the step's output and `lg`): 128 MiB for Gemma's 262144-token vocabulary. The whole
    // prompt's would be prompt x V floats, twice: 2.6 GB for 1245 tokens. Logits are the same
    // bits however the prompt is cut (GreedyLlamaCppTest), so only the speed differs.
    const size_t slice = static_cast<size_t>(std::min(chunk, 64));
    std::vector<float> lg;
    const int k = std::min(top, V);
    nlohmann::json out;
    out["tokens"] = *ids;
    out["positions"] = nlohmann::json::array();
    std::vector<int> order(V);
    const std::span<const int32_t> all(*ids);
    for (size_t t = 0; t < ids->size(); ++t) {
      const size_t c0 = t / slice * slice;
      if (t == c0) {
        Status st = engine.Prefill(0, all.subspan(c0, std::min(slice, all.size() - c0)), /*all_logits=*/true, &lg);
        if (!st.ok()) return Fail(st);
      }
      const float* row = lg.data() + (t - c0) * V;
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

  // generate
  g4::GenerateRequest req;
  req.prompt = *ids;
  req.max_tokens = n_predict;
  // Without -n, generation stops where the context ends (llama-cli's default runs to the context's
  // end) instead of refusing a prompt that leaves fewer than 128 positions; a prompt that fills
  // the context is still refused (Generate), as is an explicit -n that does not fit.
  const int room = engine.options().max_context - static_cast<int>(ids->size());
  if (n_opt->count() == 0 && room >= 1) req.max_tokens = std::min(n_predict, room);
  Status st = g4::ModelGenerationDefaults(engine.model(), &req.sampling, &req.stop_ids);
  if (!st.ok()) return Fail(st);
  if (temp) req.sampling.temperature = *temp;
  if (top_k) req.sampling.top_k = *top_k;
  if (top_p) req.sampling.top_p = *top_p;
  if (min_p) req.sampling.min_p = *min_p;
  if (repeat_penalty) req.sampling.repetition_penalty = *repeat_penalty;
  req.sampling.presence_penalty = presence;
  req.sampling.frequency_penalty = frequency;
  req.sampling.seed = seed;
  req.stop = stops;
  req.ignore_eos = ignore_eos;
  g4::GenerateResult result;
  if (!s.tokenizer) show_ids = true;  // no tokenizer: ids are the only output
  // Ctrl-C (SIGINT) ends the generation after the current token (in the prompt's prefill: after
  // the current chunk), with the timings line and exit status 130, as llama-cli; a second one
  // exits at once. Not where SIGINT was ignored on entry (a script's background job, which a
  // Ctrl-C meant for the script must not stop); the previous disposition comes back afterwards.
  g_interrupted.store(false);
  req.interrupt = &g_interrupted;
  auto previous = std::signal(SIGINT, SIG_IGN);
  if (previous != SIG_IGN) std::signal(SIGINT, OnInterrupt);
  st = g4::Generate(engine, s.tokenizer.get(), 0, req, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  }, &result);
  std::signal(SIGINT, previous);
  if (!st.ok()) return Fail(st);
  std::printf("\n");
  if (show_ids) {
    std::printf("ids:");
    for (int32_t id : result.tokens) std::printf(" %d", id);
    std::printf("\n");
  }
  std::fflush(stdout);
  const int n = static_cast<int>(result.tokens.size());
  std::fprintf(stderr,
               "gemma4rt: finish_reason=%s prompt=%d tokens%s, prefill %.1f tokens/s, %s %.3f s; "
               "generated=%d tokens, decode %.1f tokens/s%s\n",
               result.finish_reason.c_str(), result.prompt_tokens,
               result.prefilled_tokens < result.prompt_tokens
                   ? (" (" + std::to_string(result.prefilled_tokens) + " prefilled)").c_str()
                   : "",
               result.prefilled_tokens / std::max(1e-9, result.prefill_seconds),
               result.tokens.empty() ? "prefill time" : "time to first token",
               result.prefill_seconds, n, n > 1 ? (n - 1) / std::max(1e-9, result.decode_seconds) : 0.0,
               // The seed that was used (drawn when -s was -1 or absent), so a sampled run can be repeated.
               req.sampling.temperature > 0 ? ("; seed=" + std::to_string(result.seed)).c_str() : "");
  return result.finish_reason == "interrupted" ? 130 : 0;
}
}  // namespace

// An allocation that fails on the main thread or in a ThreadPool loop (a model larger than the
// memory or an address-space limit such as `ulimit -v` allows), or a thread that cannot start,
// ends the command with an error message and exit code 1, not with std::terminate's abort.
int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (...) {
    const g4::Status st = g4::StatusFromCurrentException(
        "running the command", "the model, its KV cache (-c) and working memory need more than this process may use");
    std::fprintf(stderr, "gemma4rt: error: %s\n", st.ToString().c_str());
    return 1;
  }
}
