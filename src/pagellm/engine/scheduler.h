// Continuous-batching scheduler with chunked prefill and preemption by recompute.
//
// One step of the engine is:
//   out = scheduler.schedule();                 // who runs, how many tokens, pages ready
//   sampled = runner.run(out, page_table);      // model_runner.h: batch, forward, sampler;
//                                               // one token per `samples` entry, in order
//   scheduler.on_step_done(out, sampled);       // append tokens, retire finished requests
// The contract (what each step guarantees, the preemption policy, the budget accounting)
// is written out in docs/design.md.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pagellm/engine/sequence.h"
#include "pagellm/kv/kv_cache_manager.h"

namespace pagellm {

/// Limits the scheduler works within.
struct SchedulerConfig {
  /// Most sequences running at once (also bounded by the page table's free rows).
  int32_t max_num_seqs = 256;
  /// Most tokens (prefill chunks plus decodes) in one step. Must be >= max_num_seqs, so
  /// that every running decode fits in every step.
  int32_t max_num_batched_tokens = 2048;
  /// The budget of a step that begins with more than busy_decode_rows sequences decoding
  /// (0: max_num_batched_tokens always). An offline engine's long chunk pays where few
  /// decodes share the step; where many do, each of them rides along in half as many
  /// prefill steps and costs more in the decode steps after (W2, docs/design.md "The
  /// engine step"). In [max_num_seqs, max_num_batched_tokens] when set.
  int32_t busy_batched_tokens = 0;
  int32_t busy_decode_rows = 64;
  /// Tokens per KV page.
  int32_t page_size = 16;
  /// Most tokens (prompt + output) of one sequence; a sequence stops when it reaches it.
  int32_t max_model_len = 4096;
  /// Capacity of one page-table row. 0: derived as ceil(max_model_len / page_size). Must
  /// equal the KV cache manager's max_pages_per_seq.
  int32_t max_pages_per_seq = 0;
  /// Tokens that end a request (unless its params.ignore_eos).
  std::vector<int32_t> eos_token_ids;
};

/// One sequence's share of a step.
struct ScheduledSeq {
  Sequence* seq = nullptr;
  /// Tokens computed this step: seq->token_at(num_computed .. num_computed + n - 1), where
  /// num_computed is the value before on_step_done().
  int32_t num_new_tokens = 0;
  /// True when this step reaches the end of the sequence's known tokens, so its last row
  /// produces a sampled token (a decode or the last prefill chunk).
  bool samples = false;
  /// n-sample fan-out: when this step completes the prefill of a group's sample 0, the
  /// other samples (seq->fan_out); each samples its own first token from the same logits
  /// row as seq, after it, and is forked from seq by on_step_done(). Empty otherwise.
  std::vector<Sequence*> fan_out;
  /// Pipelined decode (schedule_ahead): the sequence's tokens that the step still in
  /// flight samples, unknown on the host when this step was planned (1; 0 in a step from
  /// schedule()). This step computes tokens from index num_computed + ahead, and its input
  /// token is the in-flight step's sample of row `fed_from`, put in place on the device
  /// (Backend::feed_sampled_tokens); -1 when ahead is 0.
  int32_t ahead = 0;
  int32_t fed_from = -1;
  /// One token that samples, no fan-out: a decode (what a decode graph replays).
  bool is_decode() const { return num_new_tokens == 1 && samples && fan_out.empty(); }
};

/// The plan of one step.
struct SchedulerOutput {
  /// Step number (from 1), matched by on_step_done().
  int64_t step = 0;
  /// Running sequences first, in their running order, then newly admitted ones in FIFO
  /// order. Pages for num_computed + num_new_tokens tokens are allocated and in the page
  /// table row seq->slot. A newly admitted sequence whose prefix the KV cache manager
  /// found cached starts with num_computed at the matched tokens (pages attached), and
  /// num_new_tokens counts only the rest.
  std::vector<ScheduledSeq> scheduled;
  /// Sequences preempted this step (pages and row freed, num_computed reset to 0, back at
  /// the front of the waiting queue).
  std::vector<Sequence*> preempted;
  /// Sequences that schedule() finished with FinishReason::kError because they could not
  /// get a page even with nothing else running (only when pages are held outside the
  /// scheduler).
  std::vector<Sequence*> finished;
  /// Sum of num_new_tokens; <= max_num_batched_tokens.
  int32_t num_tokens = 0;
  /// Copy-on-write of KV pages (source, destination), in order, to run before this step's
  /// forward (Backend::copy_kv_pages): pages shared after a fan-out that a scheduled
  /// sequence writes into this step.
  std::vector<std::pair<int32_t, int32_t>> page_copies;
  /// Tokens on_step_done() expects: one per entry with samples == true, plus its fan_out.
  int32_t num_sampling() const;
  /// Every entry is a decode (ScheduledSeq::is_decode).
  bool pure_decode() const;
};

/// FIFO continuous-batching scheduler. It decides who runs and with how many tokens; it
/// asks the KvCacheManager (which it uses exclusively) whether pages and rows are there
/// and to hand them out or take them back. Holds pointers to Sequences owned by the
/// engine; a sequence must outlive its time in the scheduler (until it is finished and any
/// step that scheduled it is done). Not thread-safe: call everything from the engine's
/// thread.
class Scheduler {
 public:
  /// Throws Error for a non-positive limit, max_num_batched_tokens < max_num_seqs, or a
  /// manager whose page size or row capacity differs from the config's.
  Scheduler(SchedulerConfig config, KvCacheManager& kv);

