// `gemma4rt serve`: an OpenAI-compatible HTTP server over one model (llama-server's flags, see
// ../shared/spec/serving.md). The listener starts before the model loads, so /health answers 503
// while loading and 200 after.
//
//   gemma4rt serve [-m MODEL] [--host 127.0.0.1] [--port 8080] [-c CTX] [-np SLOTS] [-t THREADS]
//                  [--api-key KEY | --api-key-file F] [--metrics] [--alias NAME]
//                  [--max-body-bytes N] [--max-queue N] [--no-degeneracy-check]
// Every flag can also come from GEMMA4RT_<FLAG> (GEMMA4RT_PORT, GEMMA4RT_CTX_SIZE, GEMMA4RT_API_KEY,
// ...); the command line wins.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend_factory.h"
#include "base/status.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "server/http_server.h"
#include "tokenizer/tokenizer.h"

namespace g4::server {

struct ServeOptions {
  std::string model;                  // GGUF file or Hugging Face checkpoint directory
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: ephemeral
  int ctx = 0;                        // tokens per slot; 0 = the engine's default (model max, capped)
  int parallel = 4;                   // slots (concurrent sequences)
  int threads = 0;                    // CPU threads; 0 = all cores
  std::string cache_type = kDefaultCacheType;  // KV cache elements: "f16", "bf16" or "f32" (--cache-type)
  std::vector<std::string> api_keys;  // --api-key (comma-separated) and --api-key-file (one per line)
  bool metrics = false;
  std::string alias;                  // model id in /v1/models; default: the file/dir name
  size_t max_body_bytes = 8u << 20;
  int max_queue = 64;
  // --threads-http: HTTP worker threads; each open connection holds one while it is read and
  // answered (a streaming reply for its whole length; a client that stalls mid-request until the
  // 30 s read timeout). 0: DefaultHttpThreads(parallel, max_queue).
  int threads_http = 0;
  bool no_cors = false;               // --no-cors: HttpOptions::cors off
  bool degeneracy_check = true;
  int prefill_chunk = 256;            // tokens per prefill step of the scheduler
  bool cache_prompt = true;           // --cache-prompt / --no-cache-prompt: SchedulerOptions::cache_prompt
  bool log_requests = true;
  int read_timeout_s = 30;            // HttpOptions::read_timeout_s (no flag)
  std::string quantize;               // --quantize q8_0|q4_0|w4a16 ("" = as stored); see LoadOptions
  int ple_bits = 8;                   // --ple-bits 8|16
  bool mmap = false;                  // --mmap: weights used from the file mapping (LoadOptions::mmap)
  bool f32_activations = false;       // --f32-activations (CpuBackendOptionsFor: no int8 or bf16 activations)
  bool no_repack = false;             // --no-repack: Q4_0 weights stay as stored (LoadOptions::pack_q4_0)
  // --backend cpu|xla and --pjrt-plugin (backend_flags.h); threads and f32_activations are taken
  // from the fields above when the backend is made.
  BackendOptions backend;
};

// The HTTP worker threads `serve` starts when --threads-http is 0: parallel + max_queue + 16,
// at least 512 and at most kMaxHttpThreads, so that every request the scheduler may hold (running or queued) has a thread plus room
// for /health, /metrics and a few hundred idle or stalled connections (stalled clients each hold a
// thread). Threads that wait cost no CPU and little memory (their stacks are touched only as deep
// as they run).
int DefaultHttpThreads(int parallel, int max_queue);
// The most HTTP worker threads serve starts (--threads-http's range, DefaultHttpThreads' cap): a
// thread pool of a million (max_queue's range allows one) would fail to start.
inline constexpr int kMaxHttpThreads = 8192;

// The default model path: $GEMMA4RT_DEFAULT_MODEL, else $GEMMA4RT_CACHE (or ~/.cache/gemma4rt)
// /gemma-3-270m-q4_k_m.gguf ($GEMMA4RT_MODEL is read as the -m flag's environment variable).
std::string DefaultServeModel();

// Parses the arguments after "serve" (flags, then GEMMA4RT_* environment variables).
// Returns the options, or an exit code (0 after --help, 2 = cli::kUsageExit after a usage error, 1
// after an API key file that cannot be read or holds no key; the error printed to stderr).
struct ParsedFlags {
  std::optional<ServeOptions> options;
  int exit_code = 0;
};
ParsedFlags ParseServeFlags(const std::vector<std::string>& args);

// One running server: the HTTP listener, then (in the background) the model, engine and scheduler.
class ServeInstance {
 public:
  // Logs the device policy, binds and logs "listening on http://host:port", then loads the model
  // on a background thread. before_load (tests) runs on that thread first.
  // Errors: NotFound (no such model), InvalidArgument (options), FailedPrecondition (bind failed).
  static StatusOr<std::unique_ptr<ServeInstance>> Start(const ServeOptions& options,
                                                        std::function<void()> before_load = nullptr);
  ~ServeInstance();  // Stop()

  int port() const { return http_->port(); }
  // Blocks until the model is loaded (OK) or failed to load (the error).
  Status WaitLoaded();
  // Non-blocking: nullopt while loading.
  std::optional<Status> LoadResult();
  // The scheduler once loaded, else null (tests read its Stats()).
  Scheduler* scheduler() { return scheduler_.get(); }
  // Stops the listener (cancelling in-flight requests), then the scheduler. Idempotent.
  void Stop();

 private:
  ServeInstance() = default;
  void Load(std::function<void()> before_load);

  ServeOptions opt_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Scheduler> scheduler_;
  std::thread loader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Status> load_result_;
};

// ServeMain's loop over a started instance, polled every 100 ms: returns 1 once the load has
// failed; once `signal` is nonzero (SIGINT/SIGTERM, the signal's number), stops the instance and
// returns 0, or, while the model is still loading (a load cannot be interrupted; nothing is served
// yet), calls exit_now(), which `serve` makes _exit(0), and returns 0 if it returns (tests).
int RunUntilSignal(ServeInstance& inst, const std::atomic<int>& signal, const std::function<void()>& exit_now);

// The `serve` subcommand: argv holds the arguments after "serve" (argv[0] is the first of them, not
// a program name). Runs until SIGINT/SIGTERM; returns the process exit code.
int ServeMain(int argc, char** argv);

}  // namespace g4::server
