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
  /// Prefix caching: full KV pages are kept by the hash of the tokens up to them, and a
  /// request whose prompt begins with cached pages skips their prefill. Outputs are the
  /// same with it off; off frees pages as soon as their request finishes.
  bool enable_prefix_caching = true;
};

}  // namespace pagellm
