// Engine settings for LLM and AsyncEngine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pagellm {

/// EngineOptions::pipelined_decode_steps where the caller takes whole outputs and nothing
/// waits on single tokens: `pagellm generate` and `bench`, and Python's `LLM` (streams,
/// the server and `AsyncLLM`, keep 1). Measured on the H200 (docs/PERFORMANCE.md,
/// "Pipelined decode"): it takes the host gap from 0.5-0.8 s to 0.1 s of a W2 rollout;
/// 64 adds a few tenths of a percent more.
inline constexpr int32_t kOfflinePipelinedDecodeSteps = 8;

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
  /// Most tokens in one step (chunked prefill's budget); at least max_num_seqs. 0: the
  /// backend's preferred chunk for `offline` (Backend::preferred_batched_tokens: on the
  /// cuda backend 8,192, where larger products run closer to the tensor-core rate, and
  /// 16,384 offline on a device of 70 GiB or more, except in steps that begin with more
  /// than 64 sequences decoding; 2,048 on cpu), raised to max_num_seqs.
  /// Larger chunks prefill faster; smaller ones stall running decodes for less time per
  /// step (docs/design.md, "The engine step").
  int32_t max_num_batched_tokens = 0;
  /// The caller takes whole outputs and nothing waits on single tokens (`pagellm generate`,
  /// `bench` and `score`, Python's `LLM`; vLLM's offline usage context): the defaults that
  /// trade one for the other take throughput (today max_num_batched_tokens 0). false (the
  /// server, `AsyncLLM`): they take the latency of the running requests' next tokens.
  bool offline = false;
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
  /// Batch-invariant mode: a request's tokens and log-probabilities are the same bits
  /// whatever else runs in the batch, whatever the prefill chunk size, decode bucket or
  /// split-KV choice (every reduction order fixed per row; docs/design.md "Batch-invariant
  /// mode" says what it fixes and what it costs). Off by default: it slows prefill and,
  /// on the cuda backend, decode.
  bool batch_invariant = false;
  /// Prefix caching: full KV pages are kept by the hash of the tokens up to them, and a
  /// request whose prompt begins with cached pages skips their prefill. Outputs are the
  /// same with it off; off frees pages as soon as their request finishes.
  bool enable_prefix_caching = true;
  /// LoRA adapters that can be loaded at once (adapter slots; docs/design.md "LoRA").
  int32_t max_loras = 8;
  /// The largest LoRA rank a loaded adapter may have (1..64, as vLLM's max_lora_rank):
  /// adapters of higher rank are refused at load. The CUDA decode kernels size their work
  /// by it, so a value matching the adapters in use is faster (docs/design.md "LoRA").
  int32_t max_lora_rank = 64;
  /// Pipelined decode (docs/design.md, "Pipelined decode"): the most decode steps one
  /// engine step runs back to back, each launched before the previous one's tokens reach
  /// the host, so that the host's scheduling and bookkeeping overlap the device's work
  /// instead of leaving it idle. 1: off (every step waits for its tokens). Tokens and
  /// log-probabilities are the same either way; what changes is that a caller sees up to
  /// this many tokens per request at once, and a request that ends (EOS, stop token)
  /// inside a run of steps costs its row one step more (a stop string, which the API
  /// layer finds, up to the rest of the run: the tokens after it are not reported). Steps
  /// of requests with penalties or top-k log-probabilities, steps with a prefill, new
  /// requests waiting and tensor parallelism run unpipelined.
  int32_t pipelined_decode_steps = 1;
  /// Tensor parallelism (docs/design.md "Tensor parallelism"): the model split over this
  /// many ranks, one process each. The engine's process is rank 0; it starts the others
  /// (the pagellm-worker program, found beside pagellm or through $PAGELLM_WORKER), rank r
  /// on device r. 1: one process, no split. LoRA, weight updates, sleep and the float32
  /// head are refused above 1.
  int32_t tensor_parallel_size = 1;
};

/// How sleep (LLM::sleep, AsyncEngine::sleep, Engine::sleep) frees memory between rollouts,
/// so that another user of the device (a trainer) can have it. The KV cache is always
/// released (its contents are discarded: nothing may be running).
struct SleepOptions {
  /// Also copy the weights to host memory and release their device memory (and the
  /// backend's prepared copies of them); wake_up restores them bit for bit. The cpu
  /// backend's weights are host memory already and stay where they are.
  bool offload_weights = false;
};

/// What one sleep released. Bytes; free memory as the backend reports it
/// (cudaMemGetInfo on the GPU, MemAvailable on the CPU).
struct SleepReport {
  size_t kv_bytes_released = 0;
  size_t weight_bytes_offloaded = 0;
  /// The backend's own layouts of the weights (packed decode copies), rebuilt on wake.
  size_t prepared_bytes_released = 0;
  size_t free_memory_before = 0;
  size_t free_memory_after = 0;
  double seconds = 0.0;
};

/// What one wake_up took.
struct WakeReport {
  double seconds = 0.0;
  size_t free_memory_after = 0;
};

}  // namespace pagellm
