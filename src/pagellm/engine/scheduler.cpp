#include "pagellm/engine/scheduler.h"

#include <algorithm>
#include <sstream>
#include <utility>

#include "pagellm/common/check.h"

namespace pagellm {

namespace {

bool contains(const std::vector<int32_t>& tokens, int32_t token) {
  return std::find(tokens.begin(), tokens.end(), token) != tokens.end();
}

}  // namespace

int32_t SchedulerOutput::num_sampling() const {
  int32_t n = 0;
  for (const ScheduledSeq& s : scheduled) {
    n += s.samples ? 1 + static_cast<int32_t>(s.fan_out.size()) : 0;
  }
  return n;
}

bool SchedulerOutput::pure_decode() const {
  return std::all_of(scheduled.begin(), scheduled.end(),
                     [](const ScheduledSeq& s) { return s.is_decode(); });
}

Scheduler::Scheduler(SchedulerConfig config, KvCacheManager& kv)
    : config_(std::move(config)), kv_(kv) {
  PAGELLM_CHECK(config_.max_num_seqs >= 1)
      << "max_num_seqs must be at least 1, got " << config_.max_num_seqs;
  PAGELLM_CHECK(config_.max_num_batched_tokens >= config_.max_num_seqs)
      << "max_num_batched_tokens (" << config_.max_num_batched_tokens
      << ") must be at least max_num_seqs (" << config_.max_num_seqs
      << ") so that every running sequence can decode in every step";
  PAGELLM_CHECK(config_.busy_batched_tokens == 0 ||
                (config_.busy_batched_tokens >= config_.max_num_seqs &&
                 config_.busy_batched_tokens <= config_.max_num_batched_tokens))
      << "busy_batched_tokens (" << config_.busy_batched_tokens << ") must be 0 or in ["
      << config_.max_num_seqs << ", " << config_.max_num_batched_tokens << "]";
  PAGELLM_CHECK(config_.busy_decode_rows >= 0)
      << "busy_decode_rows must be >= 0, got " << config_.busy_decode_rows;
  PAGELLM_CHECK(config_.page_size >= 1) << "page_size must be at least 1, got "
                                        << config_.page_size;
  PAGELLM_CHECK(config_.max_model_len >= 2)
      << "max_model_len must be at least 2 (one prompt token and one generated token), got "
      << config_.max_model_len;
  PAGELLM_CHECK(config_.max_pages_per_seq >= 0)
      << "max_pages_per_seq must be 0 (derived) or positive, got " << config_.max_pages_per_seq;
  if (config_.max_pages_per_seq == 0) {
    config_.max_pages_per_seq =
        (config_.max_model_len + config_.page_size - 1) / config_.page_size;
  }
  PAGELLM_CHECK(kv_.max_pages_per_seq() == config_.max_pages_per_seq)
      << "the page table holds " << kv_.max_pages_per_seq()
      << " pages per sequence but the scheduler is configured for " << config_.max_pages_per_seq
      << " (ceil(max_model_len / page_size) unless set explicitly)";
  PAGELLM_CHECK(kv_.page_size() == config_.page_size)
      << "the KV cache manager has pages of " << kv_.page_size()
      << " tokens but the scheduler is configured for " << config_.page_size;
}

std::string Scheduler::rejection_reason(const Sequence& seq) const {
  std::ostringstream why;
  const int64_t prompt_len = static_cast<int64_t>(seq.prompt.size());
  if (prompt_len == 0) {
    why << "request " << seq.id << " has an empty prompt; a prompt needs at least one token";
    return why.str();
  }
  if (prompt_len >= config_.max_model_len) {
    why << "request " << seq.id << " has a prompt of " << prompt_len
        << " tokens but max_model_len is " << config_.max_model_len
        << "; the prompt must be at most " << config_.max_model_len - 1
        << " tokens so that at least one token can be generated";
    return why.str();
  }
  if (seq.params.max_tokens < 1) {
    why << "request " << seq.id << " asks for max_tokens = " << seq.params.max_tokens
        << "; it must be at least 1";
    return why.str();
  }
  // At its longest the sequence has max_total tokens; the last one is sampled but never fed
  // back, so the cache holds at most max_total - 1 of them.
  const int64_t max_total =
      std::min<int64_t>(prompt_len + seq.params.max_tokens, config_.max_model_len);
  const int64_t max_cached = max_total - 1;
  const int64_t max_pages = (max_cached + config_.page_size - 1) / config_.page_size;
  auto describe = [&] {
    why << "request " << seq.id << " needs up to " << max_pages << " KV-cache pages (prompt "
        << prompt_len << " + up to " << max_total - prompt_len << " generated tokens, "
        << max_cached << " of them cached, " << config_.page_size << " tokens per page)";
  };
  if (max_pages > config_.max_pages_per_seq) {
    describe();
    why << " but a page-table row holds only " << config_.max_pages_per_seq
        << " pages; lower max_tokens or shorten the prompt";
    return why.str();
  }
  if (max_pages > kv_.num_usable_pages()) {
    describe();
    why << " but the KV cache has only " << kv_.num_usable_pages()
        << " pages; lower max_tokens, shorten the prompt or give the KV cache more memory";
    return why.str();
  }
  return "";
}

bool Scheduler::add(Sequence* seq) {
  PAGELLM_CHECK(seq != nullptr) << "Scheduler::add() got a null sequence";
  PAGELLM_CHECK(seq->status == SequenceStatus::kWaiting && seq->output.empty() &&
                seq->sampled.empty() && seq->num_computed == 0 && seq->pages.empty() &&
                seq->slot == 0)
      << "Scheduler::add(): request " << seq->id
      << " is not a fresh sequence (it must be waiting, with no output, nothing computed, "
         "no pages and no page-table row)";
  PAGELLM_CHECK(unfinished_.count(seq->id) == 0)
      << "Scheduler::add(): request id " << seq->id << " is already waiting or running";
  std::string why = rejection_reason(*seq);
  if (!why.empty()) {
    seq->status = SequenceStatus::kFinished;
    seq->finish_reason = FinishReason::kError;
    seq->error = std::move(why);
    return false;
  }
  unfinished_.emplace(seq->id, seq);
  waiting_.push_back(seq);
  return true;
}

bool Scheduler::add_group(const std::vector<Sequence*>& samples) {
  PAGELLM_CHECK(!samples.empty()) << "Scheduler::add_group() got no samples";
  if (samples.size() == 1) return add(samples[0]);
  Sequence* first = samples[0];
  for (const Sequence* seq : samples) {
    PAGELLM_CHECK(seq != nullptr) << "Scheduler::add_group() got a null sequence";
    PAGELLM_CHECK(seq->status == SequenceStatus::kWaiting && seq->output.empty() &&
                  seq->sampled.empty() && seq->num_computed == 0 && seq->pages.empty() &&
                  seq->slot == 0 && seq->fan_out.empty() && seq->fan_out_parent == nullptr)
        << "Scheduler::add_group(): request " << seq->id
        << " is not a fresh sequence (it must be waiting, with no output, nothing computed, "
           "no pages, no page-table row and no group)";
    PAGELLM_CHECK(unfinished_.count(seq->id) == 0)
        << "Scheduler::add_group(): request id " << seq->id << " is already waiting or running";
    PAGELLM_CHECK(seq->prompt == first->prompt)
        << "Scheduler::add_group(): request " << seq->id << " has another prompt than request "
        << first->id << "; the samples of a group share one prompt";
  }
  const int32_t n = static_cast<int32_t>(samples.size());
  // All n samples run at once after the fan-out, each in a page-table row of its own.
  const int32_t capacity = std::min(config_.max_num_seqs, kv_.page_table().max_slots() - 1);
  std::string why;
  if (n > capacity) {
    std::ostringstream message;
    message << "request " << first->id << " asks for n = " << n << " samples but at most "
            << capacity << " sequences run at once (max_num_seqs = " << config_.max_num_seqs
            << "); the n samples of a request run together, sharing the prompt's KV pages: "
               "use n <= "
            << capacity << " or raise max_num_seqs";
    why = message.str();
  } else {
    why = rejection_reason(*first);
  }
  if (!why.empty()) {
    for (Sequence* seq : samples) {
      seq->status = SequenceStatus::kFinished;
      seq->finish_reason = FinishReason::kError;
      seq->error = why;
    }
    return false;
  }
  for (Sequence* seq : samples) unfinished_.emplace(seq->id, seq);
  for (int32_t j = 1; j < n; ++j) {
    first->fan_out.push_back(samples[static_cast<size_t>(j)]);
    samples[static_cast<size_t>(j)]->fan_out_parent = first;
  }
  waiting_.push_back(first);
  return true;
}

int32_t Scheduler::reserved_rows() const {
  int32_t reserved = 0;
  for (const Sequence* seq : running_) reserved += static_cast<int32_t>(seq->fan_out.size());
  return reserved;
}

void Scheduler::preempt_last_running(SchedulerOutput* out) {
  Sequence* victim = running_.back();
  running_.pop_back();
  kv_.free(*victim);
  victim->num_computed = 0;
  victim->status = SequenceStatus::kWaiting;
  ++victim->num_preemptions;
  waiting_.push_front(victim);
  out->preempted.push_back(victim);
}

void Scheduler::finish(Sequence* seq, FinishReason reason) {
  if (seq->fan_out_parent != nullptr) {  // a sample waiting for its group's fan-out
    std::vector<Sequence*>& samples = seq->fan_out_parent->fan_out;
    samples.erase(std::find(samples.begin(), samples.end(), seq));
    seq->fan_out_parent = nullptr;
  } else if (seq->status == SequenceStatus::kRunning) {
    running_.erase(std::find(running_.begin(), running_.end(), seq));
  } else {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq));
  }
  kv_.free(*seq);
  seq->status = SequenceStatus::kFinished;
  seq->finish_reason = reason;
  unfinished_.erase(seq->id);
  // Sample 0 of a group that ends before its fan-out for any reason but an abort (which
  // promotes the next sample first) takes its waiting samples with it: an error.
  for (Sequence* sample : seq->fan_out) {
    sample->fan_out_parent = nullptr;
    sample->status = SequenceStatus::kFinished;
    sample->finish_reason = reason;
    sample->error = seq->error;
    unfinished_.erase(sample->id);
  }
  seq->fan_out.clear();
}

