#include "server/http_server.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cctype>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <strings.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include <httplib.h>

#include "server/http_conn.h"
#include "server/metrics.h"
#include "tokenizer/utf8.h"

namespace g4::server {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void SetError(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 401) res.set_header("WWW-Authenticate", "Bearer");
  res.set_content(Dump(ErrorJson(e)), "application/json");
}

void SetJson(httplib::Response& res, const json& j) {
  res.status = 200;
  res.set_content(Dump(j), "application/json");
}

// Constant-time comparison, so a key cannot be guessed byte by byte from response times.
bool SameKey(const std::string& a, const std::string& b) {
  unsigned diff = a.size() != b.size();
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i % (b.size() + !b.size())]);
  return diff == 0;
}

// The configured API keys as httplib hands a request's header values to us: cpp-httplib 0.11
// URL-decodes every header value as it parses it (detail::parse_header calls decode_url), so a
// client sending the key `sk-a%41b` is seen presenting `sk-aAb`. Comparing against the keys
// decoded the same way accepts a client that sends exactly the configured key. The consequence:
// every spelling that decodes alike is accepted too (`sk-aAb` for `sk-a%41b`, `%61` for `a`); the
// secret is then the decoded string, no weaker than a key configured in that form.
std::vector<std::string> DecodedKeys(const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& k : keys) out.push_back(httplib::detail::decode_url(k, false));
  return out;
}

// Whether the request's body comes chunked (Transfer-Encoding: chunked, any case).
bool IsChunked(const httplib::Request& req) {
  return strcasecmp(req.get_header_value("Transfer-Encoding").c_str(), "chunked") == 0;
}

// Whether `c` may appear in a header field name (RFC 9110 5.6.2 tchar).
bool IsTokenChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || (c != '\0' && std::strchr("!#$%&'*+-.^_`|~", c) != nullptr);
}

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
//    body's length cannot be known: 400 (RFC 9112 6.3, found by a reviewer: it was 501). Where it
//    is final after other codings ("gzip, chunked"): 501 (RFC 9112 6.1: a transfer coding the
//    server does not implement).
// Answered without reading the body, and the connection closed (MarkClose by the callers).
std::optional<ApiError> UnusableFraming(const httplib::Request& req) {
  for (const auto& [name, value] : req.headers) {
    if (name.empty() || !std::all_of(name.begin(), name.end(), IsTokenChar))
      return ErrorForStatus(400, utf8::Sanitize("malformed header field name '" + name.substr(0, 64) +
                                                "': no spaces or other separators are allowed in it or before its colon"));
  }
  const size_t lengths = req.get_header_value_count("Content-Length");
  for (size_t i = 1; i < lengths; ++i) {
    if (req.get_header_value("Content-Length", i) != req.get_header_value("Content-Length"))
      return ErrorForStatus(400, utf8::Sanitize("conflicting Content-Length headers '" +
                                                req.get_header_value("Content-Length").substr(0, 32) + "' and '" +
                                                req.get_header_value("Content-Length", i).substr(0, 32) + "'"));
  }
  const size_t codings = req.get_header_value_count("Transfer-Encoding");
  if (codings == 0 || (codings == 1 && IsChunked(req))) return std::nullopt;
  std::string all;
  for (size_t i = 0; i < codings; ++i) all += (i ? ", " : "") + req.get_header_value("Transfer-Encoding", i);
  // The codings in order, trimmed and lower-cased.
  std::vector<std::string> list;
  for (size_t at = 0; at <= all.size();) {
    size_t end = all.find(',', at);
    if (end == std::string::npos) end = all.size();
    std::string c = all.substr(at, end - at);
    const size_t b = c.find_first_not_of(" \t"), e = c.find_last_not_of(" \t");
    c = b == std::string::npos ? std::string() : c.substr(b, e - b + 1);
    for (char& ch : c) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    list.push_back(c);
    at = end + 1;
  }
  const bool chunked_last = !list.empty() && list.back() == "chunked";
  if (!chunked_last || std::count(list.begin(), list.end(), "chunked") > 1)
    return ErrorForStatus(400, utf8::Sanitize("Transfer-Encoding '" + all.substr(0, 64) +
                                              "' does not end in one chunked coding, so the body's length cannot be "
                                              "known: send the body with a Content-Length or Transfer-Encoding: chunked"));
  return ErrorForStatus(501, utf8::Sanitize("Transfer-Encoding '" + all.substr(0, 64) +
                                            "' is not supported: send the body with a Content-Length or "
                                            "Transfer-Encoding: chunked"));
}

// Whether a Content-Length value is a decimal byte count below 10^19 (what httplib 0.11's
// strtoull reads faithfully: `-5` would become 2^64 - 5).
bool IsByteCount(const std::string& cl) {
  return !cl.empty() && cl.size() <= 19 && cl.find_first_not_of("0123456789") == std::string::npos;
}

// A request's body that httplib 0.11 never reads: it reads bodies only for POST, PUT, PATCH,
// DELETE and PRI (detail::expect_content), so the body of a GET, HEAD or OPTIONS (or any other
// method) with a Content-Length or any Transfer-Encoding would be parsed as the connection's next
// request.
bool UnreadBodyOfOtherMethod(const httplib::Request& req) {
  const std::string& m = req.method;
  if (m == "POST" || m == "PUT" || m == "PATCH" || m == "DELETE") return false;
  if (req.has_header("Transfer-Encoding")) return true;
  return req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0";
}

