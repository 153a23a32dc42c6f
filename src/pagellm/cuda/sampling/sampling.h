// Token sampling on the GPU, matching the host sampler (sampling/sampler.h) token for token.
//
// One CTA per logits row does everything the host sampler does for that row: the raw
// log-softmax statistics, penalties (from a host-built list of distinct tokens), greedy
// argmax or temperature + top-k / top-p / min-p + the seeded Gumbel race, and both
// log-probabilities. The host uploads a small per-row parameter block, launches one
// kernel and copies back 16 bytes per row: one synchronisation per step.
//
// Exactness: the same counter-based random bits (common/random.h), the same polynomial
// exp, the same thresholds and tie rules as the host. The only possible differences are
// float summation order in normalisers (which moves a top-p boundary only when the
// cumulative probability lands within ~1e-15 of top_p) and the last bit of the double
// logarithms in the Gumbel noise (which changes a token only when two scores agree to
// ~1e-15).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "pagellm/sampling/rules.h"

namespace pagellm::cuda {

/// Per-row sampling parameters as the kernel reads them (built on the host).
struct GpuSamplingRow {
  float temperature = 1.0f;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t top_k = 0;
  uint32_t flags = 0;            // kSampleGreedy | kSampleProcessedLogprobs | kSamplePenalties
  uint64_t stream_key = 0;       // sampling_stream_key(seed, output_index)
  int32_t penalty_begin = 0;     // first entry of this row in the penalty list
  int32_t penalty_count = 0;     // distinct tokens to penalise
  int32_t scratch_row = -1;      // row of the scratch buffer (rows with penalties only)
  int32_t pad = 0;
};

inline constexpr uint32_t kSampleGreedy = 1u;
inline constexpr uint32_t kSampleProcessedLogprobs = 2u;
inline constexpr uint32_t kSamplePenalties = 4u;

/// One entry of the penalty list: a distinct token of the row's prompt or output and how
/// many times it occurs in the output (0: prompt only; only listed when the repetition
/// penalty is on), as PenaltyCounter (sampling/rules.h) lists it for both samplers.
using GpuPenaltyEntry = PenaltyCount;

/// What the kernel returns per row.
struct GpuSampledToken {
  int32_t token = -1;
  int32_t status = 0;  // kSampleOk or one of the errors below
  float logprob = 0.0f;
  float processed_logprob = 0.0f;
};

inline constexpr int32_t kSampleOk = 0;
inline constexpr int32_t kSampleNoFiniteLogit = 1;         // every raw logit is NaN or -inf
inline constexpr int32_t kSampleNoFiniteAfterPenalties = 2;

/// Fills table[kPruneTableSize] on the host with the Gumbel race's pruning table
/// (prune_table_entry of sampling/rules.h, the host sampler's own).
void fill_prune_table(uint64_t* table);

/// Samples one token per row of logits [num_rows, vocab] (float32, device). rows,
/// penalties, prune_table and out are device arrays; scratch holds one float row of
/// `vocab` per row with penalties (scratch_row). Enqueues one kernel on `stream`.
void launch_sample_rows(const float* logits, int32_t num_rows, int32_t vocab,
                        const GpuSamplingRow* rows, const GpuPenaltyEntry* penalties,
                        float* scratch, const uint64_t* prune_table, GpuSampledToken* out,
                        cudaStream_t stream);

/// Pipelined decode: token_ids[i] = results[src_rows[i]].token for i < n (src_rows on the
/// host, each in [0, result_rows)), ordered after the work on `stream` (the kernels wait
/// for their predecessors before reading, by the launch contract of support/pdl.cuh).
/// Enqueues one kernel per 1,024 tokens.
void launch_feed_sampled_tokens(const GpuSampledToken* results, const int32_t* src_rows,
                                int32_t n, int32_t* token_ids, cudaStream_t stream);

}  // namespace pagellm::cuda
