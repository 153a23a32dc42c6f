// A deterministic simulation harness for the scheduler (TensorRT-LLM style): a real
// KvCacheManager (page allocator and page table) and Scheduler, a mocked model step, and
// checks after every step.
//
// Each step builds the batch both ways: with a dense page table, which the mocked model
// reads, and with the persistent table, whose updates the harness applies to its own copy
// (as a backend does); that copy must then equal the engine's table everywhere, released
// rows included, and give every sequence the same row as the dense batch.
//
// The mocked model keeps a fake KV pool with one cell per slot. Each step it writes
// (request id, position, token) into the slot of every computed token, then "attends":
// it reads positions 0 .. kv_len-1 of each sequence through the batch's page-table row and
// checks that every cell holds that sequence's own token at that position. A page handed
// to two sequences, a stale page-table row or a wrong slot mapping shows up as a mismatch.
// It then samples script[output index] for each sampling sequence (100 + output index when
// the script is shorter), so recompute after preemption reproduces the same tokens.
//
// n-sample groups (add_group): the samples share sample 0's prompt, and a cell of a prompt
// position may have been written by any member of the group (the prompt's pages are
// shared); every later position must be the reader's own. The step's copy-on-write copies
// (SchedulerOutput::page_copies) are applied to the fake pool before the step writes, as
// the model runner does, so a sample that wrote into a page it still shared, or a copy
// that was missed, shows up as a mismatch.
//
// With prefix caching, a cell read through a page attached from the cache was written by
// another request: there each cell also holds a fingerprint of the writer's tokens 0 ..
// position, and the reader's must equal it (the K/V of a position depend on exactly those).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "pagellm/common/random.h"
#include "pagellm/engine/batch_builder.h"
#include "pagellm/engine/scheduler.h"

namespace pagellm::testing {

/// Draws of the random scheduler workloads: call k returns SplitMix64 output k of the
/// initial `state` (common/random.h) modulo `bound`, identical on every platform.
class Draws {
 public:
  explicit Draws(uint64_t state) : state_(state) {}
  int32_t operator()(uint64_t bound) {
    return static_cast<int32_t>(splitmix64_at(state_, count_++) % bound);
  }

 private:
  uint64_t state_;
  uint64_t count_ = 0;
};

/// A request to add: prompt tokens are 10 + (7 * id + i) % 50, never an EOS id below 10.
struct Request {
  Request() = default;
  Request(int64_t id, int32_t prompt_len, int32_t max_tokens, std::vector<int32_t> script = {},
          std::vector<int32_t> stop_token_ids = {})
      : id(id),
        prompt_len(prompt_len),
        max_tokens(max_tokens),
        script(std::move(script)),
        stop_token_ids(std::move(stop_token_ids)) {}

  int64_t id = 0;
  int32_t prompt_len = 1;
  int32_t max_tokens = 16;
  std::vector<int32_t> script;  // tokens the mocked model samples, by output index
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  /// Leading prompt tokens common to every request (10 + i % 50), for prefix caching.
  int32_t shared_prefix = 0;
};

/// What one step did, in the compact notation of the expectation tables.
struct StepRecord {
  std::string scheduled;  // "id:n" per scheduled sequence, '*' when it samples
  std::string preempted;  // ids
  std::string finished;   // ids finished in schedule() and then on_step_done()
  std::string running;    // ids after the step, in running order
  std::string waiting;    // ids after the step, in queue order
  int32_t free_pages = 0;
};

/// One row of an expectation table.
struct Expect {
  const char* scheduled;
  const char* preempted;
  const char* finished;
  const char* running;
  const char* waiting;
  int32_t free_pages;
};

inline std::string join_ids(const std::vector<Sequence*>& seqs) {
  std::ostringstream s;
  for (size_t i = 0; i < seqs.size(); ++i) s << (i ? " " : "") << seqs[i]->id;
  return s.str();
}

class Sim {
 public:
  /// max_slots 0: max_num_seqs + 1 page-table rows.
  Sim(SchedulerConfig config, int32_t num_pages, int32_t max_slots = 0,
      bool prefix_caching = false)
      : kv_(num_pages, config.page_size, max_slots ? max_slots : config.max_num_seqs + 1,
            derived_pages(config), prefix_caching),
        scheduler_(config, kv_),
        kv_cells_(static_cast<size_t>(num_pages) * config.page_size),
        backend_table_(kv_.page_table().data().size(), 0) {}