// A response header that asks the post-routing handler to close the connection after the response
// (a request's body was not read in full, so what follows it on the connection is not a request).
// Never sent: the post-routing handler removes it.
constexpr const char* kCloseMarker = "X-Gemma4rt-Close-Connection";
void MarkClose(httplib::Response& res) {
  if (!res.has_header(kCloseMarker)) res.set_header(kCloseMarker, "1");
}

// Events of one request, pushed by the scheduler thread and drained by an HTTP worker.
struct EventQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<CompletionEvent> events;

  void Push(const CompletionEvent& e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(e);
    }
    cv.notify_one();
  }
  // Waits up to `timeout` for an event, then takes every queued one. False on timeout.
  bool PopAll(std::vector<CompletionEvent>* out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, timeout, [&] { return !events.empty(); })) return false;
    for (auto& e : events) out->push_back(std::move(e));
    events.clear();
    return true;
  }
};

constexpr auto kPoll = std::chrono::milliseconds(100);

// Numeric address and port of a socket address (IPv4, IPv6, IPv4-mapped IPv6 as dotted IPv4).
bool AddrPort(const sockaddr_storage& a, std::string* addr, int* port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    if (!inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf)) return false;
    *port = ntohs(in->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      if (!inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], buf, sizeof buf)) return false;
    } else if (!inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf)) {
      return false;
    }
    *port = ntohs(in6->sin6_port);
  } else {
    return false;
  }
  *addr = buf;
  return true;
}

// Calls fn(fd, local address, local port, peer address, peer port) for each connected TCP socket
// of this process (from /proc/self/fd), until fn returns true. cpp-httplib 0.11 (Debian 12) shows
// neither handlers nor the server its connections' sockets.
void ForEachConnectedSocket(
    const std::function<bool(int fd, const std::string& la, int lp, const std::string& pa, int pp)>& fn) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof local, pl = sizeof peer;
    std::string la, pa;
    int lp = 0, pp = 0;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||
        getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0 || !AddrPort(local, &la, &lp) ||
        !AddrPort(peer, &pa, &pp))
      continue;
    if (fn(static_cast<int>(fd), la, lp, pa, pp)) break;
  }
  closedir(dir);
}

// The file descriptor of the TCP connection `req` arrived on, or -1, found by its two endpoints
// (httplib keeps the connection open until the handler returns, so the match stays valid while
// the handler waits).
int ConnectionSocket(const httplib::Request& req) {
  if (req.remote_port <= 0 || req.local_port <= 0) return -1;
  int found = -1;
  ForEachConnectedSocket([&](int fd, const std::string&, int lp, const std::string& pa, int pp) {
    if (lp == req.local_port && pp == req.remote_port && pa == req.remote_addr) found = fd;
    return found >= 0;
  });
  return found;
}

// Ends every connection that the server listening on addr:port accepted (connected sockets of
// this process whose local address is addr:port, or any local address where addr is a wildcard;
// a client of the server in this process has an ephemeral local port) with shutdown(): a worker
// waiting for the rest of a request (up to the 30 s read timeout) or for a keep-alive
// connection's next one (5 s) sees end of file at once. The worker still closes the descriptor.
// A socket closed and its number reused by another thread between the listing and shutdown()
// could be hit instead: `serve` opens no other sockets while it stops.
void ShutDownConnections(const std::string& addr, int port) {
  const bool any = addr.empty() || addr == "0.0.0.0" || addr == "::";
  ForEachConnectedSocket([&](int fd, const std::string& la, int lp, const std::string&, int) {
    if (lp == port && (any || la == addr)) ::shutdown(fd, SHUT_RDWR);
    return false;
  });
}

// True when the peer of connected socket `fd` has closed or reset the connection (a request's
// client gave up). Data waiting to be read (a pipelined request) is not a close.
bool PeerClosed(int fd) {
  pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  if (p.revents & POLLIN) {
    char c;
    return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }
  return false;
}

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
void CloseAfterResponse(const httplib::Request& req, httplib::Response& res) {
  res.headers.erase("Keep-Alive");
  res.headers.erase("Connection");
  res.set_header("Connection", "close");
  const int fd = ConnectionSocket(req);
  if (res.content_provider_) {
    // A handler's own provider (a stream, answering a chunked request, say): once it has
    // called sink.done() (the last chunk is written), the connection is drained and reported
    // failed, which ends httplib's keep-alive loop as below. Only chunked or length-less
    // providers call sink.done() (the server's streams are chunked); one with a length would
    // keep the connection despite its "Connection: close" (a reviewer's note; none exists).
    res.content_provider_ = [inner = std::move(res.content_provider_), fd](size_t offset, size_t length,
                                                                          httplib::DataSink& sink) {
      bool ended = false;
      const std::function<void()> done = sink.done;
      sink.done = [&ended, &done] {
        ended = true;
        done();
      };
      const bool more = inner(offset, length, sink);
      sink.done = done;
      if (!more || !ended) return more;
      LingeringDrain(fd);
      return false;
    };
    return;
  }
  if (!res.has_header("Content-Length")) res.set_header("Content-Length", std::to_string(res.body.size()));
  auto body = std::make_shared<std::string>(std::move(res.body));
  res.body.clear();
  const bool had_type = res.has_header("Content-Type");
  const std::string type = res.get_header_value("Content-Type");
  res.headers.erase("Content-Type");
  // Without a length: httplib's ranges and chunking leave such a provider alone.
  res.set_content_provider(type, [body, fd](size_t, httplib::DataSink& sink) {
    if (!body->empty()) sink.write(body->data(), body->size());
    LingeringDrain(fd);
    return false;
  });
  if (!had_type) res.headers.erase("Content-Type");
}

}  // namespace

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