  /// Queues a new request (status kWaiting, no output, nothing computed). A request that
  /// can never run (empty prompt, prompt of max_model_len tokens or more, max_tokens < 1,
  /// or more KV pages at its longest than the pool or a page-table row holds) is not
  /// queued: it is finished at once with FinishReason::kError and seq->error saying why.
  /// Returns whether it was queued. Throws Error for a null, already used or duplicate-id
  /// sequence (engine bugs, not user input).
  bool add(Sequence* seq);

  /// Queues an n-sample group (n = samples.size() >= 1; all fresh, with the same prompt):
  /// samples[0] waits like add()'s request and prefills the prompt once; the others wait
  /// with it (Sequence::fan_out) and are forked from it when the prefill completes. The
  /// group is admitted only with n page-table rows and room for n sequences under
  /// max_num_seqs, and those rows stay reserved until the fork. A group that can never run
  /// (n > max_num_seqs, or any reason add() rejects a request for) is finished at once with
  /// FinishReason::kError and a message on every sample. Returns whether it was queued.
  bool add_group(const std::vector<Sequence*>& samples);
  /// Samples forked from their group's sample 0 so far.
  int64_t forked_samples() const { return forked_samples_; }

  /// Plans one step; see SchedulerOutput and docs/design.md. Throws Error if a non-empty
  /// step has not been reported with on_step_done().
  SchedulerOutput schedule();

  /// Pipelined decode (docs/design.md, "Pipelined decode"): plans the step after
  /// `in_flight` (the plan schedule() or schedule_ahead() returned last, not yet reported)
  /// before its sampled tokens are known, so that it can be launched while `in_flight`
  /// runs. Only a pure decode step continues, with no request waiting: the next step
  /// decodes each of its sequences again (ScheduledSeq::ahead 1, fed_from its row), except
  /// those aborted since and those that in_flight's token ends by length (max_tokens,
  /// max_model_len); a sequence that its token ends otherwise (EOS, a stop token) runs
  /// one step more, whose token on_step_done() drops. Pages for the extra token are
  /// allocated here. Returns an empty plan, changing nothing, when it cannot continue
  /// (another kind of step, waiting requests, too few free pages, no sequence left):
  /// report in_flight, then schedule(). Steps are reported in the order they were planned.
  SchedulerOutput schedule_ahead(const SchedulerOutput& in_flight);

  /// Reports the step `out` has run. `sampled` holds one token per entry of out.scheduled
  /// with samples == true, in order. Advances num_computed, appends the tokens (and their
  /// SampledToken to Sequence::sampled), registers the pages that became full with the
  /// prefix cache (KvCacheManager::cache_full_pages), and retires the sequences that finished (EOS,
  /// stop token, max_tokens, max_model_len), freeing their pages and rows. Sequences
  /// aborted since schedule() are skipped (their token is dropped). Returns the sequences
  /// finished by this call, in scheduled order.
  std::vector<Sequence*> on_step_done(const SchedulerOutput& out,
                                      const std::vector<SampledToken>& sampled);

  /// Cancels a waiting or running request: frees its pages and row and finishes it with
  /// FinishReason::kAborted. Returns false when no unfinished request has this id. A group's
  /// sample 0 aborted before its fan-out hands the prefill to the next sample (at the
  /// front of the waiting queue if sample 0 had started, else in its place).
  bool abort(int64_t id);

  bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  /// In running order: oldest admission first (the last one is preempted first).
  const std::vector<Sequence*>& running() const { return running_; }
  /// In admission order: the front is admitted next.
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const SchedulerConfig& config() const { return config_; }

  /// Verifies the whole bookkeeping: the KV cache manager's invariants over the running
  /// sequences (every allocated page referenced exactly refcount times by their page
  /// lists plus `extra_owners`, pages held outside the scheduler; each has its own row,
  /// equal to its pages then zeros); running sequences hold pages for at least
  /// num_computed and at most num_tokens() tokens; waiting sequences hold no pages, no
  /// row and nothing computed. Throws Error naming the first violation.
  void check_invariants(const std::vector<const std::vector<int32_t>*>& extra_owners = {}) const;

 private:
  void preempt_last_running(SchedulerOutput* out);
  void finish(Sequence* seq, FinishReason reason);
  /// Page-table rows held back for the fan-out of running groups' samples (their fan_out).
  int32_t reserved_rows() const;
  /// Forks s.fan_out from s.seq (whose prefill just completed) and makes them running.
  void fork_samples(const ScheduledSeq& s);
  /// The next sample of aborted sample 0 takes over the group's prefill.
  void promote_next_sample(Sequence* seq);
  /// Appends a sampled token and applies the stop rules; true when seq finished.
  bool append_token(Sequence* seq, const SampledToken& token);
  /// Why a new request can never run, or "" if it can.
  std::string rejection_reason(const Sequence& seq) const;

  SchedulerConfig config_;
  KvCacheManager& kv_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;
  std::unordered_map<int64_t, Sequence*> unfinished_;  // id -> sequence, waiting or running
  int64_t step_ = 0;          // the last step planned
  int32_t steps_in_flight_ = 0;  // planned and not reported: steps step_ - n + 1 .. step_
  int64_t forked_samples_ = 0;
};

}  // namespace pagellm
