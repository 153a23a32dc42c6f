// Engine settings for LLM and AsyncEngine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pagellm {

/// How the engine is set up (vLLM's engine arguments). Zero means "derive a default".
struct EngineOptions {
  /// "cpu" (float32 reference) or "cuda" (when the library was built with CUDA).
  std::string backend = "cpu";
  /// Tokens per KV-cache page.
  int32_t page_size = 16;
  /// Bytes for all layers' K and V pools. 0: a share of the backend's free memory
  /// (a quarter on the CPU, up to 4 GiB; 90 % on a GPU).
  size_t kv_cache_bytes = 0;
  /// Physical KV pages per layer, page 0 (reserved) included; overrides kv_cache_bytes.
  int64_t num_pages = 0;
  /// Most requests (samples) running at once.
  int32_t max_num_seqs = 256;
  /// Most tokens in one step (chunked prefill's budget); at least max_num_seqs.
  int32_t max_num_batched_tokens = 2048;
  /// Longest prompt + output. 0: the model's max_position_embeddings; above it is an error.
  int32_t max_model_len = 0;
  /// Decode steps replay captured graphs (backends that have them).
  bool use_graphs = true;
  /// Paged attention: "auto", "native" or "cudnn" (cuda backend).
  std::string attention_backend = "auto";
  /// The float32 head: the final RMSNorm and the output projection (lm_head) computed in
  /// float32 (the normalised rows are not rounded to the activation dtype; a float32 x
  /// float32 product, no TF32). On the cuda backend this keeps float32 copies of the final
  /// norm and lm_head weights: 4 * vocab * hidden bytes more (0.62 GB for Qwen3-0.6B, 1.56
  /// GB for Qwen3-4B). The cpu backend computes in float32 already: a no-op there.
  /// docs/design.md, "The log-probability contract".
  bool float32_head = false;
};

}  // namespace pagellm
