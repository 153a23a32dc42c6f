// The admission rules of `--attention-backend auto`, and the record of how each went.
//
// plan() evaluates the rules in order; the first that fails decides (native). The record
// holds numbers and a reason code, not text, so that plan() allocates nothing on the hot
// path; describe() turns it into a sentence for `pagellm attention-plan` and for errors.
#pragma once

#include <cstdint>
#include <string>

namespace pagellm {

/// The admission rules, in the order they are evaluated.
enum class AdmissionRule : uint8_t {
  kDomain = 0,   // 1. static domain: dtype, head dim, GQA ratio, page size, ranges, cuDNN version
  kConsistency,  // 2. declared totals and maxima agree with the per-request lengths
  kWork,         // 3. causal query-key pairs actually computed, against the measured threshold
  kDevice,       // 4. a measured crossover table exists for this device and cuDNN version
  kPlanReady,    // 5. the cuDNN execution plan for this shape is already built (auto never
                 //    builds one on the hot path)
};
inline constexpr int kNumAdmissionRules = 5;

const char* rule_name(AdmissionRule r);  // "domain", "consistency", "work", "device", "plan"

enum class Verdict : uint8_t {
  kNotEvaluated,  // an earlier rule decided, or nothing to check it against
  kPass,
  kFail,
  kSkipped,  // deliberately not applied (explicit backend choice, graph-bound planner)
};
const char* verdict_name(Verdict v);  // "not evaluated", "pass", "fail", "skipped"

/// Why a rule passed, failed or was skipped. The numbers a message needs are in RuleResult.
enum class Reason : uint8_t {
  kNone,
  kPassed,
  // domain
  kNoCudnn,              // no cuDNN library loaded (version 0)
  kCudnnTooOld,          // value: version, limit: first supporting version
  kCudnnKnownBad,        // value: version
  kComputeCapability,    // value: major * 10 + minor, limit: minimum
  kDtype,                // value: (int) DType
  kHeadDim,              // value: head_dim, limit: largest supported
  kHeadCounts,           // value: q heads, limit: kv heads (non-positive count)
  kGqaRatio,             // value: q heads, limit: kv heads
  kPageSize,             // value: page size, limit: largest accepted
  kBatchRange,           // value: declared sequences
  kQueryRange,           // value: declared max query length
  kKvRange,              // value: declared max KV length (or capacity), limit: table capacity
  kOffsetOverflow,       // value: T * Hq * D, limit: INT32_MAX (cuDNN's int32 ragged offsets)
  kGraphRagged,          // ragged Q under graph capture (per-forward offsets are not replayed)
  // consistency
  kOffsetsSize,          // value: query_start entries, limit: num_seqs + 1
  kOffsetsStart,         // value: query_start[0]
  kOffsetsEnd,           // value: query_start[B], limit: declared num_tokens
  kQueryNotPositive,     // index: sequence, value: q
  kQueryExceedsKv,       // index: sequence, value: q, limit: kv
  kMaxQueryMismatch,     // value: declared, limit: actual
  kMaxKvMismatch,        // value: declared, limit: actual
  kKvLensSize,           // value: kv_lens entries, limit: num_seqs
  kPageTableSize,        // value: entries, limit: num_seqs * max_pages_per_seq
  kKvExceedsTable,       // index: sequence, value: kv, limit: max_pages_per_seq * page_size
  kCapacityBelowKv,      // value: kv_len_capacity, limit: actual max kv
  // work
  kBelowThreshold,       // value: work, limit: min_work
  kAboveMeasured,        // value: work, limit: largest measured work
  kNoThreshold,          // no matching crossover entry, so no threshold (rule 4 decides)
  // device
  kUnknownDevice,        // no table for this device
  kOtherCudnnVersion,    // value: this cuDNN, limit: a version a table exists for
  kNoEntry,              // value: ShapeClass::code(); no entry for this mode, phase, head dim, class
  kPageSizeNotMeasured,  // value: page size
  kGqaNotMeasured,       // value: GQA ratio
  kBatchNotMeasured,     // value: sequences, limit: largest measured
  kQueryNotMeasured,     // value: max query length, limit: largest measured
  kKvNotMeasured,        // value: max KV length, limit: largest measured
  // plan
  kPlanNotBuilt,
  kPlanNotChecked,       // no plan registry (explain without a GPU)
  // skipped
  kExplicitChoice,       // --attention-backend native or cudnn
  kGraphBound,           // the planner owns a captured graph; its provider is fixed
};

/// The outcome of one rule.
struct RuleResult {
  Verdict verdict = Verdict::kNotEvaluated;
  Reason reason = Reason::kNone;
  int64_t value = 0;
  int64_t limit = 0;
  int32_t index = -1;  // the sequence a per-request check failed on, or -1

  static RuleResult pass() { return {Verdict::kPass, Reason::kPassed, 0, 0, -1}; }
  static RuleResult fail(Reason r, int64_t value = 0, int64_t limit = 0, int32_t index = -1) {
    return {Verdict::kFail, r, value, limit, index};
  }
  static RuleResult skip(Reason r) { return {Verdict::kSkipped, r, 0, 0, -1}; }
  bool failed() const { return verdict == Verdict::kFail; }
};

/// One sentence for a rule's outcome, for example
/// "work 1048576 is below the measured crossover 2097152 (heads x causal pairs)".
std::string describe(AdmissionRule rule, const RuleResult& result);

}  // namespace pagellm
