// A small persistent thread pool for the native forward, independent of torch's OpenMP pool.
//
// Why not OpenMP: libgomp throttles its workers' spinning to ~100 iterations as soon as the
// process holds more OpenMP threads than CPUs, which happens whenever two threads have ever run
// a parallel region (the main thread that loaded the model, the engine thread that decodes).
// Every small parallel region then pays a futex wake-up, and a one-token forward on the bundled
// model took 47 ms instead of 25 (docs/BENCHMARKS.md). This pool's workers spin for a
// bounded time after each job and then sleep, whoever calls it.
//
// One job runs at a time: a caller that finds the pool busy (a second model in another thread)
// runs its job on its own thread instead of waiting, so two callers can never deadlock.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define DG_PAUSE() _mm_pause()
#else
#define DG_PAUSE() std::this_thread::yield()
#endif

namespace dg {

// A spinning barrier for the threads of one job (they are all awake while the job runs).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    if (n_ == 1) return;
    int gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
      count_.store(0, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_acq_rel);
      return;
    }
    while (gen_.load(std::memory_order_acquire) == gen) DG_PAUSE();
  }

 private:
  int n_;
  alignas(64) std::atomic<int> count_{0};
  alignas(64) std::atomic<int> gen_{0};
};

class Pool {
 public:
  using Job = std::function<void(int tid, int nthreads)>;

  explicit Pool(int nthreads, int spin_us) : n_(nthreads < 1 ? 1 : nthreads), spin_us_(spin_us) {
    for (int t = 1; t < n_; t++) workers_.emplace_back([this, t] { worker(t); });
  }
  ~Pool() {
    quit_.store(true);
    {
      std::lock_guard<std::mutex> g(sleep_mu_);
      epoch_.fetch_add(1);
    }
    sleep_cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  int size() const { return n_; }

  // Run job(tid, n) on every thread of the pool (the caller is tid 0) and wait for all.
  void run(const Job& job) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock() || n_ == 1) {
      job(0, 1);  // pool in use by another caller: do the whole job here
      return;
    }
    job_ = &job;
    pending_.store(n_ - 1, std::memory_order_release);
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> g(sleep_mu_);
      sleep_cv_.notify_all();
    }
    job(0, n_);
    while (pending_.load(std::memory_order_acquire) != 0) DG_PAUSE();
    job_ = nullptr;
  }

 private:
  void worker(int tid) {
    unsigned seen = 0;
    for (;;) {
      unsigned e = wait_for_epoch(seen);
      if (quit_.load()) return;
      seen = e;
      (*job_)(tid, n_);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  unsigned wait_for_epoch(unsigned seen) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0;; i++) {
      unsigned e = epoch_.load(std::memory_order_acquire);
      if (e != seen) return e;
      DG_PAUSE();
      if ((i & 255) == 255 && std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(spin_us_)) break;
    }
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    std::unique_lock<std::mutex> g(sleep_mu_);
    sleep_cv_.wait(g, [&] { return epoch_.load(std::memory_order_seq_cst) != seen; });
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    return epoch_.load(std::memory_order_acquire);
  }

  int n_;
  int spin_us_;
  std::vector<std::thread> workers_;
  std::mutex busy_;
  const Job* job_ = nullptr;
  alignas(64) std::atomic<unsigned> epoch_{0};
  alignas(64) std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> quit_{false};
  std::mutex sleep_mu_;
  std::condition_variable sleep_cv_;
};

// The process's pool: one thread per CPU until set_pool sizes it (dg_set_threads).
inline std::mutex g_pool_mu;
inline std::unique_ptr<Pool> g_pool;

static inline Pool& pool() {
  std::lock_guard<std::mutex> g(g_pool_mu);
  if (!g_pool) g_pool.reset(new Pool(int(std::thread::hardware_concurrency()), 200));
  return *g_pool;
}

static inline void set_pool(int nthreads, int spin_us) {
  std::lock_guard<std::mutex> g(g_pool_mu);
  g_pool.reset(new Pool(nthreads, spin_us));
}

}  // namespace dg