namespace {

// Logs a stream's final event exactly once: from the stream when it sends it, or, when the client
// left first (the stream stops being polled), from the scheduler's callback or from the stream's
// end, whichever comes second.
struct StreamLog {
  HttpServer::Impl* impl = nullptr;
  std::string path;
  ResponseMeta meta;
  std::mutex mu;
  bool abandoned = false, logged = false;
  std::optional<CompletionEvent> final_event;  // a final event no one has logged yet

  // The scheduler's callback saw the final event.
  void Arrived(const CompletionEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (logged) return;
    if (abandoned) {
      logged = true;
      impl->LogCompletion(path, meta, e);
    } else {
      final_event = e;
    }
  }
  // The stream sends the final event itself.
  void Sent(const CompletionEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (logged) return;
    logged = true;
    impl->LogCompletion(path, meta, e);
  }
  // The stream ends without having sent the final event.
  void Abandon() {
    std::lock_guard<std::mutex> lock(mu);
    abandoned = true;
    if (!logged && final_event) {
      logged = true;
      impl->LogCompletion(path, meta, *final_event);
    }
  }
};

// The streaming side of one request: owns the handle; cancels it unless the final event went out.
struct StreamState {
  std::shared_ptr<RequestHandle> handle;
  std::shared_ptr<EventQueue> queue;
  ResponseMeta meta;
  HttpServer::Impl* impl = nullptr;
  uint64_t track_id = 0;
  bool started = false, finished = false;

  std::shared_ptr<StreamLog> log;

  ~StreamState() {
    if (!finished) {
      handle->Cancel();
      log->Abandon();
    }
    impl->Untrack(track_id);
  }

  bool Fail() {  // the client is gone: free the slot now
    handle->Cancel();
    log->Abandon();
    return false;
  }

  bool Provide(httplib::DataSink& sink);
  bool ProvideChunks(httplib::DataSink& sink);  // Provide's work, without its catch
};

}  // namespace

// httplib calls the content provider outside its own try and outside the routes' guard(): an
// exception here (a failed allocation building a chunk) ends this stream as a client gone would,
// not the process (found by a reviewer).
bool StreamState::Provide(httplib::DataSink& sink) {
  try {
    return ProvideChunks(sink);
  } catch (...) {
    if (!finished) return Fail();
    return false;
  }
}

bool StreamState::ProvideChunks(httplib::DataSink& sink) {
  if (finished) return false;
  if (!started) {
    started = true;
    const std::string first = FirstChunk(meta);
    if (!first.empty() && !sink.write(first.data(), first.size())) return Fail();
    return true;
  }
  std::vector<CompletionEvent> events;
  if (!queue->PopAll(&events, kPoll)) {
    if (impl->stopping.load()) handle->Cancel();  // the final "cancelled" event follows
    if (!sink.is_writable()) return Fail();
    return true;
  }
  std::string out;
  for (const CompletionEvent& e : events) {
    if (!e.done) {
      if (e.prompt) out += EchoChunk(meta, e.prompt_logprobs);  // only echo asks for the prompt's
      else if (!e.text.empty() || ((meta.return_token_ids || meta.logprobs >= 0) && !e.tokens.empty())) out += DeltaChunk(meta, e);
      continue;
    }
    finished = true;
    log->Sent(e);
    if (!e.error.ok()) out += ErrorChunks(ErrorForStatus(500, "generation failed: " + e.error.ToString()));
    else if (e.finish_reason == "cancelled") out += ErrorChunks(ErrorForStatus(503, "the request was cancelled (server shutting down)"));
    else out += FinalChunks(meta, e);
    break;
  }
  if (!out.empty() && !sink.write(out.data(), out.size())) {
    if (!finished) return Fail();
    return false;
  }
  if (finished) sink.done();
  return true;
}

