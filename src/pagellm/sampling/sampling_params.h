// Per-request sampling parameters and the result of sampling one token.
#pragma once

#include <cstdint>
#include <vector>

// SamplingParams and validate_sampling_params have one definition, the public one.
#include "pagellm/outputs.h"  // TokenLogprob
#include "pagellm/sampling_params.h"

namespace pagellm {

/// One sampled token.
struct SampledToken {
  int32_t token = -1;
  /// log-softmax of the unmodified logits at `token`: the model's own log-probability,
  /// before penalties, temperature and filters.
  float logprob = 0.0f;
  /// log-probability under the processed distribution (only when asked for; else 0).
  float processed_logprob = 0.0f;
  /// The engine's weights version when the token was sampled (set by the engine after the
  /// sampler returns; a token keeps it across later weight updates).
  uint64_t weights_version = 0;
  /// With params.logprobs = k > 0 (filled by add_top_logprobs, sampler.h): the k most
  /// likely raw tokens, the sampled token's raw rank (1-based), and with
  /// processed_logprobs the k most likely kept tokens of the processed distribution.
  std::vector<TokenLogprob> top;
  int32_t rank = 0;
  std::vector<TokenLogprob> processed_top;
};

}  // namespace pagellm
