// Per-request sampling parameters and the result of sampling one token.
#pragma once

#include <cstdint>
#include <vector>

namespace pagellm {

/// How to pick the next token of one request. Defaults sample from the raw distribution.
///
/// Order of processing (matches vLLM/transformers): penalties on the raw logits, then
/// temperature, then top-k, top-p and min-p filters. temperature == 0 means greedy.
/// sampling/sampler.h gives the exact semantics; validate_sampling_params() the ranges.
struct SamplingParams {
  float temperature = 1.0f;
  int top_k = 0;              // -1 or 0: disabled
  float top_p = 1.0f;         // 1: disabled
  float min_p = 0.0f;         // 0: disabled
  float repetition_penalty = 1.0f;  // over prompt and output tokens (transformers semantics)
  float presence_penalty = 0.0f;    // over output tokens (OpenAI semantics)
  float frequency_penalty = 0.0f;   // over output tokens (OpenAI semantics)
  uint64_t seed = 0;
  bool has_seed = false;       // false: the engine derives a seed from the request id
  int max_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  /// Also report each token's log-probability under the processed distribution
  /// (after penalties, temperature and filters, renormalised over the kept tokens;
  /// greedy's processed distribution is one-hot, so 0).
  bool processed_logprobs = false;

  bool greedy() const { return temperature <= 0.0f; }
};

/// One sampled token.
struct SampledToken {
  int32_t token = -1;
  /// log-softmax of the unmodified logits at `token`: the model's own log-probability,
  /// before penalties, temperature and filters.
  float logprob = 0.0f;
  /// log-probability under the processed distribution (only when asked for; else 0).
  float processed_logprob = 0.0f;
};

}  // namespace pagellm