void HttpServer::Impl::Completion(const httplib::Request& req, httplib::Response& res, Endpoint ep) {
  if (!CheckReady(res)) return;
  if (stopping.load()) return SetError(res, ErrorForStatus(503, "the server is shutting down"));
  auto parsed = ep == Endpoint::kChat ? ParseChatRequest(req.body, info) : ParseCompletionRequest(req.body, info);
  if (!parsed.ok()) return SetError(res, parsed.error());
  ParsedRequest& p = parsed.value();
  const ResponseMeta meta = ResponseMetaFor(p, ep, info.tokenizer);
  auto queue = std::make_shared<EventQueue>();
  auto stream_log = std::make_shared<StreamLog>();
  stream_log->impl = this;
  stream_log->path = req.path;
  stream_log->meta = meta;
  const bool stream = p.stream;
  auto submitted = scheduler->Submit(std::move(p.completion), [queue, stream_log, stream](const CompletionEvent& e) {
    queue->Push(e);
    if (stream && e.done) stream_log->Arrived(e);
  });
  if (!submitted.ok()) {
    ApiError e = FromStatus(submitted.status());
    if (e.status == 429) res.set_header("Retry-After", "1");
    return SetError(res, e);
  }
  std::shared_ptr<RequestHandle> handle = std::move(submitted).value();
  const uint64_t track_id = Track(handle);

  if (p.stream) {
    auto st = std::make_shared<StreamState>();
    st->handle = handle;
    st->queue = queue;
    st->meta = std::move(meta);
    st->impl = this;
    st->track_id = track_id;
    st->log = stream_log;
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream", [st](size_t, httplib::DataSink& sink) { return st->Provide(sink); },
        [st](bool) {
          if (!st->finished) st->handle->Cancel();
        });
    return;
  }

  struct Untracker {
    Impl* impl;
    uint64_t id;
    std::shared_ptr<RequestHandle> h;
    bool done = false;
    ~Untracker() {
      if (!done) h->Cancel();
      impl->Untrack(id);
    }
  } untracker{this, track_id, handle};
  CompletionResult result;
  std::vector<CompletionEvent> events;
  bool done = false, client_gone = false;
  const int conn = ConnectionSocket(req);  // -1: disconnects are not noticed until the end
  auto last_check = std::chrono::steady_clock::now();
  while (!done) {
    events.clear();
    const bool got = queue->PopAll(&events, kPoll);
    // Tokens may arrive continuously, so the client is checked by time, not only when idle.
    if (!client_gone && conn >= 0 && std::chrono::steady_clock::now() - last_check >= kPoll) {
      last_check = std::chrono::steady_clock::now();
      if (PeerClosed(conn)) {
        client_gone = true;  // free the slot now; the final "cancelled" event follows
        handle->Cancel();
      }
    }
    if (!got) {
      if (stopping.load()) handle->Cancel();
      continue;
    }
    for (CompletionEvent& e : events) {
      result.text += e.text;
      result.tokens.insert(result.tokens.end(), e.tokens.begin(), e.tokens.end());
      result.logprobs.insert(result.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
      result.prompt_logprobs.insert(result.prompt_logprobs.end(), e.prompt_logprobs.begin(), e.prompt_logprobs.end());
      if (e.done) {
        result.final_event = std::move(e);
        done = true;
        break;
      }
    }
  }
  untracker.done = true;
  const CompletionEvent& fin = result.final_event;
  LogCompletion(req.path, meta, fin);
  if (!fin.error.ok()) return SetError(res, ErrorForStatus(500, "generation failed: " + fin.error.ToString()));
  // A client that hung up gets nothing; its status is nginx's 499 ("client closed request"), so
  // that /metrics does not count it as a 503 the server gave (found by a fresh user: a client's
  // timeout showed as "server unavailable"). A shutdown's cancel is the 503.
  if (fin.finish_reason == "cancelled")
    return SetError(res, client_gone ? ErrorForStatus(499, "the request was cancelled (the client disconnected)")
                                     : ErrorForStatus(503, "the request was cancelled (server shutting down)"));
  SetJson(res, CompletionResponseJson(meta, result));
}

