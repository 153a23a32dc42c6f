// Weight updates broadcast from a trainer process (docs/design.md, "Weight updates",
// broadcast): the engine's end of the trainer's group, which receives a bucket at a time,
// and the trainer's end of the "tcp" transport (for C++ trainers and the tests; the Python
// package has its own, pagellm.weight_broadcast).
//
// The "tcp" wire protocol, over FramedSocket frames (common/framed_socket.h):
//   engine -> trainer  kFrameWeightHello   { string "pagellm-weight-group", uint32 version,
//                                            int32 rank, int32 world_size, string name }
//   trainer -> engine  kFrameWeightWelcome { uint32 version }   (or kFrameAbort: why not)
//   trainer -> engine  kFrameWeightBucket  { uint64 update, uint64 bucket, bytes... }
// for every bucket of every update, in order; `update` counts the trainer's updates from 0.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pagellm/backend/backend.h"
#include "pagellm/common/framed_socket.h"
#include "pagellm/model/qwen3.h"
#include "pagellm/weight_broadcast.h"

namespace pagellm {

enum WeightGroupFrame : uint32_t {
  kFrameWeightHello = 0x5000'0001u,
  kFrameWeightWelcome = 0x5000'0002u,
  kFrameWeightBucket = 0x5000'0003u,
};
inline constexpr uint32_t kWeightGroupVersion = 1;
inline constexpr const char* kWeightGroupMagic = "pagellm-weight-group";

/// The engine's end of a trainer's weight group (rank >= 1; the trainer is rank 0).
class WeightReceiver {
 public:
  virtual ~WeightReceiver() = default;
  /// Where receive() writes: kDevice (the backend's memory: NCCL) or kHost ("tcp").
  virtual TensorMemory memory() const = 0;
  /// Receives the next bucket, `bytes` long, that rank 0 broadcasts, into `dst` (memory of
  /// the kind memory() says). `update` and `bucket` number it, for the checks of "tcp".
  /// Asynchronous on the backend's stream for kDevice (later work on the stream sees it).
  /// Throws Error naming what failed (the trainer went away, sent a bucket of another
  /// size or number, timed out); the group is unusable afterwards.
  virtual void receive(void* dst, uint64_t bytes, uint64_t update, uint64_t bucket) = 0;
  /// Whether a receive failed (the group is broken; join again).
  virtual bool broken() const = 0;
  /// "nccl" or "tcp", and the spec it was joined with.
  const WeightGroupSpec& spec() const { return spec_; }

 protected:
  explicit WeightReceiver(WeightGroupSpec spec) : spec_(std::move(spec)) {}
  WeightGroupSpec spec_;
};

/// Checks `spec` (transport, id size, address form, 1 <= rank < world_size, timeout) and
/// joins: "nccl" through backend.join_communicator (blocks until every rank has joined;
/// a backend without device collectives, such as cpu, is refused naming "tcp"), "tcp" by
/// connecting to the trainer (retrying until timeout_seconds while it is not listening yet)
/// and exchanging the hello. Throws Error naming the problem. `interrupt`, when given, ends
/// a "tcp" join and every later wait of the receiver for the trainer's next bucket within
/// about 100 ms once it is true (Error: "interrupted"); an NCCL join cannot be interrupted.
std::unique_ptr<WeightReceiver> join_weight_group(Backend& backend, const WeightGroupSpec& spec,
                                                  const std::atomic<bool>* interrupt = nullptr);

/// Checks what join_weight_group checks of `spec` before it joins (throws Error naming the
/// problem); `ranks` engine ranks join as spec.rank .. spec.rank + ranks - 1 (a
/// tensor-parallel engine's ranks), which must all lie inside the world.
void check_weight_group_spec(const WeightGroupSpec& spec, int ranks = 1);

/// The staging memory of broadcast updates, where the receiver writes a bucket: device
/// memory for a device receiver (NCCL), else page-locked host memory, from which
/// write_weights copies a bucket of the weights' dtype straight to the device. Kept across
/// updates (allocating hundreds of MiB of page-locked memory takes a good part of a
/// second): ensure() grows it to the largest bucket, or remakes it for another kind.
class BroadcastStaging {
 public:
  void ensure(Backend& backend, TensorMemory receiver, const std::vector<BroadcastBucket>& buckets);
  /// Frees the memory (the group is left; the engine sleeps).
  void release();
  uint8_t* data() const {
    return static_cast<uint8_t*>(memory_ == TensorMemory::kDevice ? device_.get() : pinned_.get());
  }
  TensorMemory memory() const { return memory_; }
  uint64_t bytes() const { return bytes_; }
  /// The NamedTensors of bucket `b` of `tensors`, their bytes at their offsets in here.
  std::vector<NamedTensor> tensors(const std::vector<BroadcastTensor>& tensors,
                                   const BroadcastBucket& b) const;

