// The attention dispatcher: decides, on the host, which provider runs a paged-attention
// call, and prepares what that provider needs before anything is launched.
//
// plan() reads CPU-resident metadata only (query offsets, KV lengths, page-table size),
// never the device, and is called once per forward; every layer reuses its result. The
// launch itself (the CUDA backend's run) only enqueues work, so it is safe inside a CUDA
// graph.
//
// `auto` admits cuDNN only when every rule passes, in this order, each failing closed to
// native (admission.h):
//   1. domain:      dtype, head dim, GQA ratio, page size, declared ranges, int32 offsets,
//                   and the features the call needs from the installed cuDNN version
//   2. consistency: offsets run from 0 to the declared total, 0 < q <= kv for every
//                   sequence, the declared maxima are the real maxima, the page table
//                   covers every KV length
//   3. work:        Hq x sum_b q_b (2 kv_b - q_b + 1) / 2 (the causal pairs actually
//                   computed, never a product of maxima) within the measured crossover
//   4. device:      a measured table for this device and cuDNN version, with an entry for
//                   the launch mode, phase, head dim and shape class (shape_class.h: the
//                   buckets of the largest query and KV lengths, and whether query lengths
//                   differ; decode is one class), covering the page size, GQA ratio and
//                   ranges of this call; rule 3 uses that entry's work range
//   5. plan:        the cuDNN execution plan for this shape is already built (checked only
//                   when a registry is attached; a miss is requested for later)
// `native` skips all rules. `cudnn` applies rules 1 and 2 and throws Error when either
// fails; it never consults the tables.
//
// Graph lifecycle: bind_to_graph() fixes the provider for the lifetime of a captured graph
// and reserves, once, everything a re-plan within the graph's capacity needs (host arrays
// linear in the batch; the cuDNN plan key pinned to the capacity, so a longer KV within it
// maps to the same plan). A bound planner never changes provider; a batch outside the
// capacity, or one its provider cannot serve, is an Error, not a silent switch.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "pagellm/attention/admission.h"
#include "pagellm/attention/attention_call.h"
#include "pagellm/attention/crossover_table.h"
#include "pagellm/attention/cudnn_support.h"
#include "pagellm/attention/device_profile.h"
#include "pagellm/attention/provider.h"

namespace pagellm {

/// What the planner decides with. The pointers are borrowed and must outlive the planner.
struct AttentionPlannerConfig {
  AttentionBackendChoice choice = AttentionBackendChoice::kAuto;
  DeviceProfile device;  // the running GPU and cuDNN (cudnn_version 0: no cuDNN)
  const CrossoverTables* tables = nullptr;  // nullptr: no tables, so auto stays native
  CudnnPlanRegistry* registry = nullptr;    // nullptr: rule 5 is not checked
};

/// The capacity a captured graph was recorded for. Every replay uses exactly num_seqs
/// sequences (the graph runner pads with dummy rows) and stays within the other bounds.
struct GraphCapacity {
  int32_t num_seqs = 0;
  int32_t max_num_tokens = 0;
  int32_t max_query_len = 0;
  int32_t max_pages_per_seq = 0;  // page-table row length of every replay
  int32_t kv_len_capacity = 0;    // >= every replay's KV length, <= max_pages_per_seq * page_size
};

/// The planner's decision for one forward.
struct AttentionPlan {
  AttentionProvider provider = AttentionProvider::kNative;
  AttentionBackendChoice choice = AttentionBackendChoice::kAuto;
  LaunchMode mode = LaunchMode::kEager;
  AttentionPhase phase = AttentionPhase::kPrefill;
  bool graph_bound = false;  // decided by a planner bound to a captured graph

  /// Rule outcomes in evaluation order (index = (int) AdmissionRule).
  std::array<RuleResult, kNumAdmissionRules> rules{};
  /// The rule that decided for native, or -1 when cuDNN was admitted, the choice was
  /// explicit, or the planner is graph-bound (see `reason` then).
  int decided_by = -1;
  Reason reason = Reason::kNone;  // kPassed (admitted), kExplicitChoice or kGraphBound

