#include "backends/cpu/kernels.h"
#include "server/serve.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <unistd.h>

#include <CLI/CLI.hpp>

#include "backends/backend_flags.h"

#include "backends/cpu/cpu_backend.h"
#include "base/thread_pool.h"
#include "cli/parse_error.h"
#include "cli/progress.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "server/api.h"

namespace g4::server {
namespace {

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<std::string> SplitKeys(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!Trim(item).empty()) out.push_back(Trim(item));
  return out;
}

// "dir/model.gguf" -> "model.gguf"; "dir/checkpoint/" -> "checkpoint".
std::string BaseName(const std::string& path) {
  std::filesystem::path p(path);
  if (!p.has_filename()) p = p.parent_path();
  return p.filename().string();
}

// The first SIGINT/SIGTERM asks for an orderly shutdown (ServeMain's loop); a second one, while
// that runs, exits at once (as llama-server), with 128 + the signal's number.
std::atomic<int> g_signal{0};
void OnSignal(int sig) {
  if (g_signal.exchange(sig) != 0) {
    static const char kMsg[] = "gemma4rt: second signal, exiting now\n";
    [[maybe_unused]] const ssize_t w = write(STDERR_FILENO, kMsg, sizeof kMsg - 1);  // async-signal-safe
    _exit(128 + sig);
  }
}

}  // namespace

std::string DefaultServeModel() { return DefaultModelFile(); }

int DefaultHttpThreads(int parallel, int max_queue) {
  return static_cast<int>(std::clamp<int64_t>(int64_t{parallel} + max_queue + 16, 512, kMaxHttpThreads));
}

