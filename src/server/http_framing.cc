// HTTP framing checks that cpp-httplib 0.11 leaves to the server, and the connections' sockets
// (finding, watching, closing them). Declared in http_internal.h.

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <functional>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <strings.h>
#include <unistd.h>

#include "server/http_internal.h"

namespace g4::server::http_internal {

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

bool SameKey(const std::string& a, const std::string& b) {
  unsigned diff = a.size() != b.size();
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i % (b.size() + !b.size())]);
  return diff == 0;
}

std::vector<std::string> DecodedKeys(const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& k : keys) out.push_back(httplib::detail::decode_url(k, false));
  return out;
}

bool IsChunked(const httplib::Request& req) {
  return strcasecmp(req.get_header_value("Transfer-Encoding").c_str(), "chunked") == 0;
}

namespace {

// Whether `c` may appear in a header field name (RFC 9110 5.6.2 tchar).
bool IsTokenChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || (c != '\0' && std::strchr("!#$%&'*+-.^_`|~", c) != nullptr);
}

}  // namespace

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

bool IsByteCount(const std::string& cl) {
  return !cl.empty() && cl.size() <= 19 && cl.find_first_not_of("0123456789") == std::string::npos;
}

bool UnreadBodyOfOtherMethod(const httplib::Request& req) {
  const std::string& m = req.method;
  if (m == "POST" || m == "PUT" || m == "PATCH" || m == "DELETE") return false;
  if (req.has_header("Transfer-Encoding")) return true;
  return req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0";
}

void MarkClose(httplib::Response& res) {
  if (!res.has_header(kCloseMarker)) res.set_header(kCloseMarker, "1");
}

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

namespace {

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

}  // namespace

int ConnectionSocket(const httplib::Request& req) {
  if (req.remote_port <= 0 || req.local_port <= 0) return -1;
  int found = -1;
  ForEachConnectedSocket([&](int fd, const std::string&, int lp, const std::string& pa, int pp) {
    if (lp == req.local_port && pp == req.remote_port && pa == req.remote_addr) found = fd;
    return found >= 0;
  });
  return found;
}

void ShutDownConnections(const std::string& addr, int port) {
  const bool any = addr.empty() || addr == "0.0.0.0" || addr == "::";
  ForEachConnectedSocket([&](int fd, const std::string& la, int lp, const std::string&, int) {
    if (lp == port && (any || la == addr)) ::shutdown(fd, SHUT_RDWR);
    return false;
  });
}

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
    // keep the connection despite its "Connection: close" (none exists).
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

}  // namespace g4::server::http_internal