  // Facts about the batch (valid when rule 2 passed; otherwise the declared values).
  int32_t num_seqs = 0;
  int32_t num_tokens = 0;
  int32_t max_query_len = 0;
  int32_t max_kv_len = 0;
  int32_t kv_bound = 0;   // the KV length the decision covers: max_kv_len, or a graph's capacity
  int64_t work = -1;      // query heads x causal pairs of this batch; -1 when rule 2 failed
  /// The work range rule 3 judged: [work, work] eagerly; for a graph, every replay from KV
  /// length 1 to kv_bound (a graph replays whatever lengths come, so cuDNN must win across
  /// all of them).
  int64_t work_lo = -1;
  int64_t work_hi = -1;
  int64_t min_work = -1;  // the matching entry's crossover, -1 when none
  int64_t max_work = -1;
  /// The call's shape class (valid when class_known: rule 2 passed) and the table entry of
  /// that class that rules 3 and 4 used (nullptr when none; points into the planner's
  /// tables, valid while they are not changed).
  ShapeClass shape_class;
  bool class_known = false;
  const CrossoverEntry* entry = nullptr;

  // For the cuDNN route (valid when provider == kCudnn).
  CudnnPlanKey cudnn_key;
  bool cudnn_plan_missing = false;  // explicit cudnn, plan not yet built: build before use
  /// Prefill only: per-sequence query lengths [num_seqs] and Q/O element offsets
  /// [num_seqs + 1] (query_start[b] * Hq * D), to be uploaded before launch.
  std::vector<int32_t> cudnn_seq_len_q;
  std::vector<int32_t> cudnn_ragged_offsets;

  uint64_t epoch = 0;  // counts plan() calls of the planner that made it

  /// The provider that decided, as one sentence (for logs and errors).
  std::string summary() const;
};

/// Makes AttentionPlans. Not thread-safe: one per backend (or per captured graph).
class AttentionPlanner {
 public:
  explicit AttentionPlanner(AttentionPlannerConfig config);

  /// Plans one forward. `mode` says how it will be launched (eager, or the warm-up /
  /// capture of a graph; pass kGraph whenever batch.kv_len_capacity is set). Returns a
  /// reference valid until the next plan(); reuse it for every layer. Throws Error only
  /// for an explicit `cudnn` choice cuDNN cannot serve, or on a bound planner (see
  /// bind_to_graph). Allocates only when a batch is larger than any before (unbound) or
  /// never (bound).
  const AttentionPlan& plan(const AttentionDomain& domain, const AttentionBatchView& batch,
                            LaunchMode mode = LaunchMode::kEager);

  /// Decides the provider of a graph about to be captured and fixes it. The decision is the
  /// graph-mode one for the whole capacity (rule 3 must hold from KV length 1 to
  /// capacity.kv_len_capacity, rule 4 for the capacity's sizes), with rules 1 and 2 checked
  /// on `representative`, the batch it is captured with, which must fit the capacity.
  /// Every later plan() returns that provider (graph mode, cuDNN plan key pinned to the
  /// capacity, so a longer KV within it needs no other plan), reusing storage reserved here
  /// for capacity.num_seqs, and throws Error for a batch outside the capacity or one the
  /// bound provider cannot serve. Throws Error if already bound, if the capacity is
  /// malformed, or (explicit cudnn) if cuDNN cannot serve the graph.
  const AttentionPlan& bind_to_graph(const AttentionDomain& domain, const GraphCapacity& capacity,
                                     const AttentionBatchView& representative);
  /// Forgets the binding (call when the graph is destroyed).
  void release_graph();
  bool graph_bound() const { return bound_; }
  const GraphCapacity& capacity() const { return capacity_; }

  /// Host bytes reserved for plans (the per-sequence arrays); linear in the batch.
  size_t reserved_bytes() const;
  /// The last plan (empty before the first plan()).
  const AttentionPlan& last_plan() const { return plan_; }
  const AttentionPlannerConfig& config() const { return config_; }

 private:
  void reset_plan(const AttentionBatchView& batch, LaunchMode mode);
  void evaluate(const AttentionDomain& domain, const AttentionBatchView& batch, LaunchMode mode,
                int32_t query_capacity);
  void replan_bound(const AttentionDomain& domain, const AttentionBatchView& batch);
  void check_capacity(const GraphCapacity& cap, const AttentionBatchView& batch,
                      const char* what) const;
  void fill_cudnn_arrays(const AttentionDomain& domain, const AttentionBatchView& batch);

  AttentionPlannerConfig config_;
  AttentionPlan plan_;
  uint64_t epoch_ = 0;
  bool bound_ = false;
  GraphCapacity capacity_;
  AttentionDomain bound_domain_;
  AttentionProvider bound_provider_ = AttentionProvider::kNative;
  CudnnPlanKey bound_key_;
};

}  // namespace pagellm
