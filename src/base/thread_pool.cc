#include "base/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <exception>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define G4_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define G4_CPU_RELAX() asm volatile("yield")
#else
#define G4_CPU_RELAX() std::this_thread::yield()
#endif

namespace g4 {

int ResolveThreadCount(int requested) {
  return requested >= 1 ? requested : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

ThreadPool::ThreadPool(int threads) : slots_(new Slot[std::max(1, threads)]) {
  try {
    for (int i = 1; i < std::max(1, threads); ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
  } catch (...) {
    // A worker that cannot start (std::system_error: out of memory or threads, e.g. under
    // `ulimit -v`): the ones started are stopped and joined before the exception leaves, since no
    // destructor runs for a constructor that throws (found by a fresh user: `generate -t 16` under
    // a tight limit hung or called std::terminate).
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_.store(true);
    }
    start_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
    throw;
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

namespace {
constexpr uint64_t kField = (uint64_t{1} << 20) - 1;
inline uint64_t GenOf(uint64_t s) { return s >> 40; }
inline int64_t ChunksOf(uint64_t s) { return static_cast<int64_t>((s >> 20) & kField); }
// A slot word: [generation | back | front].
inline int64_t BackOf(uint64_t w) { return static_cast<int64_t>((w >> 20) & kField); }
inline int64_t FrontOf(uint64_t w) { return static_cast<int64_t>(w & kField); }
inline uint64_t SlotWord(uint64_t gen, int64_t front, int64_t back) {
  return gen << 40 | static_cast<uint64_t>(back) << 20 | static_cast<uint64_t>(front);
}

// Spins until pred() or `micros` have passed; returns pred().
template <class Pred>
bool SpinFor(int micros, Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(micros);
  for (int i = 0;; ++i) {
    if (pred()) return true;
    G4_CPU_RELAX();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) return pred();
  }
}
}  // namespace

int64_t ThreadPool::ChunksFor(int64_t n) const {
  return std::min<int64_t>(n, static_cast<int64_t>(kChunksPerThread) * size());
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int, int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (size() == 1 || n == 1) {
    fn(0, 0, n);
    return;
  }
  const int64_t chunks = ChunksFor(n);
  job_ = &fn;
  job_n_ = n;
  done_.store(0, std::memory_order_relaxed);
  NextGeneration();
  for (int t = 0; t < size(); ++t)
    slots_[t].word.store(SlotWord(generation_, FirstChunkOf(t, chunks), FirstChunkOf(t + 1, chunks)),
                         std::memory_order_relaxed);
  const uint64_t s = generation_ << 40 | static_cast<uint64_t>(chunks) << 20;
  state_.store(s);  // seq_cst: publishes the job and the slots; pairs with sleepers_ below (Dekker)
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    start_cv_.notify_all();
  }
  RunChunks(0, s);
  if (!SpinFor(kSpinMicros, [&] { return done_.load(std::memory_order_acquire) == chunks; })) {
    std::unique_lock<std::mutex> lock(mu_);
    caller_sleeping_.store(true);
    done_cv_.wait(lock, [&] { return done_.load() == chunks; });
    caller_sleeping_.store(false);
  }
  job_ = nullptr;
  // A chunk that threw (on any thread) ends the loop with its exception, on the caller's thread,
  // once every chunk is done: the job's fn outlives its last use (found by a reviewer: a
  // std::bad_alloc on a worker called std::terminate).
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    error.swap(error_);
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::PrefetchHint(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (size() == 1 || sleepers_.load() > 0) return;
  hint_a_.store(static_cast<const char*>(a), std::memory_order_relaxed);
  hint_a_bytes_.store(a == nullptr ? 0 : a_bytes, std::memory_order_relaxed);
  hint_b_.store(static_cast<const char*>(b), std::memory_order_relaxed);
  hint_b_bytes_.store(b == nullptr ? 0 : b_bytes, std::memory_order_relaxed);
  NextGeneration();
  state_.store(generation_ << 40);  // chunks 0: a hint
}

void ThreadPool::RunHint(uint64_t s) {
  constexpr size_t kStep = 4096;
  // Addresses as integers: a hint's range need not be an object (a prefetch never faults).
  const uintptr_t p[2] = {reinterpret_cast<uintptr_t>(hint_a_.load(std::memory_order_relaxed)),
                          reinterpret_cast<uintptr_t>(hint_b_.load(std::memory_order_relaxed))};
  const size_t n[2] = {hint_a_bytes_.load(std::memory_order_relaxed), hint_b_bytes_.load(std::memory_order_relaxed)};
  for (size_t off = 0; off < std::max(n[0], n[1]); off += kStep) {
    // Stop at the next loop (or hint), or the pool's end.
    if (GenOf(state_.load(std::memory_order_relaxed)) != GenOf(s) || stop_.load(std::memory_order_relaxed)) break;
    uint64_t lines = 0;
    for (int r = 0; r < 2; ++r) {
      for (size_t o = off; o < std::min(n[r], off + kStep); o += 64) {
#if defined(__GNUC__)
        __builtin_prefetch(reinterpret_cast<const void*>(p[r] + o), 0, 2);  // into L2 (prefetcht1 on x86)
#endif
        ++lines;
      }
    }
    hint_lines_.fetch_add(lines, std::memory_order_relaxed);
  }
}

void ThreadPool::RunChunks(int index, uint64_t s) {
  const uint64_t gen = GenOf(s);
  const int threads = size();
  // Victim v = index: own run, from the front; then the others in turn, from the back.
  for (int k = 0; k < threads; ++k) {
    const int v = (index + k) % threads;
    std::atomic<uint64_t>& slot = slots_[v].word;
    uint64_t w = slot.load(std::memory_order_acquire);
    for (;;) {
      if (GenOf(w) != gen) return;  // a newer job: the worker loop picks it up
      const int64_t front = FrontOf(w), back = BackOf(w);
      if (front >= back) break;
      const int64_t c = k == 0 ? front : back - 1;
      const uint64_t next = k == 0 ? SlotWord(gen, front + 1, back) : SlotWord(gen, front, back - 1);
      if (!slot.compare_exchange_weak(w, next, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      // Chunk c of the current job is ours: the caller cannot return (and job_, job_n_ and state_
      // cannot change) before it is done. Its chunk count from state_ (acquire: job_ and job_n_
      // as the caller wrote them), not from `s`: see the header on the generation wrapping.
      const int64_t chunks = ChunksOf(state_.load(std::memory_order_acquire));
      const int64_t n = job_n_;
      try {
        (*job_)(index, n * c / chunks, n * (c + 1) / chunks);
      } catch (...) {  // kept for the caller (ParallelFor rethrows it); the chunk still counts as done
        std::lock_guard<std::mutex> lock(error_mu_);
        if (!error_) error_ = std::current_exception();
      }
      if (done_.fetch_add(1) + 1 == chunks && index != 0 && caller_sleeping_.load()) {
        std::lock_guard<std::mutex> lock(mu_);
        done_cv_.notify_one();
      }
      w = slot.load(std::memory_order_acquire);
    }
  }
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;  // the generation before the first job (not state_: a job may already be out)
  for (;;) {
    auto fresh = [&] { return stop_.load(std::memory_order_relaxed) || GenOf(state_.load(std::memory_order_acquire)) != seen; };
    if (!SpinFor(kSpinMicros, fresh)) {
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1);
      start_cv_.wait(lock, [&] { return stop_.load() || GenOf(state_.load()) != seen; });
      sleepers_.fetch_sub(1);
    }
    if (stop_.load()) return;
    const uint64_t s = state_.load(std::memory_order_acquire);
    seen = GenOf(s);
    if (ChunksOf(s) == 0) {
      if (index == 1) RunHint(s);
      continue;
    }
    RunChunks(index, s);
  }
}

}  // namespace g4
