// LLM: offline, synchronous generation over a model folder (vLLM's LLM).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pagellm/engine_options.h"
#include "pagellm/lora_request.h"
#include "pagellm/outputs.h"
#include "pagellm/prefix_cache_stats.h"
#include "pagellm/prompt.h"
#include "pagellm/sampling_params.h"
#include "pagellm/weight_update.h"

namespace pagellm {

/// Loads a Hugging Face Qwen3 folder (config.json, safetensors, and tokenizer.json for text)
/// and generates for batches of prompts on the calling thread, all of a batch at once
/// (continuous batching, chunked prefill, preemption).
///
/// n samples: sample j of a prompt whose params carry seed s uses seed s + j, so it
/// equals a single request with seed s + j (SamplingParams documents seeds).
///
/// Thread safety: an LLM is used by one thread at a time (generate steps the engine on the
/// caller's thread). encode, decode and apply_chat_template are safe from any thread. For
/// many callers at once use AsyncEngine.
class LLM {
 public:
  /// Throws pagellm::Error for a missing or malformed folder, bad options, or
  /// options.max_model_len above the model's max_position_embeddings.
  /// Loading reports bytes of weights read so far to `progress` (optional).
  using LoadProgress = std::function<void(size_t bytes_done, size_t bytes_total)>;
  explicit LLM(const std::string& model_dir, const EngineOptions& options = {},
               const LoadProgress& progress = nullptr);
  ~LLM();
  LLM(const LLM&) = delete;
  LLM& operator=(const LLM&) = delete;

  /// One RequestOutput per prompt, in input order. `params` holds one set for all prompts
  /// or one per prompt. Every prompt and params set is checked before any work starts: bad
  /// sampling parameters, an empty prompt, a prompt that cannot fit max_model_len, ids
  /// outside the vocabulary, text without a tokenizer or bad chat messages throw
  /// pagellm::Error naming the prompt index and the problem.
  std::vector<RequestOutput> generate(const std::vector<Prompt>& prompts,
                                      const std::vector<SamplingParams>& params);
  /// Called on the caller's thread after every engine step with the requests finished so
  /// far and in all. Returning false aborts the call: every unfinished request ends with
  /// FinishReason::kAborted, its pages are freed, and generate returns the outputs as they
  /// stand (the LLM stays usable). For progress bars and interrupts (the Python package's
  /// tqdm and Ctrl-C). An exception it throws aborts the same way, then propagates.
  using StepCallback = std::function<bool(size_t requests_finished, size_t requests_total)>;
  std::vector<RequestOutput> generate(const std::vector<Prompt>& prompts,
                                      const std::vector<SamplingParams>& params,
                                      const StepCallback& on_step);
  std::vector<RequestOutput> generate(const std::vector<Prompt>& prompts,
                                      const SamplingParams& params = {});
  /// With LoRA adapters (vLLM's generate(..., lora_request=)): `lora_requests` holds none
  /// (the base model), one for all prompts, or one per prompt (an empty name: the base
  /// model for that prompt). A name not loaded yet is loaded from its path first
  /// (load_lora_adapter); a loaded name is used as loaded (its path must be empty or the
  /// same). Errors (a bad folder, an unknown name without a path) throw before any
  /// request is queued.
  std::vector<RequestOutput> generate(const std::vector<Prompt>& prompts,
                                      const std::vector<SamplingParams>& params,
                                      const std::vector<LoraRequest>& lora_requests,
                                      const StepCallback& on_step = nullptr);
  std::vector<RequestOutput> generate(const std::vector<std::string>& prompts,
                                      const SamplingParams& params = {});
  std::vector<RequestOutput> generate(const std::vector<std::vector<int32_t>>& prompt_token_ids,
                                      const SamplingParams& params = {});
  /// Chat conversations through the chat template.
  std::vector<RequestOutput> chat(const std::vector<std::vector<ChatMessage>>& conversations,
                                  const SamplingParams& params = {},
                                  std::optional<bool> enable_thinking = std::nullopt);

