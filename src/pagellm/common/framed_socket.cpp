#include "pagellm/common/framed_socket.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace pagellm {

namespace {

struct FrameHeader {
  uint32_t type;
  uint32_t zero;
  uint64_t bytes;
};
static_assert(sizeof(FrameHeader) == 16, "the frame header is 16 bytes");

constexpr int64_t kPollSliceMs = 100;

}  // namespace

int64_t monotonic_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

FramedSocket::FramedSocket(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {
  // Frames are small and answered at once (a collective's part, then its result): Nagle's
  // algorithm would hold each behind the peer's delayed acknowledgement (40 ms). Not a TCP
  // socket (a socket pair in tests): the option does not apply, and failing is harmless.
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

FramedSocket::~FramedSocket() { close(); }

void FramedSocket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool FramedSocket::send(uint32_t type, const void* payload, size_t bytes) {
  std::lock_guard<std::mutex> lock(send_mutex_);
  if (fd_ < 0) return false;
  FrameHeader header{type, 0, bytes};
  iovec parts[2] = {{&header, sizeof(header)}, {const_cast<void*>(payload), bytes}};
  msghdr msg{};
  msg.msg_iov = parts;
  msg.msg_iovlen = bytes > 0 ? 2 : 1;
  size_t left = sizeof(header) + bytes;
  while (left > 0) {
    const ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EPIPE || errno == ECONNRESET) return false;
      PAGELLM_FAIL() << "sending to " << peer_ << ": " << std::strerror(errno);
    }
    left -= static_cast<size_t>(n);
    // Skip what was sent: advance through the iovecs.
    size_t done = static_cast<size_t>(n);
    while (done > 0 && msg.msg_iovlen > 0) {
      iovec& head = msg.msg_iov[0];
      const size_t step = std::min(done, head.iov_len);
      head.iov_base = static_cast<uint8_t*>(head.iov_base) + step;
      head.iov_len -= step;
      done -= step;
      if (head.iov_len == 0) {
        ++msg.msg_iov;
        --msg.msg_iovlen;
      }
    }
  }
  return true;
}

ReceiveStatus FramedSocket::read_exact(void* dst, size_t bytes, int64_t deadline_ms,
                                       const std::atomic<bool>* interrupt) {
  auto* out = static_cast<uint8_t*>(dst);
  while (bytes > 0) {
    if (interrupt != nullptr && interrupt->load()) return ReceiveStatus::kInterrupted;
    int64_t wait = kPollSliceMs;
    if (deadline_ms >= 0) {
      const int64_t left = deadline_ms - monotonic_ms();
      if (left <= 0) return ReceiveStatus::kTimedOut;
      wait = std::min(wait, left);
    }
    if (interrupt == nullptr && deadline_ms < 0) wait = -1;
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(wait));
    if (ready < 0) {
      if (errno == EINTR) continue;
      PAGELLM_FAIL() << "waiting for " << peer_ << ": " << std::strerror(errno);
    }
    if (ready == 0) continue;
    const ssize_t n = ::recv(fd_, out, bytes, 0);
    if (n == 0) return ReceiveStatus::kClosed;
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == ECONNRESET) return ReceiveStatus::kClosed;
      PAGELLM_FAIL() << "reading from " << peer_ << ": " << std::strerror(errno);
    }
    out += n;
    bytes -= static_cast<size_t>(n);
  }
  return ReceiveStatus::kFrame;
}

ReceiveStatus FramedSocket::receive_header(uint32_t& type, uint64_t& bytes, int64_t timeout_ms,
                                           const std::atomic<bool>* interrupt) {
  if (fd_ < 0) return ReceiveStatus::kClosed;
  const int64_t deadline = timeout_ms < 0 ? -1 : monotonic_ms() + timeout_ms;
  FrameHeader header{};
  const ReceiveStatus status = read_exact(&header, sizeof(header), deadline, interrupt);
  if (status != ReceiveStatus::kFrame) return status;
  PAGELLM_CHECK(header.zero == 0 && header.bytes <= kMaxPayload)
      << "malformed frame from " << peer_ << " (type " << header.type << ", " << header.bytes
      << " bytes): not a pagellm peer, or a corrupt stream";
  type = header.type;
  bytes = header.bytes;
  return ReceiveStatus::kFrame;
}

ReceiveStatus FramedSocket::read_payload(void* dst, size_t bytes, int64_t timeout_ms) {
  if (fd_ < 0) return ReceiveStatus::kClosed;
  return read_exact(dst, bytes, timeout_ms < 0 ? -1 : monotonic_ms() + timeout_ms, nullptr);
}

ReceiveStatus FramedSocket::receive(Frame& frame, int64_t timeout_ms,
                                    const std::atomic<bool>* interrupt) {
  uint64_t bytes = 0;
  const ReceiveStatus status = receive_header(frame.type, bytes, timeout_ms, interrupt);
  if (status != ReceiveStatus::kFrame) return status;
  frame.payload.resize(static_cast<size_t>(bytes));
  // The rest of a frame whose header arrived follows at once: no deadline or interrupt,
  // so a frame is never cut in half (EOF still ends the wait).
  return read_payload(frame.payload.data(), frame.payload.size(), -1);
}

}  // namespace pagellm
