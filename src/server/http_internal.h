// Internal to the HTTP server's files (http_server.cc, http_routes.cc, http_framing.cc): the server's
// state (HttpServer::Impl) and the helpers for HTTP framing and connections. Not part of http_server.h.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <sys/socket.h>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server/http_conn.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "tokenizer/utf8.h"

namespace g4::server::http_internal {

using json = nlohmann::json;

// JSON text (bytes that are not UTF-8 replaced), an OpenAI-shaped error response (a 401 with
// WWW-Authenticate: Bearer), a 200 JSON response.
std::string Dump(const json& j);
void SetError(httplib::Response& res, const ApiError& e);
void SetJson(httplib::Response& res, const json& j);

// Constant-time comparison, so a key cannot be guessed byte by byte from response times.
bool SameKey(const std::string& a, const std::string& b);

// The configured API keys as httplib hands a request's header values to us: cpp-httplib 0.11
// URL-decodes every header value as it parses it (detail::parse_header calls decode_url), so a
// client sending the key `sk-a%41b` is seen presenting `sk-aAb`. Comparing against the keys
// decoded the same way accepts a client that sends exactly the configured key. The consequence:
// every spelling that decodes alike is accepted too (`sk-aAb` for `sk-a%41b`, `%61` for `a`); the
// secret is then the decoded string, no weaker than a key configured in that form.
std::vector<std::string> DecodedKeys(const std::vector<std::string>& keys);

// Whether the request's body comes chunked (Transfer-Encoding: chunked, any case).
bool IsChunked(const httplib::Request& req);

// The error for a request whose body httplib 0.11 would frame wrongly, or nullopt:
//  - A header field name that is not a token (`Transfer-Encoding : chunked`, an obs-fold line
//    ` Content-Length: 5`): httplib keeps the name with its spaces, so such a header is ignored
//    and the body's bytes parsed as the next request. 400 (RFC 9112 5.1 and 5.2: a server MUST
//    reject whitespace between a field name and its colon).
//  - Content-Length fields with different values: httplib takes the first. 400 (RFC 9112 6.3).
//  - A Transfer-Encoding other than exactly one `chunked` field: httplib 0.11 decodes only a first
//    field `chunked` (it would read any other body as having none, and parse the body's bytes as
//    the connection's next request). Where `chunked` is not the final coding, or is applied more
//    than once ("gzip", "identity", "chunked, chunked", a `chunked` field then a `gzip` one), the
//    body's length cannot be known: 400 (RFC 9112 6.3). Where it
//    is final after other codings ("gzip, chunked"): 501 (RFC 9112 6.1: a transfer coding the
//    server does not implement).
// Answered without reading the body, and the connection closed (MarkClose by the callers).
std::optional<ApiError> UnusableFraming(const httplib::Request& req);

// Whether a Content-Length value is a decimal byte count below 10^19 (what httplib 0.11's
// strtoull reads faithfully: `-5` would become 2^64 - 5).
bool IsByteCount(const std::string& cl);

// A request's body that httplib 0.11 never reads: it reads bodies only for POST, PUT, PATCH,
// DELETE and PRI (detail::expect_content), so the body of a GET, HEAD or OPTIONS (or any other
// method) with a Content-Length or any Transfer-Encoding would be parsed as the connection's next
// request.
bool UnreadBodyOfOtherMethod(const httplib::Request& req);

// A response header that asks the post-routing handler to close the connection after the response
// (a request's body was not read in full, so what follows it on the connection is not a request).
// Never sent: the post-routing handler removes it.
inline constexpr const char* kCloseMarker = "X-Gemma4rt-Close-Connection";
void MarkClose(httplib::Response& res);

// Numeric address and port of a socket address (IPv4, IPv6, IPv4-mapped IPv6 as dotted IPv4).
bool AddrPort(const sockaddr_storage& a, std::string* addr, int* port);

// The file descriptor of the TCP connection `req` arrived on, or -1, found by its two endpoints
// (httplib keeps the connection open until the handler returns, so the match stays valid while
// the handler waits).
int ConnectionSocket(const httplib::Request& req);

// Ends every connection that the server listening on addr:port accepted (connected sockets of
// this process whose local address is addr:port, or any local address where addr is a wildcard;
// a client of the server in this process has an ephemeral local port) with shutdown(): a worker
// waiting for the rest of a request (up to the 30 s read timeout) or for a keep-alive
// connection's next one (5 s) sees end of file at once. The worker still closes the descriptor.
// A socket closed and its number reused by another thread between the listing and shutdown()
// could be hit instead: `serve` opens no other sockets while it stops.
void ShutDownConnections(const std::string& addr, int port);

// True when the peer of connected socket `fd` has closed or reset the connection (a request's
// client gave up). Data waiting to be read (a pipelined request) is not a close.
bool PeerClosed(int fd);

// Makes httplib close the connection once `res` is sent, and says so (Connection: close).
// cpp-httplib 0.11 keeps a connection open unless the *request* said `Connection: close` (read
// before routing) or writing the response failed: a response's own `Connection: close` header is
// sent but not acted on (Server::process_request / process_server_socket_core). So the body moves
// into a content provider that writes it, drains what the client still sends (LingeringDrain) and
// then reports failure, which ends httplib's keep-alive loop; the client has the whole response
// (its Content-Length is already set). A response with its own provider (a stream) is written by
// it and then ended the same way. For the post-routing handler (it runs after httplib has set the
// length headers). A HEAD response writes no body, so the provider never runs: the logger closes
// those (Routes).
void CloseAfterResponse(const httplib::Request& req, httplib::Response& res);

}  // namespace g4::server::http_internal

