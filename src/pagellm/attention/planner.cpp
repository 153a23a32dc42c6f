#include "pagellm/attention/planner.h"

#include <algorithm>
#include <climits>
#include <sstream>

#include "pagellm/attention/explain.h"
#include "pagellm/common/check.h"

namespace pagellm {
namespace {

constexpr int kDomain = static_cast<int>(AdmissionRule::kDomain);
constexpr int kConsistency = static_cast<int>(AdmissionRule::kConsistency);
constexpr int kWork = static_cast<int>(AdmissionRule::kWork);
constexpr int kDevice = static_cast<int>(AdmissionRule::kDevice);
constexpr int kPlanReady = static_cast<int>(AdmissionRule::kPlanReady);

// What rule 2 learns from the per-request lengths.
struct BatchFacts {
  int32_t min_query_len = 0;
  int32_t max_query_len = 0;
  int32_t max_kv_len = 0;
  int64_t query_tokens = 0;  // all sequences' query tokens (= the declared token count)
  int64_t work = 0;  // query heads x causal pairs, saturated at INT64_MAX
};

// The class of a consistent batch: its query tokens, its real largest KV, and whether its
// query lengths differ.
ShapeClass shape_class_of(const BatchFacts& f) {
  return classify_shape(f.max_query_len, f.query_tokens, f.max_kv_len,
                        f.min_query_len != f.max_query_len);
}

int64_t saturate(__int128 x) { return x > INT64_MAX ? INT64_MAX : static_cast<int64_t>(x); }

// Rule 2: the declared totals and maxima agree with the per-request lengths. Computes the
// real maxima and the causal work on the way (one pass over the batch, no allocation).
RuleResult check_consistency(const AttentionDomain& d, const AttentionBatchView& b,
                             BatchFacts& facts) {
  const int64_t B = b.num_seqs;
  if (B < 0 || b.query_start_size != static_cast<size_t>(B + 1) ||
      (b.query_start == nullptr && b.query_start_size > 0)) {
    return RuleResult::fail(Reason::kOffsetsSize, static_cast<int64_t>(b.query_start_size), B + 1);
  }
  if (b.kv_lens_size != static_cast<size_t>(B) || (b.kv_lens == nullptr && B > 0)) {
    return RuleResult::fail(Reason::kKvLensSize, static_cast<int64_t>(b.kv_lens_size), B);
  }
  const int64_t table_entries = B * b.max_pages_per_seq;
  if (b.max_pages_per_seq < 0 || b.page_table_size != static_cast<size_t>(table_entries)) {
    return RuleResult::fail(Reason::kPageTableSize, static_cast<int64_t>(b.page_table_size),
                            table_entries);
  }
  if (b.query_start[0] != 0) return RuleResult::fail(Reason::kOffsetsStart, b.query_start[0]);
  if (b.query_start[B] != b.num_tokens) {
    return RuleResult::fail(Reason::kOffsetsEnd, b.query_start[B], b.num_tokens);
  }
  const int64_t row_tokens = int64_t{b.max_pages_per_seq} * d.page_size;
  int32_t min_q = INT32_MAX, max_q = 0, max_kv = 0;
  __int128 pairs = 0;
  for (int64_t s = 0; s < B; ++s) {
    const int64_t q = int64_t{b.query_start[s + 1]} - b.query_start[s];
    const int64_t kv = b.kv_lens[s];
    const int32_t index = static_cast<int32_t>(s);
    if (q <= 0) return RuleResult::fail(Reason::kQueryNotPositive, q, 0, index);
    if (q > kv) return RuleResult::fail(Reason::kQueryExceedsKv, q, kv, index);
    if (kv > row_tokens) return RuleResult::fail(Reason::kKvExceedsTable, kv, row_tokens, index);
    min_q = std::min(min_q, static_cast<int32_t>(q));
    max_q = std::max(max_q, static_cast<int32_t>(q));
    max_kv = std::max(max_kv, static_cast<int32_t>(kv));
    pairs += causal_pairs(q, kv);
  }
  if (b.max_query_len != max_q) {
    return RuleResult::fail(Reason::kMaxQueryMismatch, b.max_query_len, max_q);
  }
  if (b.max_kv_len != max_kv) return RuleResult::fail(Reason::kMaxKvMismatch, b.max_kv_len, max_kv);
  if (b.kv_len_capacity > 0 && b.kv_len_capacity < max_kv) {
    return RuleResult::fail(Reason::kCapacityBelowKv, b.kv_len_capacity, max_kv);
  }
  facts.min_query_len = B > 0 ? min_q : 0;
  facts.max_query_len = max_q;
  facts.max_kv_len = max_kv;
  facts.query_tokens = b.num_tokens;
  facts.work = saturate(pairs * d.num_q_heads);
  return RuleResult::pass();
}

bool contains(const std::vector<int32_t>& sorted, int32_t x) {
  return std::binary_search(sorted.begin(), sorted.end(), x);
}

// Rule 4 for a table entry: the call lies inside what was measured.
RuleResult check_measured_range(const CrossoverEntry& e, const AttentionDomain& d, int32_t seqs,
                                int32_t max_q, int32_t max_kv) {
  if (!contains(e.page_sizes, d.page_size)) {
    return RuleResult::fail(Reason::kPageSizeNotMeasured, d.page_size);
  }
  const int32_t ratio = d.num_q_heads / d.num_kv_heads;
  if (!contains(e.gqa_ratios, ratio)) return RuleResult::fail(Reason::kGqaNotMeasured, ratio);
  if (seqs > e.max_num_seqs) return RuleResult::fail(Reason::kBatchNotMeasured, seqs, e.max_num_seqs);
  if (max_q > e.max_query_len) {
    return RuleResult::fail(Reason::kQueryNotMeasured, max_q, e.max_query_len);
  }
  if (max_kv > e.max_kv_len) return RuleResult::fail(Reason::kKvNotMeasured, max_kv, e.max_kv_len);
  return RuleResult::pass();
}

[[noreturn]] void fail_explicit_cudnn(const AttentionPlan& p, int rule) {
  const AdmissionRule r = static_cast<AdmissionRule>(rule);
  PAGELLM_FAIL() << "--attention-backend cudnn cannot serve this attention call: rule "
                 << rule + 1 << " (" << rule_name(r) << "): " << describe(r, p.rules[rule])
                 << ". Use --attention-backend auto (falls back to the native kernels) or native";
}

}  // namespace

std::string AttentionPlan::summary() const {
  std::ostringstream s;
  s << provider_name(provider) << " (" << choice_name(choice) << ", " << mode_name(mode) << " "
    << phase_name(phase) << "): ";
  if (graph_bound) {
    s << "bound to a captured graph";
  } else if (reason == Reason::kExplicitChoice) {
    s << "explicit --attention-backend " << choice_name(choice);
  } else if (decided_by >= 0) {
    const AdmissionRule r = static_cast<AdmissionRule>(decided_by);
    s << "rule " << decided_by + 1 << " (" << rule_name(r) << "): " << describe(r, rules[decided_by]);
  } else {
    s << "admitted by every rule";
  }
  return s.str();
}

AttentionPlanner::AttentionPlanner(AttentionPlannerConfig config) : config_(std::move(config)) {}

size_t AttentionPlanner::reserved_bytes() const {
  return (plan_.cudnn_seq_len_q.capacity() + plan_.cudnn_ragged_offsets.capacity()) *
         sizeof(int32_t);
}

void AttentionPlanner::reset_plan(const AttentionBatchView& batch, LaunchMode mode) {
  AttentionPlan& p = plan_;
  p.provider = AttentionProvider::kNative;
  p.choice = config_.choice;
  p.mode = mode;
  p.phase = batch.max_query_len <= 1 ? AttentionPhase::kDecode : AttentionPhase::kPrefill;
  p.graph_bound = false;
  p.rules.fill(RuleResult{});
  p.decided_by = -1;
  p.reason = Reason::kNone;
  p.num_seqs = batch.num_seqs;
  p.num_tokens = batch.num_tokens;
  p.max_query_len = batch.max_query_len;
  p.max_kv_len = batch.max_kv_len;
  p.kv_bound = 0;
  p.work = p.work_lo = p.work_hi = -1;
  p.min_work = p.max_work = -1;
  p.shape_class = ShapeClass{};
  p.class_known = false;
  p.entry = nullptr;
  p.cudnn_key = CudnnPlanKey{};
  p.cudnn_plan_missing = false;
  p.cudnn_seq_len_q.clear();  // keeps capacity: no allocation within what was reserved
  p.cudnn_ragged_offsets.clear();
  p.epoch = epoch_;
}

void AttentionPlanner::fill_cudnn_arrays(const AttentionDomain& d, const AttentionBatchView& b) {
  AttentionPlan& p = plan_;
  if (!p.cudnn_key.ragged) return;  // decode: dense Q, seq_len_q is all ones (kept on device)
  const int64_t row = int64_t{d.num_q_heads} * d.head_dim;
  p.cudnn_seq_len_q.resize(static_cast<size_t>(b.num_seqs));
  p.cudnn_ragged_offsets.resize(static_cast<size_t>(b.num_seqs) + 1);
  for (int32_t s = 0; s <= b.num_seqs; ++s) {
    // Rule 1 bounded tokens x Hq x D by INT_MAX, so these fit.
    p.cudnn_ragged_offsets[s] = static_cast<int32_t>(b.query_start[s] * row);
    if (s < b.num_seqs) p.cudnn_seq_len_q[s] = b.query_start[s + 1] - b.query_start[s];
  }
}

void AttentionPlanner::evaluate(const AttentionDomain& d, const AttentionBatchView& batch_in,
                                LaunchMode mode, int32_t query_capacity) {
  AttentionPlan& p = plan_;
  if (config_.choice == AttentionBackendChoice::kNative) {
    for (RuleResult& r : p.rules) r = RuleResult::skip(Reason::kExplicitChoice);
    p.reason = Reason::kExplicitChoice;
    return;
  }
  const bool explicit_cudnn = config_.choice == AttentionBackendChoice::kCudnn;

  // A graph replays with any KV length up to its capacity; without a declared capacity,
  // assume the worst a replay could bring: the whole page-table row.
  AttentionBatchView batch = batch_in;
  if (mode == LaunchMode::kGraph && batch.kv_len_capacity <= 0) {
    const int64_t row = int64_t{batch.max_pages_per_seq} * d.page_size;
    batch.kv_len_capacity = static_cast<int32_t>(std::clamp<int64_t>(row, 0, INT_MAX));
  }

  p.rules[kDomain] = check_cudnn_domain(d, batch, p.phase, mode, config_.device);
  BatchFacts facts;
  p.rules[kConsistency] = check_consistency(d, batch, facts);
  if (p.rules[kConsistency].verdict == Verdict::kPass) {
    p.max_query_len = facts.max_query_len;
    p.max_kv_len = facts.max_kv_len;
    p.work = facts.work;
    p.phase = facts.max_query_len <= 1 ? AttentionPhase::kDecode : AttentionPhase::kPrefill;
    p.shape_class = shape_class_of(facts);
    p.class_known = true;
  }
  for (int rule : {kDomain, kConsistency}) {
    if (p.rules[rule].failed()) {
      if (explicit_cudnn) fail_explicit_cudnn(p, rule);
      p.decided_by = rule;
      return;
    }
  }

  // The work range this decision must hold for: the call itself (eager), or every replay
  // of the graph, from KV length 1 to the capacity (decode; ragged graphs failed rule 1).
  if (mode == LaunchMode::kGraph) {
    const __int128 per_seq_hi = causal_pairs(1, batch.kv_len_capacity);
    p.kv_bound = batch.kv_len_capacity;
    p.work_lo = saturate(static_cast<__int128>(batch.num_seqs) * d.num_q_heads);
    p.work_hi = saturate(per_seq_hi * batch.num_seqs * d.num_q_heads);
  } else {
    p.kv_bound = p.max_kv_len;
    p.work_lo = p.work_hi = p.work;
  }

  if (explicit_cudnn) {
    p.rules[kWork] = RuleResult::skip(Reason::kExplicitChoice);
    p.rules[kDevice] = RuleResult::skip(Reason::kExplicitChoice);
    p.reason = Reason::kExplicitChoice;
  } else {
    const CrossoverTable* table = config_.tables ? config_.tables->find(config_.device) : nullptr;
    // The entry of the call's shape class. A graph is decode here (rule 1 refused prefill
    // graphs), and decode is one class for every KV length a replay can bring, so the
    // entry holds for the whole capacity; rule 3 judges the capacity's work range in it.
    const CrossoverEntry* entry =
        table ? table->find(mode, p.phase, d.head_dim, p.shape_class) : nullptr;
    p.entry = entry;
    // Rule 3: the causal work, never a product of maxima.
    if (entry == nullptr) {
      p.rules[kWork] = {Verdict::kNotEvaluated, Reason::kNoThreshold, 0, 0, -1};
    } else {
      p.min_work = entry->min_work;
      p.max_work = entry->max_work;
      if (p.work_lo < entry->min_work) {
        p.rules[kWork] = RuleResult::fail(Reason::kBelowThreshold, p.work_lo, entry->min_work);
      } else if (p.work_hi > entry->max_work) {
        p.rules[kWork] = RuleResult::fail(Reason::kAboveMeasured, p.work_hi, entry->max_work);
      } else {
        p.rules[kWork] = RuleResult::pass();
      }
    }
    // Rule 4: a table measured on this device and cuDNN, covering this call.
    if (table == nullptr) {
      const CrossoverTable* other =
          config_.tables ? config_.tables->find_other_version(config_.device) : nullptr;
      p.rules[kDevice] = other ? RuleResult::fail(Reason::kOtherCudnnVersion,
                                                  config_.device.cudnn_version,
                                                  other->device.cudnn_version)
                               : RuleResult::fail(Reason::kUnknownDevice);
    } else if (entry == nullptr) {
      p.rules[kDevice] = RuleResult::fail(Reason::kNoEntry, p.shape_class.code());
    } else {
      p.rules[kDevice] =
          check_measured_range(*entry, d, batch.num_seqs, p.max_query_len, p.kv_bound);
    }
    for (int rule : {kWork, kDevice}) {
      if (p.rules[rule].failed()) {
        p.decided_by = rule;
        return;
      }
    }
  }

  p.cudnn_key = make_cudnn_plan_key(d, batch, p.phase, p.max_query_len, p.max_kv_len,
                                    query_capacity);
  // Rule 5: never build a cuDNN plan on the hot path under auto.
  if (config_.registry == nullptr) {
    p.rules[kPlanReady] = {Verdict::kNotEvaluated, Reason::kPlanNotChecked, 0, 0, -1};
  } else if (config_.registry->has_plan(p.cudnn_key)) {
    p.rules[kPlanReady] = RuleResult::pass();
  } else if (explicit_cudnn) {
    p.rules[kPlanReady] = RuleResult::skip(Reason::kExplicitChoice);
    p.cudnn_plan_missing = true;
  } else {
    config_.registry->request_plan(p.cudnn_key);
    p.rules[kPlanReady] = RuleResult::fail(Reason::kPlanNotBuilt);
    p.decided_by = kPlanReady;
    return;
  }
  if (!explicit_cudnn) p.reason = Reason::kPassed;
  p.provider = AttentionProvider::kCudnn;
  fill_cudnn_arrays(d, batch);
}

const AttentionPlan& AttentionPlanner::plan(const AttentionDomain& domain,
                                            const AttentionBatchView& batch, LaunchMode mode) {
  ++epoch_;
  if (bound_) {
    replan_bound(domain, batch);
  } else {
    reset_plan(batch, mode);
    evaluate(domain, batch, mode, 0);
  }
  return plan_;
}

const AttentionPlan& AttentionPlanner::bind_to_graph(const AttentionDomain& domain,
                                                     const GraphCapacity& cap,
                                                     const AttentionBatchView& representative) {
  PAGELLM_CHECK(!bound_) << "attention planner already owns a captured graph; release_graph() "
                            "before binding another";
  const int64_t row_tokens = int64_t{cap.max_pages_per_seq} * domain.page_size;
  PAGELLM_CHECK(cap.num_seqs > 0 && cap.max_num_tokens >= cap.num_seqs &&
                cap.max_query_len > 0 && cap.max_query_len <= cap.max_num_tokens &&
                cap.max_pages_per_seq > 0 && cap.kv_len_capacity > 0 &&
                cap.kv_len_capacity <= row_tokens)
      << "graph capacity is malformed: " << cap.num_seqs << " sequences, " << cap.max_num_tokens
      << " tokens, max query " << cap.max_query_len << ", KV capacity " << cap.kv_len_capacity
      << " with " << cap.max_pages_per_seq << " pages of " << domain.page_size
      << " (need sequences > 0, tokens >= sequences, 0 < max query <= tokens, "
         "0 < KV capacity <= pages x page size)";
  check_capacity(cap, representative, "the batch it is captured with");
  ++epoch_;
  // Reserve once, for the capacity: re-plans within it never allocate, so the host arrays a
  // replay uploads from keep their addresses; linear in the batch (one int per sequence
  // and one per offset).
  plan_.cudnn_seq_len_q.reserve(static_cast<size_t>(cap.num_seqs));
  plan_.cudnn_ragged_offsets.reserve(static_cast<size_t>(cap.num_seqs) + 1);
  AttentionBatchView view = representative;
  view.kv_len_capacity = cap.kv_len_capacity;
  reset_plan(view, LaunchMode::kGraph);
  evaluate(domain, view, LaunchMode::kGraph, cap.max_query_len);
  bound_ = true;
  capacity_ = cap;
  bound_domain_ = domain;
  bound_provider_ = plan_.provider;
  bound_key_ = plan_.cudnn_key;
  plan_.graph_bound = true;
  return plan_;
}

void AttentionPlanner::release_graph() {
  bound_ = false;
  capacity_ = GraphCapacity{};
}

void AttentionPlanner::check_capacity(const GraphCapacity& cap, const AttentionBatchView& b,
                                      const char* what) const {
  PAGELLM_CHECK(b.num_seqs == cap.num_seqs && b.num_tokens <= cap.max_num_tokens &&
                b.max_query_len <= cap.max_query_len &&
                b.max_pages_per_seq == cap.max_pages_per_seq &&
                b.max_kv_len <= cap.kv_len_capacity &&
                (b.kv_len_capacity == 0 || b.kv_len_capacity <= cap.kv_len_capacity))
      << "attention planner bound to a captured graph: " << what << " (" << b.num_seqs
      << " sequences, " << b.num_tokens << " tokens, max query " << b.max_query_len
      << ", max KV " << b.max_kv_len << ", " << b.max_pages_per_seq
      << " pages per sequence) does not fit the graph's capacity (exactly " << cap.num_seqs
      << " sequences, up to " << cap.max_num_tokens << " tokens, max query "
      << cap.max_query_len << ", KV up to " << cap.kv_len_capacity << ", "
      << cap.max_pages_per_seq << " pages per sequence); pad to the capacity or run eagerly";
}

void AttentionPlanner::replan_bound(const AttentionDomain& d, const AttentionBatchView& batch) {
  PAGELLM_CHECK(d == bound_domain_)
      << "attention planner bound to a captured graph: the attention shape changed (now "
      << d.num_q_heads << "/" << d.num_kv_heads << " heads, head_dim " << d.head_dim
      << ", page size " << d.page_size << "; captured with " << bound_domain_.num_q_heads << "/"
      << bound_domain_.num_kv_heads << ", " << bound_domain_.head_dim << ", "
      << bound_domain_.page_size << ")";
  check_capacity(capacity_, batch, "this batch");
  AttentionBatchView view = batch;
  view.kv_len_capacity = capacity_.kv_len_capacity;
  reset_plan(view, LaunchMode::kGraph);
  AttentionPlan& p = plan_;
  p.graph_bound = true;
  p.reason = Reason::kGraphBound;
  p.provider = bound_provider_;
  p.kv_bound = capacity_.kv_len_capacity;
  p.rules[kWork] = RuleResult::skip(Reason::kGraphBound);
  p.rules[kDevice] = RuleResult::skip(Reason::kGraphBound);
  p.rules[kPlanReady] = RuleResult::skip(Reason::kGraphBound);
  BatchFacts facts;
  p.rules[kConsistency] = check_consistency(d, view, facts);
  if (p.rules[kConsistency].verdict == Verdict::kPass) {
    p.max_query_len = facts.max_query_len;
    p.max_kv_len = facts.max_kv_len;
    p.work = p.work_lo = p.work_hi = facts.work;
    p.phase = facts.max_query_len <= 1 ? AttentionPhase::kDecode : AttentionPhase::kPrefill;
    p.shape_class = shape_class_of(facts);
    p.class_known = true;
  }
  if (bound_provider_ == AttentionProvider::kNative) {
    // Native serves anything the kernels accept; the graph keeps it whatever this batch is.
    p.rules[kDomain] = RuleResult::skip(Reason::kGraphBound);
    return;
  }
  // Bound to cuDNN: the captured graph holds cuDNN's kernels, so a batch cuDNN cannot serve
  // is an error; switching to native would need another graph.
  p.rules[kDomain] = check_cudnn_domain(d, view, p.phase, LaunchMode::kGraph, config_.device);
  for (int rule : {kDomain, kConsistency}) {
    if (p.rules[rule].failed()) {
      const AdmissionRule r = static_cast<AdmissionRule>(rule);
      PAGELLM_FAIL() << "attention planner bound to a captured graph with provider cudnn cannot "
                        "serve this batch: rule "
                     << rule + 1 << " (" << rule_name(r) << "): " << describe(r, p.rules[rule])
                     << "; the graph keeps its provider: re-capture it or run this batch eagerly";
    }
  }
  p.cudnn_key = make_cudnn_plan_key(d, view, p.phase, p.max_query_len, p.max_kv_len,
                                    capacity_.max_query_len);
  PAGELLM_CHECK(p.cudnn_key == bound_key_)
      << "attention planner bound to a captured graph: this batch needs the cuDNN plan "
      << p.cudnn_key.describe() << " but the graph was captured with " << bound_key_.describe();
  fill_cudnn_arrays(d, view);
}

}  // namespace pagellm