 private:
  TensorMemory memory_ = TensorMemory::kHostPinned;
  uint64_t bytes_ = 0;
  DeviceBuffer device_;
  PinnedHostBuffer pinned_;
};

/// Receives every bucket of update number `update` and drops it (a rejected update: the
/// trainer's broadcast completes, and the group stays in step for the next). Throws Error
/// when a bucket cannot be received.
void drain_broadcast(WeightReceiver& group, Backend& backend, BroadcastStaging& staging,
                     const std::vector<BroadcastBucket>& buckets, uint64_t update);

/// What receive_broadcast_update did.
struct BroadcastWrite {
  WeightWriteStats stats;
  uint64_t written = 0;  // buckets received and written
  std::string error;     // empty: every bucket was written and the update finished
};

/// Receives update number `update` a bucket at a time into `staging` and writes
/// each bucket's tensors (the model's share of them: Qwen3Model::write_weights_part)
/// before the next, then finishes the update (decode copies refreshed once). A failure
/// midway stops there: the buckets written stay written, their decode copies are refreshed,
/// and `error` says what failed (nothing is thrown).
BroadcastWrite receive_broadcast_update(WeightReceiver& group, Backend& backend,
                                        BroadcastStaging& staging, Qwen3Model& model,
                                        const std::vector<BroadcastTensor>& tensors,
                                        const std::vector<BroadcastBucket>& buckets,
                                        uint64_t update);

/// Splits "host:port" (host a name, an IPv4 address, or [IPv6]); throws Error naming `what`.
void split_host_port(const std::string& address, const std::string& what, std::string& host,
                     int& port);

/// The trainer's end of a "tcp" weight group (rank 0): listens, accepts the engine ranks,
/// and sends every update's buckets. For C++ trainers and the tests.
class TcpWeightSender {
 public:
  /// Listens on `host` ("127.0.0.1"; port 0: one the kernel picks) for world_size - 1
  /// engine ranks.
  TcpWeightSender(const std::string& host, int port, int world_size, std::string name = "");
  ~TcpWeightSender();
  TcpWeightSender(const TcpWeightSender&) = delete;
  TcpWeightSender& operator=(const TcpWeightSender&) = delete;

  /// "host:port" to put in WeightGroupSpec::address.
  std::string address() const;
  /// Accepts the world_size - 1 ranks (each hello checked: magic, version, rank not yet
  /// seen, world size, name; a wrong one is answered with kFrameAbort and refused), within
  /// timeout_ms. Throws Error naming the problem.
  void accept(int64_t timeout_ms);
  /// Sends one update: `data[i]` holds tensors[i]'s bytes; they are packed as
  /// plan_broadcast_buckets(tensors, bucket_bytes) says and each bucket goes to every rank.
  /// Throws Error when a rank's connection is gone.
  void send(const std::vector<BroadcastTensor>& tensors, const std::vector<const void*>& data,
            uint64_t bucket_bytes);
  /// Closes the connections (the engine ranks see their group end).
  void close();

 private:
  int listen_fd_ = -1;
  std::string host_;
  int port_ = 0;
  int world_size_;
  std::string name_;
  std::vector<std::unique_ptr<FramedSocket>> ranks_;
  uint64_t updates_ = 0;
};

}  // namespace pagellm
