// The HTTP worker pool: grows on demand up to its cap, queues beyond it, hands work to the
// most recently idle thread (so a steady load keeps a fixed set of warm threads), ends
// threads idle past the timeout, and drains its queue on shutdown.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "pagellm/error.h"
#include "pagellm/server/worker_pool.h"

namespace pagellm::server {
namespace {

using namespace std::chrono_literals;

/// Polls `pred` until it holds or 10 s pass.
template <class Pred>
bool eventually(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

/// A gate jobs wait at until it opens.
class Gate {
 public:
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return open_; });
  }
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

TEST(WorkerPool, GrowsToItsCapThenQueues) {
  WorkerPool pool(4, 10s);
  EXPECT_EQ(pool.counts().live, 0u);  // no thread until there is work
  Gate gate;
  std::atomic<int> ran{0};
  for (int i = 0; i < 10; ++i) {
    pool.enqueue([&] {
      gate.wait();
      ++ran;
    });
  }
  WorkerPool::Counts c = pool.counts();
  EXPECT_EQ(c.live, 4u);
  EXPECT_EQ(c.queued, 6u);
  gate.open();
  ASSERT_TRUE(eventually([&] { return ran == 10 && pool.counts().idle == 4; }));
  c = pool.counts();
  EXPECT_EQ(c.started, 4u);
  EXPECT_EQ(c.peak_live, 4u);
  EXPECT_EQ(c.queued, 0u);
}

TEST(WorkerPool, ReusesTheMostRecentlyIdleThread) {
  WorkerPool pool(16, 10s);
  // Eight threads made busy at once, then all idle.
  Gate gate;
  for (int i = 0; i < 8; ++i) pool.enqueue([&] { gate.wait(); });
  gate.open();
  ASSERT_TRUE(eventually([&] { return pool.counts().idle == 8; }));
  // One job at a time after that: every one runs on the same thread, the one that went
  // idle last, and no thread is started.
  std::mutex mu;
  std::set<std::thread::id> used;
  for (int i = 0; i < 50; ++i) {
    std::atomic<bool> done{false};
    pool.enqueue([&] {
      std::lock_guard<std::mutex> lock(mu);
      used.insert(std::this_thread::get_id());
      done = true;
    });
    ASSERT_TRUE(eventually([&] { return done && pool.counts().idle == 8; }));
  }
  EXPECT_EQ(used.size(), 1u);
  EXPECT_EQ(pool.counts().started, 8u);
}

TEST(WorkerPool, EndsIdleThreadsAndStartsNewOnesLater) {
  WorkerPool pool(8, 30ms);
  Gate gate;
  for (int i = 0; i < 6; ++i) pool.enqueue([&] { gate.wait(); });
  EXPECT_EQ(pool.counts().live, 6u);
  gate.open();
  ASSERT_TRUE(eventually([&] { return pool.counts().live == 0; }));
  std::atomic<bool> done{false};
  pool.enqueue([&] { done = true; });
  ASSERT_TRUE(eventually([&] { return done.load(); }));
  EXPECT_EQ(pool.counts().started, 7u);
}

TEST(WorkerPool, EndsAThreadAfterItsJobCount) {
  WorkerPool pool(4, 10s, 5);
  // How many jobs the running thread has run, itself included (fresh in a new thread;
  // thread ids cannot tell threads apart, as the system reuses them).
  static thread_local int jobs_on_this_thread = 0;
  std::mutex mu;
  std::vector<int> seen;
  for (int i = 0; i < 12; ++i) {
    std::atomic<bool> done{false};
    pool.enqueue([&] {
      std::lock_guard<std::mutex> lock(mu);
      seen.push_back(++jobs_on_this_thread);
      done = true;
    });
    // Wait until the worker is idle again or has ended, so each job finds the pool settled.
    ASSERT_TRUE(eventually([&] {
      const WorkerPool::Counts c = pool.counts();
      return done && c.idle == c.live;
    }));
  }
  // One job at a time: a thread runs five, then ends and a fresh one takes over.
  EXPECT_EQ(seen, (std::vector<int>{1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2}));
  EXPECT_EQ(pool.counts().started, 3u);
  EXPECT_EQ(pool.counts().live, 1u);
}

TEST(WorkerPool, ShutdownRunsQueuedJobsThenRefusesWork) {
  WorkerPool pool(1, 10s);
  std::atomic<int> ran{0};
  for (int i = 0; i < 20; ++i) {
    pool.enqueue([&] {
      std::this_thread::sleep_for(1ms);
      ++ran;
    });
  }
  pool.shutdown();
  EXPECT_EQ(ran, 20);
  EXPECT_EQ(pool.counts().live, 0u);
  try {
    pool.enqueue([] {});
    FAIL() << "enqueue after shutdown was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("after shutdown"), std::string::npos) << e.what();
  }
  pool.shutdown();  // idempotent
}

TEST(WorkerPool, RefusesBadSettings) {
  EXPECT_THROW(WorkerPool(0, 1s), Error);
  EXPECT_THROW(WorkerPool(4, 0ms), Error);
}

// Many producers, jobs of mixed length and an idle timeout short enough that threads end
// while others are handed work: every job runs exactly once, the cap holds. (ThreadSanitizer
// runs this too: server_threadsanitizer.)
TEST(WorkerPool, ConcurrentProducersWithThreadsEnding) {
  WorkerPool pool(6, 2ms);
  std::atomic<int> ran{0};
  std::vector<std::thread> producers;
  for (int p = 0; p < 4; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < 300; ++i) {
        pool.enqueue([&, i] {
          if (i % 7 == 0) std::this_thread::sleep_for(200us);
          ++ran;
        });
        if ((i + p) % 50 == 0) std::this_thread::sleep_for(5ms);  // let threads time out
      }
    });
  }
  for (std::thread& t : producers) t.join();
  ASSERT_TRUE(eventually([&] { return ran == 1200; }));
  const WorkerPool::Counts c = pool.counts();
  EXPECT_LE(c.peak_live, 6u);
  EXPECT_GT(c.started, c.peak_live);  // some threads ended and others started later
  pool.shutdown();
  EXPECT_EQ(ran, 1200);
}

}  // namespace
}  // namespace pagellm::server
