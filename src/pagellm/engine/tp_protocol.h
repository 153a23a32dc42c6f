// What the ranks of a tensor-parallel engine say to each other (docs/design.md, "Tensor
// parallelism", the message protocol): the frame types on the loopback TCP connection
// between rank 0 (the leader, the engine's process) and each worker process, and the
// encoding of their payloads. One protocol version: the handshake refuses any other.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pagellm/common/framed_socket.h"
#include "pagellm/engine/model_runner.h"
#include "pagellm/kv/forward_batch.h"
#include "pagellm/model/qwen3.h"
#include "pagellm/weight_broadcast.h"

namespace pagellm::tp {

/// First in every hello and welcome, before the version: "PGLMTP" as little-endian bytes.
constexpr uint64_t kMagic = 0x0000'5054'4d4c'4750ULL;
constexpr uint32_t kProtocolVersion = 3;
/// The environment variable that carries the launch's token to a worker (not argv, which
/// every user of the machine can read in /proc).
constexpr const char* kTokenEnv = "PAGELLM_TP_TOKEN";

/// Frame types (FramedSocket). W: worker to leader; L: leader to worker. In order of use.
enum Message : uint32_t {
  kHello = 1,        // W: u64 magic, u32 version, i32 rank, string token
  kWelcome = 2,      // L: u64 magic, u32 version
  kSetup = 3,        // L: WorkerSetup
  kBackendUp = 11,   // W: the backend is made; the worker joins the device group next
  kRunnerConfig = 4, // L: ModelRunnerConfig
  kPages = 5,        // W: i64 the KV pages that fit this rank
  kPagesAgreed = 6,  // L: i64 the group's page count (the minimum)
  kReady = 7,        // W: the runner is built (graphs captured)
  kCopyPages = 8,    // L: vector<pair<i32, i32>> src/dst pages (copy_kv_pages)
  kForward = 9,      // L: i32 graph bucket (0: eager), ForwardBatch
  kShutdown = 10,    // L: exit now (no payload)
  // Weight updates (docs/design.md, "Weight updates at TP > 1"); each is answered by a
  // kWeightsDone.
  kJoinWeightGroup = 12,   // L: WeightGroupSpec whose rank is the engine's first (rank 0's)
  kLeaveWeightGroup = 13,  // L: no payload
  kLoadWeights = 14,       // L: string path (a safetensors folder or file)
  kBroadcastWeights = 15,  // L: BroadcastOp
  kWeightsDone = 16,       // W: WeightsDone
};
// kFrameAbort (framed_socket.h) and HostCommunicator's collective frames share the
// connection.

/// The model every rank loads: a Hugging Face folder, or (model_dir empty) random weights
/// of a preset (what make-model would write with this seed and dtype; benchmarks).
struct ModelSource {
  std::string model_dir;
  std::string preset;
  uint64_t seed = 0;
  DType dtype = DType::BF16;
  /// The architecture (config.json, or the preset's).
  Qwen3Config config() const;
  /// A rank's share of the weights on `backend` (the whole model without `parallel`).
  std::unique_ptr<Qwen3Model> load(Backend& backend, const TensorParallel* parallel,
                                   const ProgressFn& progress = nullptr) const;
};

/// What a worker needs before it loads: the model, its backend (device = its rank), the
/// backend settings the leader's engine applies, and the device communicator's id (empty:
/// the backend has none, and the ranks use HostCommunicator over this connection).
struct WorkerSetup {
  ModelSource source;
  std::string backend;
  int32_t device = 0;
  std::string attention_backend = "auto";
  bool batch_invariant = false;
  std::vector<uint8_t> communicator_id;
  /// How long a collective waits for a peer before it gives up (HostCommunicator).
  int64_t timeout_ms = 600'000;
};

std::vector<uint8_t> encode(const WorkerSetup& setup);
WorkerSetup decode_worker_setup(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> encode(const ModelRunnerConfig& config);
ModelRunnerConfig decode_runner_config(const std::vector<uint8_t>& bytes);
/// kForward's payload: the batch as the leader uploads it (padded to the graph's bucket).
std::vector<uint8_t> encode_forward(const ForwardBatch& batch, int32_t graph_bucket);
ForwardBatch decode_forward(const std::vector<uint8_t>& bytes, int32_t* graph_bucket);
std::vector<uint8_t> encode_page_copies(const std::vector<std::pair<int32_t, int32_t>>& pairs);
std::vector<std::pair<int32_t, int32_t>> decode_page_copies(const std::vector<uint8_t>& bytes);

/// kLoadWeights: the folder or file every rank loads.
std::vector<uint8_t> encode_load_weights(const std::string& path);
std::string decode_load_weights(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> encode(const WeightGroupSpec& spec);
WeightGroupSpec decode_weight_group_spec(const std::vector<uint8_t>& bytes);

/// kBroadcastWeights: receive update number `update` of the trainer's group, packed as
/// plan_broadcast_buckets(tensors, bucket_bytes) says, and write the rank's share of each
/// tensor; with `drain`, receive the buckets and drop them (rank 0 rejected the update).
struct BroadcastOp {
  uint64_t update = 0;
  bool drain = false;
  uint64_t bucket_bytes = 0;
  std::vector<BroadcastTensor> tensors;
};
std::vector<uint8_t> encode(const BroadcastOp& op);
BroadcastOp decode_broadcast_op(const std::vector<uint8_t>& bytes);

/// A worker's answer to a weights operation. `error` empty: it did what was asked.
/// `changed`: some weight of this rank was written (a failure before any write leaves it
/// false); `buckets`: the broadcast buckets written.
struct WeightsDone {
  std::string error;
  bool changed = false;
  int64_t tensors = 0;
  uint64_t bytes = 0;
  uint64_t buckets = 0;
};
std::vector<uint8_t> encode(const WeightsDone& done);
WeightsDone decode_weights_done(const std::vector<uint8_t>& bytes);

/// A frame's name for error messages ("kForward", "message 77").
std::string message_name(uint32_t type);

}  // namespace pagellm::tp
