// The engine: the composition of the requests, the scheduler, the KV cache manager and the
// model runner; it turns requests into tokens one step at a time (continuous batching).
#pragma once

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
#include "pagellm/kv/kv_cache_manager.h"
#include "pagellm/model/qwen3.h"

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
  /// Host time per step while the device waits: scheduling, batch building and upload
  /// before the forward is launched, plus the bookkeeping after the sampled tokens arrive.
  double host_gap_seconds = 0.0;
};

/// The engine (nano-vllm's LLMEngine, vLLM v1's EngineCore): owns the requests, and
/// composes the Scheduler (who runs), the KvCacheManager (pages and page-table rows) and
/// the ModelRunner (backend, model, KV pools, graphs). Not thread-safe: one thread calls
/// it. docs/design.md, "The engine step", states what one step does.
class Engine {
 public:
  Engine(std::unique_ptr<Backend> backend, std::unique_ptr<Qwen3Model> model,
         const EngineConfig& config);
  /// Loads the model folder onto the named backend.
  static std::unique_ptr<Engine> create(const std::string& model_dir, const EngineConfig& config,
                                        const ProgressFn& progress = nullptr);
  ~Engine();

  /// Queues a request and returns its id. A request that can never run (empty or
  /// too-long prompt, token ids outside the vocabulary, bad sampling parameters) is
  /// finished at once with FinishReason::kError and a message in Sequence::error.
  int64_t add_request(std::vector<int32_t> prompt, const SamplingParams& params);
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

  /// Called after each forward pass with every sampled row's float32 logits on the host
  /// (request id, index of the output token they produce, logits [vocab]). For tests and
  /// debugging: setting it costs a device-to-host copy of the logits each step.
  using LogitsHook = ModelRunner::LogitsHook;
  void set_logits_hook(LogitsHook hook) { runner_->set_logits_hook(std::move(hook)); }

  /// Version of the weights the model samples with: 0 after loading, increased by one by
  /// each weight update (bump_weights_version). Outputs report the version their tokens
  /// were sampled under.
  uint64_t weights_version() const { return weights_version_; }
  /// Records that the weights changed; call between steps (after the update is complete).
  void bump_weights_version() { ++weights_version_; }

  const EngineConfig& config() const { return config_; }
  const SchedulerConfig& scheduler_config() const { return scheduler_config_; }
  const EngineStats& stats() const { return stats_; }
  Qwen3Model& model() { return runner_->model(); }
  Backend& backend() { return runner_->backend(); }
  const PageAllocator& allocator() const { return kv_cache_->allocator(); }
  /// Fault injection for tests: from the next step on, the scheduler finds `pages` fewer KV
  /// pages free than there are (PageAllocator::withhold_for_testing), as if they were held
  /// elsewhere; 0 restores normal operation.
  void withhold_pages_for_testing(int32_t pages) {
    kv_cache_->allocator().withhold_for_testing(pages);
  }
  int64_t num_pages() const { return runner_->num_pages(); }
  /// The captured decode buckets (empty without graphs).
  std::vector<int32_t> graph_buckets() const { return runner_->graph_buckets(); }
  /// Checks page ownership: free + referenced == total, each page owned as counted.
  void check_invariants() const;

 private:
  /// Checks config_ and derives what it leaves at 0 (max_model_len) and scheduler_config_.
  void resolve_config(const Qwen3Config& model_config);
  /// Adds the step's computed tokens to the prefill and decode counters.
  void count_tokens(const SchedulerOutput& out);

  EngineConfig config_;
  SchedulerConfig scheduler_config_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<KvCacheManager> kv_cache_;
  std::unique_ptr<Scheduler> scheduler_;
  std::map<int64_t, std::unique_ptr<Sequence>> requests_;
  int64_t next_id_ = 1;
  uint64_t weights_version_ = 0;
  EngineStats stats_;
};

}  // namespace pagellm