ParsedFlags ParseServeFlags(const std::vector<std::string>& args) {
  ServeOptions o;
  o.model = DefaultServeModel();
  std::string api_key, api_key_file;
  bool no_degeneracy = false;
  CLI::App app{"gemma4rt serve: OpenAI-compatible HTTP server (every flag also from GEMMA4RT_<FLAG>)", "gemma4rt serve"};
  app.add_option("-m,--model", o.model, "GGUF file or Hugging Face checkpoint directory")->envname("GEMMA4RT_MODEL");
  app.add_option("--host", o.host, "address to listen on")->envname("GEMMA4RT_HOST")->capture_default_str();
  app.add_option("--port", o.port, "port to listen on (0 = any free port)")->envname("GEMMA4RT_PORT")->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("-c,--ctx-size", o.ctx, "context size per slot in tokens (0 = the model's maximum, capped at 4096)")
      ->envname("GEMMA4RT_CTX_SIZE")->check(CLI::Range(0, 1 << 24));
  app.add_option("--parallel", o.parallel, "parallel slots (continuous batching); -np works too")
      ->envname("GEMMA4RT_PARALLEL")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("-t,--threads", o.threads, "CPU threads (0 = all cores)")->envname("GEMMA4RT_THREADS")->check(CLI::Range(0, 1024));
  app.add_option("--cache-type", o.cache_type, kCacheTypeHelp)->envname("GEMMA4RT_CACHE_TYPE")
      ->check(CLI::IsMember(kCacheTypeNames))->capture_default_str();
  CLI::Option* api_key_opt = app.add_option("--api-key", api_key,
                                            "API key clients must send as 'Authorization: Bearer KEY' or 'X-Api-Key: KEY' "
                                            "(comma-separated for several)")
                                 ->envname("GEMMA4RT_API_KEY");
  app.add_option("--api-key-file", api_key_file, "file with API keys, one per line (blank lines and lines starting with # are skipped)")->envname("GEMMA4RT_API_KEY_FILE");
  app.add_flag("--metrics", o.metrics, "serve Prometheus metrics at GET /metrics")->envname("GEMMA4RT_METRICS");
  app.add_option("--alias", o.alias, "model id in /v1/models and responses (default: the model's file name)")->envname("GEMMA4RT_ALIAS");
  app.add_option("--max-body-bytes", o.max_body_bytes, "largest request body accepted (larger: 413)")
      ->envname("GEMMA4RT_MAX_BODY_BYTES")->check(CLI::Range(size_t{1}, size_t{1} << 32))->capture_default_str();
  app.add_option("--max-queue", o.max_queue, "requests that may wait for a slot besides the -np running ones; more get 429")
      ->envname("GEMMA4RT_MAX_QUEUE")->check(CLI::Range(0, 1 << 20))->capture_default_str();
  app.add_option("--threads-http", o.threads_http,
                 "HTTP worker threads, one per open connection (0 = parallel + max queue + 16, at least 512, at most 8192)")
      ->envname("GEMMA4RT_THREADS_HTTP")->check(CLI::Range(0, kMaxHttpThreads))->capture_default_str();
  app.add_flag("--no-cors", o.no_cors, "no CORS headers: browsers then keep the answers from pages on other origins "
               "(default: any origin may call, as llama-server and vLLM)")->envname("GEMMA4RT_NO_CORS");
  app.add_flag("--no-degeneracy-check", no_degeneracy, "do not end generations that loop")->envname("GEMMA4RT_NO_DEGENERACY_CHECK");
  app.add_option("--quantize", o.quantize, "quantise an F32/F16/BF16 checkpoint at load: q8_0, q4_0 or w4a16")
      ->envname("GEMMA4RT_QUANTIZE")->check(CLI::IsMember({"q8_0", "q4_0", "w4a16"}));
  app.add_flag("--mmap,!--no-mmap", o.mmap, kMmapFlagHelp)->envname("GEMMA4RT_MMAP");
  app.add_flag("--no-repack", o.no_repack, kNoRepackFlagHelp)->envname("GEMMA4RT_NO_REPACK");
  app.add_option("--ple-bits", o.ple_bits, "with --quantize: bits of the embedding and PLE tables (8 = Q8_0, 16 = as stored)")
      ->envname("GEMMA4RT_PLE_BITS")->check(CLI::IsMember({8, 16}));
  app.add_flag("--f32-activations", o.f32_activations, "multiply quantised and BF16 weights with f32 activations (transformers' "
               "arithmetic; slower) instead of int8 or bf16 ones")->envname("GEMMA4RT_F32_ACTIVATIONS");
  app.add_flag("--cache-prompt,!--no-cache-prompt,--enable-prefix-caching,!--no-enable-prefix-caching", o.cache_prompt,
               "reuse the KV cache of a slot's last sequence where a prompt begins with it, skipping that prefill "
               "(default on; the output is the same)")
      ->envname("GEMMA4RT_CACHE_PROMPT");
  app.add_option("--prefill-chunk", o.prefill_chunk, "prompt tokens per prefill step")->envname("GEMMA4RT_PREFILL_CHUNK")->check(CLI::Range(1, 1 << 16));
  AddBackendFlags(&app, &o.backend, /*with_env=*/true);
  // llama-server's two-letter short flag; CLI11 only has one-letter short names.
  // Then llama.cpp's cache-type spellings (-ctk, -ctv, ...). Option values stay as given.
  std::vector<std::string> argv_s{"gemma4rt serve"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  auto rewritten = cli::RewriteLlamaSpellings(app, argv_s, "-np", "--parallel");
  if (!rewritten.ok()) {
    return ParsedFlags{std::nullopt, cli::FailUsage(rewritten.status())};
  }
  std::vector<char*> argv;
  for (std::string& a : *rewritten) argv.push_back(a.data());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    const int code = cli::ExitOnParseError(app, e);
    // A bad value from a GEMMA4RT_* variable reads like a bad flag ("--threads: Value abc not in
    // range 0 to 1024", "Could not convert: --mmap = maybe"): name the variable when the flag was
    // not on the command line.
    const std::string what = e.what();
    for (const CLI::Option* opt : app.get_options()) {
      const std::string& env = opt->get_envname();
      const char* value = env.empty() ? nullptr : std::getenv(env.c_str());
      if (value == nullptr || opt->get_lnames().empty()) continue;
      const std::string flag = "--" + opt->get_lnames()[0];
      // "--threads: ..." for values, "Could not convert: --no-repack = maybe" for flags.
      if (what.rfind(flag + ":", 0) != 0 && what.find(" " + flag + " = ") == std::string::npos) continue;
      bool on_command_line = false;
      for (const std::string& a : *rewritten) {
        for (const std::string& n : opt->get_lnames())
          if (a == "--" + n || a.rfind("--" + n + "=", 0) == 0) on_command_line = true;
        for (const std::string& n : opt->get_snames())
          if (a.rfind("-" + n, 0) == 0) on_command_line = true;
      }
      if (!on_command_line)
        std::fprintf(stderr, "gemma4rt serve: %s was read from the environment variable %s='%s'\n", flag.c_str(),
                     env.c_str(), value);
    }
    return ParsedFlags{std::nullopt, code};
  }
  o.degeneracy_check = !no_degeneracy;
  o.api_keys = SplitKeys(api_key, ',');
  // An empty key ("--api-key \"$UNSET\"", GEMMA4RT_API_KEY= ) would leave the server open to
  // every client while its user believes it guarded: an error, as an
  // --api-key-file without a key is. CLI11 skips an empty environment variable, so it is read here.
  const char* env_key = std::getenv("GEMMA4RT_API_KEY");
  if (o.api_keys.empty() && api_key_file.empty() && (api_key_opt->count() > 0 || (env_key != nullptr && Trim(env_key).empty()))) {
    std::fprintf(stderr, "gemma4rt serve: error: %s is empty: the server would answer every client; give a key, or "
                 "leave it out to run without one\n", api_key_opt->count() > 0 ? "--api-key" : "GEMMA4RT_API_KEY");
    return ParsedFlags{std::nullopt, cli::kUsageExit};
  }
  if (!api_key_file.empty()) {
    std::ifstream f(api_key_file);
    if (!f) {
      std::fprintf(stderr, "gemma4rt serve: error: cannot read --api-key-file '%s'\n", api_key_file.c_str());
      return ParsedFlags{std::nullopt, 1};
    }
    std::stringstream ss;
    ss << f.rdbuf();
    // Blank lines and comment lines (`#` first) are not keys: a commented key file made
    // "# comment" a key that opened the server. A key that starts with
    // `#` can still be given with --api-key.
    std::vector<std::string> keys = SplitKeys(ss.str(), '\n');
    std::erase_if(keys, [](const std::string& k) { return k[0] == '#'; });
    if (keys.empty()) {
      std::fprintf(stderr, "gemma4rt serve: error: --api-key-file '%s' holds no key\n", api_key_file.c_str());
      return ParsedFlags{std::nullopt, 1};
    }
    o.api_keys.insert(o.api_keys.end(), keys.begin(), keys.end());
  }
  o.threads = ResolveThreadCount(o.threads);
  return ParsedFlags{o, 0};
}

