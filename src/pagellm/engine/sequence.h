// A request as the scheduler and engine track it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagellm/kv/kv_cache_manager.h"
#include "pagellm/outputs.h"
#include "pagellm/sampling/sampling_params.h"

namespace pagellm {

enum class SequenceStatus { kWaiting, kRunning, kFinished };

// FinishReason and finish_reason_name() are public (pagellm/outputs.h): the engine's
// reasons are what a caller sees. The engine never sets kStopString (the text API does).

/// One generation request and its progress. Owned by the engine; the scheduler holds
/// pointers. Tokens are the prompt followed by the output. The KvSequence part (id,
/// num_computed, pages, slot) is what the KV cache manager reads and writes: num_computed
/// counts the tokens whose K/V are in the cache (it drops to 0 after a preemption, and the
/// prompt and output so far are recomputed); pages and slot are the sequence's pages and
/// page-table row while it runs, and empty and 0 otherwise.
struct Sequence : KvSequence {
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  std::vector<SampledToken> sampled;  // one per output token, with log-probabilities
  SamplingParams params;
  /// What min_tokens bans until the sample has params.min_tokens outputs: the model's EOS
  /// ids (unless ignore_eos) and params.stop_token_ids. Empty when min_tokens is 0.
  std::vector<int32_t> min_tokens_banned;
  uint64_t seed = 0;  // effective seed (params.seed or derived from id)
  /// The model's LoRA slot the request runs with (0: none); adapter_key (KvSequence) is
  /// that adapter's prefix-cache identity.
  int32_t lora_slot = 0;

  SequenceStatus status = SequenceStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;  // set with FinishReason::kError

  int32_t num_preemptions = 0;

  /// n-sample fan-out (Engine::add_request_group). On sample 0 of a group until its prompt
  /// is prefilled: samples 1..n-1, in order, forked from it (sharing its pages) at the step
  /// that completes the prefill. On a sample waiting for that: sample 0. Empty and null
  /// otherwise (once forked, a sample is an ordinary running sequence).
  std::vector<Sequence*> fan_out;
  Sequence* fan_out_parent = nullptr;

  int32_t num_tokens() const { return static_cast<int32_t>(prompt.size() + output.size()); }
  /// Prompt then output, for the prefix cache's hashing.
  SequenceTokens tokens() const { return {&prompt, &output}; }
  int32_t token_at(int32_t i) const {
    int32_t p = static_cast<int32_t>(prompt.size());
    return i < p ? prompt[i] : output[i - p];
  }
  bool finished() const { return status == SequenceStatus::kFinished; }
};

}  // namespace pagellm
