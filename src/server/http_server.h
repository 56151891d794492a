// The HTTP front of `gemma4rt serve` (cpp-httplib): routes, API keys, body limits, SSE streaming,
// OpenAI-shaped errors. Requests become Scheduler::Submit calls; the scheduler thread pushes each
// request's events into a per-request queue that the HTTP worker thread drains.
//
// Routes: POST /v1/chat/completions, POST /v1/completions (stream or not), GET /v1/models,
// GET /health (200 {"status":"ok"}, 503 while loading), GET /metrics (with `metrics` only),
// POST /tokenize, POST /detokenize, POST /apply-template. Unknown routes: 404 JSON. A known route
// asked with another method (GET /v1/completions, POST /v1/models): 405 JSON with an Allow header.
// Every route but /health needs `Authorization: Bearer KEY` (scheme in any case) or `X-Api-Key: KEY`
// when api_keys is not empty (401; PresentedApiKeys in api.h; a request's body is read and dropped
// before its 401, so a keep-alive connection stays usable). httplib URL-decodes header values, so
// keys are compared decoded alike: `%41` in a key also matches `A`. With `cors` (the default) any
// origin may call: OPTIONS on any path is a 204 preflight, before the key check.
// Bodies over max_body_bytes (by Content-Length, or counted as they arrive: chunked, inflated):
// 413; a Content-Length that is not a byte count: 400. An answer given without reading the
// whole body (that 400, a chunked body over the limit, a GET or OPTIONS with a body) says
// `Connection: close` and closes the connection. Queue full: 429. Internal errors: 500. All errors are
// {"error": {"message", "type", "param", "code"}}; no input can take the server down.
// A streaming client that goes away has its request cancelled at the next write, which frees the
// slot at the scheduler's next step.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/scheduler.h"
#include "server/api.h"

namespace g4::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                      // 0: an ephemeral port (see HttpServer::port())
  std::vector<std::string> api_keys;    // empty: no authentication
  bool metrics = false;                 // serve GET /metrics
  size_t max_body_bytes = 8u << 20;     // larger request bodies get 413
  int http_threads = 0;                 // worker threads, one per open connection; 0 = 64 (serve: DefaultHttpThreads)
  bool log_requests = true;             // one stderr line per completion request and per 4xx answer
  // A client that sends nothing for this long in the middle of a request is answered 408 and its
  // connection closed (a request's head is also bounded: HeadLimits in http_conn.h, 431).
  int read_timeout_s = 30;
  // CORS: every response says Access-Control-Allow-Origin: * and a preflight OPTIONS (any path)
  // is 204 before the API-key check, as llama-server and vLLM answer. false: no CORS headers,
  // OPTIONS is 404, and browsers keep pages on other origins from reading the answers.
  bool cors = true;
};

class HttpServer {
 public:
  explicit HttpServer(HttpOptions options);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port and serves from a background thread. Until SetReady every model route answers
  // 503 and /health answers 503 {"status":"loading"}. Ignores SIGPIPE (process-wide): a client
  // that disconnects must not kill the server. Errors: FailedPrecondition if the address cannot be
  // bound.
  Status Start();
  int port() const;

  // Makes the model available. `scheduler` must stay alive until Stop() returns.
  void SetReady(ModelInfo info, Scheduler* scheduler);

  // From its start /health answers 503 {"status":"stopping"} (a load balancer stops sending).
  // Cancels every in-flight request and gives them up to 3 s to send their final event (a stream
  // ends with an error event and [DONE]), then stops accepting connections and joins the server
  // thread. Idempotent.
  void Stop();

  struct Impl;  // public only so the .cc's helpers can name it

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace g4::server
