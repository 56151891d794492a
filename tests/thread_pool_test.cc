// ThreadPool: every index of every loop runs exactly once, in both hand-off modes (workers still
// spinning from the previous loop, and workers asleep after a pause longer than the spin).
#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace g4 {
namespace {

void CheckLoop(ThreadPool& pool, int64_t n) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::atomic<int> calls{0};
  pool.ParallelFor(n, [&](int task, int64_t b, int64_t e) {
    ASSERT_GE(task, 0);
    ASSERT_LT(task, pool.size());
    calls.fetch_add(1);
    for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n=" << n << " i=" << i;
  EXPECT_LE(calls.load(), std::min<int64_t>(n, pool.size()));
}

TEST(ThreadPoolTest, BackToBackLoopsOfEverySizeCoverEachIndexOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int rep = 0; rep < 300; ++rep) CheckLoop(pool, 1 + rep % 9);  // n below and above size()
    CheckLoop(pool, 100000);
  }
}

TEST(ThreadPoolTest, LoopsAfterTheWorkersFellAsleep) {
  ThreadPool pool(3);
  for (int rep = 0; rep < 5; ++rep) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));  // longer than the spin
    CheckLoop(pool, 7);
    CheckLoop(pool, 2);
  }
}

TEST(ThreadPoolTest, SlowWorkerMakesTheCallerWait) {
  ThreadPool pool(2);
  std::atomic<bool> done{false};
  pool.ParallelFor(2, [&](int task, int64_t, int64_t) {
    if (task == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // past the caller's spin
      done.store(true);
    }
  });
  EXPECT_TRUE(done.load());
}

}  // namespace
}  // namespace g4