void Scheduler::promote_next_sample(Sequence* seq) {
  Sequence* heir = seq->fan_out.front();
  heir->fan_out.assign(seq->fan_out.begin() + 1, seq->fan_out.end());
  seq->fan_out.clear();
  heir->fan_out_parent = nullptr;
  for (Sequence* sample : heir->fan_out) sample->fan_out_parent = heir;
  if (seq->status == SequenceStatus::kRunning) {
    waiting_.push_front(heir);  // it had started: first in line, as a preempted one
  } else {
    waiting_.insert(std::find(waiting_.begin(), waiting_.end(), seq), heir);
  }
}

SchedulerOutput Scheduler::schedule() {
  PAGELLM_CHECK(steps_in_flight_ == 0) << "Scheduler::schedule() called before on_step_done() "
                                         "reported step "
                                      << step_;
  SchedulerOutput out;
  out.step = ++step_;
  int32_t budget = config_.max_num_batched_tokens;
  if (config_.busy_batched_tokens > 0) {
    const auto decoding = std::count_if(running_.begin(), running_.end(), [](const Sequence* s) {
      return s->num_tokens() - s->num_computed == 1;
    });
    if (decoding > config_.busy_decode_rows) budget = config_.busy_batched_tokens;
  }
  const int32_t step_budget = budget;

  // 1. Running sequences, oldest first. Each needs pages for the tokens it computes now; if
  // the pool is short, the newest running sequence is preempted until it is not. Victims
  // come from the back, so they were not scheduled yet this step (or are `seq` itself).
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
    const int32_t remaining = seq->num_tokens() - seq->num_computed;
    PAGELLM_ASSERT(remaining >= 1) << "running request " << seq->id << " has nothing to compute";
    const int32_t n = std::min(remaining, budget);
    const int32_t target = seq->num_computed + n;
    bool fits = kv_.allocate_for_write(*seq, n);
    while (!fits && running_.size() > i + 1) {
      preempt_last_running(&out);
      fits = kv_.allocate_for_write(*seq, n);
    }
    if (fits) {
      out.scheduled.push_back({seq, n, target == seq->num_tokens(), {}});
      budget -= n;
      ++i;
    } else if (i > 0) {
      preempt_last_running(&out);  // seq itself: the newest, and the older ones keep going
    } else {
      // Alone and still short: only possible when pages are held outside the scheduler
      // (add() rejects any request that cannot fit the whole pool). Report, do not spin.
      const int32_t need = kv_.pages_needed(*seq, n);
      std::ostringstream why;
      why << "request " << seq->id << " needs " << need << " more KV-cache pages but only "
          << kv_.num_free_pages() << " of " << kv_.num_usable_pages()
          << " are free and no other request is running (pages are held outside the "
             "scheduler)";
      seq->error = why.str();
      out.finished.push_back(seq);
      out.finished.insert(out.finished.end(), seq->fan_out.begin(), seq->fan_out.end());
      finish(seq, FinishReason::kError);
    }
  }

  // 2. Waiting requests, FIFO, while budget, rows and pages allow. Not after a preemption:
  // the pool is short, and a new request would only be preempted in turn. A request whose
  // prompt exceeds the remaining budget is admitted with a chunk of it.
  // A group's sample 0 needs rows and room for all n samples (reserved until its fan-out).
  if (out.preempted.empty()) {
    int32_t reserved = reserved_rows();
    while (!waiting_.empty() && budget > 0) {
      Sequence* seq = waiting_.front();
      const int32_t group = 1 + static_cast<int32_t>(seq->fan_out.size());
      if (static_cast<int32_t>(running_.size()) + reserved + group > config_.max_num_seqs ||
          kv_.num_free_rows() - reserved < group) {
        break;
      }
      // Nothing computed yet: the cached pages that begin its tokens are attached and
      // their prefill skipped, so the budget pays only for the rest.
      const PrefixMatch match = kv_.match_prefix(*seq, seq->tokens());
      const int32_t n = std::min(seq->num_tokens() - match.num_tokens, budget);
      if (!kv_.can_allocate(*seq, match, n)) {
        if (!running_.empty()) break;  // pages come back as running requests finish
        // Nothing runs that could free pages: the missing pages are held outside the
        // scheduler. Report instead of returning empty steps forever.
        std::ostringstream why;
        why << "request " << seq->id << " needs " << kv_.pages_needed(*seq, match, n)
            << " KV-cache pages to start but only " << kv_.num_free_pages() << " of "
            << kv_.num_usable_pages()
            << " are free and no request is running (pages are held outside the scheduler)";
        seq->error = why.str();
        out.finished.push_back(seq);
        out.finished.insert(out.finished.end(), seq->fan_out.begin(), seq->fan_out.end());
        finish(seq, FinishReason::kError);
        continue;
      }
      waiting_.pop_front();
      const bool allocated = kv_.allocate(*seq, match, n);
      PAGELLM_ASSERT(allocated) << "a row and pages checked free but allocation failed";
      seq->status = SequenceStatus::kRunning;
      running_.push_back(seq);
      reserved += group - 1;
      out.scheduled.push_back({seq, n, seq->num_computed + n == seq->num_tokens(), {}});
      budget -= n;
    }
  }

  // Fan-out: the step that completes a group's prefill samples every sample's first token.
  for (ScheduledSeq& s : out.scheduled) {
    if (s.samples && !s.seq->fan_out.empty()) s.fan_out = s.seq->fan_out;
    PAGELLM_ASSERT(kv_.pages_to_copy(*s.seq, s.num_new_tokens) == 0)
        << "request " << s.seq->id << " would write a shared KV page";
  }
  out.page_copies = kv_.take_page_copies();
  out.num_tokens = step_budget - budget;
  steps_in_flight_ = out.scheduled.empty() ? 0 : 1;
  return out;
}