StatusOr<std::unique_ptr<ServeInstance>> ServeInstance::Start(const ServeOptions& options, std::function<void()> before_load) {
  if (!std::filesystem::exists(options.model))
    return NotFound("model '" + options.model + "' does not exist" +
                    (options.model == DefaultServeModel() ? " (run scripts/fetch-default-model.sh to get the default model)" : ""));
  if (options.parallel < 1) return InvalidArgument("--parallel must be >= 1");
  std::unique_ptr<ServeInstance> s(new ServeInstance());
  s->opt_ = options;
  const int threads = ResolveThreadCount(options.threads);
  s->opt_.threads = threads;
  s->opt_.backend.threads = threads;
  s->opt_.backend.f32_activations = options.f32_activations;
  G4_ASSIGN_OR_RETURN(s->backend_, MakeBackend(s->opt_.backend));
  std::fprintf(stderr, "gemma4rt: device policy: %s kv=%s threads=%d slots=%d\n",
               DevicePolicyFields(*s->backend_, s->opt_.backend).c_str(), options.cache_type.c_str(), threads,
               options.parallel);
  HttpOptions h;
  h.host = options.host;
  h.port = options.port;
  h.api_keys = options.api_keys;
  h.metrics = options.metrics;
  h.max_body_bytes = options.max_body_bytes;
  h.http_threads = options.threads_http > 0 ? options.threads_http : DefaultHttpThreads(options.parallel, options.max_queue);
  h.log_requests = options.log_requests;
  h.read_timeout_s = options.read_timeout_s;
  h.cors = !options.no_cors;
  s->http_ = std::make_unique<HttpServer>(h);
  G4_RETURN_IF_ERROR(s->http_->Start());
  // Listening starts before the model loads (as llama-server): /health answers 503 "loading"
  // until the "model loaded" line.
  std::fprintf(stderr, "gemma4rt: listening on http://%s:%d; loading the model (/health answers 503 until it is loaded)\n",
               options.host.c_str(), s->http_->port());
  ServeInstance* self = s.get();
  s->loader_ = std::thread([self, before_load] { self->Load(before_load); });
  return s;
}

