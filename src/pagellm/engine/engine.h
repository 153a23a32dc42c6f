// The engine: owns the backend, the model, the KV pools, the page bookkeeping and the
// scheduler, and turns requests into tokens one step at a time (continuous batching).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pagellm/backend/backend.h"
#include "pagellm/engine/scheduler.h"
#include "pagellm/engine/sequence.h"
#include "pagellm/kv/page_allocator.h"
#include "pagellm/kv/page_table.h"
#include "pagellm/model/qwen3.h"

namespace pagellm {

/// Engine settings. Zero means "derive a default".
struct EngineConfig {
  std::string backend = "cpu";
  int32_t page_size = 16;
  /// Physical pages per layer, page 0 included. 0: sized from kv_cache_bytes.
  int64_t num_pages = 0;
  /// Bytes for all layers' K and V pools. 0: a share of the backend's free memory
  /// (a quarter on the CPU, up to 4 GiB; 90 % on a GPU).
  size_t kv_cache_bytes = 0;
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 2048;
  /// Longest prompt + output. 0: the model's max_position_embeddings.
  int32_t max_model_len = 0;
  /// Decode steps replay one captured graph per batch-size bucket (backends with graphs).
  bool use_graphs = true;
  /// Bucket sizes; empty: 1, 2, 4, 8, 16, 24, 32, 48, 64, then every 32 up to max_num_seqs.
  std::vector<int32_t> graph_buckets;
  /// Who runs paged attention: "auto" (the backend's dispatcher: cuDNN only where measured
  /// to win, never an error because of cuDNN), "native" or "cudnn" (cuda backend only;
  /// a call cuDNN cannot serve is an Error). Passed to Backend::set_attention_backend.
  std::string attention_backend = "auto";
};

/// Counters since the engine started.
struct EngineStats {
  int64_t steps = 0;
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  int64_t preemptions = 0;
  int64_t graph_steps = 0;  // decode steps that replayed a captured graph
  /// Host time per step while the device waits: scheduling, batch building and upload
  /// before the forward is launched, plus the bookkeeping after the sampled tokens arrive.
  double host_gap_seconds = 0.0;
};

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
  using LogitsHook =
      std::function<void(int64_t id, int64_t output_index, const float* logits, int64_t vocab)>;
  void set_logits_hook(LogitsHook hook) { logits_hook_ = std::move(hook); }

  /// Version of the weights the model samples with: 0 after loading, increased by one by
  /// each weight update (bump_weights_version). Outputs report the version their tokens
  /// were sampled under.
  uint64_t weights_version() const { return weights_version_; }
  /// Records that the weights changed; call between steps (after the update is complete).
  void bump_weights_version() { ++weights_version_; }

  const EngineConfig& config() const { return config_; }
  const SchedulerConfig& scheduler_config() const { return scheduler_config_; }
  const EngineStats& stats() const { return stats_; }
  Qwen3Model& model() { return *model_; }
  Backend& backend() { return *backend_; }
  const PageAllocator& allocator() const { return *allocator_; }
  int64_t num_pages() const { return num_pages_; }
  /// The captured decode buckets (empty without graphs).
  std::vector<int32_t> graph_buckets() const;
  /// Checks page ownership: free + referenced == total, each page owned as counted.
  void check_invariants() const;

 private:
  void allocate_kv(int64_t num_pages);
  void capture_graphs();
  /// Runs the forward pass of `batch`, through a captured graph when one fits; returns
  /// the logits of the batch's logits rows.
  Tensor run_forward(ForwardBatch& batch, bool pure_decode,
                     std::chrono::steady_clock::time_point step_start);

  EngineConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Qwen3Model> model_;
  SchedulerConfig scheduler_config_;
  int64_t num_pages_ = 0;
  std::vector<DeviceBuffer> kv_storage_;
  std::vector<LayerKv> kv_;
  std::unique_ptr<PageAllocator> allocator_;
  std::unique_ptr<PageTable> page_table_;
  std::unique_ptr<Scheduler> scheduler_;
  std::map<int64_t, std::unique_ptr<Sequence>> requests_;
  int64_t next_id_ = 1;
  uint64_t weights_version_ = 0;
  EngineStats stats_;
  LogitsHook logits_hook_;
  struct DecodeGraph {
    std::unique_ptr<RecordedGraph> graph;
    Tensor logits;  // [bucket, V] in the model's workspace
  };
  std::map<int32_t, DecodeGraph> graphs_;  // by bucket size
};

}  // namespace pagellm
