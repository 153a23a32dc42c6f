// The engine: the composition of the requests, the scheduler, the KV cache manager and the
// model runner; it turns requests into tokens one step at a time (continuous batching).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pagellm/backend/backend.h"
#include "pagellm/engine/model_runner.h"
#include "pagellm/engine_options.h"
#include "pagellm/engine/scheduler.h"
#include "pagellm/engine/sequence.h"
#include "pagellm/engine/tp_leader.h"
#include "pagellm/engine/tp_protocol.h"
#include "pagellm/engine/weight_group.h"
#include "pagellm/kv/kv_cache_manager.h"
#include "pagellm/lora_request.h"
#include "pagellm/model/qwen3.h"
#include "pagellm/weight_broadcast.h"
#include "pagellm/weight_update.h"

namespace pagellm {

/// Engine settings: the public EngineOptions (pagellm/engine_options.h, one definition for
/// the API and the engine) plus what only the engine's own callers set.
struct EngineConfig : EngineOptions {
  /// Bucket sizes; empty: 1, 2, 4, 8, 16, 24, 32, 48, 64, then every 32 up to max_num_seqs.
  std::vector<int32_t> graph_buckets;
  /// Sends only the page-table entries that changed when the backend keeps its own table
  /// (Backend::supports_persistent_page_table); false sends every batch its dense rows
  /// (an ablation: `pagellm bench --dense-page-table`).
  bool persistent_page_table = true;
  /// Tensor parallelism: how long the worker processes have to start and connect, and how
  /// long any later wait for one (loading, a step's collective) may take before the engine
  /// gives up on it with an Error naming the rank.
  int64_t tensor_parallel_join_timeout_ms = 60'000;
  int64_t tensor_parallel_timeout_ms = 600'000;
};

/// Host time while the device waits, seconds, in three parts: the scheduler's decision
/// (Scheduler::schedule), the batch's building, upload and launch (to
/// ModelRunner::StepResult::launched), and what follows the sampled tokens' arrival
/// (Scheduler::on_step_done: appending tokens, stop checks, freeing pages). A difference of
/// two readings is the gap of the steps between them.
struct HostGap {
  double schedule = 0.0;
  double launch = 0.0;
  double finish = 0.0;
  double total() const { return schedule + launch + finish; }
  HostGap& operator+=(const HostGap& o) {
    schedule += o.schedule;
    launch += o.launch;
    finish += o.finish;
    return *this;
  }
  friend HostGap operator-(HostGap a, const HostGap& b) {
    a.schedule -= b.schedule;
    a.launch -= b.launch;
    a.finish -= b.finish;
    return a;
  }
};

/// Counters since the engine started.
struct EngineStats {
  int64_t steps = 0;
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  int64_t preemptions = 0;
  int64_t graph_steps = 0;  // decode steps that replayed a captured graph
  /// Page-table entries sent to the backend: every row of every batch (padding rows
  /// included) on the dense path; on the persistent path only the entries that changed,
  /// about one per sequence every page_size decode steps.
  int64_t page_table_entries_uploaded = 0;
  /// n-sample fan-out: samples forked from their group's sample 0 (sharing its pages), and
  /// KV pages copied because a sample wrote into a page it still shared (copy-on-write).
  int64_t forked_samples = 0;
  int64_t cow_page_copies = 0;
  /// Pipelined decode: steps launched before the previous step's tokens reached the host
  /// (EngineOptions::pipelined_decode_steps).
  int64_t pipelined_steps = 0;
  /// Host time while the device waits (HostGap's three parts).
  HostGap host_gap;
};

/// The engine (nano-vllm's LLMEngine, vLLM v1's EngineCore): owns the requests, and
/// composes the Scheduler (who runs), the KvCacheManager (pages and page-table rows) and
/// the ModelRunner (backend, model, KV pools, graphs). Not thread-safe: one thread calls
/// it. docs/design.md, "The engine step", states what one step does.
class Engine {
 public:
  /// A single-process engine. With `leader` (and `comm`, rank 0's end of the collectives
  /// `model` was loaded with), rank 0 of a tensor-parallel group: the runner tells the
  /// leader's workers every device operation (create_tensor_parallel makes the three).
  Engine(std::unique_ptr<Backend> backend, std::unique_ptr<Qwen3Model> model,
         const EngineConfig& config, std::unique_ptr<TpLeader> leader = nullptr,
         std::unique_ptr<Communicator> comm = nullptr);
  /// Loads the model folder onto the named backend; with tensor_parallel_size > 1 through
  /// create_tensor_parallel.
  static std::unique_ptr<Engine> create(const std::string& model_dir, const EngineConfig& config,
                                        const ProgressFn& progress = nullptr);
  /// A tensor-parallel engine of config.tensor_parallel_size ranks over `source` (docs/
  /// design.md "Tensor parallelism"): checks that the size divides the model and that no
  /// option refused at TP > 1 is set, before any process starts; spawns the workers, which
  /// load their shares while this process loads rank 0's; joins the backend's device
  /// collectives or, where it has none, a HostCommunicator over the workers' connections.
  /// Throws Error naming the problem (a worker that is missing, exits or does not join
  /// names its rank and exit status), leaving no process behind.
  static std::unique_ptr<Engine> create_tensor_parallel(const tp::ModelSource& source,
                                                        const EngineConfig& config,
                                                        const ProgressFn& progress = nullptr);
  /// Tells the workers (tensor parallelism) to exit, and reaps them.
  ~Engine();

  /// Ranks of the model: 1, or tensor_parallel_size.
  int tensor_parallel_size() const { return tp_leader_ ? tp_leader_->size() : 1; }
  /// The worker processes' ids, rank 1 first (empty for one rank). For tests and tools.
  std::vector<pid_t> tensor_parallel_worker_pids() const {
    return tp_leader_ ? tp_leader_->worker_pids() : std::vector<pid_t>{};
  }

  /// Queues a request and returns its id. A request that can never run (empty or
  /// too-long prompt, token ids outside the vocabulary, bad sampling parameters) is
  /// finished at once with FinishReason::kError and a message in Sequence::error.
  /// `lora` names a loaded adapter (load_lora_adapter) to run the request with; "" runs
  /// the base model. An unknown name finishes the request at once with kError.
  int64_t add_request(std::vector<int32_t> prompt, const SamplingParams& params,
                      const std::string& lora = "");
  /// Queues params.n samples of one prompt (n-sample fan-out) and returns their ids,
  /// sample 0 first; n == 1 is add_request. The prompt is prefilled once, by sample 0; the
  /// step that completes it samples every sample's first token from the same logits, and
  /// the other samples then share its KV pages (copy-on-write of the partly filled last
  /// page). Sample j runs with params.n = 1 and seed s + j when params.seed is s, else a
  /// seed derived from its own id (as add_request), so it produces what a single request
  /// with that seed would. A group that can never run is rejected at once: n above
  /// max_num_seqs, bad sampling parameters or prompt tokens give one id, finished with
  /// FinishReason::kError and a message naming the value and the limit; a prompt the
  /// scheduler rejects (too long, ...) finishes all n ids so. `max_tokens`, when not
  /// empty, holds one limit per sample (>= 1) in place of params.max_tokens (the rollout
  /// benchmark draws each sample's length, as EOS would end it).
  std::vector<int64_t> add_request_group(std::vector<int32_t> prompt,
                                         const SamplingParams& params,
                                         const std::vector<int32_t>& max_tokens = {},
                                         const std::string& lora = "");
  /// Finishes a request with FinishReason::kAborted and frees its pages.
  void abort(int64_t id);
  /// Runs one scheduling step and one forward pass; returns the ids that finished in it.
  std::vector<int64_t> step();
  bool has_unfinished() const;
  const Sequence& request(int64_t id) const;
  /// Forgets a finished request.
  void release(int64_t id);

  /// Adds the prompts, steps until all are finished, returns them in order.
  std::vector<const Sequence*> generate(const std::vector<std::vector<int32_t>>& prompts,
                                        const std::vector<SamplingParams>& params);

  /// Scoring (docs/design.md, "The log-probability contract"): the raw log-probability of
  /// every token of each sequence after its first prompt_lengths[i] tokens (empty
  /// prompt_lengths: 1 each), and with top_k (0..20) > 0 the top_k alternatives, computed
  /// with prefill forwards whose logits rows cover every scored position; nothing is
  /// sampled. Runs now, between steps, on its own path: each sequence gets fresh KV pages
  /// and a page-table row from the free ones (running requests keep theirs), as many
  /// sequences at once as fit, chunked to max_num_batched_tokens tokens and max_num_seqs
  /// logits rows per forward; the pages are freed before it returns, also on error.
  /// Everything is checked before any work: an empty or one-token sequence, one longer
  /// than max_model_len or than the whole KV cache, a prompt length outside
  /// [1, size - 1], an id outside the vocabulary or a bad top_k throws Error naming the
  /// sequence. Throws Error, with nothing held, when the free pages cannot hold one
  /// sequence while requests run.
  /// With `lora` (a loaded adapter's name) the sequences are scored with that adapter; a
  /// name not loaded throws Error before any work, as does an asleep engine.
  std::vector<ScoreOutput> score(const std::vector<std::vector<int32_t>>& sequences,
                                 const std::vector<int32_t>& prompt_lengths = {},
                                 int top_k = 0, const std::string& lora = "");

  /// Called after each forward pass with every sampled row's float32 logits on the host
  /// (request id, index of the output token they produce, logits [vocab]). For tests and
  /// debugging: setting it costs a device-to-host copy of the logits each step.
  using LogitsHook = ModelRunner::LogitsHook;
  void set_logits_hook(LogitsHook hook) { runner_->set_logits_hook(std::move(hook)); }
  /// Called once per forward step with its plan, when its tokens have arrived and before
  /// they are appended (each sequence's num_computed is the step's start; the sequences
  /// finished already are the rows a pipelined run kept one step more). One step() may run
  /// several (pipelined decode): the benchmarks count the bytes each read through this.
  using StepObserver = std::function<void(const SchedulerOutput& out)>;
  void set_step_observer(StepObserver observer) { step_observer_ = std::move(observer); }
  /// Pipelined decode: asked before each step planned ahead; true ends the run there (the
  /// step in flight still completes), so that a caller with new input (requests, aborts,
  /// calls) waits one decode step instead of a run of them. Called on the engine's thread.
  void set_run_interrupt(std::function<bool()> interrupt) {
    run_interrupt_ = std::move(interrupt);
  }

  /// Version of the weights the model samples with: 0 after loading, increased by one by
  /// each weight update (bump_weights_version). Every SampledToken records the version it
  /// was sampled under, and outputs report that.
  uint64_t weights_version() const { return weights_version_; }
  /// Records that the weights changed; call between steps (after the update is complete).
  void bump_weights_version() { ++weights_version_; }

  // ---- weight updates and pause / resume (docs/design.md, "Weight updates") -----------
  /// Pauses the engine for a weight update; `mode` says what happens to the requests
  /// already added (the unfinished ones, waiting or running):
  ///   kWait:  they keep running (step() goes on) until they finish; drained() tells when.
  ///   kAbort: they are finished now with FinishReason::kAborted and their pages freed.
  ///   kKeep:  they stay where they are; step() runs nothing until resume().
  /// Requests added while paused are held (accepted, not scheduled) and queue in order
  /// after resume(). Throws Error when already paused or for an unknown mode.
  void pause(PauseMode mode);
  /// Ends the pause: the held requests join the scheduler's queue. No-op when not paused.
  void resume();
  bool paused() const { return paused_; }
  /// The mode of the current pause (meaningful while paused()).
  PauseMode pause_mode() const { return pause_mode_; }
  /// Paused and no request added before the pause is unfinished (kWait has finished).
  bool drained() const { return paused_ && !scheduler_->has_unfinished(); }
  /// Whether step() would advance any request now.
  bool has_runnable() const {
    return scheduler_->has_unfinished() && !(paused_ && pause_mode_ == PauseMode::kKeep);
  }

