#include "server/http_conn.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace g4::server {
namespace {

using Clock = std::chrono::steady_clock;

struct ConnectionState {
  ReadRefusal refusal = ReadRefusal::kNone;
  std::string message;
};
thread_local ConnectionState* tls_connection = nullptr;

// poll() for `events` on fd for up to `ms` milliseconds (negative: no limit), retried on EINTR.
int PollFor(int fd, short events, int ms) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, ms);
    if (r >= 0 || errno != EINTR) return r;
  }
}

int Millis(time_t sec, time_t usec) { return static_cast<int>(sec * 1000 + usec / 1000); }

// Numeric host and port of a socket address, as httplib reports them (getnameinfo).
void IpAndPort(const sockaddr_storage& a, socklen_t len, std::string& ip, int& port) {
  if (a.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port);
  } else if (a.ss_family == AF_INET6) {
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
  } else {
    return;
  }
  char host[NI_MAXHOST] = {};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) == 0) ip = host;
}

// One request's reads and writes on a connection (a new one per request, as httplib's
// SocketStream, whose 4 KiB read-ahead is dropped with it). While the request's head is read
// (httplib reads it a byte at a time through stream_line_reader) each byte is counted against
// HeadLimits; past one, reads fail, which httplib answers 400 (the error handler makes it 431 from
// CurrentRefusal). A refusal or read timeout inside the request line ends that line early with a
// '\n' so that httplib still answers (414 for a long line, else 400 -> 408); without it httplib
// would close the connection silently.
class GuardedStream : public httplib::Stream {
 public:
  GuardedStream(int sock, const HeadLimits& limits, int read_ms, int write_ms, ConnectionState* state)
      : sock_(sock), limits_(limits), read_ms_(read_ms), write_ms_(write_ms), state_(state), buf_(4096) {}

  bool is_readable() const override { return PollFor(sock_, POLLIN, read_ms_) > 0; }
  bool is_writable() const override {
    if (PollFor(sock_, POLLOUT, write_ms_) <= 0) return false;
    // Alive unless the peer has closed: nothing to read, or a byte that can be peeked.
    if (PollFor(sock_, POLLIN, 0) == 0) return true;
    char c;
    return recv(sock_, &c, 1, MSG_PEEK) > 0;
  }

