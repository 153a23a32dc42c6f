// The tensor-parallel watchdog (docs/design.md, "Tensor parallelism"): PeerWatchdog reports
// the first connection whose peer ends, once, and never for data the peer sends; stopped, it
// reports nothing and keeps no connection open. TpLeader's watchdog over real worker
// processes aborts rank 0's communicator when a worker is killed, naming the rank, and the
// group fails from then on.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/expect_error.h"
#include "pagellm/backend/communicator.h"
#include "pagellm/engine/peer_watchdog.h"
#include "pagellm/engine/tp_leader.h"

namespace pagellm {
namespace {

struct SocketPairs {
  explicit SocketPairs(int n) {
    for (int i = 0; i < n; ++i) {
      int fds[2];
      EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
      ours.push_back(fds[0]);
      peers.push_back(fds[1]);
    }
  }
  ~SocketPairs() {
    for (int fd : ours) if (fd >= 0) ::close(fd);
    for (int fd : peers) if (fd >= 0) ::close(fd);
  }
  std::vector<int> ours, peers;
};

// Waits up to 5 s for `done`.
template <class Fn>
bool eventually(Fn done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

TEST(PeerWatchdog, ThePeerThatEndsIsReportedOnceAndDataIsNot) {
  SocketPairs s(3);
  std::mutex mu;
  std::vector<size_t> lost;
  PeerWatchdog dog(s.ours, [&](size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    lost.push_back(i);
  });
  // A peer that sends data is alive: nothing is reported, and the data stays unread.
  ASSERT_EQ(::write(s.peers[1], "abc", 3), 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(lost.empty());
  }
  ::close(s.peers[2]);
  s.peers[2] = -1;
  ASSERT_TRUE(eventually([&] {
    std::lock_guard<std::mutex> lock(mu);
    return !lost.empty();
  }));
  ::close(s.peers[0]);  // after the first loss the watchdog has stopped watching
  s.peers[0] = -1;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  dog.stop();
  EXPECT_EQ(lost, std::vector<size_t>{2});
  char buf[4] = {};
  EXPECT_EQ(::read(s.ours[1], buf, 3), 3) << "the watchdog read the peer's data";
  EXPECT_EQ(std::string(buf), "abc");
}

TEST(PeerWatchdog, StoppedItReportsNothingAndHoldsNoConnectionOpen) {
  SocketPairs s(2);
  std::atomic<int> calls{0};
  PeerWatchdog dog(s.ours, [&](size_t) { ++calls; });
  dog.stop();
  dog.stop();  // idempotent
  ::close(s.peers[0]);
  s.peers[0] = -1;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(calls.load(), 0);
  // Closing our end now gives the peer end of file: the watchdog's copies are closed.
  ::close(s.ours[1]);
  s.ours[1] = -1;
  char c = 0;
  EXPECT_EQ(::read(s.peers[1], &c, 1), 0);
}

// Records abort() as a device communicator would take it.
class RecordingCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void all_reduce_sum(Backend&, Tensor&) override {}
  void all_gather_columns(Backend&, const Tensor&, Tensor&) override {}
  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mu);
    reasons.push_back(reason);
  }
  std::mutex mu;
  std::vector<std::string> reasons;
};

TEST(TpLeaderWatchdog, AKilledWorkerAbortsRankZerosCommunicatorNamingTheRank) {
  ::setenv("PAGELLM_WORKER", PAGELLM_WORKER_PATH, 1);
  TpLeader::Options options;
  options.size = 2;
  RecordingCommunicator comm;
  {
    std::unique_ptr<TpLeader> leader = TpLeader::launch(options);
    leader->start_watchdog(&comm);
    leader->throw_if_failed();  // a live group
    const pid_t worker = leader->worker_pids().at(0);
    ASSERT_EQ(::kill(worker, SIGKILL), 0);
    ASSERT_TRUE(eventually([&] {
      std::lock_guard<std::mutex> lock(comm.mu);
      return !comm.reasons.empty();
    }));
    {
      std::lock_guard<std::mutex> lock(comm.mu);
      ASSERT_EQ(comm.reasons.size(), 1u);
      EXPECT_NE(comm.reasons[0].find("tensor-parallel rank 1 (pid " + std::to_string(worker)),
                std::string::npos)
          << comm.reasons[0];
    }
    const std::string error = testing::error_of([&] { leader->throw_if_failed(); });
    EXPECT_NE(error.find("rank 1"), std::string::npos) << error;
    EXPECT_NE(error.find("closed its connection"), std::string::npos) << error;
  }  // the leader reaps the worker
  // An orderly shutdown with a live worker aborts nothing: the watchdog stops first.
  RecordingCommunicator quiet;
  {
    std::unique_ptr<TpLeader> leader = TpLeader::launch(options);
    leader->start_watchdog(&quiet);
  }
  std::lock_guard<std::mutex> lock(quiet.mu);
  EXPECT_TRUE(quiet.reasons.empty());
}

}  // namespace
}  // namespace pagellm
