#include "pagellm/engine/weight_group.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <thread>

#include "pagellm/backend/communicator.h"
#include "pagellm/common/check.h"

namespace pagellm {

std::vector<BroadcastBucket> plan_broadcast_buckets(const std::vector<BroadcastTensor>& tensors,
                                                    uint64_t bucket_bytes) {
  PAGELLM_CHECK(!tensors.empty()) << "a broadcast update needs at least one tensor";
  PAGELLM_CHECK(bucket_bytes > 0) << "bucket_bytes must be at least 1";
  constexpr uint64_t kMaxTensorBytes = uint64_t{1} << 40;
  std::vector<BroadcastBucket> buckets;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const BroadcastTensor& t = tensors[i];
    const std::string what = "tensor " + std::to_string(i) + " '" + t.name + "'";
    PAGELLM_CHECK(!t.name.empty()) << "tensor " << i << ": the name is empty";
    const uint64_t element = tensor_dtype_size(t.dtype);
    PAGELLM_CHECK(element > 0) << what << ": unknown dtype value " << static_cast<int>(t.dtype);
    uint64_t bytes = element;
    for (int64_t d : t.shape) {
      PAGELLM_CHECK(d >= 0) << what << ": negative size " << d << " in its shape";
      PAGELLM_CHECK(d == 0 || bytes <= kMaxTensorBytes / static_cast<uint64_t>(d))
          << what << ": larger than 2^40 bytes";
      bytes *= static_cast<uint64_t>(d);
    }
    if (!buckets.empty()) {
      BroadcastBucket& b = buckets.back();
      const uint64_t at = (b.bytes + kBroadcastAlignment - 1) / kBroadcastAlignment *
                          kBroadcastAlignment;
      if (at + bytes <= bucket_bytes) {
        b.offsets.push_back(at);
        b.bytes = at + bytes;
        continue;
      }
    }
    BroadcastBucket b;
    b.first = i;
    b.offsets.push_back(0);
    b.bytes = bytes;
    buckets.push_back(std::move(b));
  }
  return buckets;
}

void split_host_port(const std::string& address, const std::string& what, std::string& host,
                     int& port) {
  const size_t colon = address.rfind(':');
  PAGELLM_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < address.size())
      << what << ": '" << address << "' is not host:port";
  host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string digits = address.substr(colon + 1);
  PAGELLM_CHECK(digits.size() <= 5 &&
                std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      << what << ": '" << digits << "' in '" << address << "' is not a port number";
  port = std::stoi(digits);
  PAGELLM_CHECK(port >= 1 && port <= 65535)
      << what << ": port " << port << " in '" << address << "' is outside 1..65535";
}

namespace {

// ---- nccl: a device communicator's broadcast from rank 0 ---------------------------------

class NcclWeightReceiver final : public WeightReceiver {
 public:
  NcclWeightReceiver(Backend& backend, const WeightGroupSpec& spec)
      : WeightReceiver(spec), backend_(backend) {
    comm_ = backend.join_communicator(spec.nccl_unique_id, spec.rank, spec.world_size);
    PAGELLM_CHECK(comm_ != nullptr) << "weight group: the " << backend.name()
                                    << " backend returned no communicator";
  }
  ~NcclWeightReceiver() override = default;
  TensorMemory memory() const override { return TensorMemory::kDevice; }
  bool broken() const override { return broken_; }
  void receive(void* dst, uint64_t bytes, uint64_t /*update*/, uint64_t /*bucket*/) override {
    PAGELLM_CHECK(!broken_) << "weight group: broken by an earlier failure; join it again";
    try {
      comm_->broadcast(backend_, dst, static_cast<size_t>(bytes), 0);
    } catch (...) {
      broken_ = true;
      throw;
    }
  }