  ssize_t read(char* ptr, size_t size) override {
    if (size == 0) return 0;
    if (state_->refusal != ReadRefusal::kNone) return -1;
    if (!in_head_) {
      const ssize_t n = Fill(ptr, size);
      if (n <= 0) return n;
      moved_ += static_cast<size_t>(n);
      // httplib reads a chunked body's size and trailer lines a byte at a time (stream_line_reader)
      // into a buffer that grows with the line, and its data in larger reads (a 1-byte read of
      // data ends before a line): a run of 1-byte reads without a newline is such a line.
      if (size > 1 || *ptr == '\n') {
        body_line_ = 0;
      } else if (++body_line_ > limits_.max_body_line) {
        return Refuse(ReadRefusal::kBodyLineTooLong, "a chunk-size or trailer line of the chunked body is longer than " +
                                                         std::to_string(limits_.max_body_line) + " bytes");
      }
      return n;
    }
    char c;
    const ssize_t n = Fill(&c, 1);
    if (n <= 0) return in_request_line_with_bytes() && state_->refusal != ReadRefusal::kNone ? EndLine(ptr) : n;
    ++moved_;
    ++head_bytes_;
    ++line_len_;
    if (line_ == 0) {
      if (c != '\n' && line_len_ > limits_.max_request_line) {
        Refuse(ReadRefusal::kRequestLineTooLong, "the request line is longer than " +
                                                     std::to_string(limits_.max_request_line) + " bytes");
        return EndLine(ptr);
      }
    } else if (line_len_ > limits_.max_line) {
      return Refuse(ReadRefusal::kHeadTooLarge,
                    "a header field line is longer than " + std::to_string(limits_.max_line) + " bytes");
    } else if (head_bytes_ > limits_.max_bytes) {
      return Refuse(ReadRefusal::kHeadTooLarge, "the request's header fields are larger than " +
                                                    std::to_string(limits_.max_bytes) + " bytes in all");
    }
    if (c == '\n') {
      if (line_ > 0 && line_len_ == 2 && prev_ == '\r') {
        in_head_ = false;  // the blank line that ends the head (httplib's read_headers ends there too)
      } else if (line_ > 0 && ++fields_ > limits_.max_fields) {
        return Refuse(ReadRefusal::kHeadTooLarge, "the request has more than " + std::to_string(limits_.max_fields) +
                                                      " header fields");
      }
      ++line_;
      line_len_ = 0;
    }
    prev_ = c;
    *ptr = c;
    return 1;
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    for (;;) {
      const ssize_t n = send(sock_, ptr, size, MSG_NOSIGNAL);
      if (n >= 0 || errno != EINTR) {
        if (n > 0) moved_ += static_cast<size_t>(n);
        return n;
      }
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (getpeername(sock_, reinterpret_cast<sockaddr*>(&a), &len) == 0) IpAndPort(a, len, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (getsockname(sock_, reinterpret_cast<sockaddr*>(&a), &len) == 0) IpAndPort(a, len, ip, port);
  }
  socket_t socket() const override { return sock_; }

  size_t moved() const { return moved_; }

 private:
  bool in_request_line_with_bytes() const { return in_head_ && line_ == 0 && line_len_ > 0; }

  ssize_t Refuse(ReadRefusal why, std::string message) {
    state_->refusal = why;
    state_->message = std::move(message);
    return -1;
  }
  ssize_t EndLine(char* ptr) {
    *ptr = '\n';
    return 1;
  }

  // Up to `size` bytes from the read-ahead buffer or the socket; -1 on error or after the read
  // timeout (a timeout mid-request is a kTimedOut refusal), 0 at the end of the stream.
  ssize_t Fill(char* ptr, size_t size) {
    if (off_ == len_) {
      const int ready = PollFor(sock_, POLLIN, read_ms_);
      if (ready <= 0) {
        if (ready == 0 && (!in_head_ || head_bytes_ > 0))
          Refuse(ReadRefusal::kTimedOut, "the client sent nothing for " + std::to_string(read_ms_ / 1000) +
                                             " s (the read timeout) before its request was complete");
        return -1;
      }
      if (size >= buf_.size()) {
        for (;;) {
          const ssize_t n = recv(sock_, ptr, size, 0);
          if (n >= 0 || errno != EINTR) return n;
        }
      }
      ssize_t n;
      do n = recv(sock_, buf_.data(), buf_.size(), 0);
      while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      off_ = 0;
      len_ = static_cast<size_t>(n);
    }
    const size_t take = std::min(size, len_ - off_);
    std::copy(buf_.begin() + static_cast<std::ptrdiff_t>(off_), buf_.begin() + static_cast<std::ptrdiff_t>(off_ + take), ptr);
    off_ += take;
    return static_cast<ssize_t>(take);
  }

  const int sock_;
  const HeadLimits& limits_;
  const int read_ms_, write_ms_;
  ConnectionState* state_;
  std::vector<char> buf_;
  size_t off_ = 0, len_ = 0;
  bool in_head_ = true;
  size_t head_bytes_ = 0, line_ = 0, line_len_ = 0, fields_ = 0;
  size_t body_line_ = 0;  // consecutive 1-byte body reads since a newline
  char prev_ = 0;
  size_t moved_ = 0;  // bytes read and written
};

}  // namespace

ReadRefusal CurrentRefusal(std::string* message) {
  if (tls_connection == nullptr) return ReadRefusal::kNone;
  if (message != nullptr) *message = tls_connection->message;
  return tls_connection->refusal;
}

void LingeringDrain(int fd) {
  if (fd < 0) return;
  ::shutdown(fd, SHUT_WR);
  const auto end = Clock::now() + std::chrono::seconds(2);
  size_t dropped = 0;
  char buf[16384];
  while (dropped < (1u << 20)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
    if (left <= 0) break;
    if (PollFor(fd, POLLIN, static_cast<int>(left)) <= 0) break;
    const ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) break;
    dropped += static_cast<size_t>(n);
  }
}

bool GuardedServer::process_and_close_socket(socket_t sock) {
  ConnectionState state;
  tls_connection = &state;
  const int read_ms = Millis(read_timeout_sec_, read_timeout_usec_);
  const int write_ms = Millis(write_timeout_sec_, write_timeout_usec_);
  bool ret = false;
  // As httplib: up to keep_alive_max_count_ requests, each within keep_alive_timeout_sec_ of the
  // previous answer, while the server runs.
  for (size_t left = keep_alive_max_count_; left > 0 && svr_sock_ != INVALID_SOCKET; --left) {
    if (PollFor(sock, POLLIN, static_cast<int>(keep_alive_timeout_sec_ * 1000)) <= 0) break;
    state = ConnectionState{};
    bool closed = false;
    size_t moved = 0;
    {
      GuardedStream strm(sock, limits_, read_ms, write_ms, &state);
      ret = process_request(strm, left == 1, closed, nullptr);
      moved = strm.moved();
    }
#if defined(__GLIBC__)
    // Counted over all connections: many smaller requests at once free as much as one large one.
    static std::atomic<size_t> untrimmed{0};
    if (untrimmed.fetch_add(moved) + moved >= (1u << 20)) {
      untrimmed.store(0);
      malloc_trim(0);
    }
#endif
    if (state.refusal != ReadRefusal::kNone) {
      // The rest of the head may still be on its way: drain it so that the answer arrives. A
      // client that stalled is not waited for.
      if (state.refusal != ReadRefusal::kTimedOut) LingeringDrain(sock);
      ret = false;
      break;
    }
    if (!ret || closed) break;
  }
  tls_connection = nullptr;
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ret;
}

}  // namespace g4::server