SchedulerOutput Scheduler::schedule_ahead(const SchedulerOutput& in_flight) {
  PAGELLM_CHECK(steps_in_flight_ == 1 && in_flight.step == step_)
      << "Scheduler::schedule_ahead() needs step " << in_flight.step
      << " to be the only step in flight (" << steps_in_flight_ << " in flight, the last "
      << step_ << ")";
  SchedulerOutput out;
  if (!waiting_.empty()) return out;  // new requests: schedule() once the tokens are in
  std::vector<std::pair<Sequence*, int32_t>> next;  // a sequence, its row in in_flight
  int32_t need = 0;
  int32_t row = 0;
  for (const ScheduledSeq& s : in_flight.scheduled) {
    if (!s.is_decode()) return {};
    const int32_t r = row++;
    Sequence* seq = s.seq;
    if (seq->finished()) continue;  // aborted since
    // After in_flight's token: does append_token() end it by length?
    if (static_cast<int64_t>(seq->output.size()) + 1 >= seq->params.max_tokens ||
        seq->num_tokens() + 1 >= config_.max_model_len) {
      continue;
    }
    // Pages for num_computed + 2 tokens: in_flight's and this step's.
    need += kv_.pages_needed(*seq, 2) + kv_.pages_to_copy(*seq, 2);
    next.emplace_back(seq, r);
  }
  if (next.empty() || !kv_.allocator().can_allocate(need)) return out;
  out.step = ++step_;
  ++steps_in_flight_;
  for (const auto& [seq, r] : next) {
    const bool allocated = kv_.allocate_for_write(*seq, 2);
    PAGELLM_ASSERT(allocated) << "pages counted free but allocation ahead failed";
    ScheduledSeq s{seq, 1, true, {}};
    s.ahead = 1;
    s.fed_from = r;
    out.scheduled.push_back(std::move(s));
  }
  out.page_copies = kv_.take_page_copies();
  out.num_tokens = static_cast<int32_t>(out.scheduled.size());
  return out;
}

