#include "pagellm/server/worker_pool.h"

#include <algorithm>
#include <system_error>

#include "pagellm/common/check.h"

namespace pagellm::server {

/// One thread. Its own condition variable lets enqueue() wake exactly the worker it picked
/// (one shared condition variable would wake an arbitrary waiter, and over time every
/// thread of the pool, which is what made the resident memory creep).
struct WorkerPool::Worker {
  std::condition_variable cv;
  std::function<void()> job;  // set by enqueue() (under mu_) when it picks this worker
  std::thread thread;
  std::list<std::unique_ptr<Worker>>::iterator self;  // where live_ holds it
};

WorkerPool::WorkerPool(size_t max_threads, std::chrono::milliseconds idle_timeout,
                       size_t max_jobs)
    : max_threads_(max_threads), idle_timeout_(idle_timeout), max_jobs_(max_jobs) {
  PAGELLM_CHECK(max_threads >= 1) << "worker pool: max_threads must be >= 1, got " << max_threads;
  PAGELLM_CHECK(idle_timeout.count() > 0)
      << "worker pool: the idle timeout must be > 0 ms, got " << idle_timeout.count();
}

WorkerPool::~WorkerPool() { shutdown(); }

void WorkerPool::enqueue(std::function<void()> job) {
  join_retired();
  std::lock_guard<std::mutex> lock(mu_);
  PAGELLM_CHECK(!shutting_down_) << "worker pool: enqueue after shutdown";
  if (!idle_.empty()) {
    Worker* w = idle_.back();
    idle_.pop_back();
    w->job = std::move(job);
    w->cv.notify_one();
    return;
  }
  if (live_.size() < max_threads_) {
    live_.push_back(std::make_unique<Worker>());
    Worker& w = *live_.back();
    w.self = std::prev(live_.end());
    w.job = std::move(job);
    try {
      // The worker reads w.job first without the lock: the thread's start orders it after
      // this write. It cannot retire (which moves w.thread) before taking mu_, held here.
      w.thread = std::thread([this, &w] { work(w); });
    } catch (const std::system_error& e) {
      // No thread to be had (a process or memory limit): the job waits for a live worker,
      // or, with none, the caller hears why.
      std::function<void()> orphan = std::move(w.job);
      live_.pop_back();
      PAGELLM_CHECK(!live_.empty())
          << "worker pool: cannot start a thread (" << e.what() << ") and none is running";
      queue_.push_back(std::move(orphan));
      return;
    }
    ++started_;
    peak_live_ = std::max(peak_live_, live_.size());
    return;
  }
  queue_.push_back(std::move(job));
}

void WorkerPool::work(Worker& self) {
  std::function<void()> job = std::move(self.job);
  self.job = nullptr;
  size_t jobs_run = 0;
  for (;;) {
    job();
    job = nullptr;  // the job's captures (a socket's state) go before the worker waits
    ++jobs_run;
    std::unique_lock<std::mutex> lock(mu_);
    if (!queue_.empty()) {
      job = std::move(queue_.front());
      queue_.pop_front();
      continue;
    }
    if (shutting_down_) return;  // shutdown() joins it
    if (max_jobs_ > 0 && jobs_run >= max_jobs_) {
      retire(self);  // a fresh thread takes its place on the next enqueue()
      return;
    }
    idle_.push_back(&self);
    self.cv.wait_for(lock, idle_timeout_, [&] { return self.job || shutting_down_; });
    if (self.job) {  // enqueue() took it off idle_
      job = std::move(self.job);
      self.job = nullptr;
      continue;
    }
    idle_.erase(std::find(idle_.begin(), idle_.end(), &self));
    if (shutting_down_) return;
    retire(self);  // idle too long
    return;
  }
}

void WorkerPool::retire(Worker& self) {
  // The next enqueue() or shutdown() joins it.
  retired_.push_back(std::move(*self.self));
  live_.erase(self.self);
}

void WorkerPool::join_retired() {
  std::vector<std::unique_ptr<Worker>> ended;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ended.swap(retired_);
  }
  for (const std::unique_ptr<Worker>& w : ended) w->thread.join();
}

void WorkerPool::shutdown() {
  std::vector<Worker*> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    for (Worker* w : idle_) w->cv.notify_one();
    // From here on live_ does not change: enqueue() is refused and workers no longer retire.
    for (const std::unique_ptr<Worker>& w : live_) live.push_back(w.get());
  }
  for (Worker* w : live) w->thread.join();
  join_retired();
  std::lock_guard<std::mutex> lock(mu_);
  idle_.clear();
  live_.clear();
}

WorkerPool::Counts WorkerPool::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  Counts c;
  c.live = live_.size();
  c.idle = idle_.size();
  c.queued = queue_.size();
  c.started = started_;
  c.peak_live = peak_live_;
  return c;
}

}  // namespace pagellm::server