  /// Scoring: for each sequence, the raw log-probability the model gives every token after
  /// its first prompt_lengths[i] tokens (empty prompt_lengths: 1 each, i.e. every token
  /// after the first), and with top_k in 1..20 the top_k most likely tokens at each of those
  /// positions; nothing is sampled. What a trainer compares its own logprobs with:
  /// ScoreOutput::logprobs are the numbers generate reports as CompletionOutput::logprobs
  /// for the same tokens (docs/design.md, "The log-probability contract", states the
  /// precision). Checked before any work: an empty or one-token sequence, one longer than
  /// max_model_len, a prompt length outside [1, size - 1], ids outside the vocabulary or a
  /// bad top_k throw pagellm::Error naming the sequence. KV pages are freed before return.
  /// `lora`: score with that loaded adapter (by name; "" the base model).
  std::vector<ScoreOutput> score(const std::vector<std::vector<int32_t>>& sequences,
                                 const std::vector<int32_t>& prompt_lengths = {},
                                 int top_k = 0, const std::string& lora = "");

  /// Text to ids with the model's tokenizer (throws without one).
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = true) const;
  /// The prompt text a chat Prompt renders to (add_generation_prompt on).
  std::string apply_chat_template(const Prompt& chat_prompt) const;
  /// Token ids of any Prompt, exactly as generate would use them.
  std::vector<int32_t> prompt_token_ids(const Prompt& prompt) const;

  bool has_tokenizer() const;
  int64_t vocab_size() const;
  int32_t max_model_len() const;
  /// KV pages free now and in all (page 0, reserved, excluded): equal when idle.
  int64_t num_free_pages() const;
  int64_t num_usable_pages() const;
  /// Version of the weights the next tokens are sampled with (see RequestOutput).
  uint64_t weights_version() const;

  /// Rewrites weights in place from named tensors (Hugging Face names; any subset; host,
  /// pinned host or device memory) and bumps weights_version(); docs/design.md, "Weight
  /// updates". Between generate calls no request runs, so nothing waits. Atomic: a wrong
  /// name, shape, dtype or memory kind throws pagellm::Error naming each problem, and the
  /// old weights keep serving.
  WeightUpdateResult update_weights(const std::vector<NamedTensor>& tensors);
  /// The same from a safetensors folder (model.safetensors or an index with shards) or file.
  WeightUpdateResult load_weights(const std::string& path);

  /// LoRA adapters (docs/design.md, "LoRA"): loads the PEFT folder request.path under
  /// request.name into a free slot (EngineOptions::max_loras), or replaces the adapter of
  /// that name in place (its version goes up; prefix-cache pages of the old one never
  /// match again). Throws pagellm::Error naming the problem and changes nothing.
  LoraAdapterInfo load_lora_adapter(const LoraRequest& request);
  /// Unloads an adapter; throws pagellm::Error for an unknown name.
  void unload_lora_adapter(const std::string& name);
  /// The loaded adapters, by name.
  std::vector<LoraAdapterInfo> list_lora_adapters() const;
  /// Releases the KV cache's memory (and, with options.offload_weights, the weights' after
  /// copying them to host memory) so that another user of the device, such as a trainer,
  /// can have it until wake_up(). Throws pagellm::Error when already asleep or when the
  /// backend cannot sleep. generate and chat throw while asleep. The report gives the bytes
  /// released and the backend's free memory before and after.
  SleepReport sleep(const SleepOptions& options = {});
  /// Brings the memory back (weights bit for bit, an empty KV cache); outputs afterwards
  /// are those the LLM gave before sleeping. Throws pagellm::Error when awake.
  WakeReport wake_up();
  bool is_sleeping() const;

  /// Prefix cache (EngineOptions::enable_prefix_caching): forgets every cached KV page, so
  /// that no later request reuses K/V computed before the call.
  void reset_prefix_cache();
  /// Lookups, hits and evictions since loading, and the pages cached now.
  PrefixCacheStats prefix_cache_stats() const;

  /// Debugging and tests: called after each forward pass with every sampled row's float32
  /// logits [vocab]. sample_number counts the samples this LLM has queued, from 0, in
  /// order (prompt i's sample j of a first generate call with n samples each: i * n + j);
  /// output_index is the index of the token the logits produce. Costs a device-to-host
  /// copy each step; nullptr removes it.
  using LogitsHook = std::function<void(int64_t sample_number, int64_t output_index,
                                        const float* logits, int64_t vocab)>;
  void set_logits_hook(LogitsHook hook);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagellm
