// AsyncEngine: the engine loop on its own thread, for many callers at once (vLLM's AsyncLLM).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pagellm/engine_options.h"
#include "pagellm/lora_request.h"
#include "pagellm/outputs.h"
#include "pagellm/prefix_cache_stats.h"
#include "pagellm/prompt.h"
#include "pagellm/sampling_params.h"
#include "pagellm/weight_broadcast.h"
#include "pagellm/weight_update.h"

namespace pagellm {

class RequestStream;

/// The engine's load as the loop thread last published it (after its latest step or
/// control call); reading it never waits for the loop. Counts are samples (sequences), so a
/// request with n = 4 counts 4.
struct EngineLoad {
  /// Samples the scheduler runs now.
  int64_t running = 0;
  /// Samples submitted and not yet running: queued for the loop thread, in the scheduler's
  /// queue, or held by a pause.
  int64_t waiting = 0;
  /// KV pages free (cached-but-unreferenced prefix pages count as free) and usable in all;
  /// idle, free == usable.
  int64_t free_pages = 0;
  int64_t usable_pages = 0;
  bool paused = false;
  bool asleep = false;
};

/// An engine whose loop runs on a thread of its own. Requests stream their tokens back as
/// deltas (RequestOutput whose CompletionOutputs hold only what is new), through a callback
/// or a pull-based RequestStream.
///
/// Thread contract:
///   - submit, abort, shutdown, weights_version and every RequestStream method are safe to
///     call from any number of threads at once.
///   - Callbacks run on the engine loop thread, one at a time, in the order of the request's
///     deltas. A callback must return quickly (the whole engine waits for it) and must not
///     call shutdown() or destroy the AsyncEngine (that would wait for the loop it runs on);
///     it may call submit and abort. An exception thrown by a callback is caught: the
///     request is aborted and the callback is not called again.
///   - The destructor calls shutdown().
///
/// One request's path: submit checks the prompt and params on the caller's thread (errors
/// throw at once, before any work), tokenizes, and queues the request; the loop thread adds
/// its n samples to the engine before its next step, steps the engine, and after each step
/// turns every advanced sample's new tokens into a delta (text by an incremental
/// StreamDecoder, stop strings checked) delivered to the callback or stream. abort() is
/// queued the same way and applied before the next step: the engine frees the samples'
/// KV pages at once and the request ends with FinishReason::kAborted.
class AsyncEngine {
 public:
  /// Loads the model on the calling thread, then starts the loop thread.
  explicit AsyncEngine(const std::string& model_dir, const EngineOptions& options = {});
  ~AsyncEngine();
  AsyncEngine(const AsyncEngine&) = delete;
  AsyncEngine& operator=(const AsyncEngine&) = delete;

  /// Called with each delta on the loop thread; the last has finished == true.
  using Callback = std::function<void(const RequestOutput& delta)>;

  /// Queues a request whose deltas are pulled from the returned stream. request_id: unique
  /// among unfinished requests; empty: "req-<counter>". Throws pagellm::Error for bad
  /// params or prompt (same checks as LLM::generate), a duplicate id, or after shutdown.
  /// `lora` names a loaded LoRA adapter (load_lora_adapter) to run with, "" none; a name
  /// not loaded when the request reaches the engine ends it with FinishReason::kError.
  std::shared_ptr<RequestStream> submit(const Prompt& prompt, const SamplingParams& params,
                                        std::string request_id = "",
                                        const std::string& lora = "");
  /// Queues a request whose deltas go to `callback`; returns its id.
  std::string submit(const Prompt& prompt, const SamplingParams& params, Callback callback,
                     std::string request_id = "", const std::string& lora = "");

  /// Ends the request (all its samples) with FinishReason::kAborted and frees its pages
  /// before the next step. Unknown or finished ids are ignored (the request may have just
  /// finished). A final delta (finished == true) is still delivered.
  void abort(const std::string& request_id);

  /// Stops accepting requests, aborts every unfinished one (each gets its final delta),
  /// and joins the loop thread. Idempotent.
  void shutdown();

  /// Version of the weights the engine samples with now; increases on a weight update.
  uint64_t weights_version() const;
  /// The engine's tensor-parallel ranks (EngineOptions::tensor_parallel_size).
  int tensor_parallel_size() const;

  // ---- weight updates (docs/design.md, "Weight updates"); from any thread but a callback
  /// Pauses generation; `mode` says what happens to the requests submitted before:
  /// kWait lets them finish and returns when they have (their final deltas delivered);
  /// kAbort ends them with FinishReason::kAborted (pages freed) and returns; kKeep freezes
  /// them where they are. Requests submitted while paused queue and run after resume().
  /// Throws pagellm::Error when already paused or after shutdown.
  void pause(PauseMode mode = PauseMode::kWait);
  /// Ends the pause; no-op when not paused.
  void resume();
  /// Rewrites weights in place on the loop thread, between steps, and bumps the weights
  /// version. Not paused: pauses with `mode` around the update (kWait blocks until the
  /// running requests finish) and resumes after; paused: the pause's mode applies and it
  /// stays paused. Running requests kept across the update (kKeep) report the version of
  /// every token in CompletionOutput::weights_versions. A wrong name, shape, dtype or
  /// memory kind throws pagellm::Error naming each problem; the old weights keep serving.
  WeightUpdateResult update_weights(const std::vector<NamedTensor>& tensors,
                                    PauseMode mode = PauseMode::kWait);
  /// The same from a safetensors folder or file.
  WeightUpdateResult load_weights(const std::string& path, PauseMode mode = PauseMode::kWait);
  /// The same from another process's CUDA memory (IpcTensor says how it is shared): the
  /// handles are opened on the loop thread before the update and closed after it. Throws
  /// pagellm::Error on a backend without device IPC (cpu) or for a handle that cannot be
  /// opened, changing nothing.
  WeightUpdateResult update_weights_from_ipc(const std::vector<IpcTensor>& tensors,
                                             PauseMode mode = PauseMode::kWait);
  /// Weight updates broadcast from a trainer process (docs/design.md, "Weight updates",
  /// broadcast). Joins the group the trainer made (WeightGroupSpec), on the loop thread
  /// between steps: it blocks stepping until the trainer has joined too (it should be
  /// joining already: NCCL's join waits for every rank; "tcp" waits up to the spec's
  /// timeout for the trainer to listen). At tensor_parallel_size N every rank joins, rank r
  /// as spec.rank + r. Throws pagellm::Error when a group is joined already, or naming why
  /// the join failed (on any rank).
  void init_weight_group(const WeightGroupSpec& spec);
  /// Leaves the group (no-op without one).
  void destroy_weight_group();
  /// Ends a "tcp" join or broadcast update that waits for the trainer within about 100 ms
  /// (it throws pagellm::Error saying it was interrupted), and every later one: for a server
  /// stopping on a signal, whose requests in flight may finish but which must not wait out a
  /// trainer's timeout first. shutdown() does it too. From any thread, any time.
  void interrupt_weight_transfers();
  bool has_weight_group() const;
  /// update_weights, the tensors' bytes coming from the trainer, which broadcasts them
  /// packed as plan_broadcast_buckets(tensors, bucket_bytes) says while this call runs.
  /// The checks run before the pause; a rejected update still receives (and drops) the
  /// trainer's buckets, so its broadcast completes and the group stays usable. `group`:
  /// empty, or the joined group's name. Engine::update_weights_from_broadcast says what a
  /// transfer failing midway leaves.
  WeightUpdateResult update_weights_from_broadcast(const std::vector<BroadcastTensor>& tensors,
                                                   uint64_t bucket_bytes,
                                                   PauseMode mode = PauseMode::kWait,
                                                   const std::string& group = "");
  /// Tokenizer access, safe from any thread (throws without a tokenizer).
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = true) const;
  /// The text a chat Prompt renders to, and the ids any Prompt is encoded to, as
  /// LLM::apply_chat_template and LLM::prompt_token_ids; safe from any thread. Throw
  /// pagellm::Error for a bad prompt (or text without a tokenizer).
  std::string apply_chat_template(const Prompt& chat_prompt) const;
  std::vector<int32_t> prompt_token_ids(const Prompt& prompt) const;

  /// Scores given token sequences without sampling (LLM::score has the contract): runs on
  /// the loop thread between two steps and blocks the caller until it is done; running
  /// requests keep their pages and continue after it. Safe from any thread but a callback.
  /// Throws pagellm::Error for bad input (before any work) or after shutdown. `lora`: a
  /// loaded adapter's name ("" the base model).
  std::vector<ScoreOutput> score(const std::vector<std::vector<int32_t>>& sequences,
                                 const std::vector<int32_t>& prompt_lengths = {},
                                 int top_k = 0, const std::string& lora = "");

  /// Releases the KV cache's memory (and, with options.offload_weights, the weights'), on
  /// the loop thread between steps; returns when done. Throws pagellm::Error (nothing
  /// changed) while any submitted request is unfinished, when already asleep, after
  /// shutdown, or when the backend cannot sleep. Requests submitted while asleep are not
  /// queued: each ends at once with FinishReason::kError and an error saying the engine is
  /// asleep (its final delta comes as usual).
  SleepReport sleep(const SleepOptions& options = {});
  /// Brings the memory back on the loop thread; throws pagellm::Error when awake or after
  /// shutdown.
  WakeReport wake_up();

  /// Engine introspection for tests and monitoring, answered by the loop thread (blocks
  /// until its current step ends). Checks page ownership and returns the free KV pages.
  int64_t check_invariants_and_count_free_pages();
  int64_t num_usable_pages() const;
  /// The load snapshot (see EngineLoad); safe from any thread, never blocks on the loop.
  /// Published after every step and by pause, resume, sleep and wake_up before they return.
  EngineLoad load() const;
  /// The longest prompt + output a request may have (EngineOptions::max_model_len, or the
  /// model's when that was 0).
  int32_t max_model_len() const;
  /// The model's vocabulary size: token ids run from 0 to vocab_size() - 1.
  int64_t vocab_size() const;

  /// LoRA adapters (LLM::load_lora_adapter has the contract), run by the loop thread
  /// between steps (blocks until done). A replace in place applies to the running
  /// requests of that adapter from the next step on.
  LoraAdapterInfo load_lora_adapter(const LoraRequest& request);
  void unload_lora_adapter(const std::string& name);
  std::vector<LoraAdapterInfo> list_lora_adapters();

  /// Prefix cache, run by the loop thread between steps (blocks until it has run):
  /// forgets every cached KV page, so that no later request reuses K/V computed before.
  void reset_prefix_cache();
  /// Lookups, hits and evictions since loading, and the pages cached now.
  PrefixCacheStats prefix_cache_stats();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

/// The pull side of one request. Deltas queue up until next() takes them.
class RequestStream {
 public:
  /// Waits for the next delta. Returns false when the timeout passed first (nullopt: wait
  /// without limit) or when the stream has ended (finished() is then true and no delta is
  /// left).
  bool next(RequestOutput& delta,
            std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  /// Waits for the end and returns the whole output (all remaining deltas merged); the
  /// deltas taken by next() before are included.
  RequestOutput collect();
  /// The last delta has been taken.
  bool finished() const;
  const std::string& request_id() const { return request_id_; }
  /// Same as AsyncEngine::abort(request_id()).
  void abort();

  struct State;
  RequestStream(std::string request_id, std::shared_ptr<State> state);

 private:
  std::string request_id_;
  std::shared_ptr<State> state_;
};

/// Appends a delta to an accumulated output: per sample, token ids, logprobs, text and
/// weights versions are appended and the finish reason and cumulative logprob replaced.
void merge_delta(RequestOutput& total, const RequestOutput& delta);

}  // namespace pagellm
