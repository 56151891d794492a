#include "base/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define G4_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define G4_CPU_RELAX() asm volatile("yield")
#else
#define G4_CPU_RELAX() std::this_thread::yield()
#endif

namespace g4 {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(1, threads); ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
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
inline void Range(int64_t n, int tasks, int task, int64_t* b, int64_t* e) {
  *b = n * task / tasks;
  *e = n * (task + 1) / tasks;
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

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int, int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int tasks = static_cast<int>(std::min<int64_t>(size(), n));
  if (tasks == 1) {
    fn(0, 0, n);
    return;
  }
  job_ = &fn;
  job_n_ = n;
  tasks_ = tasks;
  // Every worker acknowledges every job (those past `tasks` with an empty range), so no worker can
  // still be reading job_ when the next ParallelFor overwrites it.
  pending_.store(size() - 1);
  generation_.fetch_add(1);  // seq_cst: publishes the job; pairs with sleepers_ below (Dekker)
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    start_cv_.notify_all();
  }
  int64_t b, e;
  Range(n, tasks, 0, &b, &e);
  fn(0, b, e);
  if (!SpinFor(kSpinMicros, [this] { return pending_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock<std::mutex> lock(mu_);
    caller_sleeping_.store(true);
    done_cv_.wait(lock, [this] { return pending_.load() == 0; });
    caller_sleeping_.store(false);
  }
  job_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    auto fresh = [&] { return stop_.load(std::memory_order_relaxed) || generation_.load(std::memory_order_acquire) != seen; };
    if (!SpinFor(kSpinMicros, fresh)) {
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1);
      start_cv_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
      sleepers_.fetch_sub(1);
    }
    if (stop_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    const auto* job = job_;
    const int64_t n = job_n_;
    const int tasks = tasks_;
    if (index < tasks) {
      int64_t b, e;
      Range(n, tasks, index, &b, &e);
      (*job)(index, b, e);
    }
    if (pending_.fetch_sub(1) == 1 && caller_sleeping_.load()) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace g4
