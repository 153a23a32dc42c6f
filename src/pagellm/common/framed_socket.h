// Framed binary messages over a connected stream socket, and the plain encoding of their
// payloads: what the ranks of a tensor-parallel engine say to each other over loopback TCP
// (docs/design.md, "Tensor parallelism", the message protocol). Host-only, no pagellm types.
//
// A frame is a 16-byte header { uint32 type, uint32 zero, uint64 payload bytes } and the
// payload. Both ends are processes of one machine, so integers and floats travel in the
// machine's own byte order.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "pagellm/common/check.h"

namespace pagellm {

/// The frame type every peer understands: the sender gives up on the group (payload: the
/// reason, UTF-8, naming the sender). Other layers number their own types below 2^31.
constexpr uint32_t kFrameAbort = 0x80000001u;

/// One received frame.
struct Frame {
  uint32_t type = 0;
  std::vector<uint8_t> payload;
};

/// Why FramedSocket::receive returned no frame.
enum class ReceiveStatus { kFrame, kClosed, kTimedOut, kInterrupted };

/// Owns a connected socket (closed by the destructor). send() may be called from several
/// threads (whole frames, one at a time); receive() from one thread at a time.
class FramedSocket {
 public:
  /// The largest payload receive() accepts (a corrupt header must not allocate wildly).
  static constexpr uint64_t kMaxPayload = uint64_t{1} << 34;

  FramedSocket() = default;
  /// Takes ownership of `fd` (a connected stream socket); `peer` names the other end in
  /// error messages ("tensor-parallel rank 2").
  FramedSocket(int fd, std::string peer);
  ~FramedSocket();
  FramedSocket(const FramedSocket&) = delete;
  FramedSocket& operator=(const FramedSocket&) = delete;

  bool is_open() const { return fd_ >= 0; }
  /// The descriptor (-1 once closed), for poll() alone: reads and writes go through here.
  int fd() const { return fd_; }
  const std::string& peer() const { return peer_; }
  void set_peer(std::string peer) { peer_ = std::move(peer); }
  /// Sends one frame. Returns false when the peer has gone (EPIPE, ECONNRESET: never
  /// SIGPIPE); throws Error for other failures.
  bool send(uint32_t type, const void* payload, size_t bytes);
  bool send(uint32_t type, const std::vector<uint8_t>& payload) {
    return send(type, payload.data(), payload.size());
  }
  /// Waits up to `timeout_ms` (< 0: forever) for the next frame. `interrupt`, when given,
  /// is checked every 100 ms; once it is true the wait ends with kInterrupted. kClosed: the
  /// peer closed the connection (or it reset) before a whole frame arrived. Throws Error
  /// for a frame larger than kMaxPayload or a failing socket.
  ReceiveStatus receive(Frame& frame, int64_t timeout_ms,
                        const std::atomic<bool>* interrupt = nullptr);
  /// receive() in two parts, for a large payload that goes straight into the caller's
  /// memory: the next frame's header (its type and payload size; checked as receive()
  /// checks it), then read_payload() calls that take exactly that many bytes in all.
  ReceiveStatus receive_header(uint32_t& type, uint64_t& bytes, int64_t timeout_ms,
                               const std::atomic<bool>* interrupt = nullptr);
  /// The next `bytes` of the current frame's payload into `dst`, within `timeout_ms` (< 0:
  /// no limit).
  ReceiveStatus read_payload(void* dst, size_t bytes, int64_t timeout_ms);
  /// Closes the socket now (the peer reads end-of-file).
  void close();

 private:
  /// Reads exactly `bytes` into dst before `deadline_ms` (monotonic, < 0: none).
  ReceiveStatus read_exact(void* dst, size_t bytes, int64_t deadline_ms,
                           const std::atomic<bool>* interrupt);
  int fd_ = -1;
  std::string peer_;
  std::mutex send_mutex_;
};

/// Milliseconds of a monotonic clock (deadlines).
int64_t monotonic_ms();

/// Appends scalars, vectors and strings to a payload.
class WireWriter {
 public:
  template <class T>
  WireWriter& put(const T& value) {
    static_assert(std::is_trivially_copyable<T>::value, "put: plain values only");
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
    return *this;
  }
  /// A count (uint64), then the elements.
  template <class T>
  WireWriter& put_vector(const std::vector<T>& values) {
    static_assert(std::is_trivially_copyable<T>::value, "put_vector: plain values only");
    put<uint64_t>(values.size());
    const auto* p = reinterpret_cast<const uint8_t*>(values.data());
    bytes_.insert(bytes_.end(), p, p + values.size() * sizeof(T));
    return *this;
  }
  WireWriter& put_string(const std::string& s) {
    put<uint64_t>(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

/// Reads what WireWriter wrote, in the same order; running past the end (a malformed
/// message) throws Error naming `what` (the message's name).
class WireReader {
 public:
  WireReader(const std::vector<uint8_t>& bytes, std::string what)
      : bytes_(bytes), what_(std::move(what)) {}
  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable<T>::value, "get: plain values only");
    T value;
    std::memcpy(&value, take(sizeof(T)), sizeof(T));
    return value;
  }
  template <class T>
  std::vector<T> get_vector() {
    const uint64_t n = get<uint64_t>();
    PAGELLM_CHECK(n <= (bytes_.size() - pos_) / sizeof(T))
        << "malformed " << what_ << " message: a vector of " << n << " elements in "
        << bytes_.size() - pos_ << " bytes";
    std::vector<T> values(static_cast<size_t>(n));
    if (n > 0) std::memcpy(values.data(), take(n * sizeof(T)), n * sizeof(T));
    return values;
  }
  std::string get_string() {
    const uint64_t n = get<uint64_t>();
    PAGELLM_CHECK(n <= bytes_.size() - pos_)
        << "malformed " << what_ << " message: a string of " << n << " bytes in "
        << bytes_.size() - pos_;
    const char* p = reinterpret_cast<const char*>(take(n));
    return std::string(p, p + n);
  }
  /// Throws unless every byte was read (a message of another shape).
  void expect_end() const {
    PAGELLM_CHECK(pos_ == bytes_.size()) << "malformed " << what_ << " message: "
                                         << bytes_.size() - pos_ << " bytes left over";
  }

 private:
  const uint8_t* take(size_t n) {
    PAGELLM_CHECK(n <= bytes_.size() - pos_)
        << "malformed " << what_ << " message: " << n << " bytes wanted, "
        << bytes_.size() - pos_ << " left";
    const uint8_t* p = bytes_.data() + pos_;
    pos_ += n;
    return p;
  }
  const std::vector<uint8_t>& bytes_;
  std::string what_;
  size_t pos_ = 0;
};

}  // namespace pagellm