void ServeInstance::Load(std::function<void()> before_load) {
  const auto t0 = std::chrono::steady_clock::now();
  // ready (success only): run under mu_ with the result, so that LoadResult() never reads
  // "loading" from a server that already serves (RunUntilSignal exits at once while loading).
  auto finish = [&](Status st, const std::function<void()>& ready = nullptr) {
    if (!st.ok()) std::fprintf(stderr, "gemma4rt: error: loading %s failed: %s\n", opt_.model.c_str(), st.ToString().c_str());
    std::lock_guard<std::mutex> lock(mu_);
    if (ready) ready();
    load_result_ = st;
    cv_.notify_all();
  };
  // The loader runs on its own thread, where main()'s catch of std::bad_alloc does not reach: an
  // allocation that fails here (the weights' copy, a KV cache of --parallel x --ctx-size that does
  // not fit, the scheduler's thread) is a load error like any other, not std::terminate's abort
  // (`ulimit -v 3000000; gemma4rt serve -np 64 -c 32768`).
  try {
    if (before_load) before_load();
    LoadOptions lo;
    lo.ple_bits = opt_.ple_bits;
    lo.mmap = opt_.mmap;
    lo.copy_progress = cli::TerminalCopyProgress("gemma4rt serve");
    lo.pack_q4_0 = PackQ4_0For(opt_.backend, opt_.no_repack);
    auto q = ParseQuantizeFlag(opt_.quantize);
    if (!q.ok()) return finish(q.status());
    lo.quantize = *q;
    auto loaded = LoadModel(opt_.model, lo);
    if (!loaded.ok()) return finish(loaded.status());
    std::unique_ptr<LoadedModel> model = std::move(loaded).value();
    PrefaultWeights(*model, nullptr);  // read the mmap'd weights now, not during the first request
    ModelInfo info;
    Status st = ModelGenerationDefaults(*model, &info.default_sampling, &info.default_stop_ids);
    if (!st.ok()) return finish(st);
    auto tok = LoadTokenizerFor(*model);
    if (tok.ok()) {
      tokenizer_ = std::move(tok).value();
    } else {
      std::fprintf(stderr, "gemma4rt: no tokenizer (%s): token-id prompts only\n", tok.status().ToString().c_str());
    }
    const ModelConfig& c = model->config;
    info.template_kind = c.family == ModelFamily::kGemma4 ? ChatTemplateKind::kGemma4 : ChatTemplateKind::kGemma3;
    info.vocab_size = c.ple_dim > 0 ? std::min(c.vocab, c.ple_vocab) : c.vocab;
    info.bos_id = tokenizer_ ? tokenizer_->bos_id() : c.bos_id;
    info.tokenizer = tokenizer_.get();
    const std::string base = BaseName(opt_.model);
    info.id = opt_.alias.empty() ? base : opt_.alias;
    info.accepted_ids = {info.id, base, opt_.model, std::filesystem::absolute(opt_.model).string()};
    if (const std::string stem = std::filesystem::path(base).stem().string(); stem != base) info.accepted_ids.push_back(stem);
    const std::string weights = WeightsDescription(*model);
    const char* memory = WeightsMemory(*model);
    const std::string arch = c.architecture;
    EngineOptions eo;
    eo.max_seqs = opt_.parallel;
    eo.max_context = opt_.ctx;
    auto kv_type = ParseCacheType(opt_.cache_type);
    if (!kv_type.ok()) return finish(kv_type.status());
    eo.kv_type = *kv_type;
    auto engine = Engine::Create(std::move(model), std::move(backend_), eo);
    if (!engine.ok()) return finish(engine.status());
    engine_ = std::move(engine).value();
    if (engine_->backend().CompilesPerShape()) {  // every step shape compiled before /health answers 200
      const auto w0 = std::chrono::steady_clock::now();
      auto steps = engine_->Warmup(opt_.prefill_chunk);
      if (!steps.ok()) return finish(steps.status());
      std::fprintf(stderr, "gemma4rt: warm-up: %d step shapes (prefill chunks up to %d tokens, decode of up to %d sequences) "
                   "compiled and run in %.1f s\n", *steps, opt_.prefill_chunk, opt_.parallel,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count());
      if (const std::string plan = MemoryPlanText(engine_->backend()); !plan.empty())
        std::fprintf(stderr, "gemma4rt: memory plan: %s\n", plan.c_str());
    }
    SchedulerOptions so;
    so.max_queue = opt_.max_queue;
    so.prefill_chunk = opt_.prefill_chunk;
    so.degeneracy.enabled = opt_.degeneracy_check;
    so.cache_prompt = opt_.cache_prompt;
    scheduler_ = std::make_unique<Scheduler>(*engine_, tokenizer_.get(), so);
    info.context_size = scheduler_->context_size();
    info.created = UnixNow();
    std::fprintf(stderr, "gemma4rt: model loaded: %s (%s) weights=%s memory=%s context=%d slots=%d tokenizer=%s in %.1f s; serving as '%s'\n",
                 opt_.model.c_str(), arch.c_str(), weights.c_str(), memory, info.context_size, opt_.parallel, tokenizer_ ? "yes" : "no",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), info.id.c_str());
    finish(OkStatus(), [&] { http_->SetReady(std::move(info), scheduler_.get()); });
  } catch (...) {  // std::bad_alloc, a thread that could not start (std::system_error), ...
    finish(StatusFromCurrentException("loading the model", "the model, its KV cache of --parallel x --ctx-size "
                                                           "tokens and working memory need more than this process may use"));
  }
}

