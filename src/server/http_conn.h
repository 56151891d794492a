// The HTTP server's connection layer: cpp-httplib's Server with its connections read through a
// stream of our own, which bounds each request's head (count and bytes of header fields, the
// length of a line), notes a client that stalls mid-request (the read timeout), and hands freed
// memory back to the system after a request that moved many bytes. cpp-httplib 0.11 (Debian 12)
// has no limit on the number of header fields or their total size: 400,000 fields (43 MiB) were
// read and kept, bypassing the body limit, and the memory stayed with the process.
#pragma once

#include <cstddef>
#include <string>

#include <httplib.h>

namespace g4::server {

struct HeadLimits {
  size_t max_fields = 100;        // header fields (Apache's LimitRequestFields default)
  size_t max_bytes = 64u << 10;   // request line and header fields together, CRLFs included
  size_t max_line = CPPHTTPLIB_HEADER_MAX_LENGTH;             // one header field line (httplib: 400 past it)
  size_t max_request_line = CPPHTTPLIB_REQUEST_URI_MAX_LENGTH;  // the request line (httplib: 414 past it)
  size_t max_body_line = 4096;    // a chunked body's chunk-size line (extensions included) or trailer line
};

// Why the request being read on this thread could not be read in full.
enum class ReadRefusal {
  kNone,
  kHeadTooLarge,        // over a HeadLimits bound (431); the message says which
  kRequestLineTooLong,  // over max_request_line: httplib answers 414
  kTimedOut,            // the client sent nothing for the read timeout mid-request (408)
  kBodyLineTooLong,     // a chunked body's size or trailer line over max_body_line (400)
};

// The refusal of the request this worker thread is serving (kNone outside a connection), and a
// message for the client in *message (may be null). For the error handler and content readers,
// which httplib calls on the thread that reads the connection.
ReadRefusal CurrentRefusal(std::string* message = nullptr);

// Reads and drops what the peer of connected socket `fd` still sends, after sending our FIN,
// until it closes, 1 MiB has been dropped or 2 s have passed (a "lingering close"): closing a
// socket with unread bytes sends a reset, which may destroy the response still in flight.
void LingeringDrain(int fd);

class GuardedServer : public httplib::Server {
 public:
  explicit GuardedServer(HeadLimits limits = {}) : limits_(limits) {}

 private:
  // httplib's keep-alive loop (Server::process_and_close_socket) with our stream: after a
  // refused request the connection is drained and closed; once requests have read or written
  // 1 MiB since the last time, malloc_trim returns the freed memory of every malloc arena to the system
  // (each worker thread allocates from its own arena, which glibc otherwise keeps).
  bool process_and_close_socket(socket_t sock) override;

  HeadLimits limits_;
};

}  // namespace g4::server