  static int32_t derived_pages(const SchedulerConfig& c) {
    return c.max_pages_per_seq ? c.max_pages_per_seq
                               : (c.max_model_len + c.page_size - 1) / c.page_size;
  }

  Sequence* make(const Request& r) {
    auto seq = std::make_unique<Sequence>();
    seq->id = r.id;
    for (int32_t i = 0; i < r.prompt_len; ++i) {
      seq->prompt.push_back(i < r.shared_prefix ? 10 + i % 50
                                                : 10 + static_cast<int32_t>((7 * r.id + i) % 50));
    }
    seq->params.max_tokens = r.max_tokens;
    seq->params.stop_token_ids = r.stop_token_ids;
    seq->params.ignore_eos = r.ignore_eos;
    seq->seed = static_cast<uint64_t>(r.id) * 1000 + 7;
    // A second request with an id keeps the first's script and lookup (duplicate-id tests).
    scripts_.emplace(r.id, r.script);
    Sequence* raw = seq.get();
    by_id_.emplace(r.id, raw);
    owned_.push_back(std::move(seq));
    return raw;
  }
  bool add(const Request& r) { return scheduler_.add(make(r)); }
  /// Adds the requests as one n-sample group: every sample gets the first one's prompt.
  bool add_group(const std::vector<Request>& samples) {
    std::vector<Sequence*> group;
    for (const Request& r : samples) {
      group.push_back(make(r));
      group.back()->prompt = group.front()->prompt;
      group_of_[r.id] = samples.front().id;
    }
    return scheduler_.add_group(group);
  }
  Sequence* seq(int64_t id) { return by_id_.at(id); }

  /// The token the mocked model samples for `seq` now.
  int32_t next_token(const Sequence& s) const {
    const std::vector<int32_t>& script = scripts_.at(s.id);
    size_t k = s.output.size();
    return k < script.size() ? script[k] : 100 + static_cast<int32_t>(k);
  }

  /// schedule(), mocked model step, on_step_done(), with invariant checks around each.
  StepRecord step() {
    SchedulerOutput out = scheduler_.schedule();
    EXPECT_NO_THROW(scheduler_.check_invariants(extra_owners_));
    check_budget(out);
    ForwardBatch batch = build_forward_batch(out, kv_.page_table(), page_size());
    EXPECT_NO_THROW(batch.validate());
    check_persistent_batch(out, batch);
    run_mock_model(out, batch);
    std::vector<SampledToken> sampled;
    for (const ScheduledSeq& s : out.scheduled) {
      if (!s.samples) continue;
      SampledToken t;
      t.token = next_token(*s.seq);
      t.logprob = -0.25f * static_cast<float>(s.seq->output.size() + 1);
      sampled.push_back(t);
      for (const Sequence* sample : s.fan_out) {  // first tokens of a fan-out
        t.token = next_token(*sample);
        t.logprob = -0.25f;
        sampled.push_back(t);
      }
    }
    last_output_ = out;
    std::vector<Sequence*> done = scheduler_.on_step_done(out, sampled);
    EXPECT_NO_THROW(scheduler_.check_invariants(extra_owners_));

    StepRecord rec;
    std::ostringstream sch;
    for (size_t i = 0; i < out.scheduled.size(); ++i) {
      sch << (i ? " " : "") << out.scheduled[i].seq->id << ":" << out.scheduled[i].num_new_tokens
          << (out.scheduled[i].samples ? "*" : "");
      if (!out.scheduled[i].fan_out.empty()) sch << "+" << out.scheduled[i].fan_out.size();
    }
    rec.scheduled = sch.str();
    rec.preempted = join_ids(out.preempted);
    std::vector<Sequence*> all_finished = out.finished;
    all_finished.insert(all_finished.end(), done.begin(), done.end());
    rec.finished = join_ids(all_finished);
    rec.running = join_ids(scheduler_.running());
    rec.waiting = join_ids(std::vector<Sequence*>(scheduler_.waiting().begin(),
                                                  scheduler_.waiting().end()));
    rec.free_pages = kv_.num_free_pages();
    return rec;
  }