void HttpServer::Impl::Routes() {
  auto guard = [](auto fn) {
    return [fn](const httplib::Request& req, httplib::Response& res) {
      try {
        fn(req, res);
      } catch (const std::exception& e) {
        SetError(res, ErrorForStatus(500, std::string("internal error: ") + e.what()));
      } catch (...) {
        SetError(res, ErrorForStatus(500, "internal error"));
      }
    };
  };
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what += std::string(": ") + e.what();
    } catch (...) {
    }
    SetError(res, ErrorForStatus(500, what));
  });
  // Statuses httplib produces itself (404 no route, 413 body too large, 400 unparsable HTTP)
  // arrive here with an empty body; ours already carry JSON. After httplib's 400 (the request's
  // line or headers did not parse), 414 (URI too long) or 416 (bad Range) nothing of the body
  // was read, and after a 400 not even all of the headers: the connection is closed. A 400 that
  // the connection layer caused is answered for what it was: 431 for a head over HeadLimits, 408
  // for a client that stalled mid-request (CurrentRefusal).
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg;
    if (res.status == 400) {
      const ReadRefusal why = CurrentRefusal(&msg);
      if (why == ReadRefusal::kHeadTooLarge) res.status = 431;
      if (why == ReadRefusal::kTimedOut) res.status = 408;
    }
    if (res.status == 400 || res.status == 408 || res.status == 414 || res.status == 416 || res.status == 431) MarkClose(res);
    switch (res.status) {
      case 404: msg = "no route for " + req.method + " " + req.path; break;
      case 413: msg = "the request body is too large"; break;
      case 400: msg = "bad request (malformed HTTP)"; break;
      case 414: msg = "the request URI is too long"; break;
      case 408: case 431: break;
      default: msg = "HTTP error " + std::to_string(res.status);
    }
    SetError(res, ErrorForStatus(res.status, utf8::Sanitize(msg)));
  });
  // CORS, as llama-server and vLLM (its default allowed origins "*") answer: every response
  // carries Access-Control-Allow-Origin: *, and a browser's preflight (OPTIONS, sent without
  // credentials) is answered 204 before the API-key check, allowing GET/POST and the headers it
  // asks for (Authorization, Content-Type, X-Api-Key by default). Without this a page on another
  // origin could not call the server at all (found by a fresh user: OPTIONS was 404). Requests
  // themselves still need the key where one is set.
  // The key is checked here for requests without a body to read (GET, HEAD, ...); for POST, PUT,
  // PATCH and DELETE the content-reader handlers below check it after reading and dropping the
  // body: a 401 given here would leave the body on a keep-alive connection, to be parsed as the
  // client's next request (found by a reviewer: the request after a 401 got a stray 400).
  api_keys = DecodedKeys(opt.api_keys);
  if (opt.cors) svr.set_default_headers({{"Access-Control-Allow-Origin", "*"}});
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (auto e = UnusableFraming(req)) {
      SetError(res, *e);
      MarkClose(res);
      return httplib::Server::HandlerResponse::Handled;
    }
    if (opt.cors && req.method == "OPTIONS") {
      res.status = 204;
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      const std::string asked = req.get_header_value("Access-Control-Request-Headers");
      res.set_header("Access-Control-Allow-Headers",
                     asked.empty() ? std::string("Authorization, Content-Type, X-Api-Key") : utf8::Sanitize(asked.substr(0, 1024)));
      res.set_header("Access-Control-Max-Age", "86400");
      return httplib::Server::HandlerResponse::Handled;
    }
    const std::string& m = req.method;
    if (m == "POST" || m == "PUT" || m == "PATCH" || m == "DELETE") return httplib::Server::HandlerResponse::Unhandled;
    if (auto e = Authorize(req)) {
      SetError(res, *e);
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // A HEAD response has no body, so CloseAfterResponse's provider never runs for a HEAD that
  // carried a body (which httplib never reads): httplib's logger, which runs once the response is
  // written, drains what the client sends and shuts the socket's reading side, so the keep-alive
  // loop ends there instead of parsing the body as the next request (found by a reviewer).
  svr.set_logger([](const httplib::Request& req, const httplib::Response& res) {
    if (req.method != "HEAD" || (!UnreadBodyOfOtherMethod(req) && res.get_header_value("Connection") != "close")) return;
    const int fd = ConnectionSocket(req);
    if (fd < 0) return;
    LingeringDrain(fd);
    ::shutdown(fd, SHUT_RD);
  });
  // Counted before the response is written (the logger runs after it is sent, so a client could
  // read /metrics on another connection before its previous response was counted). Then, where
  // the request's body was not read in full (MarkClose by a handler, or a GET/HEAD/OPTIONS body,
  // which httplib never reads), the connection is closed after the response: whatever follows on
  // it is not the client's next request. So is it after every chunked request: httplib 0.11
  // parses chunks leniently (chunk data not followed by CRLF ends the body there, as a success;
  // sizes like `0x2f`, `+2f`; bare-LF lines; found by a fresh user), so where it and a client or
  // proxy disagree on a body's end, the rest would be taken as a request; and a request with
  // both Transfer-Encoding: chunked and a Content-Length (read as chunked) must have its
  // connection closed after the answer (RFC 9112 6.3: a proxy before the server may have framed
  // it by the other header). Clients in common use send bodies with a Content-Length.
  svr.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    counters.Count(res.status);
    // (A 499, a client that left a completion, has its completion line already; a 400 for a
    // request whose connection Stop closed halfway was never sent.)
    const bool cut_by_stop = res.status == 400 && stopping.load() && CurrentRefusal() == ReadRefusal::kNone &&
                             res.body.find("malformed HTTP") != std::string::npos;
    if (opt.log_requests && res.status >= 400 && res.status < 500 && res.status != 499 && !cut_by_stop)
      LogRefusal(req, res);
    const bool marked = res.has_header(kCloseMarker);
    res.headers.erase(kCloseMarker);
    if (marked || IsChunked(req) || UnreadBodyOfOtherMethod(req)) CloseAfterResponse(req, res);
  });

  // 503 "stopping" from the moment Stop() begins (SIGTERM), so that a load balancer sends no
  // more requests while the ones in flight end.
  auto health = guard([this](const httplib::Request&, httplib::Response& res) {
    const bool stop = stopping.load();
    if (!stop && ready.load(std::memory_order_acquire)) return SetJson(res, json{{"status", "ok"}});
    json j = ErrorJson(ErrorForStatus(503, stop ? "the server is shutting down" : "Loading model"));
    j["status"] = stop ? "stopping" : "loading";
    res.status = 503;
    if (!stop) res.set_header("Retry-After", "1");
    res.set_content(Dump(j), "application/json");
  });
  svr.Get("/health", health);
  svr.Get("/v1/health", health);
  auto models = guard([this](const httplib::Request&, httplib::Response& res) {
    if (CheckReady(res)) SetJson(res, ModelsJson(info));
  });
  svr.Get("/v1/models", models);
  svr.Get("/models", models);
  auto one_model = guard([this](const httplib::Request& req, httplib::Response& res) {
    if (!CheckReady(res)) return;
    auto r = ModelJson(req.matches[1].str(), info);
    if (!r.ok()) return SetError(res, r.error());
    SetJson(res, r.value());
  });
  svr.Get(R"(/v1/models/(.+))", one_model);
  svr.Get(R"(/models/(.+))", one_model);
  svr.Get("/metrics", guard([this](const httplib::Request& req, httplib::Response& res) {
    if (!opt.metrics) return SetError(res, ErrorForStatus(404, "metrics are disabled; start the server with --metrics"));
    if (!CheckReady(res)) return;
    const auto http = counters.Snapshot();
    res.status = 200;
    res.set_content(RenderMetrics(scheduler->Stats(), &http), "text/plain; version=0.0.4; charset=utf-8");
  }));
  // POST bodies are read by the handler, not parsed by httplib: httplib turns an
  // application/x-www-form-urlencoded body (what `curl -d` sends without a content-type header)
  // into form fields and refuses one over 8 KiB with a 413 before any handler runs. The API reads
  // its JSON whatever the content type says, up to --max-body-bytes (set_payload_max_length,
  // enforced while reading: 413). Multipart bodies are refused with 415.
  // Every request that may carry a body (POST, PUT, PATCH, DELETE) reaches a handler that reads
  // it (httplib's content-reader routes): the API's bodies are kept up to --max-body-bytes, any
  // other route's body is read and dropped (so a keep-alive connection stays in step) before its
  // 404 or 405. Before anything is read:
  //  - a Content-Length that is not a decimal byte count (a sign, letters, 20 digits or more) is
  //    400 at once: httplib 0.11 reads it with strtoull, so `-5` became 2^64 - 5 and the server
  //    waited for that many bytes until its 30 s read timeout, holding a worker thread, then said
  //    413 (found by a fresh user). Nothing of such a body is read, so the connection is closed
  //    after the 400 (what did arrive was taken as the connection's next request, found by a
  //    reviewer).
  //  - a request with neither a length nor chunking has no body (RFC 9112 6.3): httplib 0.11
  //    would read until the client closed or the read timeout passed. An API route answers 400;
  //    another route its 404/405 without reading.
  // Any answer given without reading the whole body (a bad Content-Length, a chunked or inflated
  // body over the limit, a body that could not be read, a DELETE's chunked body, which httplib
  // 0.11 skips) closes the connection after it (MarkClose, CloseAfterResponse).
  // A request without the API key has its body read and dropped (not kept), then 401, so its
  // keep-alive connection stays usable (found by a reviewer: the 401 was given before the body was
  // read, and the body then parsed as the client's next request). Multipart bodies too, then 415.
  // A valid count over the limit is read and dropped (by httplib), then 413: a client that sends
  // what it announced gets its 413 (cutting it off would reset the connection under its upload);
  // one that announces more than it sends waits for the read timeout. Chunked and compressed
  // bodies (Debian's httplib inflates gzip/brotli before the reader sees it) are counted as they
  // arrive: past the limit, 413 (a reviewer found them unbounded: one request could fill memory).
  // Returns an error, or nullopt when the body may be read; *has_body: whether there is one.
  auto framing = [](const httplib::Request& req, bool* has_body) -> std::optional<ApiError> {
    *has_body = IsChunked(req) || req.has_header("Content-Length");
    if (req.has_header("Content-Length")) {
      const std::string cl = req.get_header_value("Content-Length");
      if (!IsByteCount(cl))
        return ErrorForStatus(400, utf8::Sanitize("invalid Content-Length header '" + cl.substr(0, 64) +
                                                  "': not a decimal byte count below 10^19"));
    }
    return std::nullopt;
  };
  // Reads the body through `read`, handing each piece to `keep` (nullptr: dropped; a multipart
  // body is always dropped); an error past --max-body-bytes (httplib's own 413 for a
  // Content-Length over it, ours for chunked/inflated bytes) or when the read broke off. Where the
  // body was not read to its end, MarkClose(res): the connection is closed after the answer.
  // The 413 for a body over --max-body-bytes (cl: its Content-Length, or empty where unknown).
  auto too_large = [this](const std::string& cl) {
    return ErrorForStatus(413, "the request body" + (cl.empty() ? std::string() : " (Content-Length " + cl + " bytes)") +
                                   " is larger than the limit of " + std::to_string(opt.max_body_bytes) +
                                   " bytes (--max-body-bytes)");
  };
  auto read_body = [this, too_large](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read,
                          std::string* keep) -> std::optional<ApiError> {
    size_t got = 0;
    bool too_big = false;
    auto receive = [&](const char* data, size_t n) {
      got += n;
      if (got > opt.max_body_bytes) {
        too_big = true;
        return false;
      }
      if (keep != nullptr) keep->append(data, n);
      return true;
    };
    // httplib 0.11 reads no body of a DELETE without a Content-Length, chunked or not.
    if (IsChunked(req) && req.method == "DELETE" && !req.has_header("Content-Length")) MarkClose(res);
    const bool complete = req.is_multipart_form_data()
                              ? read([](const httplib::MultipartFormData&) { return true; },
                                     [&](const char* data, size_t n) { return receive(data, n); })
                              : read(receive);
    if (complete) return std::nullopt;
    // httplib's own 413 (a Content-Length over the limit) has skipped the body: still in step.
    if (too_big || res.status != 413) MarkClose(res);
    if (too_big || res.status == 413) return too_large(req.get_header_value("Content-Length"));
    std::string why;
    const ReadRefusal refusal = CurrentRefusal(&why);
    if (refusal == ReadRefusal::kTimedOut) return ErrorForStatus(408, why);
    if (refusal == ReadRefusal::kBodyLineTooLong) return ErrorForStatus(400, why);
    return ErrorForStatus(400, "the request body could not be read in full");
  };
  // `Expect: 100-continue` (curl sends it before bodies over 1 MiB): httplib 0.11 answers "100
  // Continue" before routing, inviting the upload. A request with unusable framing (an unsupported
  // Transfer-Encoding, a Content-Length that is not a byte count, ...), without the API key, or
  // announcing a body over --max-body-bytes, gets its final 400 or 501 / 401 / 413 instead,
  // before any of the body is sent (found by a fresh user: an unauthenticated client was invited
  // to upload everything), and the connection is closed after it (MarkClose): a client may still
  // send the body it announced.
  svr.set_expect_100_continue_handler([this, too_large, framing](const httplib::Request& req, httplib::Response& res) {
    bool has_body = false;
    std::optional<ApiError> e = UnusableFraming(req);
    if (!e) e = framing(req, &has_body);  // a Content-Length that is not a byte count: 400 before the upload
    if (!e && opt.cors && req.method == "OPTIONS") return 100;  // a preflight is answered before the key check
    if (!e) e = Authorize(req);
    const std::string cl = req.get_header_value("Content-Length");
    if (!e && IsByteCount(cl) && std::stoull(cl) > opt.max_body_bytes) e = too_large(cl);
    if (!e) return 100;
    SetError(res, *e);
    MarkClose(res);
    return res.status;
  });
  // A Content-Length that is not a byte count: the body's end is unknown, so the connection is
  // closed after the 400 (MarkClose). So is it after the answer to a body method without any
  // framing: an empty Transfer-Encoding field, which httplib drops, looks the same (found by a
  // fresh user and a reviewer), so what follows is not taken as the next request.
  auto bad_framing = [framing](const httplib::Request& req, httplib::Response& res, bool* has_body) {
    auto e = framing(req, has_body);
    if (!*has_body || e) MarkClose(res);
    if (!e) return false;
    SetError(res, *e);
    return true;
  };
  auto with_body = [this, bad_framing, read_body](httplib::Server::Handler h) {
    return [this, bad_framing, read_body, h](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read) {
      bool has_body = false;
      if (bad_framing(req, res, &has_body)) return;
      const std::optional<ApiError> denied = Authorize(req);
      const bool multipart = req.is_multipart_form_data();
      if (!has_body)
        return SetError(res, denied      ? *denied
                             : multipart ? ErrorForStatus(415, "multipart/form-data bodies are not accepted; send the request as JSON")
                                         : ErrorForStatus(400, "the request has no body: send the JSON request with a Content-Length "
                                                               "or Transfer-Encoding: chunked"));
      httplib::Request with = req;
      const std::optional<ApiError> read_error = read_body(req, res, read, denied || multipart ? nullptr : &with.body);
      if (denied) return SetError(res, *denied);
      if (read_error) return SetError(res, *read_error);
      if (multipart) return SetError(res, ErrorForStatus(415, "multipart/form-data bodies are not accepted; send the request as JSON"));
      h(with, res);
    };
  };
  auto chat = with_body(guard([this](const httplib::Request& req, httplib::Response& res) { Completion(req, res, Endpoint::kChat); }));
  auto completions =
      with_body(guard([this](const httplib::Request& req, httplib::Response& res) { Completion(req, res, Endpoint::kCompletion); }));
  svr.Post("/v1/chat/completions", chat);
  svr.Post("/chat/completions", chat);
  svr.Post("/v1/completions", completions);
  svr.Post("/completions", completions);
  auto simple = [this, guard, with_body](ApiOr<json> (*fn)(std::string_view, const ModelInfo&)) {
    return with_body(guard([this, fn](const httplib::Request& req, httplib::Response& res) {
      if (!CheckReady(res)) return;
      auto r = fn(req.body, info);
      if (!r.ok()) return SetError(res, r.error());
      SetJson(res, r.value());
    }));
  };
  svr.Post("/tokenize", simple(&HandleTokenize));
  svr.Post("/detokenize", simple(&HandleDetokenize));
  svr.Post("/apply-template", simple(&HandleApplyTemplate));

  // A known route asked with another method: 405 with an Allow header (RFC 9110) and an
  // OpenAI-shaped body, as vLLM and OpenAI answer, not 404. (httplib answers HEAD from GET routes.)
  auto not_allowed = [](std::string allow) {
    return [allow](const httplib::Request& req, httplib::Response& res) {
      SetError(res, ErrorForStatus(405, utf8::Sanitize("method " + req.method + " is not allowed on " + req.path + " (allowed: " + allow + ")")));
      res.set_header("Allow", allow);
    };
  };
  const std::vector<std::string> body_routes = {"/v1/chat/completions", "/chat/completions", "/v1/completions",
                                                "/completions", "/tokenize", "/detokenize", "/apply-template"};
  for (const std::string& path : body_routes) svr.Get(path, not_allowed("POST"));
  // Any other request that may carry a body: its body is read and dropped (within the limit),
  // then 405 on a known route (the API routes take POST; /health, /v1/models[/id] and, with
  // --metrics, /metrics take GET and HEAD) or 404 (without --metrics, /metrics is 404 for every
  // method).
  auto other = [this, bad_framing, read_body, body_routes, not_allowed](const httplib::Request& req, httplib::Response& res,
                                                                       const httplib::ContentReader& read) {
    bool has_body = false;
    if (bad_framing(req, res, &has_body)) return;
    const std::optional<ApiError> read_error = has_body ? read_body(req, res, read, nullptr) : std::nullopt;
    if (auto denied = Authorize(req)) return SetError(res, *denied);
    if (read_error) return SetError(res, *read_error);
    const std::string& p = req.path;
    const bool get_route = p == "/health" || p == "/v1/health" || p == "/v1/models" || p == "/models" ||
                           (opt.metrics && p == "/metrics") || (p.rfind("/v1/models/", 0) == 0 && p.size() > 11) ||
                           (p.rfind("/models/", 0) == 0 && p.size() > 8);
    const bool post_route = std::find(body_routes.begin(), body_routes.end(), p) != body_routes.end();
    if (get_route || post_route) return not_allowed(get_route ? "GET, HEAD" : "POST")(req, res);
    SetError(res, ErrorForStatus(404, utf8::Sanitize("no route for " + req.method + " " + p)));
  };
  svr.Post(".*", other);
  svr.Put(".*", other);
  svr.Patch(".*", other);
  svr.Delete(".*", other);
}

