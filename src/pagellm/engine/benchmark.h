// Throughput benchmarks as library calls: a named workload, run through an Engine, measured
// against the device's bandwidth limit. `pagellm bench` parses flags, calls these and prints.
//
//   DecodeWorkload w = named_workload("w1");          // or fill one in
//   auto engine = make_benchmark_engine(w, config);   // random weights of w.preset, or w.model_dir
//   BenchmarkReport r = run_benchmark(*engine, w);
//   std::string line = benchmark_json_line(r);        // what `bench --json-out` appends
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pagellm/common/kernel_timeline.h"
#include "pagellm/engine/engine.h"

namespace pagellm {

/// What a decode benchmark runs: `batch` requests of `prompt_len` random token ids (from
/// `seed`), each generating exactly `output_len` tokens greedily with EOS ignored, all
/// admitted at once. The model is the folder `model_dir` or, when it is empty, `preset`'s
/// architecture with random bf16 weights made in memory from `seed` (the values make-model
/// would write).
struct DecodeWorkload {
  std::string name;  // the named workload it came from ("w1"), empty when custom
  std::string model_dir;
  std::string preset = "qwen3-4b";
  int32_t batch = 32;
  int32_t prompt_len = 256;
  int32_t output_len = 512;  // the first token comes from prefill: output_len - 1 decode steps
  uint64_t seed = 0;

  /// Throws Error naming the field when a count is out of range (batch, prompt_len >= 1;
  /// output_len >= 2, so that there is a decode phase) or the preset is unknown.
  void validate() const;
  /// "qwen3-4b (random weights)" or the model folder: the model as reports name it.
  std::string model_name() const;
};

/// A workload the project measures by name, with the sentence that defines it.
struct NamedWorkload {
  std::string name;
  std::string description;
  DecodeWorkload workload;
};

/// Every named workload. W1 ("w1", docs/PERFORMANCE.md): Qwen3-4B architecture, random
/// bf16 weights, 32 prompts of 256 random ids, 512 new tokens each, greedy, EOS ignored.
const std::vector<NamedWorkload>& named_workloads();
/// The workload called `name` (case-insensitive); Error listing the known names otherwise.
DecodeWorkload named_workload(const std::string& name);

/// `base` widened so that the workload runs as one batch: max_num_seqs >= batch, a step
/// holds at least one token per sequence, and max_model_len (when 0) prompt + output.
EngineConfig benchmark_engine_config(const DecodeWorkload& workload, EngineConfig base);

/// The engine a workload runs on: Engine::create on model_dir, or random weights of the
/// preset on a backend made by create_backend(config.backend). `config` is widened by
/// benchmark_engine_config. `progress` reports bytes of weights loaded or made.
std::unique_ptr<Engine> make_benchmark_engine(const DecodeWorkload& workload,
                                              const EngineConfig& config,
                                              const ProgressFn& progress = nullptr);

/// How to run a benchmark beyond the workload.
struct BenchmarkOptions {
  /// Record this many decode steps' kernels (Backend::begin_kernel_trace) in the middle of
  /// the decode, where the context is the run's average. 0: no trace.
  int32_t trace_steps = 0;
  /// Measure the backend's copy bandwidth (Backend::measure_copy_bandwidth) for the
  /// fraction-of-limit figures. Without it those figures are absent.
  bool measure_bandwidth = true;
};

/// Where the traced decode steps' device time went.
struct BenchmarkTrace {
  int32_t steps = 0;                // decode steps recorded (the figures include them)
  std::vector<KernelSpan> spans;    // every kernel, copy and host runtime call
  KernelTimeline timeline;          // summarize_kernel_timeline(spans)
};

/// The figures of one run. Times in seconds, rates in tokens or bytes per second.
struct BenchmarkReport {
  DecodeWorkload workload;
  std::string model;    // workload.model_name()
  std::string backend;  // Backend::name()
  int32_t page_size = 0;

  // Token counts (exact: every request generates output_len tokens).
  int64_t prompt_tokens = 0;     // batch * prompt_len
  int64_t generated_tokens = 0;  // batch * output_len
  int64_t decode_tokens = 0;     // generated_tokens - batch (the first tokens are prefill's)

  // Phase 1 runs until every request has its first token (prefill); phase 2 to the end.
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t decode_steps = 0;
  int64_t graph_steps = 0;        // decode steps that replayed a captured graph
  double median_step_seconds = 0;
  double host_gap_seconds = 0;    // per decode step: the host's time while the device waits

  double prefill_tok_s() const;   // prompt_tokens / prefill_seconds
  double decode_tok_s() const;    // decode_tokens / decode_seconds
  double e2e_tok_s() const;       // generated_tokens / (prefill + decode)
  /// host_gap_seconds / median_step_seconds (0 when there is no step).
  double host_gap_fraction() const;

  // The decode limit: bytes a decode step must read (every weight once, the embedding
  // table only as lm_head when tied, an untied table is only gathered; plus the K/V of the
  // run's average context), against the measured copy bandwidth.
  double weight_read_bytes = 0;    // per decode step
  double kv_read_bytes = 0;        // per decode step, at the average context
  double achieved_bytes_per_s = 0; // (weight + KV bytes) / mean decode step
  std::optional<double> bandwidth_bytes_per_s;  // absent without measure_bandwidth
  /// achieved / bandwidth; absent without a bandwidth.
  std::optional<double> fraction_of_limit() const;
  /// Decode tok/s at the bandwidth limit: bandwidth / step bytes * batch.
  std::optional<double> limit_tok_s() const;

  /// The prefix cache over the timed run (the warm-up's pages are forgotten before it):
  /// queries, hits and evictions of its requests; all zero with prefix caching off.
  PrefixCacheStats prefix_cache;

  size_t weight_bytes = 0;    // Qwen3Model::weight_bytes
  size_t prepared_bytes = 0;  // Qwen3Model::prepared_bytes (packed decode layouts)

  /// Present when a trace was asked for and the backend recorded one.
  std::optional<BenchmarkTrace> trace;
  /// Why no trace was recorded although one was asked for (Backend::begin_kernel_trace).
  std::string trace_unavailable;
};

/// Runs `workload` on `engine` (which must be idle and hold the workload's model, e.g. from
/// make_benchmark_engine): a short warm-up outside the timed region (the CUDA backend
/// autotunes and builds plans on first sight of a shape), then the timed prefill and
/// decode. Throws Error when the engine cannot hold the workload or a request ends other
/// than by reaching its length.
BenchmarkReport run_benchmark(Engine& engine, const DecodeWorkload& workload,
                              const BenchmarkOptions& options = {});

/// The report as one JSON object on one line (no newline): model, backend, batch,
/// prompt_len, output_len, prefill_tok_s, decode_tok_s, e2e_tok_s, median_step_ms,
/// host_gap_us, bandwidth_gbs, fraction_of_limit, limit_tok_s (the last three null
/// without a bandwidth), prefix_hit_rate. What `pagellm bench --json-out` appends and the GPU suite reads.
std::string benchmark_json_line(const BenchmarkReport& report);

}  // namespace pagellm