  /// Runs the table: before step k (from 1) adds arrivals[k], then checks row k-1.
  void run_table(const std::map<int, std::vector<Request>>& arrivals,
                 const std::vector<Expect>& table) {
    for (size_t k = 1; k <= table.size(); ++k) {
      auto it = arrivals.find(static_cast<int>(k));
      if (it != arrivals.end()) {
        for (const Request& r : it->second) EXPECT_TRUE(add(r)) << "request " << r.id;
      }
      StepRecord got = step();
      const Expect& want = table[k - 1];
      SCOPED_TRACE("step " + std::to_string(k));
      EXPECT_EQ(got.scheduled, want.scheduled);
      EXPECT_EQ(got.preempted, want.preempted);
      EXPECT_EQ(got.finished, want.finished);
      EXPECT_EQ(got.running, want.running);
      EXPECT_EQ(got.waiting, want.waiting);
      EXPECT_EQ(got.free_pages, want.free_pages);
    }
  }

  int32_t page_size() const { return scheduler_.config().page_size; }
  KvCacheManager& kv() { return kv_; }
  PageAllocator& allocator() { return kv_.allocator(); }
  PageTable& table() { return kv_.page_table(); }
  Scheduler& scheduler() { return scheduler_; }
  const SchedulerOutput& last_output() const { return last_output_; }
  /// Copy-on-write page copies the steps have carried so far.
  int64_t copies() const { return copies_; }
  /// Page-table entries the persistent path has uploaded so far.
  int64_t entries_uploaded() const { return entries_uploaded_; }
  /// Page lists held outside the scheduler, for the ownership cross-check.
  std::vector<const std::vector<int32_t>*>& extra_owners() { return extra_owners_; }

 private:
  struct Cell {
    int64_t id = -1;
    int32_t position = -1;
    int32_t token = -1;
    uint64_t prefix = 0;  // fingerprint of the writer's tokens 0 .. position
  };

  // fingerprints[p]: of s's tokens 0 .. p, for p < n.
  static std::vector<uint64_t> fingerprints(const Sequence& s, int32_t n) {
    std::vector<uint64_t> f(static_cast<size_t>(n));
    uint64_t h = 1469598103934665603ull;
    for (int32_t p = 0; p < n; ++p) {
      h = (h ^ static_cast<uint64_t>(s.token_at(p) + 1)) * 1099511628211ull;
      f[p] = h;
    }
    return f;
  }

  void check_budget(const SchedulerOutput& out) {
    int32_t total = 0;
    for (const ScheduledSeq& s : out.scheduled) {
      EXPECT_GE(s.num_new_tokens, 1);
      total += s.num_new_tokens;
    }
    EXPECT_EQ(total, out.num_tokens);
    EXPECT_LE(out.num_tokens, scheduler_.config().max_num_batched_tokens);
    EXPECT_LE(out.scheduled.size(), static_cast<size_t>(scheduler_.config().max_num_seqs));
  }

  // Builds the persistent batch of the same step, applies its updates to backend_table_ and
  // checks it against the dense batch and the engine's table.
  void check_persistent_batch(const SchedulerOutput& out, const ForwardBatch& dense) {
    ForwardBatch batch = build_persistent_forward_batch(out, kv_.page_table(), page_size());
    if (out.scheduled.empty()) {
      EXPECT_TRUE(batch.seq_slots.empty() && batch.page_table_updates.empty());
      return;
    }
    EXPECT_NO_THROW(batch.validate(kv_.page_table().data()));
    EXPECT_EQ(batch.token_ids, dense.token_ids);
    EXPECT_EQ(batch.slot_mapping, dense.slot_mapping);
    EXPECT_EQ(kv_.page_table().num_pending_entries(), 0);
    const int32_t width = batch.max_pages_per_seq;
    size_t v = 0;
    for (const PageTableUpdate& u : batch.page_table_updates) {
      for (int32_t j = u.begin; j < u.end; ++j) {
        backend_table_[static_cast<size_t>(u.row) * width + j] = batch.page_table_values[v++];
      }
    }
    entries_uploaded_ += static_cast<int64_t>(v);
    ASSERT_EQ(backend_table_, kv_.page_table().data()) << "the persistent copy diverged";
    for (int32_t b = 0; b < batch.num_seqs(); ++b) {
      for (int32_t j = 0; j < width; ++j) {
        ASSERT_EQ(backend_table_[static_cast<size_t>(batch.seq_slots[b]) * width + j],
                  dense.page_table[static_cast<size_t>(b) * width + j]);
      }
    }
  }