namespace g4::server {

using namespace http_internal;

struct HttpServer::Impl {
  HttpOptions opt;
  GuardedServer svr;
  std::thread thread;
  int port = -1;
  std::string bound_addr;  // the listening socket's address as AddrPort writes it ("" if unknown)
  std::atomic<int> listen_fd{-1};  // the listening socket (httplib's set_socket_options sees it made)
  bool started = false, stopped = false;
  std::mutex stop_mu;
  std::atomic<bool> stopping{false};

  std::atomic<bool> ready{false};
  ModelInfo info;  // immutable once ready
  Scheduler* scheduler = nullptr;
  HttpCounters counters;

  std::mutex inflight_mu;
  std::map<uint64_t, std::weak_ptr<RequestHandle>> inflight;
  uint64_t next_inflight = 0;

  uint64_t Track(const std::shared_ptr<RequestHandle>& h) {
    std::lock_guard<std::mutex> lock(inflight_mu);
    inflight[++next_inflight] = h;
    return next_inflight;
  }
  void Untrack(uint64_t id) {
    std::lock_guard<std::mutex> lock(inflight_mu);
    inflight.erase(id);
  }
  void CancelAll() {
    std::lock_guard<std::mutex> lock(inflight_mu);
    for (auto& [id, w] : inflight)
      if (auto h = w.lock()) h->Cancel();
  }

  void LogCompletion(const std::string& path, const ResponseMeta& meta, const CompletionEvent& e) {
    if (!opt.log_requests) return;
    std::fprintf(stderr,
                 "gemma4rt: POST %s %s prompt=%d completion=%d finish=%s queue=%.1fms prompt=%.1fms predicted=%.1fms%s%s%s\n",
                 path.c_str(), meta.id.c_str(), e.prompt_tokens, e.completion_tokens,
                 e.error.ok() ? e.finish_reason.c_str() : "error", e.queue_ms,
                 e.prompt_ms, e.predicted_ms, e.degenerate.empty() ? "" : " degenerate=\"",
                 e.degenerate.c_str(), e.degenerate.empty() ? "" : "\"");
    if (!e.error.ok()) std::fprintf(stderr, "gemma4rt: %s failed: %s\n", meta.id.c_str(), e.error.ToString().c_str());
  }

  std::vector<std::string> api_keys;  // opt.api_keys as httplib decodes header values (DecodedKeys)

  // nullopt when `req` may proceed: no keys are set, the path is /health, or it presents one of
  // the keys (compared in constant time); else the 401 to answer.
  std::optional<ApiError> Authorize(const httplib::Request& req) const {
    if (api_keys.empty() || req.path == "/health" || req.path == "/v1/health") return std::nullopt;
    const std::string auth = req.get_header_value("Authorization"), x_api_key = req.get_header_value("X-Api-Key");
    bool ok = false;
    for (const std::string& key : PresentedApiKeys(auth, x_api_key))
      for (const std::string& k : api_keys) ok |= SameKey(key, k);
    if (ok) return std::nullopt;
    return ErrorForStatus(401, auth.empty() && x_api_key.empty()
                                   ? "missing API key: send Authorization: Bearer <key> (or X-Api-Key: <key>)"
                                   : "invalid API key (send Authorization: Bearer <key> or X-Api-Key: <key>)");
  }

  // One stderr line for a request answered 4xx: method, path, status and the error's code (its
  // type where it has none); never the body. Control bytes in the path are shown as '?'.
  void LogRefusal(const httplib::Request& req, const httplib::Response& res) const {
    auto printable = [](const std::string& s) {
      std::string out = s.substr(0, 256);
      for (char& c : out)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
      return out.empty() ? std::string("-") : utf8::Sanitize(out);
    };
    std::string code = "-";
    const json body = json::parse(res.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_object() && body.contains("error") && body["error"].is_object()) {
      const json& e = body["error"];
      if (e.contains("code") && e["code"].is_string()) code = e["code"].get<std::string>();
      else if (e.contains("type") && e["type"].is_string()) code = e["type"].get<std::string>();
    }
    std::fprintf(stderr, "gemma4rt: %s %s %d %s\n", printable(req.method).c_str(), printable(req.path).c_str(), res.status,
                 code.c_str());
  }

  bool CheckReady(httplib::Response& res) {
    if (ready.load(std::memory_order_acquire)) return true;
    SetError(res, ErrorForStatus(503, "the model is loading; retry when /health answers 200"));
    res.set_header("Retry-After", "1");
    return false;
  }

  void Completion(const httplib::Request& req, httplib::Response& res, Endpoint ep);
  void Routes();
};

}  // namespace g4::server