 private:
  Backend& backend_;
  std::unique_ptr<Communicator> comm_;
  bool broken_ = false;
};

// ---- tcp --------------------------------------------------------------------------------

// A connected socket to host:port, retrying refused connections (the trainer not yet
// listening) until `deadline_ms`.
int connect_with_retry(const std::string& host, int port, int64_t deadline_ms,
                       const std::atomic<bool>* interrupt) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  PAGELLM_CHECK(gai == 0) << "weight group: cannot resolve '" << host << "': " << gai_strerror(gai);
  std::string last = "no address";
  for (;;) {
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        last = std::strerror(errno);
        continue;
      }
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        ::freeaddrinfo(found);
        return fd;
      }
      last = std::strerror(errno);
      ::close(fd);
    }
    if (monotonic_ms() >= deadline_ms) break;
    if (interrupt != nullptr && interrupt->load()) {
      ::freeaddrinfo(found);
      PAGELLM_FAIL() << "weight group: connecting to the trainer at " << host << ":" << port
                     << " was interrupted (the engine is shutting down)";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::freeaddrinfo(found);
  PAGELLM_FAIL() << "weight group: cannot connect to the trainer at " << host << ":" << port
                 << ": " << last;
}

class TcpWeightReceiver final : public WeightReceiver {
 public:
  TcpWeightReceiver(const WeightGroupSpec& spec, const std::atomic<bool>* interrupt)
      : WeightReceiver(spec), interrupt_(interrupt) {
    std::string host;
    int port = 0;
    split_host_port(spec.address, "weight group address", host, port);
    timeout_ms_ = static_cast<int64_t>(spec.timeout_seconds * 1000.0);
    const int64_t deadline = monotonic_ms() + timeout_ms_;
    socket_ = std::make_unique<FramedSocket>(connect_with_retry(host, port, deadline, interrupt),
                                             "the trainer at " + spec.address);
    WireWriter hello;
    hello.put_string(kWeightGroupMagic).put<uint32_t>(kWeightGroupVersion);
    hello.put<int32_t>(spec.rank).put<int32_t>(spec.world_size).put_string(spec.name);
    PAGELLM_CHECK(socket_->send(kFrameWeightHello, hello.bytes()))
        << "weight group: " << socket_->peer() << " closed the connection";
    Frame welcome = next_frame("the welcome", std::max<int64_t>(0, deadline - monotonic_ms()));
    PAGELLM_CHECK(welcome.type == kFrameWeightWelcome)
        << "weight group: " << socket_->peer() << " answered the hello with message type "
        << welcome.type << " (not a pagellm trainer?)";
    WireReader r(welcome.payload, "weight group welcome");
    const uint32_t version = r.get<uint32_t>();
    PAGELLM_CHECK(version == kWeightGroupVersion)
        << "weight group: " << socket_->peer() << " speaks version " << version
        << ", this engine " << kWeightGroupVersion;
  }
  TensorMemory memory() const override { return TensorMemory::kHost; }
  bool broken() const override { return broken_; }

  void receive(void* dst, uint64_t bytes, uint64_t update, uint64_t bucket) override {
    PAGELLM_CHECK(!broken_) << "weight group: broken by an earlier failure; join it again";
    try {
      const std::string what = "bucket " + std::to_string(bucket) + " of update " +
                               std::to_string(update);
      // The header, then the bucket's bytes straight into `dst` (a bucket may be GBs).
      uint32_t type = 0;
      uint64_t payload = 0;
      check_status(socket_->receive_header(type, payload, timeout_ms_, interrupt_), what);
      if (type != kFrameWeightBucket) {
        // Small frames only (an abort's reason); anything else is not the protocol.
        PAGELLM_CHECK(payload <= (1u << 20))
            << "weight group: " << socket_->peer() << " sent message type " << type << " of "
            << payload << " bytes where " << what << " was due";
        std::vector<uint8_t> body(static_cast<size_t>(payload));
        check_status(socket_->read_payload(body.data(), body.size(), timeout_ms_), what);
        PAGELLM_CHECK(type != kFrameAbort)
            << "weight group: the trainer ended the group: "
            << std::string(body.begin(), body.end());
        PAGELLM_FAIL() << "weight group: " << socket_->peer() << " sent message type " << type
                       << " where " << what << " was due";
      }
      PAGELLM_CHECK(payload == 16 + bytes)
          << "weight group: " << what << " has " << (payload < 16 ? 0 : payload - 16)
          << " bytes, the tensors the update names pack into " << bytes
          << " (the trainer's tensor list or bucket size differs from the request's)";
      uint64_t numbers[2] = {0, 0};
      check_status(socket_->read_payload(numbers, sizeof(numbers), timeout_ms_), what);
      PAGELLM_CHECK(numbers[0] == update && numbers[1] == bucket)
          << "weight group: " << socket_->peer() << " sent bucket " << numbers[1]
          << " of update " << numbers[0] << " where " << what
          << " was due (the trainer and the engine disagree on the updates)";
      check_status(socket_->read_payload(dst, static_cast<size_t>(bytes), timeout_ms_), what);
    } catch (...) {
      broken_ = true;
      socket_->close();
      throw;
    }
  }