namespace {
// httplib's task queue (one worker thread per connection being served) with the threads started
// as connections need them, up to `max`, and kept once started: httplib's ThreadPool starts all of
// them at once, and the 512 or more that `serve` allows (DefaultHttpThreads) held ~6 MB of stacks
// and thread state while idle (12 KB each; `serve -np 4` with the f16 cache: 344.6 -> ~338.5 MB
// idle, of a 352.8 MB budget). The same queue otherwise: jobs run in arrival order, shutdown runs
// the queued ones and joins.
class GrowingThreadPool : public httplib::TaskQueue {
 public:
  explicit GrowingThreadPool(size_t max_threads) : max_threads_(std::max<size_t>(1, max_threads)) {}
  ~GrowingThreadPool() override { shutdown(); }

  // Runs on httplib's listening thread, where an exception would end the process: a thread that
  // cannot start (out of memory or the process's thread limit, std::system_error) leaves the job
  // to the running threads; with none running, or when the job cannot even be queued, the
  // connection is served here, holding up new connections for its duration but never aborting
  // (found by a reviewer: a burst of connections under `ulimit -v` would have called
  // std::terminate).
  void enqueue(std::function<void()> fn) override {
    std::unique_lock<std::mutex> lock(mu_);
    try {
      jobs_.push_back(std::move(fn));  // the strong guarantee: fn is left as it was if this throws
    } catch (...) {
      lock.unlock();
      fn();
      return;
    }
    if (!stop_ && idle_ < jobs_.size() && threads_.size() < max_threads_) {
      try {
        threads_.emplace_back([this] { Work(); });  // it takes a job once the lock is released
        return;
      } catch (...) {
        if (threads_.empty()) {
          std::function<void()> job = std::move(jobs_.back());
          jobs_.pop_back();
          lock.unlock();
          job();
          return;
        }
      }
    }
    cv_.notify_one();
  }