std::vector<Sequence*> Scheduler::on_step_done(const SchedulerOutput& out,
                                               const std::vector<SampledToken>& sampled) {
  std::vector<Sequence*> finished;
  if (out.scheduled.empty()) {
    PAGELLM_CHECK(sampled.empty()) << "on_step_done(): step " << out.step
                                   << " scheduled nothing but got " << sampled.size()
                                   << " sampled tokens";
    return finished;
  }
  const int64_t oldest = step_ - steps_in_flight_ + 1;
  PAGELLM_CHECK(steps_in_flight_ > 0 && out.step == oldest)
      << "on_step_done() for step " << out.step << ", but the step awaiting it is "
      << (steps_in_flight_ > 0 ? std::to_string(oldest) : std::string("none"));
  PAGELLM_CHECK(static_cast<int32_t>(sampled.size()) == out.num_sampling())
      << "on_step_done(): step " << out.step << " has " << out.num_sampling()
      << " sampling sequences but got " << sampled.size() << " sampled tokens";
  --steps_in_flight_;

  size_t k = 0;
  for (const ScheduledSeq& s : out.scheduled) {
    const SampledToken* token = s.samples ? &sampled[k++] : nullptr;
    const size_t first_fanned = k;  // the fan-out samples' tokens follow seq's
    if (s.samples) k += s.fan_out.size();
    Sequence* seq = s.seq;
    if (seq->finished()) continue;  // aborted after schedule(): drop its token
    PAGELLM_ASSERT(seq->status == SequenceStatus::kRunning &&
                   seq->num_computed + s.num_new_tokens <= seq->num_tokens())
        << "request " << seq->id << " was changed between schedule() and on_step_done()";
    seq->num_computed += s.num_new_tokens;
    kv_.cache_full_pages(*seq, seq->tokens());  // pages filled this step become shareable
    if (token == nullptr) continue;
    if (!s.fan_out.empty()) fork_samples(s);  // before seq can finish and drop its pages
    if (append_token(seq, *token)) finished.push_back(seq);
    for (size_t j = 0; j < s.fan_out.size(); ++j) {
      Sequence* sample = s.fan_out[j];
      if (sample->status != SequenceStatus::kRunning) continue;  // aborted: not forked
      if (append_token(sample, sampled[first_fanned + j])) finished.push_back(sample);
    }
  }
  return finished;
}