 private:
  // Throws naming `what` unless a read within `timeout_ms` (default: the group's) succeeded.
  void check_status(ReceiveStatus status, const std::string& what, int64_t timeout_ms = -1) const {
    PAGELLM_CHECK(status != ReceiveStatus::kClosed)
        << "weight group: " << socket_->peer() << " closed the connection before " << what;
    PAGELLM_CHECK(status != ReceiveStatus::kTimedOut)
        << "weight group: " << socket_->peer() << " sent nothing for "
        << (timeout_ms < 0 ? timeout_ms_ : timeout_ms) / 1000.0 << " s while " << what
        << " was due";
    PAGELLM_CHECK(status == ReceiveStatus::kFrame)
        << "weight group: receiving " << what
        << " from the trainer was interrupted (the engine is shutting down)";
  }

  Frame next_frame(const std::string& what, int64_t timeout_ms) {
    Frame frame;
    check_status(socket_->receive(frame, timeout_ms, interrupt_), what, timeout_ms);
    PAGELLM_CHECK(frame.type != kFrameAbort)
        << "weight group: the trainer refused or ended the group: "
        << std::string(frame.payload.begin(), frame.payload.end());
    return frame;
  }

  std::unique_ptr<FramedSocket> socket_;
  const std::atomic<bool>* interrupt_ = nullptr;
  int64_t timeout_ms_ = 0;
  bool broken_ = false;
};

}  // namespace

void check_weight_group_spec(const WeightGroupSpec& spec, int ranks) {
  if (ranks == 1) {
    PAGELLM_CHECK(spec.world_size >= 2 && spec.rank >= 1 && spec.rank < spec.world_size)
        << "weight group: rank " << spec.rank << " of world size " << spec.world_size
        << " (the trainer is rank 0; the engine a rank in 1 .. world_size - 1)";
  } else {
    PAGELLM_CHECK(spec.rank >= 1 && spec.world_size >= 2 &&
                  int64_t{spec.rank} + ranks <= int64_t{spec.world_size})
        << "weight group: this engine's " << ranks << " tensor-parallel ranks join as ranks "
        << spec.rank << " .. " << int64_t{spec.rank} + ranks - 1 << " of world size "
        << spec.world_size << " (the trainer is rank 0; the group needs a world size of at "
        << "least rank_offset + " << ranks << ")";
  }
  if (spec.transport == "nccl") {
    PAGELLM_CHECK(spec.nccl_unique_id.size() == 128)
        << "weight group: an NCCL unique id is 128 bytes, got " << spec.nccl_unique_id.size();
  } else if (spec.transport == "tcp") {
    PAGELLM_CHECK(std::isfinite(spec.timeout_seconds) && spec.timeout_seconds > 0)
        << "weight group: timeout_seconds must be > 0, got " << spec.timeout_seconds;
    std::string host;
    int port = 0;
    split_host_port(spec.address, "weight group address", host, port);
  } else {
    PAGELLM_FAIL() << "weight group: unknown transport '" << spec.transport
                   << "' (expected \"nccl\" or \"tcp\")";
  }
}

std::unique_ptr<WeightReceiver> join_weight_group(Backend& backend, const WeightGroupSpec& spec,
                                                  const std::atomic<bool>* interrupt) {
  check_weight_group_spec(spec);
  if (spec.transport == "nccl") {
    try {
      return std::make_unique<NcclWeightReceiver>(backend, spec);
    } catch (const Error& e) {
      const std::string why = e.what();
      const bool no_collectives = why.find("no device collectives") != std::string::npos;
      PAGELLM_FAIL() << "weight group: joining the NCCL group as rank " << spec.rank << " of "
                     << spec.world_size << " failed: " << why
                     << (no_collectives ? " (a backend without device collectives, such as cpu, "
                                          "takes the \"tcp\" transport)"
                                        : "");
    }
  }
  return std::make_unique<TcpWeightReceiver>(spec, interrupt);
}