  void shutdown() override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();  // no thread is added once stop_ is set
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ++idle_;
        cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
        --idle_;
        if (jobs_.empty()) return;  // stopping, nothing left
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }

  const size_t max_threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;  // threads waiting for a job
  bool stop_ = false;
};
}  // namespace

HttpServer::HttpServer(HttpOptions options) : impl_(std::make_unique<Impl>()) { impl_->opt = std::move(options); }

HttpServer::~HttpServer() { Stop(); }

Status HttpServer::Start() {
  Impl& m = *impl_;
  if (m.started) return FailedPrecondition("the HTTP server was already started");
  std::signal(SIGPIPE, SIG_IGN);
  const int threads = m.opt.http_threads > 0 ? m.opt.http_threads : 64;
  m.svr.new_task_queue = [threads] { return new GrowingThreadPool(static_cast<size_t>(threads)); };
  m.svr.set_payload_max_length(m.opt.max_body_bytes);
  // httplib's default is SO_REUSEPORT, which lets a second server bind the same port and silently
  // take half of the connections. SO_REUSEADDR only: quick restarts, but "address in use" is an error.
  m.svr.set_socket_options([&m](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    m.listen_fd.store(sock);
  });
  m.svr.set_read_timeout(std::max(1, m.opt.read_timeout_s), 0);
  m.svr.set_write_timeout(30, 0);
  m.Routes();
  if (m.opt.port == 0) {
    m.port = m.svr.bind_to_any_port(m.opt.host);
  } else {
    m.port = m.svr.bind_to_port(m.opt.host, m.opt.port) ? m.opt.port : -1;
  }
  if (m.port <= 0)
    return FailedPrecondition("cannot listen on " + m.opt.host + ":" + std::to_string(m.opt.port) +
                              " (address in use, or not a local address?)");
  // httplib 0.11 listens with a backlog of 5 connections not yet accepted: a burst of more
  // clients connecting at once had their SYNs dropped and retried after 1 s, 3 s, ... (200
  // connections took 15 s to open in StalledClientsLeaveRoomForOthers). listen() again on the
  // bound socket raises the backlog (Linux takes the new value; capped by net.core.somaxconn).
  if (const int fd = m.listen_fd.load(); fd >= 0) {
    ::listen(fd, 4096);
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    int lp = 0;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0 || !AddrPort(local, &m.bound_addr, &lp))
      m.bound_addr.clear();
  }
  m.started = true;
  m.thread = std::thread([&m] { m.svr.listen_after_bind(); });
  // Stop() is a no-op on a server that is not yet running: wait until it runs.
  for (int i = 0; i < 5000 && !m.svr.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return OkStatus();
}

