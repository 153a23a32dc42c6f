// The HTTP server's worker threads: made on demand up to a cap, reused most recently idle
// first, and ended after an idle timeout or a number of jobs. docs/design.md, "Server", says why (resident
// memory stays flat under a long soak instead of growing with every thread ever woken).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace pagellm::server {

/// A thread pool whose size follows the load. A job goes to the worker that went idle last
/// (so a steady load keeps using the same few warm threads, and the rest stay cold and end);
/// with none idle a new worker starts if fewer than `max_threads` live, otherwise the job
/// waits in a FIFO queue for the next worker to finish. A worker idle for `idle_timeout`
/// ends, and so does one that has run `max_jobs` jobs (when no job is queued): an ended
/// thread gives back its stack pages and its allocator cache (glibc's tcache, which a
/// long-lived thread fills a little more with every new allocation size it meets).
/// Thread-safe; enqueue() after shutdown() is refused.
class WorkerPool {
 public:
  /// What a pool holds at one moment, for tests and metrics.
  struct Counts {
    size_t live = 0;        // started and not ended
    size_t idle = 0;        // live and waiting for a job
    size_t queued = 0;      // jobs waiting for a worker
    size_t started = 0;     // workers ever started
    size_t peak_live = 0;   // most live at once
  };

  /// `max_threads` >= 1; `idle_timeout` > 0; `max_jobs` 0: no limit.
  WorkerPool(size_t max_threads, std::chrono::milliseconds idle_timeout, size_t max_jobs = 0);
  /// Calls shutdown().
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  /// Runs `job` on a worker. Throws pagellm::Error after shutdown(). A job must not throw
  /// (one that does ends the process, as an exception leaving any thread does).
  void enqueue(std::function<void()> job);
  /// Runs the queued jobs, then ends and joins every worker. Idempotent.
  void shutdown();
  Counts counts() const;

 private:
  struct Worker;
  void work(Worker& self);
  /// Moves `self` to retired_ (under mu_): a thread cannot join itself.
  void retire(Worker& self);
  /// Joins the workers that ended (idle timeout or job count). Called without the lock held.
  void join_retired();

  const size_t max_threads_;
  const std::chrono::milliseconds idle_timeout_;
  const size_t max_jobs_;
  mutable std::mutex mu_;
  std::list<std::unique_ptr<Worker>> live_;     // owns every live worker
  std::vector<Worker*> idle_;                   // the most recently idle at the back
  std::deque<std::function<void()>> queue_;     // jobs no worker has taken yet
  std::vector<std::unique_ptr<Worker>> retired_;  // ended, not yet joined
  bool shutting_down_ = false;
  size_t started_ = 0;
  size_t peak_live_ = 0;
};

}  // namespace pagellm::server