// ---- receiving an update ------------------------------------------------------------------

namespace {

uint64_t largest_bucket(const std::vector<BroadcastBucket>& buckets) {
  uint64_t most = 1;
  for (const BroadcastBucket& b : buckets) most = std::max(most, b.bytes);
  return most;
}

}  // namespace

void BroadcastStaging::ensure(Backend& backend, TensorMemory receiver,
                              const std::vector<BroadcastBucket>& buckets) {
  const TensorMemory memory =
      receiver == TensorMemory::kDevice ? TensorMemory::kDevice : TensorMemory::kHostPinned;
  const uint64_t n = largest_bucket(buckets);
  if (memory == memory_ && n <= bytes_) return;
  release();  // before the new one: both at once may not fit
  memory_ = memory;
  if (memory_ == TensorMemory::kDevice) {
    device_ = DeviceBuffer(&backend, static_cast<size_t>(n));
  } else {
    pinned_ = PinnedHostBuffer(&backend, static_cast<size_t>(n));
  }
  bytes_ = n;
}

void BroadcastStaging::release() {
  device_ = DeviceBuffer();
  pinned_ = PinnedHostBuffer();
  bytes_ = 0;
}

std::vector<NamedTensor> BroadcastStaging::tensors(const std::vector<BroadcastTensor>& tensors,
                                                   const BroadcastBucket& b) const {
  std::vector<NamedTensor> out;
  for (size_t j = 0; j < b.offsets.size(); ++j) {
    const BroadcastTensor& t = tensors[b.first + j];
    NamedTensor n;
    n.name = t.name;
    n.data = data() + b.offsets[j];
    n.dtype = t.dtype;
    n.shape = t.shape;
    n.memory = memory_;
    out.push_back(std::move(n));
  }
  return out;
}

void drain_broadcast(WeightReceiver& group, Backend& backend, BroadcastStaging& staging,
                     const std::vector<BroadcastBucket>& buckets, uint64_t update) {
  staging.ensure(backend, group.memory(), buckets);
  for (size_t i = 0; i < buckets.size(); ++i) {
    group.receive(staging.data(), buckets[i].bytes, update, i);
  }
  backend.synchronize();
}

BroadcastWrite receive_broadcast_update(WeightReceiver& group, Backend& backend,
                                        BroadcastStaging& staging, Qwen3Model& model,
                                        const std::vector<BroadcastTensor>& tensors,
                                        const std::vector<BroadcastBucket>& buckets,
                                        uint64_t update) {
  BroadcastWrite out;
  Qwen3Model::PartialUpdate partial = model.begin_weights_update();
  try {
    staging.ensure(backend, group.memory(), buckets);
    for (; out.written < buckets.size(); ++out.written) {
      const BroadcastBucket& b = buckets[out.written];
      group.receive(staging.data(), b.bytes, update, out.written);
      model.write_weights_part(staging.tensors(tensors, b), partial);
    }
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  try {
    out.stats = model.finish_weights_update(partial);
  } catch (const std::exception& e) {
    if (out.error.empty()) out.error = e.what();
  }
  return out;
}

// ---- TcpWeightSender ----------------------------------------------------------------------

TcpWeightSender::TcpWeightSender(const std::string& host, int port, int world_size,
                                 std::string name)
    : host_(host), world_size_(world_size), name_(std::move(name)) {
  PAGELLM_CHECK(world_size >= 2) << "TcpWeightSender: world size " << world_size << " (>= 2)";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  PAGELLM_CHECK(gai == 0) << "TcpWeightSender: cannot resolve '" << host
                          << "': " << gai_strerror(gai);
  std::string last = "no address";
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, world_size) == 0) {
      listen_fd_ = fd;
    } else {
      last = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  PAGELLM_CHECK(listen_fd_ >= 0) << "TcpWeightSender: cannot listen on " << host << ":" << port
                                 << ": " << last;
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = addr.ss_family == AF_INET6
              ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
              : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  ranks_.resize(static_cast<size_t>(world_size));
}

