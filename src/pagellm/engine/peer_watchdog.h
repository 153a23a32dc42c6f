// A thread that watches connections to peer processes for their end (docs/design.md,
// "Tensor parallelism", the watchdog): a tensor-parallel worker that dies while rank 0 waits
// inside a device collective (NCCL) would leave rank 0 waiting forever, since nothing reads
// the worker's connection during a step. The watchdog polls the connections for hang-up
// without reading them and reports the first that ends, so the caller can abort the
// collectives (Communicator::abort, which ncclCommAbort makes safe from another thread).
#pragma once

#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace pagellm {

class PeerWatchdog {
 public:
  /// Watches `fds` (connected stream sockets; duplicated here, so the caller may close its
  /// own at any time) on a new thread. When the peer of fds[i] closes or resets its end,
  /// `on_lost(i)` runs once, on the watchdog's thread, and the watchdog stops. Data the
  /// peers send is left unread. Throws Error when the thread or the descriptors cannot be
  /// made.
  PeerWatchdog(const std::vector<int>& fds, std::function<void(size_t)> on_lost);
  /// stop().
  ~PeerWatchdog();
  PeerWatchdog(const PeerWatchdog&) = delete;
  PeerWatchdog& operator=(const PeerWatchdog&) = delete;

  /// Stops watching and waits for the thread (on_lost, if running, finishes first); then
  /// closes the duplicated descriptors, so a peer sees end of file once the caller closes
  /// its own. Idempotent; not from on_lost.
  void stop();

 private:
  void run();

  std::vector<int> fds_;
  int wake_[2] = {-1, -1};  // a pipe: stop() writes, the poll wakes
  std::function<void(size_t)> on_lost_;
  std::thread thread_;
};

}  // namespace pagellm