  /// Rewrites weights in place (Qwen3Model::update_weights: any subset, by Hugging Face
  /// names, from host, pinned or device memory), between steps, then bumps the weights
  /// version. The tensors are checked first (see check_weights_update). Not paused: pauses with `mode` for the update (kWait steps the engine here
  /// until the requests added before have finished) and resumes after. Paused already:
  /// the pause's mode applies (kWait steps until drained) and the engine stays paused.
  /// A rejected update (bad name, shape, dtype or memory kind: Error naming each) changes
  /// no weight and no version, and resumes a pause it made.
  WeightUpdateResult update_weights(const std::vector<NamedTensor>& tensors,
                                    PauseMode mode = PauseMode::kWait);
  /// update_weights from a safetensors folder or file (WeightStore::open; errors name it).
  /// At TP > 1 every rank reads the folder and writes its share.
  WeightUpdateResult load_weights(const std::string& path, PauseMode mode = PauseMode::kWait);
  /// The same from a store opened already (AsyncEngine opens it off the loop thread).
  WeightUpdateResult load_weights(const WeightStore& store, PauseMode mode = PauseMode::kWait);
  /// The checks of load_weights alone (check_weights_update's, naming the store; at any
  /// tensor-parallel size). Returns the store's tensors it checked.
  std::vector<NamedTensor> check_load_weights(const WeightStore& store) const;
  /// The checks of update_weights alone (Qwen3Model::check_weights_update, and that the
  /// engine is awake: sleep() may have released the weights' memory): throws the same Error, pauses and writes nothing. update_weights runs them
  /// before it pauses, so that a bad update never waits for running requests.
  void check_weights_update(const std::vector<NamedTensor>& tensors) const;

  // ---- weight updates broadcast from a trainer (docs/design.md, "Weight updates") -------
  /// Joins the trainer's group (join_weight_group: blocks until the trainer has joined too,
  /// or, for "tcp", the timeout). At TP > 1 every rank joins, tensor-parallel rank r as
  /// spec.rank + r, so the group's world holds 1 + tensor_parallel_size() ranks at least.
  /// Throws Error when a usable group is joined already (leave it first; a broken one is
  /// replaced) or when the join fails on any rank (the ranks that joined leave again).
  void join_weight_group(const WeightGroupSpec& spec);
  /// Leaves the group (no-op without one); at TP > 1 every rank leaves.
  void leave_weight_group();
  /// Ends, within about 100 ms, a "tcp" join or transfer of rank 0 that waits for the
  /// trainer (Error: "interrupted"), and every later one: for a shutdown, which must not
  /// wait out the group's timeout (an NCCL join cannot be interrupted). The one Engine call
  /// that is safe from another thread while the engine's thread works
  /// (AsyncEngine::shutdown makes it).
  void interrupt_weight_transfers() { weight_interrupt_.store(true); }
  /// Bytes of the bucket memory kept between broadcast updates (the largest bucket so far;
  /// 0 after leaving the group or sleeping).
  uint64_t weight_group_staging_bytes() const { return broadcast_staging_.bytes(); }
  /// The joined group's spec, or null.
  const WeightGroupSpec* weight_group() const {
    return weight_group_ ? &weight_group_->spec() : nullptr;
  }
  /// The checks of update_weights_from_broadcast (the bucket plan, a group is joined and
  /// usable, `group` empty or its name, every name, dtype and shape) before anything
  /// pauses. On a problem found once the plan is known and the group usable, every bucket
  /// is received and dropped first, so that the trainer's broadcast completes and the
  /// group stays in step; then Error names the problem and says the buckets were "received
  /// and dropped". Returns the plan.
  std::vector<BroadcastBucket> check_broadcast_update(const std::vector<BroadcastTensor>& tensors,
                                                      uint64_t bucket_bytes,
                                                      const std::string& group = "");
  /// update_weights with the tensors' bytes coming from the trainer's broadcast, a bucket
  /// at a time (plan_broadcast_buckets): each is received into a staging buffer of the
  /// largest bucket's size and written before the next arrives, so the update needs that
  /// much memory beyond the weights, not the model's. The pause protocol is update_weights'.
  /// A transfer that fails after some buckets were written leaves those written: the
  /// weights version advances (so nothing cached from the old weights matches), the group
  /// is left, and Error says so; join again and send the whole update.
  WeightUpdateResult update_weights_from_broadcast(const std::vector<BroadcastTensor>& tensors,
                                                   uint64_t bucket_bytes,
                                                   PauseMode mode = PauseMode::kWait,
                                                   const std::string& group = "");