int HttpServer::port() const { return impl_->port; }

void HttpServer::SetReady(ModelInfo info, Scheduler* scheduler) {
  impl_->info = std::move(info);
  impl_->scheduler = scheduler;
  impl_->ready.store(true, std::memory_order_release);
}

void HttpServer::Stop() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.stop_mu);
  if (!m.started || m.stopped) return;
  m.stopped = true;
  m.stopping.store(true);
  m.CancelAll();
  // Let cancelled requests send their last event (streams end with an error event and [DONE])
  // before the sockets go: httplib stops writing once it is shutting down.
  for (int i = 0; i < 300; ++i) {
    {
      std::lock_guard<std::mutex> inflight_lock(m.inflight_mu);
      if (m.inflight.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  m.svr.stop();
  // httplib's stop() closes the listening socket, then joins the workers, which wait on their
  // clients: one that sent part of a request held shutdown for the 30 s read timeout (found by a
  // fresh user: Ctrl-C seemed ignored). Nothing such a client sent has reached a handler. After
  // half a second (a handler that has returned still has its response written by httplib: a
  // cancelled non-streaming request's 503 goes out after it leaves `inflight`; a review cut
  // such answers off when this ran at once), then again every 20 ms until the workers are
  // joined: a connection accepted just before the listening socket closed may reach
  // /proc/self/fd after a pass.
  if (!m.thread.joinable()) return;
  std::future<void> joined;
  try {
    joined = std::async(std::launch::async, [&m] { m.thread.join(); });
  } catch (...) {
    // No thread to join with (out of memory or threads: std::system_error; found by a fresh user
    // under `ulimit -v`, where the listener thread was then destroyed unjoined: std::terminate).
    // The same steps in line: half a second, the connections shut down, then the join.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ShutDownConnections(m.bound_addr, m.port);
    m.thread.join();
    return;
  }
  if (joined.wait_for(std::chrono::milliseconds(500)) == std::future_status::ready) return;
  do {
    ShutDownConnections(m.bound_addr, m.port);
  } while (joined.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready);
}

}  // namespace g4::server