void Scheduler::fork_samples(const ScheduledSeq& s) {
  Sequence* parent = s.seq;
  // parent->fan_out, not s.fan_out: samples aborted since schedule() have left it.
  for (Sequence* sample : parent->fan_out) {
    const bool forked = kv_.fork_all_pages(*parent, *sample);
    PAGELLM_ASSERT(forked) << "no page-table row for request " << sample->id
                           << "'s fan-out, though rows were reserved at admission";
    sample->fan_out_parent = nullptr;
    sample->status = SequenceStatus::kRunning;
    running_.push_back(sample);
    ++forked_samples_;
  }
  parent->fan_out.clear();
}

bool Scheduler::append_token(Sequence* seq, const SampledToken& token) {
  seq->output.push_back(token.token);
  seq->sampled.push_back(token);

  FinishReason reason = FinishReason::kNone;
  if (!seq->params.ignore_eos && contains(config_.eos_token_ids, token.token)) {
    reason = FinishReason::kEos;
  } else if (contains(seq->params.stop_token_ids, token.token)) {
    reason = FinishReason::kStopToken;
  } else if (static_cast<int64_t>(seq->output.size()) >= seq->params.max_tokens) {
    reason = FinishReason::kLength;
  } else if (seq->num_tokens() >= config_.max_model_len) {
    reason = FinishReason::kContextLimit;
  }
  if (reason == FinishReason::kNone) return false;
  finish(seq, reason);
  return true;
}

