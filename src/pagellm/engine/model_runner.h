// The model runner: everything of a step that touches the device (nano-vllm's ModelRunner,
// vLLM v1's GPUModelRunner). It owns the backend, the model, the KV pools and the decode
// graphs; given a scheduler's plan it builds the batch, runs the forward pass (a captured
// graph or eagerly) and samples.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pagellm/backend/backend.h"
#include "pagellm/backend/communicator.h"
#include "pagellm/engine/scheduler.h"
#include "pagellm/kv/page_table.h"
#include "pagellm/model/qwen3.h"

namespace pagellm {

/// What the runner needs to size its pools, batches and graphs.
struct ModelRunnerConfig {
  int32_t page_size = 16;
  /// Physical pages per layer, page 0 included. 0: sized from kv_cache_bytes.
  int64_t num_pages = 0;
  /// Bytes for all layers' K and V pools. 0: a share of the backend's free memory
  /// (a quarter on the CPU, up to 4 GiB; 90 % on a GPU).
  size_t kv_cache_bytes = 0;
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 2048;
  int32_t max_model_len = 4096;
  /// Capacity of a page-table row: ceil(max_model_len / page_size).
  int32_t max_pages_per_seq = 0;
  /// Rows of the engine's page table (max_num_seqs + 1: row 0 is the padding row).
  int32_t page_table_rows = 0;
  bool use_graphs = true;
  /// Bucket sizes; empty: 1, 2, 4, 8, 16, 24, 32, 48, 64, then every 32 up to max_num_seqs.
  std::vector<int32_t> graph_buckets;
  /// Use the backend's persistent page table when it has one (EngineConfig's switch).
  bool persistent_page_table = true;
};

/// What the leader (rank 0) of a tensor-parallel group tells the other ranks before each
/// device operation of a step, so that every rank runs the same operations in the same
/// order: the collectives inside a forward need every rank (docs/design.md, "Tensor
/// parallelism"). Throws Error naming a rank that cannot be told.
class StepMirror {
 public:
  virtual ~StepMirror() = default;
  /// Backend::copy_kv_pages with these pairs.
  virtual void copy_kv_pages(const std::vector<std::pair<int32_t, int32_t>>& src_dst) = 0;
  /// A forward of `batch` as the leader uploads it (padding rows included): the replay of
  /// the decode graph of `graph_bucket` rows, or (0) an eager forward.
  virtual void forward(const ForwardBatch& batch, int32_t graph_bucket) = 0;
};

/// A ModelRunner's place in a tensor-parallel group (the default: a single rank).
struct RunnerGroup {
  /// This rank's end of the collectives the model calls; the runner keeps it until the
  /// model is gone (and lets it go before the backend).
  std::unique_ptr<Communicator> comm;
  /// The leader's: told each device operation before this runner runs it. Null elsewhere.
  StepMirror* mirror = nullptr;
  /// Turns the KV pages that fit this rank into the group's count (the minimum over the
  /// ranks), so that every rank's pools have the same pages. Null: this rank's own count.
  std::function<int64_t(int64_t)> agree_num_pages;
};

/// Runs steps on one backend. Not thread-safe: the engine's thread only.
class ModelRunner {
 public:
  /// Called after each forward pass with every sampled row's float32 logits on the host
  /// (request id, index of the output token they produce, logits [vocab]).
  using LogitsHook =
      std::function<void(int64_t id, int64_t output_index, const float* logits, int64_t vocab)>;

  /// What one step did, for the engine's counters.
  struct StepResult {
    /// One token per scheduled sequence with samples == true, in scheduled order, each
    /// followed by its fan-out samples' first tokens.
    std::vector<SampledToken> sampled;
    bool replayed_graph = false;
    /// Page-table entries sent to the backend: B * max_pages_per_seq (padding rows
    /// included) on the dense path, only the changed entries on the persistent one.
    int64_t page_table_entries = 0;
    /// When the forward was launched and when the sampled tokens were on the host.
    std::chrono::steady_clock::time_point launched;
    std::chrono::steady_clock::time_point sampled_at;
  };

  /// Sizes and allocates the KV pools (zero-filled: padding lanes read page 0), reserves
  /// the model's activations and, when asked and the backend has graphs, captures one
  /// decode graph per bucket. Throws Error when not even 2 pages fit or the page count
  /// overflows 32-bit slot numbers.
  /// In a tensor-parallel group (`group`), every rank is built with the same `config`,
  /// so that each captures the same graphs with the same collectives inside.
  ModelRunner(std::unique_ptr<Backend> backend, std::unique_ptr<Qwen3Model> model,
              const ModelRunnerConfig& config, RunnerGroup group = {});
  ~ModelRunner();

  /// Runs the step `out` plans (non-empty, between schedule() and on_step_done()) with the
  /// engine's page table: on the persistent path its changed entries travel with the batch
  /// and count as uploaded. out.page_copies run first (Backend::copy_kv_pages); a step
  /// with a fan-out runs eagerly and samples 1 + fan_out.size() tokens from that row.
  StepResult run(const SchedulerOutput& out, PageTable& page_table);

  /// Pipelined decode (docs/design.md, "Pipelined decode"): a step launched and not yet
  /// waited for.
  struct InFlight {
    SchedulerOutput out;
    SampleTicket ticket;
    StepResult result;  // everything but the tokens and sampled_at
  };
  /// run() without the wait: the page copies, the forward and the sampling are enqueued
  /// and the step is returned in flight. Entries planned ahead (ScheduledSeq::ahead) take
  /// their input token from `previous`'s row fed_from on the device; `previous` is the
  /// step launched just before, not finished yet (null when nothing is planned ahead).
  /// Only for steps whose logits stay on the device: no logits hook, no top-k
  /// log-probabilities (SamplingParams::logprobs), no tensor-parallel group.
  InFlight launch(SchedulerOutput out, PageTable& page_table, const InFlight* previous);
  /// Waits for a launched step's tokens (StepResult::sampled, as run() gives them).
  StepResult finish(InFlight& step);
  bool has_logits_hook() const { return static_cast<bool>(logits_hook_); }