  // ---- LoRA adapters (docs/design.md, "LoRA") -----------------------------------------
  /// Loads the PEFT adapter folder request.path under request.name (non-empty) into a free
  /// adapter slot, or, when the name is loaded already, replaces that adapter in place
  /// (same slot; for RL, where the adapter changes every step): its version goes up and
  /// its prefix-cache key changes, so no page computed with the old weights matches again,
  /// and requests running with it continue with the new weights from the next step. Call
  /// between steps. Throws Error naming the problem (a bad folder, an adapter that does
  /// not fit the model, no free slot of max_loras) and then changes nothing.
  LoraAdapterInfo load_lora_adapter(const LoraRequest& request);
  /// Unloads an adapter. Throws Error for an unknown name, or while a request that is not
  /// finished uses it (abort or finish it first).
  void unload_lora_adapter(const std::string& name);
  /// The loaded adapters, by name.
  std::vector<LoraAdapterInfo> lora_adapters() const;
  // ---- sleep and wake (docs/design.md, "Sleep and wake") ------------------------------
  /// Releases the KV cache's memory (and, with options.offload_weights, the weights' after
  /// copying them to host memory) so that another user of the device can have it between
  /// rollouts. Throws Error, changing nothing, while a request is waiting or running
  /// (finish or abort them first), when already asleep, or when the backend cannot sleep.
  /// While asleep, add_request finishes each new request at once with FinishReason::kError
  /// ("the engine is asleep ...") and step() does nothing.
  SleepReport sleep(const SleepOptions& options = {});
  /// Backs the released memory again at the same addresses, so captured decode graphs stay
  /// valid: every KV page is free and reads as zeros, weights are bit for bit as before.
  /// Throws Error when the engine is awake.
  WakeReport wake_up();
  bool asleep() const { return asleep_; }
  /// Drops and captures again every decode graph (between steps, awake): the alternative
  /// to fixed addresses that the sleep-wake benchmark measures. Returns the graph count.
  size_t recapture_graphs();

  /// Prefix cache (docs/design.md, "Prefix cache"). Its hashes carry weights_version(), so
  /// pages computed under older weights never match once the version is bumped.
  /// Forgets every cached page (they return to the free list; running requests keep
  /// theirs); nothing computed before matches afterwards. Call between steps.
  void reset_prefix_cache() { kv_cache_->reset_prefix_cache(); }
  /// Queries, hits and evictions since the engine started, and the pages cached now.
  PrefixCacheStats prefix_cache_stats() const { return kv_cache_->prefix_cache_stats(); }

  const EngineConfig& config() const { return config_; }
  const SchedulerConfig& scheduler_config() const { return scheduler_config_; }
  const EngineStats& stats() const { return stats_; }
  Qwen3Model& model() { return runner_->model(); }
  Backend& backend() { return runner_->backend(); }
  /// num_free() counts cached-free pages too: idle, every page is free.
  const PageAllocator& allocator() const { return kv_cache_->allocator(); }
  /// Fault injection for tests: from the next step on, the scheduler finds `pages` fewer KV
  /// pages free than there are (PageAllocator::withhold_for_testing), as if they were held
  /// elsewhere; 0 restores normal operation.
  void withhold_pages_for_testing(int32_t pages) {
    kv_cache_->allocator().withhold_for_testing(pages);
  }
  int64_t num_pages() const { return runner_->num_pages(); }
  /// Samples (sequences) the scheduler runs now, and those waiting for a slot (queued in
  /// the scheduler or held by a pause), for load reporting.
  size_t num_running() const { return scheduler_->num_running(); }
  size_t num_waiting() const {
    size_t held = 0;
    for (const auto& group : held_) held += group.size();
    return scheduler_->num_waiting() + held;
  }
  /// The captured decode buckets (empty without graphs).
  std::vector<int32_t> graph_buckets() const { return runner_->graph_buckets(); }
  /// Checks page ownership: free + referenced == total, each page owned as counted.
  void check_invariants() const;

