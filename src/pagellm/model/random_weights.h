// Random Qwen3 weights generated in memory, with the values make-model writes to disk.
#pragma once

#include <cstdint>

#include "pagellm/model/config.h"
#include "pagellm/model/qwen3.h"
#include "pagellm/model/qwen3_weights.h"

namespace pagellm {

/// Mean and standard deviation of a random weight of this kind: linear and embedding
/// N(0, 0.02) (transformers' initializer_range), RMSNorm scales N(1, 0.1).
struct RandomInit {
  float mean;
  float stddev;
};
RandomInit random_init_for(WeightKind kind);

/// A WeightLookup that generates each weight on request from (seed, name), identical to
/// the folder make_model() writes with the same seed and dtype. The returned view stays
/// valid until the next call (one reusable buffer), which is how Qwen3Model uses it.
WeightLookup random_weight_lookup(const Qwen3Config& config, uint64_t seed, DType dtype);

}  // namespace pagellm
