#include "server/http_server.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include <sys/socket.h>

#include "server/http_internal.h"

namespace g4::server {
namespace {

using Clock = std::chrono::steady_clock;

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
// not the process.
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
  // that /metrics does not count a client's timeout as a 503 the server gave. A shutdown's cancel
  // is the 503.
  if (fin.finish_reason == "cancelled")
    return SetError(res, client_gone ? ErrorForStatus(499, "the request was cancelled (the client disconnected)")
                                     : ErrorForStatus(503, "the request was cancelled (server shutting down)"));
  SetJson(res, CompletionResponseJson(meta, result));
}

namespace {
// httplib's task queue (one worker thread per connection being served) with the threads started
// as connections need them, up to `max`, and kept once started: httplib's ThreadPool starts all of
// them at once, and the 512 or more that `serve` allows (DefaultHttpThreads) would hold their
// stacks and thread state while idle. The same queue otherwise: jobs run in arrival order,
// shutdown runs the queued ones and joins.
class GrowingThreadPool : public httplib::TaskQueue {
 public:
  explicit GrowingThreadPool(size_t max_threads) : max_threads_(std::max<size_t>(1, max_threads)) {}
  ~GrowingThreadPool() override { shutdown(); }

  // Runs on httplib's listening thread, where an exception would end the process: a thread that
  // cannot start (out of memory or the process's thread limit, std::system_error) leaves the job
  // to the running threads; with none running, or when the job cannot even be queued, the
  // connection is served here, holding up new connections for its duration but never aborting
  // (a burst of connections under `ulimit -v` must not call std::terminate).
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
  // clients: one that sent part of a request would hold shutdown for the read timeout. Nothing such
  // a client sent has reached a handler, so their connections are shut down: after half a second
  // (a handler that has returned still has its response written by httplib: a cancelled
  // non-streaming request's 503 goes out after it leaves `inflight`), then again every 20 ms until the workers are
  // joined: a connection accepted just before the listening socket closed may reach
  // /proc/self/fd after a pass.
  if (!m.thread.joinable()) return;
  std::future<void> joined;
  try {
    joined = std::async(std::launch::async, [&m] { m.thread.join(); });
  } catch (...) {
    // No thread to join with (out of memory or threads: std::system_error, e.g. under `ulimit -v`;
    // the listener thread must not be destroyed unjoined: std::terminate).
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