 private:
  /// Checks config_ and derives what it leaves at 0 (max_model_len) and scheduler_config_.
  void resolve_config(const Qwen3Config& model_config, const Backend& backend);
  /// Adds the step's computed tokens to the prefill and decode counters.
  void count_tokens(const SchedulerOutput& out);
  /// Whether a step of `out` may start a run of pipelined steps: pipelining on, a pure
  /// decode step, no request that needs its tokens on the host before the next step
  /// (penalties, top-k log-probabilities), no logits hook, one rank. Stop strings are
  /// the API layer's: EngineCore::advance ends a sample at the token that completes one
  /// however many tokens a step brought, so they need nothing here.
  bool can_pipeline(const SchedulerOutput& out) const;
  /// Runs `out` and the steps planned ahead of it (Scheduler::schedule_ahead), at most
  /// pipelined_decode_steps in all; returns the requests they finished.
  std::vector<int64_t> run_pipelined(SchedulerOutput out);
  /// Reports a step's tokens to the scheduler and the counters; appends what finished.
  void complete_step(const SchedulerOutput& out, ModelRunner::StepResult& result,
                     std::vector<int64_t>& done);

  /// Refuses `what` at TP > 1 (not built for tensor parallelism yet) with an Error.
  void refuse_tensor_parallel(const char* what) const;
  /// The checks of every weight update: awake, and the model's (full names and shapes).
  void check_writable(const std::vector<NamedTensor>& tensors) const;
  /// TP > 1, after rank 0 did its part of a weight operation sent to every rank (`own`):
  /// the workers' answers. Every rank done: returns. Otherwise throws Error naming each
  /// rank's failure; when some rank's weights changed and another's did not finish, the
  /// ranks now hold different weights, and the group is marked failed first.
  void agree_weights(const tp::WeightsDone& own, const std::string& what);

  EngineConfig config_;
  SchedulerConfig scheduler_config_;
  /// Tensor parallelism: the worker processes. Declared before the runner, so that the
  /// runner (whose communicator may use the workers' connections) goes first.
  std::unique_ptr<TpLeader> tp_leader_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<KvCacheManager> kv_cache_;
  std::unique_ptr<Scheduler> scheduler_;
  std::map<int64_t, std::unique_ptr<Sequence>> requests_;
  int64_t next_id_ = 1;
  uint64_t weights_version_ = 0;
  bool asleep_ = false;
  EngineStats stats_;
  StepObserver step_observer_;
  std::function<bool()> run_interrupt_;
  /// Loaded LoRA adapters by name; info.slot is the model's slot.
  std::map<std::string, LoraAdapterInfo> loras_;
  /// Prefix-cache keys per slot (KvSequence::adapter_key): a new one at each load.
  std::map<int32_t, uint64_t> lora_keys_;
  uint64_t next_lora_key_ = 1;
  /// Sets the request's slot and key from a name; returns an error text for an unknown one.
  std::string attach_lora(Sequence& seq, const std::string& lora) const;

  /// Runs `write` (the model's update) under the pause protocol of update_weights.
  WeightUpdateResult run_update(PauseMode mode, const std::function<WeightWriteStats()>& write);
  /// The trainer's weight group, when joined; its updates so far (the "tcp" numbering).
  std::unique_ptr<WeightReceiver> weight_group_;
  uint64_t weight_group_updates_ = 0;
  std::atomic<bool> weight_interrupt_{false};  // interrupt_weight_transfers()
  /// Where broadcast buckets arrive, kept from one update to the next (the group's
  /// receiver writes there); freed when the group is left or the engine sleeps.
  BroadcastStaging broadcast_staging_;
  // Pause state (pause() / resume()).
  bool paused_ = false;
  PauseMode pause_mode_ = PauseMode::kWait;
  std::chrono::steady_clock::time_point paused_at_;
  int64_t paused_unfinished_ = 0;  // unfinished requests when the pause began
  int64_t paused_aborted_ = 0;     // of them, aborted by a kAbort pause
  /// Requests (a group's samples together) added while paused, in order.
  std::vector<std::vector<Sequence*>> held_;
};

}  // namespace pagellm
