// The HTTP server's routes and handlers: CORS, API keys, body framing and limits, errors, and the
// API's endpoints (http_server.h lists them).

#include <algorithm>
#include <exception>
#include <string>
#include <vector>

#include <sys/socket.h>

#include "server/http_internal.h"

namespace g4::server {

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
  // origin could not call the server at all. Requests themselves still need the key where one is
  // set.
  // The key is checked here for requests without a body to read (GET, HEAD, ...); for POST, PUT,
  // PATCH and DELETE the content-reader handlers below check it after reading and dropping the
  // body: a 401 given here would leave the body on a keep-alive connection, to be parsed as the
  // client's next request.
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
  // loop ends there instead of parsing the body as the next request.
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
  // sizes like `0x2f`, `+2f`; bare-LF lines), so where it and a client or
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
  //    400 at once: httplib 0.11 reads it with strtoull, so `-5` would become 2^64 - 5 and the
  //    server would wait for that many bytes until its read timeout, holding a worker thread.
  //    Nothing of such a body is read, so the connection is closed after the 400 (what did arrive
  //    would be taken as the connection's next request).
  //  - a request with neither a length nor chunking has no body (RFC 9112 6.3): httplib 0.11
  //    would read until the client closed or the read timeout passed. An API route answers 400;
  //    another route its 404/405 without reading.
  // Any answer given without reading the whole body (a bad Content-Length, a chunked or inflated
  // body over the limit, a body that could not be read, a DELETE's chunked body, which httplib
  // 0.11 skips) closes the connection after it (MarkClose, CloseAfterResponse).
  // A request without the API key has its body read and dropped (not kept), then 401, so its
  // keep-alive connection stays usable (a 401 before the body is read would leave the body to be
  // parsed as the client's next request). Multipart bodies too, then 415.
  // A valid count over the limit is read and dropped (by httplib), then 413: a client that sends
  // what it announced gets its 413 (cutting it off would reset the connection under its upload);
  // one that announces more than it sends waits for the read timeout. Chunked and compressed
  // bodies (Debian's httplib inflates gzip/brotli before the reader sees it) are counted as they
  // arrive: past the limit, 413 (unbounded, one request could fill memory).
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
  // before any of the body is sent (an unauthenticated client is not invited to upload), and the
  // connection is closed after it (MarkClose): a client may still send the body it announced.
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
  // framing: an empty Transfer-Encoding field, which httplib drops, looks the same, so what
  // follows is not taken as the next request.
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

}  // namespace g4::server