  void run_mock_model(const SchedulerOutput& out, const ForwardBatch& batch) {
    const int32_t ps = batch.page_size;
    ASSERT_EQ(batch.num_seqs(), static_cast<int32_t>(out.scheduled.size()));
    ASSERT_EQ(batch.num_tokens(), out.num_tokens);
    ASSERT_EQ(static_cast<int32_t>(batch.logits_indices.size()), out.num_sampling());
    for (const auto& [src, dst] : out.page_copies) {
      ASSERT_EQ(allocator().refcount(dst), 1) << "a copy into page " << dst << ", not owned once";
      for (int32_t o = 0; o < ps; ++o) kv_cells_[dst * ps + o] = kv_cells_[src * ps + o];
    }
    copies_ += static_cast<int64_t>(out.page_copies.size());
    std::set<int32_t> written;
    for (int32_t b = 0; b < batch.num_seqs(); ++b) {
      const Sequence& s = *out.scheduled[b].seq;
      const std::vector<uint64_t> prefix = fingerprints(s, batch.kv_lens[b]);
      for (int32_t t = batch.query_start[b]; t < batch.query_start[b + 1]; ++t) {
        const int32_t slot = batch.slot_mapping[t];
        ASSERT_TRUE(written.insert(slot).second) << "two tokens of one step write slot " << slot;
        ASSERT_GE(slot / ps, 1) << "a token writes the reserved page 0";
        // The slot must be in the page the batch's own page-table row names.
        const int32_t pos = batch.positions[t];
        ASSERT_EQ(batch.page_table[b * batch.max_pages_per_seq + pos / ps], slot / ps);
        ASSERT_EQ(slot % ps, pos % ps);
        // A page shared through the prefix cache is never written.
        ASSERT_EQ(kv_.allocator().refcount(slot / ps), 1) << "a token writes a shared page";
        ASSERT_FALSE(kv_.allocator().is_cached(slot / ps)) << "a token writes a cached page";
        kv_cells_[slot] = Cell{s.id, pos, batch.token_ids[t], prefix[pos]};
      }
    }
    // Attention reads every cached position of every sequence through its row.
    const bool shared_ok = kv_.prefix_caching_enabled();
    for (int32_t b = 0; b < batch.num_seqs(); ++b) {
      const Sequence& s = *out.scheduled[b].seq;
      const std::vector<uint64_t> prefix = fingerprints(s, batch.kv_lens[b]);
      for (int32_t pos = 0; pos < batch.kv_lens[b]; ++pos) {
        const int32_t page = batch.page_table[b * batch.max_pages_per_seq + pos / ps];
        const Cell& c = kv_cells_[page * ps + pos % ps];
        const bool group_ok = pos < static_cast<int32_t>(s.prompt.size()) &&
                              group_of_.count(s.id) && group_of_.count(c.id) &&
                              group_of_.at(c.id) == group_of_.at(s.id);
        ASSERT_TRUE((c.id == s.id || group_ok || shared_ok) && c.position == pos &&
                    c.token == s.token_at(pos) && c.prefix == prefix[pos])
            << "request " << s.id << " position " << pos << " reads a cell of request " << c.id
            << " position " << c.position;
      }
    }
  }

  KvCacheManager kv_;
  Scheduler scheduler_;
  std::vector<Cell> kv_cells_;  // [num_pages * page_size]
  std::vector<int32_t> backend_table_;  // the persistent copy a backend would keep
  int64_t entries_uploaded_ = 0;
  int64_t copies_ = 0;
  std::map<int64_t, int64_t> group_of_;  // sample id -> its group's first id
  std::vector<std::unique_ptr<Sequence>> owned_;
  std::map<int64_t, Sequence*> by_id_;
  std::map<int64_t, std::vector<int32_t>> scripts_;
  std::vector<const std::vector<int32_t>*> extra_owners_;
  SchedulerOutput last_output_;
};

/// A config with small numbers for tables: page_size 4, max_model_len 64.
inline SchedulerConfig small_config(int32_t max_num_seqs, int32_t max_num_batched_tokens) {
  SchedulerConfig c;
  c.max_num_seqs = max_num_seqs;
  c.max_num_batched_tokens = max_num_batched_tokens;
  c.page_size = 4;
  c.max_model_len = 64;
  c.eos_token_ids = {2};
  return c;
}

}  // namespace pagellm::testing
