// ThreadPool: a fixed set of worker threads for data-parallel loops. Passed in explicitly to
// whatever needs it (backends); there is no global pool.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace g4 {

class ThreadPool {
 public:
  // threads >= 1: the calling thread counts as one, so threads - 1 workers are started.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(task, begin, end) over [0, n) split into size() contiguous ranges (fewer when n is
  // small), task in [0, size()) identifies the range (for per-thread scratch). Blocks until all
  // ranges are done. Not reentrant: fn must not call ParallelFor on the same pool.
  void ParallelFor(int64_t n, const std::function<void(int task, int64_t begin, int64_t end)>& fn);

 private:
  void WorkerLoop(int index);

  // Hand-off: ParallelFor publishes the job and bumps generation_; workers spin on generation_
  // for up to kSpinMicros after their last job (decode runs a few hundred short parallel loops
  // per token, and a futex wake-up costs tens of microseconds), then sleep on start_cv_. The
  // caller spins on pending_ the same way. sleepers_ tells ParallelFor whether to notify.
  static constexpr int kSpinMicros = 500;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int, int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int tasks_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> stop_{false};
};

}  // namespace g4