  /// Scoring (Engine::score): runs the forward `out` plans eagerly (never a graph, nothing
  /// sampled) with the logits rows at the batch's token indices `logits_indices` (at most
  /// max_logits_rows()), and returns those rows [R, V] float32 on the device (a view into
  /// the model's workspace, valid until the next forward).
  Tensor forward_rows(const SchedulerOutput& out, PageTable& page_table,
                      const std::vector<int32_t>& logits_indices);
  /// The most logits rows one forward may produce (the model's reservation).
  int32_t max_logits_rows() const { return config_.max_num_seqs; }
  /// The most tokens one forward may hold.
  int32_t max_forward_tokens() const { return config_.max_num_batched_tokens; }

  /// A tensor-parallel follower (rank > 0): the device operations the leader's StepMirror
  /// sent, run as the leader runs them. Nothing is sampled or read back here.
  void follow_copy_kv_pages(const std::vector<std::pair<int32_t, int32_t>>& src_dst);
  void follow_forward(const ForwardBatch& batch, int32_t graph_bucket);

  void set_logits_hook(LogitsHook hook) { logits_hook_ = std::move(hook); }
  /// Whether batches carry the persistent page table (the backend supports it).
  bool persistent_page_table() const { return persistent_; }
  /// Physical pages of each pool, page 0 included.
  int64_t num_pages() const { return num_pages_; }
  /// The captured decode buckets (empty without graphs).
  std::vector<int32_t> graph_buckets() const;
  /// Drops every decode graph and captures them again (what keeping graphs valid across
  /// sleep would cost without fixed addresses; the sleep-wake benchmark times it); LoRA
  /// graphs are captured again as steps need them. Only between steps. Returns the number
  /// of graphs captured.
  size_t recapture_graphs();
  Qwen3Model& model() { return *model_; }
  Backend& backend() { return *backend_; }

 private:
  int64_t size_kv_cache() const;
  void allocate_kv(int64_t num_pages);
  void capture_graphs();
  /// Captures the decode graph of `bucket` rows: the LoRA forward (lora_slots all zeros
  /// at capture; the replays read each step's slots) when `lora`, the plain one otherwise.
  void capture_graph(int32_t bucket, bool lora);
  /// The step's batch: with the persistent page table's changes, or dense rows.
  ForwardBatch build_batch(const SchedulerOutput& out, PageTable& page_table) const;
  /// Input tokens fed from a step in flight: the batch's first src_rows.size() tokens are
  /// that step's samples of rows src_rows (Backend::feed_sampled_tokens).
  struct Feed {
    const SampleTicket* from = nullptr;
    std::vector<int32_t> src_rows;
  };
  /// Pads `batch` to a bucket and replays its graph when it is a pure decode batch and a
  /// bucket fits; otherwise runs the forward eagerly. Returns the logits rows.
  Tensor forward(ForwardBatch& batch, bool pure_decode, StepResult* result,
                 const Feed* feed = nullptr);
  /// Uploads `batch` (then feeds its tokens, when `feed`) and runs it: the graph of
  /// `graph_bucket` rows (returning the first `rows` logits rows) or, for 0, the eager
  /// forward. A failure aborts the group's communicator first, so that no other rank
  /// waits for this one.
  Tensor run_forward(const ForwardBatch& batch, int32_t graph_bucket, int32_t rows,
                     StepResult* result, const Feed* feed = nullptr);
  /// Fills the top-k alternatives (SamplingParams::logprobs) of the sampled rows that ask
  /// for them: each such row of logits is copied to the host and scored by the host
  /// sampler's add_top_logprobs, whatever the backend (docs/design.md, "The
  /// log-probability contract").
  void add_top_logprobs_rows(const Tensor& logits, const std::vector<SamplingRow>& rows,
                             std::vector<SampledToken>& sampled);
  /// Appends `rows` padding rows: token 0 at position 0, KV length 1, slot 0 (the reserved
  /// page) and page-table row 0 (the reserved all-zero row).
  void append_padding_rows(ForwardBatch& batch, int32_t rows) const;

  ModelRunnerConfig config_;
  std::unique_ptr<Backend> backend_;
  // Declared between the backend and the model: the model (which calls it) goes first,
  // the backend (whose stream a device communicator uses) last.
  std::unique_ptr<Communicator> comm_;
  StepMirror* mirror_ = nullptr;
  std::unique_ptr<Qwen3Model> model_;
  bool persistent_ = false;
  int64_t num_pages_ = 0;
  std::vector<DeviceBuffer> kv_storage_;
  std::vector<LayerKv> kv_;
  LogitsHook logits_hook_;
  SamplerWorkspace top_logprobs_workspace_;  // add_top_logprobs_rows's scratch
  struct DecodeGraph {
    std::unique_ptr<RecordedGraph> graph;
    Tensor logits;  // [bucket, V] in the model's workspace
  };
  std::map<int32_t, DecodeGraph> graphs_;  // by bucket size
  /// Decode graphs of steps with LoRA adapters, by bucket size: captured the first time a
  /// step of that bucket has an adapter (docs/design.md "LoRA").
  std::map<int32_t, DecodeGraph> lora_graphs_;
};

}  // namespace pagellm
