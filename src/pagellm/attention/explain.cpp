#include "pagellm/attention/explain.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <sstream>

namespace pagellm {
namespace {

std::string decision_line(const AttentionPlan& p) {
  std::ostringstream s;
  if (p.graph_bound) {
    s << "graph binding: the planner owns a captured graph and keeps provider "
      << provider_name(p.provider);
  } else if (p.reason == Reason::kExplicitChoice) {
    s << "explicit --attention-backend " << choice_name(p.choice);
  } else if (p.decided_by >= 0) {
    const AdmissionRule r = static_cast<AdmissionRule>(p.decided_by);
    s << "rule " << p.decided_by + 1 << " (" << rule_name(r)
      << "): " << describe(r, p.rules[p.decided_by]);
  } else {
    s << "every rule admitted cuDNN";
  }
  return s.str();
}

// Whether rule 4 looked the call up in a table (so "no entry" means something).
bool table_consulted(const AttentionPlan& p) {
  const Verdict v = p.rules[static_cast<int>(AdmissionRule::kDevice)].verdict;
  return v == Verdict::kPass || v == Verdict::kFail;
}

std::string class_line(const AttentionPlan& p) {
  std::ostringstream s;
  s << shape_class_name(p.shape_class);
  if (p.shape_class.decode()) {
    s << " (every query one token; one class for every KV length)";
  } else {
    s << " (" << p.num_tokens << " query tokens, largest query " << p.max_query_len
      << ", largest KV " << p.max_kv_len << ", query "
      << (p.shape_class.ragged ? "lengths differ" : "lengths equal") << ")";
  }
  return s.str();
}

std::string entry_line(const AttentionPlan& p) {
  std::ostringstream s;
  if (p.entry != nullptr) {
    const CrossoverEntry& e = *p.entry;
    s << "cuDNN measured faster in this class for work in [" << e.min_work << ", " << e.max_work
      << "] (" << e.admitted_points << " of " << e.points << " points; up to " << e.max_num_seqs
      << " sequences, query " << e.max_query_len << ", KV " << e.max_kv_len << ")";
  } else {
    const RuleResult& device = p.rules[static_cast<int>(AdmissionRule::kDevice)];
    s << "none: " << describe(AdmissionRule::kDevice, device);
  }
  return s.str();
}

nlohmann::json entry_json(const CrossoverEntry& e) {
  return {{"class", shape_class_name(e.shape_class)},
          {"min_work", e.min_work},
          {"max_work", e.max_work},
          {"points", e.points},
          {"admitted_points", e.admitted_points},
          {"page_sizes", e.page_sizes},
          {"gqa_ratios", e.gqa_ratios},
          {"max_num_seqs", e.max_num_seqs},
          {"max_query_len", e.max_query_len},
          {"max_kv_len", e.max_kv_len}};
}

}  // namespace

std::string explain_text(const AttentionPlan& p, const AttentionDomain& d,
                         const DeviceProfile& device) {
  std::ostringstream s;
  s << "provider:    " << provider_name(p.provider) << "\n";
  s << "decided by:  " << decision_line(p) << "\n";
  s << "request:     --attention-backend " << choice_name(p.choice) << ", " << mode_name(p.mode)
    << " launch, " << phase_name(p.phase) << "\n";
  s << "device:      " << device.describe() << "\n";
  s << "shape:       " << d.num_q_heads << " query / " << d.num_kv_heads << " KV heads, head_dim "
    << d.head_dim << ", page size " << d.page_size << ", " << dtype_name(d.dtype) << "\n";
  s << "batch:       " << p.num_seqs << " sequences, " << p.num_tokens << " tokens, max query "
    << p.max_query_len << ", max KV " << p.max_kv_len << "\n";
  if (p.work >= 0) {
    s << "work:        " << p.work << " (query heads x causal query-key pairs)";
    if (p.work_lo >= 0 && (p.work_lo != p.work || p.work_hi != p.work)) {
      s << "; judged over [" << p.work_lo << ", " << p.work_hi << "] (every replay up to KV "
        << p.kv_bound << ")";
    }
    s << "\n";
  }
  if (p.class_known) s << "class:       " << class_line(p) << "\n";
  if (table_consulted(p)) s << "entry:       " << entry_line(p) << "\n";
  s << "rules:\n";
  for (int i = 0; i < kNumAdmissionRules; ++i) {
    const AdmissionRule r = static_cast<AdmissionRule>(i);
    char head[64];
    std::snprintf(head, sizeof head, "  %d. %-12s %-14s ", i + 1, rule_name(r),
                  verdict_name(p.rules[i].verdict));
    s << head << describe(r, p.rules[i]) << "\n";
  }
  if (p.provider == AttentionProvider::kCudnn) {
    s << "cuDNN plan:  " << p.cudnn_key.describe()
      << (p.cudnn_plan_missing ? " (not built yet: built before first use)" : "") << "\n";
  }
  return s.str();
}

std::string explain_json(const AttentionPlan& p, const AttentionDomain& d,
                         const DeviceProfile& device) {
  nlohmann::json rules = nlohmann::json::array();
  for (int i = 0; i < kNumAdmissionRules; ++i) {
    const AdmissionRule r = static_cast<AdmissionRule>(i);
    rules.push_back({{"rule", i + 1},
                     {"name", rule_name(r)},
                     {"verdict", verdict_name(p.rules[i].verdict)},
                     {"detail", describe(r, p.rules[i])}});
  }
  nlohmann::json j = {
      {"provider", provider_name(p.provider)},
      {"decided_by", p.decided_by >= 0 ? nlohmann::json(p.decided_by + 1) : nlohmann::json()},
      {"decision", decision_line(p)},
      {"choice", choice_name(p.choice)},
      {"mode", mode_name(p.mode)},
      {"phase", phase_name(p.phase)},
      {"graph_bound", p.graph_bound},
      {"device",
       {{"name", device.name},
        {"sm_count", device.sm_count},
        {"compute_capability", device.compute_capability()},
        {"cudnn_version", cudnn_version_string(device.cudnn_version)}}},
      {"shape",
       {{"num_q_heads", d.num_q_heads},
        {"num_kv_heads", d.num_kv_heads},
        {"head_dim", d.head_dim},
        {"page_size", d.page_size},
        {"dtype", dtype_name(d.dtype)}}},
      {"batch",
       {{"num_seqs", p.num_seqs},
        {"num_tokens", p.num_tokens},
        {"max_query_len", p.max_query_len},
        {"max_kv_len", p.max_kv_len}}},
      {"work", p.work},
      {"work_range", {p.work_lo, p.work_hi}},
      {"min_work", p.min_work},
      {"max_work", p.max_work},
      {"class", p.class_known ? nlohmann::json(shape_class_name(p.shape_class)) : nlohmann::json()},
      {"table_consulted", table_consulted(p)},
      {"entry", p.entry ? entry_json(*p.entry) : nlohmann::json()},
      {"rules", rules}};
  if (p.provider == AttentionProvider::kCudnn) j["cudnn_plan"] = p.cudnn_key.describe();
  return j.dump(2) + "\n";
}

}  // namespace pagellm
