// The sampling rules that the host sampler (sampler.cpp) and the GPU sampler
// (cuda/sampling.cu, with its host side in the CUDA backend) must apply identically, written
// once: which rows are penalised, how a penalty changes one logit, which tokens the
// penalties touch and how often each occurs, and the Gumbel race's pruning table. The GPU
// sampler is tested against the host one token for token (tests/cuda/sampler_test.cpp), so
// a rule changed here changes both.
//
// The functions marked PAGELLM_HOST_DEVICE compile for the host and, under nvcc, for the
// device too (common/random.h defines the macro). PenaltyCounter and the table's entries
// are host code.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "pagellm/common/random.h"

namespace pagellm {

// ---- penalties ------------------------------------------------------------------------

/// Whether a row with these parameters is penalised at all (any penalty not neutral).
PAGELLM_HOST_DEVICE inline bool penalties_enabled(float repetition_penalty,
                                                  float presence_penalty,
                                                  float frequency_penalty) {
  return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
}

/// PenaltyCount::output_count of a banned token (SamplingRow::banned_tokens): its logit
/// becomes -inf whatever the penalties.
inline constexpr int32_t kBannedToken = -1;

/// One logit after the penalties (vLLM's order): the repetition penalty divides a positive
/// logit and multiplies a negative one (for every token of the prompt or the output, when
/// it is not 1); a token that occurs output_count > 0 times in the output then loses
/// frequency_penalty x output_count and presence_penalty. Every product and difference is
/// rounded once (no fused multiply-add), on the host and on the device alike.
PAGELLM_HOST_DEVICE inline float penalised_logit(float v, float repetition_penalty,
                                                 float frequency_penalty,
                                                 float presence_penalty,
                                                 int32_t output_count) {
  if (output_count == kBannedToken) return -INFINITY;
#ifdef __CUDA_ARCH__
  if (repetition_penalty != 1.0f) {
    v = v > 0.0f ? v / repetition_penalty : __fmul_rn(v, repetition_penalty);
  }
  if (output_count > 0) {
    v = __fsub_rn(v, __fmul_rn(frequency_penalty, static_cast<float>(output_count)));
    v = __fsub_rn(v, presence_penalty);
  }
#else
  if (repetition_penalty != 1.0f) {
    v = v > 0.0f ? v / repetition_penalty : v * repetition_penalty;
  }
  if (output_count > 0) {
    v = v - frequency_penalty * static_cast<float>(output_count);
    v = v - presence_penalty;
  }
#endif
  return v;
}

/// A distinct token the penalties touch and how many times it occurs in the output (0: in
/// the prompt only, listed only when the repetition penalty is on; kBannedToken: banned).
/// The GPU sampler reads these as they are (cuda/sampling.h: GpuPenaltyEntry).
struct PenaltyCount {
  int32_t token;
  int32_t output_count;
};

/// Lists the tokens a row's penalties touch: every distinct token of the output and, when
/// the repetition penalty is on, of the prompt, with its count in the output, in first-seen
/// order (output first). Keeps [V] scratch between rows (all zero between calls), so one
/// row costs O(prompt + output), not O(V). One per thread; not thread-safe.
class PenaltyCounter {
 public:
  /// Appends the row's entries to `out`. prompt, output and banned may be null (empty);
  /// each banned token is listed once with kBannedToken (also when it occurs elsewhere).
  /// Checks every id before counting: throws Error ("sampling: output token id 7 is
  /// outside the vocabulary [0, 5)") and leaves the scratch clean when one is outside
  /// [0, vocab_size).
  void count(const std::vector<int32_t>* prompt, const std::vector<int32_t>* output,
             bool repetition, int64_t vocab_size, std::vector<PenaltyCount>& out,
             const std::vector<int32_t>* banned = nullptr);

 private:
  std::vector<int32_t> counts_;   // [V] occurrences in the output
  std::vector<uint8_t> seen_;     // [V] 1 once listed
  std::vector<int32_t> touched_;  // tokens in first-seen order
};

// ---- the Gumbel race's pruning table --------------------------------------------------

/// Race pruning: a token whose Gumbel noise must exceed `gap` to beat the best score can
/// only do so if its 53-bit draw k = bits >> 11 is at least entry floor(gap * 8) of the
/// table. Entry j = floor(exp(-exp(-j / 8)) * 2^53) - 4096: u >= exp(-exp(-gap)) is
/// necessary for -log(-log u) >= gap, u <= (k + 1) 2^-53, and the 4096 (u - 4.5e-13)
/// absorbs the rounding of both logarithms with room to spare. Gaps above kGumbelMax
/// cannot be bridged at all.
inline constexpr int kPruneStepsPerNat = 8;
inline constexpr int kPruneTableSize = static_cast<int>(kGumbelMax * kPruneStepsPerNat) + 2;

/// Entry j of the table (host; the GPU sampler gets a copy the host filled).
inline uint64_t prune_table_entry(int j) {
  const double u = std::exp(-std::exp(-double(j) / kPruneStepsPerNat));
  const double k = std::floor(u * 0x1p53) - 4096.0;
  return k <= 0.0 ? 0 : static_cast<uint64_t>(k);
}

/// Whether a token `gap` below the running best score can never win, whatever its draw
/// (checked before its random bits are computed).
PAGELLM_HOST_DEVICE inline bool race_out_of_reach(double gap) { return gap > kGumbelMax; }

/// Whether the token with random `bits`, `gap` below the running best score, cannot win:
/// the table says its draw is too small (no logarithm evaluated). `table` holds
/// kPruneTableSize entries of prune_table_entry; gap <= kGumbelMax.
PAGELLM_HOST_DEVICE inline bool race_pruned(double gap, uint64_t bits, const uint64_t* table) {
  if (!(gap > 1e-9)) return false;
  const int j = static_cast<int>((gap - 1e-9) * kPruneStepsPerNat);
  return (bits >> 11) < table[j];
}

}  // namespace pagellm
