#include "pagellm/attention/admission.h"

#include <sstream>

#include "pagellm/attention/device_profile.h"
#include "pagellm/attention/shape_class.h"
#include "pagellm/common/dtype.h"

namespace pagellm {

const char* rule_name(AdmissionRule r) {
  switch (r) {
    case AdmissionRule::kDomain: return "domain";
    case AdmissionRule::kConsistency: return "consistency";
    case AdmissionRule::kWork: return "work";
    case AdmissionRule::kDevice: return "device";
    case AdmissionRule::kPlanReady: return "plan";
  }
  return "?";
}

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kNotEvaluated: return "not evaluated";
    case Verdict::kPass: return "pass";
    case Verdict::kFail: return "fail";
    case Verdict::kSkipped: return "skipped";
  }
  return "?";
}

std::string describe(AdmissionRule rule, const RuleResult& r) {
  std::ostringstream s;
  const auto seq = [&]() -> std::ostringstream& {
    s << "sequence " << r.index << ": ";
    return s;
  };
  switch (r.reason) {
    case Reason::kNone:
      s << (r.verdict == Verdict::kNotEvaluated ? "not reached: an earlier rule decided" : "");
      break;
    case Reason::kPassed:
      switch (rule) {
        case AdmissionRule::kDomain: s << "within cuDNN's supported domain"; break;
        case AdmissionRule::kConsistency: s << "declared totals and maxima match the lengths"; break;
        case AdmissionRule::kWork: s << "work within the measured crossover"; break;
        case AdmissionRule::kDevice: s << "a measured crossover table covers this call"; break;
        case AdmissionRule::kPlanReady: s << "the cuDNN plan for this shape is built"; break;
      }
      break;
    case Reason::kNoCudnn: s << "no cuDNN library is loaded"; break;
    case Reason::kCudnnTooOld:
      s << "cuDNN " << cudnn_version_string(static_cast<CudnnVersion>(r.value))
        << " is older than " << cudnn_version_string(static_cast<CudnnVersion>(r.limit))
        << ", the first release whose paged SDPA serves this call";
      break;
    case Reason::kCudnnKnownBad:
      s << "cuDNN " << cudnn_version_string(static_cast<CudnnVersion>(r.value))
        << " has known bf16/fp16 SDPA forward bugs (9.10.0 and 9.10.1 are excluded)";
      break;
    case Reason::kComputeCapability:
      s << "compute capability " << r.value / 10 << "." << r.value % 10
        << " is below 8.0, the oldest cuDNN's bf16 SDPA supports";
      break;
    case Reason::kDtype:
      s << "dtype " << dtype_name(static_cast<DType>(r.value))
        << " is not supported (cuDNN route: bf16 or f16)";
      break;
    case Reason::kHeadDim:
      s << "head_dim " << r.value << " is not a multiple of 8 in [8, " << r.limit
        << "] (cuDNN paged SDPA of this version)";
      break;
    case Reason::kHeadCounts:
      s << "head counts " << r.value << " query / " << r.limit << " KV must both be positive";
      break;
    case Reason::kGqaRatio:
      s << r.value << " query heads are not a multiple of " << r.limit << " KV heads";
      break;
    case Reason::kPageSize:
      s << "page size " << r.value << " is outside [1, " << r.limit << "]";
      break;
    case Reason::kBatchRange:
      s << "batch has " << r.value << " sequences (need at least 1)";
      break;
    case Reason::kQueryRange:
      s << "declared max query length " << r.value << " is not positive (" << r.limit
        << " tokens declared)";
      break;
    case Reason::kKvRange:
      s << "KV bound " << r.value << " is outside [1, " << r.limit
        << "] (the page-table row's capacity, which cuDNN's graph declares as its KV length, "
           "an int)";
      break;
    case Reason::kOffsetOverflow:
      s << "tokens x query heads x head_dim = " << r.value
        << " exceeds cuDNN's int32 ragged offsets (" << r.limit << ")";
      break;
    case Reason::kGraphRagged:
      s << "ragged (prefill) batches are not routed to cuDNN under graph capture: its per-forward "
           "Q offsets are uploaded outside the graph and a replay would not renew them";
      break;
    case Reason::kOffsetsSize:
      s << "query offsets have " << r.value << " entries, expected num_seqs + 1 = " << r.limit;
      break;
    case Reason::kOffsetsStart: s << "query offsets start at " << r.value << ", not 0"; break;
    case Reason::kOffsetsEnd:
      s << "query offsets end at " << r.value << ", not at the declared " << r.limit << " tokens";
      break;
    case Reason::kQueryNotPositive:
      seq() << "query length " << r.value << " (need 0 < q)";
      break;
    case Reason::kQueryExceedsKv:
      seq() << "query length " << r.value << " exceeds its KV length " << r.limit
            << " (need q <= kv)";
      break;
    case Reason::kMaxQueryMismatch:
      s << "declared max query length " << r.value << " differs from the real maximum " << r.limit;
      break;
    case Reason::kMaxKvMismatch:
      s << "declared max KV length " << r.value << " differs from the real maximum " << r.limit;
      break;
    case Reason::kKvLensSize:
      s << "KV lengths have " << r.value << " entries, expected num_seqs = " << r.limit;
      break;
    case Reason::kPageTableSize:
      s << "page table has " << r.value << " entries, expected num_seqs x max_pages_per_seq = "
        << r.limit;
      break;
    case Reason::kKvExceedsTable:
      seq() << "KV length " << r.value << " exceeds its page-table row (" << r.limit << " tokens)";
      break;
    case Reason::kCapacityBelowKv:
      s << "declared KV capacity " << r.value << " is below the real max KV length " << r.limit;
      break;
    case Reason::kBelowThreshold:
      s << "work " << r.value << " is below the measured crossover " << r.limit
        << " (query heads x causal query-key pairs)";
      break;
    case Reason::kAboveMeasured:
      s << "work " << r.value << " is above the largest measured work " << r.limit
        << " (not extrapolated)";
      break;
    case Reason::kNoThreshold:
      s << "no measured crossover for this call (see rule 4)";
      break;
    case Reason::kUnknownDevice: s << "no crossover table was measured on this device"; break;
    case Reason::kOtherCudnnVersion:
      s << "crossover tables for this device were measured with cuDNN "
        << cudnn_version_string(static_cast<CudnnVersion>(r.limit)) << ", not "
        << cudnn_version_string(static_cast<CudnnVersion>(r.value));
      break;
    case Reason::kNoEntry:
      s << "the device's table has no entry for shape class "
        << shape_class_name(ShapeClass::from_code(r.value))
        << " at this launch mode, phase and head_dim (cuDNN never won there, or it was not "
           "measured)";
      break;
    case Reason::kPageSizeNotMeasured:
      s << "page size " << r.value << " was not measured";
      break;
    case Reason::kGqaNotMeasured: s << "GQA ratio " << r.value << " was not measured"; break;
    case Reason::kBatchNotMeasured:
      s << r.value << " sequences exceed the largest measured batch " << r.limit;
      break;
    case Reason::kQueryNotMeasured:
      s << "max query length " << r.value << " exceeds the largest measured " << r.limit;
      break;
    case Reason::kKvNotMeasured:
      s << "max KV length " << r.value << " exceeds the largest measured " << r.limit;
      break;
    case Reason::kPlanNotBuilt:
      s << "the cuDNN plan for this shape is not built yet (requested; auto never builds on "
           "the hot path)";
      break;
    case Reason::kPlanNotChecked: s << "no plan cache attached (not checked)"; break;
    case Reason::kExplicitChoice: s << "not applied: explicit --attention-backend"; break;
    case Reason::kGraphBound:
      s << "not applied: the planner owns a captured graph and keeps its provider";
      break;
  }
  return s.str();
}

}  // namespace pagellm
