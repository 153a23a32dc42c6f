// Weight updates broadcast from a trainer process (docs/design.md, "Weight updates",
// broadcast): the group the trainer makes, the tensors an update names, and how their bytes
// are packed into buckets. A vocabulary header, so that the engine layer and the public API
// use the same definitions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagellm/weight_update.h"

namespace pagellm {

/// Bytes per element of a TensorDType.
inline uint64_t tensor_dtype_size(TensorDType dtype) {
  switch (dtype) {
    case TensorDType::kFloat32: return 4;
    case TensorDType::kBFloat16: return 2;
    case TensorDType::kFloat16: return 2;
    case TensorDType::kInt32: return 4;
    case TensorDType::kInt64: return 8;
  }
  return 0;
}

/// A group that a trainer process made to broadcast weights to the engine (docs/design.md,
/// "Weight updates", broadcast): the trainer is rank 0 and sends, the engine is rank `rank`
/// of `world_size` and receives. Two transports:
///   "nccl": `nccl_unique_id` is ncclGetUniqueId's 128 bytes from the trainer; the weights
///           travel GPU to GPU (the cuda backend; the trainer on another GPU).
///   "tcp":  the trainer listens at `address` ("host:port") and the engine connects; the
///           weights travel through host memory (any backend: a trainer without NCCL, the
///           cpu backend, tests).
struct WeightGroupSpec {
  std::string transport = "nccl";
  std::vector<uint8_t> nccl_unique_id;
  std::string address;
  int rank = 1;
  int world_size = 2;
  /// The trainer's name for the group (optional); an update naming another group is refused.
  std::string name;
  /// "tcp": how long connecting, and each wait for the trainer's next bucket, may take.
  double timeout_seconds = 300.0;
};

/// One tensor of a broadcast update: its name, dtype and shape; its bytes come from the
/// trainer, packed into buckets as plan_broadcast_buckets says.
struct BroadcastTensor {
  std::string name;
  TensorDType dtype = TensorDType::kBFloat16;
  std::vector<int64_t> shape;
};

/// One bucket of a broadcast update: `bytes` sent in one broadcast, holding tensors
/// [first, first + offsets.size()) of the list at `offsets` from the bucket's start.
struct BroadcastBucket {
  uint64_t bytes = 0;
  size_t first = 0;
  std::vector<uint64_t> offsets;
};

/// Byte alignment of every tensor inside a bucket.
inline constexpr uint64_t kBroadcastAlignment = 256;

/// How the trainer packs `tensors` (in their order) into buckets, which both sides compute
/// alike: each tensor starts at the next multiple of kBroadcastAlignment of its bucket; a
/// new bucket begins when the next tensor would end past `bucket_bytes` and the bucket
/// holds one already (so a tensor larger than `bucket_bytes` has a bucket of its own); a
/// bucket's bytes end where its last tensor ends. Throws Error for an empty list,
/// bucket_bytes 0, an empty name, a negative size, an unknown dtype, or a tensor of over
/// 2^40 bytes.
std::vector<BroadcastBucket> plan_broadcast_buckets(const std::vector<BroadcastTensor>& tensors,
                                                    uint64_t bucket_bytes);

}  // namespace pagellm