bool Scheduler::abort(int64_t id) {
  auto it = unfinished_.find(id);
  if (it == unfinished_.end()) return false;
  if (!it->second->fan_out.empty()) promote_next_sample(it->second);
  finish(it->second, FinishReason::kAborted);
  return true;
}

void Scheduler::check_invariants(
    const std::vector<const std::vector<int32_t>*>& extra_owners) const {
  std::vector<const KvSequence*> holders(running_.begin(), running_.end());
  kv_.check_invariants(holders, extra_owners);

  PAGELLM_ASSERT(static_cast<int32_t>(running_.size()) <= config_.max_num_seqs)
      << running_.size() << " running sequences exceed max_num_seqs " << config_.max_num_seqs;
  PAGELLM_ASSERT(kv_.num_used_rows() == static_cast<int32_t>(running_.size()))
      << kv_.num_used_rows() << " page-table rows in use for " << running_.size()
      << " running sequences";
  // Samples waiting for their group's fan-out are in neither queue: they hang off sample 0.
  size_t pending = 0;
  for (const Sequence* seq : running_) pending += seq->fan_out.size();
  for (const Sequence* seq : waiting_) pending += seq->fan_out.size();
  PAGELLM_ASSERT(unfinished_.size() == running_.size() + waiting_.size() + pending)
      << unfinished_.size() << " unfinished requests but " << running_.size() << " running, "
      << waiting_.size() << " waiting and " << pending << " waiting for a fan-out";
  PAGELLM_ASSERT(static_cast<int32_t>(running_.size()) + reserved_rows() <= config_.max_num_seqs &&
                 reserved_rows() <= kv_.num_free_rows())
      << running_.size() << " running sequences and " << reserved_rows()
      << " rows reserved for fan-outs exceed max_num_seqs " << config_.max_num_seqs
      << " or the free page-table rows " << kv_.num_free_rows();
  auto check_group = [&](const Sequence* seq) {
    PAGELLM_ASSERT(seq->fan_out_parent == nullptr)
        << "queued request " << seq->id << " still waits for a fan-out";
    PAGELLM_ASSERT(seq->fan_out.empty() || seq->output.empty())
        << "request " << seq->id << " has output but its samples were not forked";
    for (const Sequence* sample : seq->fan_out) {
      auto it = unfinished_.find(sample->id);
      PAGELLM_ASSERT(it != unfinished_.end() && it->second == sample &&
                     sample->fan_out_parent == seq && sample->fan_out.empty() &&
                     sample->status == SequenceStatus::kWaiting && sample->pages.empty() &&
                     sample->slot == 0 && sample->num_computed == 0 && sample->output.empty())
          << "request " << sample->id << ", waiting for request " << seq->id
          << "'s fan-out, is not registered, or holds pages, a row, tokens or samples";
    }
  };
  for (const Sequence* seq : running_) check_group(seq);
  for (const Sequence* seq : waiting_) check_group(seq);

  for (const Sequence* seq : running_) {
    auto it = unfinished_.find(seq->id);
    PAGELLM_ASSERT(it != unfinished_.end() && it->second == seq)
        << "running request " << seq->id << " is not registered";
    PAGELLM_ASSERT(seq->status == SequenceStatus::kRunning)
        << "request " << seq->id << " is in the running list but not running";
    PAGELLM_ASSERT(seq->slot != 0) << "running request " << seq->id << " has no row";
    const int32_t num_pages = static_cast<int32_t>(seq->pages.size());
    PAGELLM_ASSERT(num_pages >= kv_.pages_for(seq->num_computed) &&
                   num_pages <= kv_.pages_for(seq->num_tokens()))
        << "request " << seq->id << " holds " << num_pages << " pages for "
        << seq->num_computed << " computed of " << seq->num_tokens() << " tokens";
  }
  for (const Sequence* seq : waiting_) {
    auto it = unfinished_.find(seq->id);
    PAGELLM_ASSERT(it != unfinished_.end() && it->second == seq)
        << "waiting request " << seq->id << " is not registered";
    PAGELLM_ASSERT(seq->status == SequenceStatus::kWaiting && seq->pages.empty() &&
                   seq->slot == 0 && seq->num_computed == 0)
        << "waiting request " << seq->id << " holds pages, a row or computed tokens";
  }
}

}  // namespace pagellm