TcpWeightSender::~TcpWeightSender() {
  close();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

std::string TcpWeightSender::address() const {
  const bool v6 = host_.find(':') != std::string::npos;
  return (v6 ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_);
}

void TcpWeightSender::accept(int64_t timeout_ms) {
  const int64_t deadline = monotonic_ms() + timeout_ms;
  int joined = 0;
  for (size_t r = 1; r < ranks_.size(); ++r) joined += ranks_[r] != nullptr;
  while (joined < world_size_ - 1) {
    const int64_t left = deadline - monotonic_ms();
    PAGELLM_CHECK(left > 0) << "TcpWeightSender: " << world_size_ - 1 - joined
                            << " engine rank(s) did not join within " << timeout_ms / 1000.0
                            << " s";
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 100))) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    auto socket = std::make_unique<FramedSocket>(fd, "an engine rank");
    Frame hello;
    if (socket->receive(hello, std::max<int64_t>(1, deadline - monotonic_ms())) !=
            ReceiveStatus::kFrame ||
        hello.type != kFrameWeightHello) {
      continue;  // not a pagellm engine
    }
    std::string refusal;
    int32_t rank = -1;
    try {
      WireReader r(hello.payload, "weight group hello");
      const std::string magic = r.get_string();
      const uint32_t version = r.get<uint32_t>();
      rank = r.get<int32_t>();
      const int32_t size = r.get<int32_t>();
      const std::string name = r.get_string();
      if (magic != kWeightGroupMagic) {
        continue;
      } else if (version != kWeightGroupVersion) {
        refusal = "the trainer speaks weight-group version " + std::to_string(kWeightGroupVersion) +
                  ", the engine " + std::to_string(version);
      } else if (size != world_size_) {
        refusal = "the engine joined with world size " + std::to_string(size) +
                  ", the trainer's group has " + std::to_string(world_size_);
      } else if (rank < 1 || rank >= world_size_ || ranks_[static_cast<size_t>(rank)]) {
        refusal = "rank " + std::to_string(rank) + " is outside 1.." +
                  std::to_string(world_size_ - 1) + " or taken";
      } else if (name != name_) {
        refusal = "the engine names the group '" + name + "', the trainer '" + name_ + "'";
      }
    } catch (const Error& e) {
      refusal = e.what();
    }
    if (!refusal.empty()) {
      socket->send(kFrameAbort, refusal.data(), refusal.size());
      continue;
    }
    WireWriter welcome;
    welcome.put<uint32_t>(kWeightGroupVersion);
    if (!socket->send(kFrameWeightWelcome, welcome.bytes())) continue;
    socket->set_peer("engine rank " + std::to_string(rank));
    ranks_[static_cast<size_t>(rank)] = std::move(socket);
    ++joined;
  }
}

void TcpWeightSender::send(const std::vector<BroadcastTensor>& tensors,
                           const std::vector<const void*>& data, uint64_t bucket_bytes) {
  PAGELLM_CHECK(data.size() == tensors.size())
      << "TcpWeightSender::send: " << data.size() << " data pointers for " << tensors.size()
      << " tensors";
  const std::vector<BroadcastBucket> buckets = plan_broadcast_buckets(tensors, bucket_bytes);
  std::vector<uint8_t> payload;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const BroadcastBucket& bucket = buckets[b];
    payload.assign(16 + bucket.bytes, 0);
    const uint64_t update = updates_, index = b;
    std::memcpy(payload.data(), &update, 8);
    std::memcpy(payload.data() + 8, &index, 8);
    for (size_t j = 0; j < bucket.offsets.size(); ++j) {
      const BroadcastTensor& t = tensors[bucket.first + j];
      uint64_t bytes = tensor_dtype_size(t.dtype);
      for (int64_t d : t.shape) bytes *= static_cast<uint64_t>(d);
      if (bytes > 0) std::memcpy(payload.data() + 16 + bucket.offsets[j], data[bucket.first + j], bytes);
    }
    for (size_t r = 1; r < ranks_.size(); ++r) {
      PAGELLM_CHECK(ranks_[r] != nullptr) << "TcpWeightSender::send: rank " << r << " has not joined";
      PAGELLM_CHECK(ranks_[r]->send(kFrameWeightBucket, payload))
          << "TcpWeightSender::send: " << ranks_[r]->peer() << " closed its connection";
    }
  }
  ++updates_;
}

void TcpWeightSender::close() {
  for (auto& r : ranks_) {
    if (r) r->close();
  }
}

}  // namespace pagellm
