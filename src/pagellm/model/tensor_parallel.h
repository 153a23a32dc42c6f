// Megatron-style tensor parallelism for Qwen3 (docs/design.md, "Tensor parallelism"): which
// part of each weight a rank holds. q/k/v and gate/up are split by output columns (whole
// heads; KV heads replicated when there are fewer than ranks), o_proj and down by input
// columns (each rank's product is a partial sum, all-reduced), lm_head by vocabulary rows
// (the ranks' logits gathered into full rows). Embeddings and norms are replicated.
#pragma once

#include <cstdint>

#include "pagellm/backend/communicator.h"
#include "pagellm/model/config.h"

namespace pagellm {

/// Rank `rank` of `size`'s share of a Qwen3 model. Ranges are [begin, begin + count).
struct TpShard {
  int rank = 0;
  int size = 1;
  int64_t q_head_begin = 0, q_heads = 0;    // attention heads
  int64_t kv_head_begin = 0, kv_heads = 0;  // the KV heads those q heads read
  int64_t inter_begin = 0, inter = 0;       // intermediate (gate/up rows, down columns)
  int64_t vocab_begin = 0, vocab = 0;       // lm_head rows, logits columns
};

/// The shares of `size` ranks: Hq, I and V divided evenly, Hkv divided evenly or (fewer KV
/// heads than ranks) each KV head held by size / Hkv ranks. Throws Error naming every
/// dimension that does not divide, before anything is loaded.
TpShard plan_tensor_parallel(const Qwen3Config& config, int size, int rank);

/// What a Qwen3Model of one rank needs: its share and its end of the group (the
/// communicator outlives the model).
struct TensorParallel {
  TpShard shard;
  Communicator* comm = nullptr;
};

}  // namespace pagellm
