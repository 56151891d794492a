#include "base/thread_pool.h"

#include <algorithm>

namespace g4 {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(1, threads); ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

namespace {
inline void Range(int64_t n, int tasks, int task, int64_t* b, int64_t* e) {
  *b = n * task / tasks;
  *e = n * (task + 1) / tasks;
}
}  // namespace

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int, int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int tasks = static_cast<int>(std::min<int64_t>(size(), n));
  if (tasks == 1) {
    fn(0, 0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    tasks_ = tasks;
    pending_ = tasks - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  int64_t b, e;
  Range(n, tasks, 0, &b, &e);
  fn(0, b, e);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int, int64_t, int64_t)>* job;
    int64_t n;
    int tasks;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      tasks = tasks_;
    }
    if (index < tasks) {
      int64_t b, e;
      Range(n, tasks, index, &b, &e);
      (*job)(index, b, e);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

}  // namespace g4