Status ServeInstance::WaitLoaded() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return load_result_.has_value(); });
  return *load_result_;
}

std::optional<Status> ServeInstance::LoadResult() {
  std::lock_guard<std::mutex> lock(mu_);
  return load_result_;
}

void ServeInstance::Stop() {
  if (http_) http_->Stop();
  if (loader_.joinable()) loader_.join();
  scheduler_.reset();
  engine_.reset();
}

ServeInstance::~ServeInstance() { Stop(); }

int ServeMain(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  ParsedFlags flags = ParseServeFlags(args);
  if (!flags.options) return flags.exit_code;
#if defined(__GLIBC__)
  // glibc gives threads that allocate their own heap arenas (up to 8 per core), and each keeps what
  // it freed resident: the HTTP worker threads' request, JSON and response buffers then stay in
  // memory once per thread. Two arenas, unless MALLOC_ARENA_MAX says otherwise, keep the server's
  // peak RSS within its budget (weights + KV cache + 10%) under a mixed load of long prompts.
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, 2);
#endif
  auto inst = ServeInstance::Start(*flags.options);
  if (!inst.ok()) {
    std::fprintf(stderr, "gemma4rt: error: %s\n", inst.status().ToString().c_str());
    return 1;
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  return RunUntilSignal(**inst, g_signal, [] {
    std::fflush(stderr);
    _exit(0);
  });
}

int RunUntilSignal(ServeInstance& inst, const std::atomic<int>& signal, const std::function<void()>& exit_now) {
  for (;;) {
    if (const int sig = signal.load()) {
      if (!inst.LoadResult()) {
        // Still loading: nothing is served yet (requests get 503), and a copy or --quantize of a
        // large model takes up to a minute, which the signal would wait for. Exit now; an orderly
        // stop has nothing to end.
        std::fprintf(stderr, "gemma4rt: signal %d while the model loads: exiting\n", sig);
        exit_now();
        return 0;
      }
      std::fprintf(stderr, "gemma4rt: signal %d, shutting down\n", sig);
      break;
    }
    if (auto r = inst.LoadResult(); r && !r->ok()) {
      inst.Stop();
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  inst.Stop();
  return 0;
}

}  // namespace g4::server
