// ThreadPool: a fixed set of worker threads for data-parallel loops. Passed in explicitly to
// whatever needs it (backends); there is no global pool.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace g4 {

// The thread count a --threads value stands for: `requested` itself when >= 1; 0 (or less) = all
// cores, std::thread::hardware_concurrency(), at least 1 (it may report 0).
int ResolveThreadCount(int requested);

class ThreadPool {
 public:
  // threads >= 1: the calling thread counts as one, so threads - 1 workers are started.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(task, begin, end) over [0, n), split into up to kChunksPerThread * size() contiguous
  // chunks. Each thread owns an equal run of consecutive chunks (task t the t-th run; the calling
  // thread is task 0) and claims its own from the front, so it streams through one contiguous
  // range of [0, n); a thread whose run is used up takes chunks from the back of the others' runs.
  // So a thread the OS has descheduled holds up the loop by at most the chunk it is in, never by
  // work it has not started. task in [0, size()) identifies the thread running the chunk (for
  // per-thread scratch; one thread may run several chunks, one at a time). Blocks until every
  // chunk is done. Not reentrant: fn must not call ParallelFor on the same pool. If fn throws (on
  // any thread), the other chunks still run and ParallelFor then rethrows the first exception.
  //
  // Why owned runs: E2B decode streams each weight matrix once per token. A plain read of 35
  // layers' matrices (697 MB, 2 threads, gemma4rt_sweep) took 23.5 ms per step with the chunks
  // handed out in turn (each thread jumping between 16 separate pieces, each a new stream to
  // prefetch) and 20.4 ms with each thread reading one contiguous half. The matmul kernels on
  // the same weights, owned runs against chunks in turn, alternating in one process: 1.08x as
  // fast for Q4_0x4, 1.03x for Q4_K and Q6_K (whose kernels prefetch the start of each range).
  void ParallelFor(int64_t n, const std::function<void(int task, int64_t begin, int64_t end)>& fn);

  // A read-ahead hint for the time between loops (decode's serial steps: norms, attention, the
  // quantisation of a matmul's input): worker 1 prefetches the 64-byte lines of [a, a + a_bytes)
  // and [b, b + b_bytes) into its L2 cache, 4 KiB of each in turn, until both are done or the
  // next ParallelFor or PrefetchHint is called. Returns at once; reads nothing itself (any
  // addresses are allowed: a prefetch never faults). Nothing happens with one thread, or while a
  // worker sleeps (waking it would cost the caller more than the hint saves). Meant for the start
  // of worker 1's run of the next loop's weights (FirstChunkOf(1, ...)), which it then reads
  // from its cache.
  void PrefetchHint(const void* a, size_t a_bytes, const void* b = nullptr, size_t b_bytes = 0);
  // Lines worker 1 has prefetched for hints so far (in 4 KiB steps; for tests).
  uint64_t HintLinesForTest() const { return hint_lines_.load(std::memory_order_relaxed); }

  // The chunks a loop of n >= 2 is split into on a pool of size() >= 2 (ParallelFor runs smaller
  // loops, and every loop of a one-thread pool, as one call on the caller), and the first chunk of
  // task t's run: chunk c covers [n * c / chunks, n * (c + 1) / chunks), and task t's run is
  // chunks [FirstChunkOf(t, chunks), FirstChunkOf(t + 1, chunks)) (FirstChunkOf(size(), chunks)
  // == chunks).
  int64_t ChunksFor(int64_t n) const;
  int64_t FirstChunkOf(int task, int64_t chunks) const { return chunks * task / size(); }

  // 16: a loop's last chunk is short enough that the thread finishing first rarely waits long for
  // the other. E2B Q4_0 decode, 2 threads, 200 tokens (55888 loops), with chunks handed out in
  // turn: the caller waited at the end of loops for 0.26-0.34 s at 4 chunks per thread, 0.31 at
  // 8, 0.15-0.18 at 16, 0.10-0.12 at 32; pp512 was the same or faster (75.6-78.2 t/s at 4,
  // 77.8-81.5 at 16). With owned runs, gemma4rt_sweep's E2B matmuls took the same time at 16,
  // 32 and 64 (Q4_0x4 25.1-25.6 ms per step; Q4_K and Q6_K 2-10% slower at 64).
  static constexpr int kChunksPerThread = 16;

 private:
  void WorkerLoop(int index);
  // Claims and runs chunks of the job whose state word is `s` (as loaded): first from the front
  // of thread `index`'s own run, then from the back of the others', until none are left or a
  // newer job has replaced it.
  void RunChunks(int index, uint64_t s);
  // Worker 1's part of a hint published as state word `s` (chunks 0).
  void RunHint(uint64_t s);
  // Advances generation_ (24 bits, wrapping) for a new job or hint.
  void NextGeneration() { generation_ = (generation_ + 1) & ((uint64_t{1} << 24) - 1); }

  // Hand-off: ParallelFor writes each thread's run into its slot, [generation: 24 bits | back: 20
  // bits | front: 20 bits] (chunks [front, back) unclaimed), then publishes the job in state_ =
  // [generation | chunks: 20 bits] (chunks 0: a PrefetchHint, whose ranges are in hint_a_ ..
  // hint_b_bytes_). A chunk is claimed by a compare-exchange of a whole slot word (front + 1 by
  // the owner, back - 1 by another thread), so a claim can only succeed for the job that is
  // current (or, after the 24-bit generation has wrapped under a thread stalled between its load
  // and its compare-exchange, for a current job whose slot word happens to be the same: so the
  // chunk count and job are read from state_ after the claim, never from the word loaded before
  // it), whose fields are then stable until its chunks are all done. Workers spin on a
  // new generation for up to kSpinMicros after their last job (decode runs a few hundred short
  // parallel loops per token, and a futex wake-up costs tens of microseconds), then sleep on
  // start_cv_. The caller spins on done_ the same way. sleepers_ tells ParallelFor whether to
  // notify.
  static constexpr int kSpinMicros = 500;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int, int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  uint64_t generation_ = 0;  // the caller's; state_ carries its low 24 bits
  std::atomic<uint64_t> state_{0};
  struct alignas(64) Slot {
    std::atomic<uint64_t> word{0};
  };
  std::unique_ptr<Slot[]> slots_;  // one per thread, each on its own cache line
  // The latest hint's ranges (atomics: a new hint may be written while worker 1 reads the last;
  // it then prefetches a mix of the two until it sees the newer generation).
  std::atomic<const char*> hint_a_{nullptr}, hint_b_{nullptr};
  std::atomic<size_t> hint_a_bytes_{0}, hint_b_bytes_{0};
  alignas(64) std::atomic<uint64_t> hint_lines_{0};  // written by worker 1 only: a line of its own
  std::atomic<int> done_{0};  // chunks of the current job finished
  std::mutex error_mu_;
  std::exception_ptr error_;  // the first exception a chunk of the current job threw
  std::atomic<int> sleepers_{0};
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> stop_{false};
};

}  // namespace g4
