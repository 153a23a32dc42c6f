#include "pagellm/engine/peer_watchdog.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "pagellm/common/check.h"

namespace pagellm {

PeerWatchdog::PeerWatchdog(const std::vector<int>& fds, std::function<void(size_t)> on_lost)
    : on_lost_(std::move(on_lost)) {
  try {
    PAGELLM_CHECK(::pipe2(wake_, O_CLOEXEC) == 0)
        << "peer watchdog: pipe: " << std::strerror(errno);
    for (int fd : fds) {
      const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
      PAGELLM_CHECK(copy >= 0) << "peer watchdog: dup of descriptor " << fd << ": "
                               << std::strerror(errno);
      fds_.push_back(copy);
    }
    thread_ = std::thread([this] { run(); });
  } catch (...) {
    stop();
    throw;
  }
}

PeerWatchdog::~PeerWatchdog() { stop(); }

void PeerWatchdog::stop() {
  if (thread_.joinable()) {
    const char byte = 1;
    while (::write(wake_[1], &byte, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  for (int fd : fds_) ::close(fd);
  fds_.clear();
  for (int& fd : wake_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

void PeerWatchdog::run() {
  std::vector<pollfd> polled(fds_.size() + 1);
  polled[0] = {wake_[0], POLLIN, 0};
  for (size_t i = 0; i < fds_.size(); ++i) polled[i + 1] = {fds_[i], POLLRDHUP, 0};
  for (;;) {
    const int n = ::poll(polled.data(), polled.size(), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // cannot watch (never expected): the collectives' own checks remain
    }
    if (polled[0].revents != 0) return;  // stop()
    for (size_t i = 1; i < polled.size(); ++i) {
      // POLLRDHUP: the peer closed (or shut down) its end; POLLHUP / POLLERR: the
      // connection is gone. Readable data alone is not asked for, so it never wakes this.
      if ((polled[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0) {
        on_lost_(i - 1);
        return;
      }
    }
  }
}

}  // namespace pagellm
