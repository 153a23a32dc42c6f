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

/// The name of the weight-update benchmark's workload (run_weight_update_benchmark).
inline constexpr const char* kWeightUpdateWorkload = "weight-update";
/// The name of W2, the rollout benchmark (run_grpo_benchmark).
inline constexpr const char* kGrpoWorkload = "grpo";

/// Every named workload. W1 ("w1", docs/PERFORMANCE.md): Qwen3-4B architecture, random
/// bf16 weights, 32 prompts of 256 random ids, 512 new tokens each, greedy, EOS ignored.
/// "weight-update": the model of run_weight_update_benchmark (Qwen3-4B, random bf16).
/// "grpo": the model of W2 (GrpoWorkload::model_workload()).
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

/// LoRA for a decode benchmark (`pagellm bench --lora-rank R --lora-adapters N`): N random
/// PEFT adapters of rank R on all seven modules of every layer, lora_alpha = 2R (scale 2),
/// bf16 factors, seeds workload.seed + 1 .. + N; request i runs with adapter i % N.
struct LoraBenchConfig {
  int32_t rank = 0;      // 0: no LoRA
  int32_t adapters = 1;  // different adapters across the batch
  bool enabled() const { return rank > 0; }
  /// Throws Error naming the flag: rank outside 0..kMaxLoraRank (64), adapters < 1, more
  /// adapters than the engine has slots (`max_loras`) or a rank above the engine's
  /// `max_lora_rank`. Cheap: run it before any work.
  void validate(int32_t max_loras, int32_t max_lora_rank = 64) const;
};

/// The adapters make_benchmark_lora_adapters loaded, and what each load took.
struct LoraBenchAdapters {
  /// Engine names, in request order: request i uses names[i % names.size()].
  std::vector<std::string> names;
  /// Wall time of each Engine::load_lora_adapter, reading the folder from disk included
  /// (the device synchronised before the clock stops), in seconds.
  std::vector<double> load_seconds;
  /// Where each load's time went inside Qwen3Model::set_lora (the rest of load_seconds is
  /// reading and checking the folder, and the slot's table).
  std::vector<Qwen3Model::LoraLoadTimes> load_phases;
};

/// Writes `config.adapters` random adapters for the engine's model into `dir` (made if
/// needed; one sub-folder each) and loads each into `engine` under "bench-lora-<i>",
/// timing the loads. Throws Error when the config is invalid for the engine or a load fails.
LoraBenchAdapters make_benchmark_lora_adapters(Engine& engine, const LoraBenchConfig& config,
                                               const std::string& dir, uint64_t seed);

/// How to run a benchmark beyond the workload.
struct BenchmarkOptions {
  /// Record this many decode steps' kernels (Backend::begin_kernel_trace) in the middle of
  /// the decode, where the context is the run's average. 0: no trace.
  int32_t trace_steps = 0;
  /// Record the prefill phase's kernels instead: every step until each request has its
  /// first token. Not with trace_steps.
  bool trace_prefill = false;
  /// Measure the backend's copy bandwidth (Backend::measure_copy_bandwidth) for the
  /// fraction-of-limit figures. Without it those figures are absent.
  bool measure_bandwidth = true;
  /// Loaded adapter names (Engine::load_lora_adapter): request i, the warm-up's included,
  /// runs with lora_adapters[i % size]. Empty: the base model.
  std::vector<std::string> lora_adapters;
};

/// Where the traced decode steps' device time went.
struct BenchmarkTrace {
  int32_t steps = 0;                // steps recorded (the figures include them)
  bool prefill = false;             // the prefill phase's steps (trace_prefill), not decode's
  std::vector<KernelSpan> spans;    // every kernel, copy and host runtime call
  KernelTimeline timeline;          // summarize_kernel_timeline(spans)
};

/// The figures of one run. Times in seconds, rates in tokens or bytes per second.
struct BenchmarkReport {
  DecodeWorkload workload;
  std::string model;    // workload.model_name()
  std::string backend;  // Backend::name()
  int32_t page_size = 0;
  int32_t batched_tokens = 0;  // the engine's chunked-prefill budget (tokens per step)

  // Token counts (exact: every request generates output_len tokens).
  int64_t prompt_tokens = 0;     // batch * prompt_len
  int64_t generated_tokens = 0;  // batch * output_len
  /// Tokens sampled inside the decode window (phase 2). generated_tokens - batch when
  /// every request gets its first token in the same step; fewer when chunked prefill lets
  /// the first requests decode before the last has its first token.
  int64_t decode_tokens = 0;

  // Phase 1 runs until every request has its first token (prefill); phase 2 to the end.
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t decode_steps = 0;
  int64_t graph_steps = 0;        // decode steps that replayed a captured graph
  int64_t pipelined_steps = 0;    // decode steps launched ahead (pipelined decode)
  double median_step_seconds = 0;
  double host_gap_seconds = 0;    // per decode step: the host's time while the device waits

  double prefill_tok_s() const;   // prompt_tokens / prefill_seconds
  double decode_tok_s() const;    // decode_tokens / decode_seconds
  double e2e_tok_s() const;       // generated_tokens / (prefill + decode)
  /// host_gap_seconds / median_step_seconds (0 when there is no step).
  double host_gap_fraction() const;

  // The decode limit: bytes the window's steps must read (every weight once a step, the
  // embedding table only as lm_head when tied, an untied table is only gathered; plus, for
  // every sequence a step advanced, the K/V of its context after the step), against the
  // measured copy bandwidth. Counted step by step, so no figure can pass the copy rate.
  double weight_read_bytes = 0;    // per decode step
  double kv_read_bytes = 0;        // per decode step: the window's K/V bytes / decode_steps
  double achieved_bytes_per_s = 0; // (weight + KV bytes) / mean decode step
  std::optional<double> bandwidth_bytes_per_s;  // absent without measure_bandwidth
  /// achieved / bandwidth; absent without a bandwidth.
  std::optional<double> fraction_of_limit() const;
  /// Decode tok/s at the bandwidth limit: decode_tokens over the time the window's bytes
  /// take at the copy rate.
  std::optional<double> limit_tok_s() const;

  /// The prefix cache over the timed run (the warm-up's pages are forgotten before it):
  /// queries, hits and evictions of its requests; all zero with prefix caching off.
  PrefixCacheStats prefix_cache;

  size_t weight_bytes = 0;    // Qwen3Model::weight_bytes
  size_t prepared_bytes = 0;  // Qwen3Model::prepared_bytes (packed decode layouts)

  /// LoRA: the rank of the adapters the requests ran with (0: none), how many different
  /// ones, and each adapter's load time in seconds (filled by the caller that loaded them;
  /// empty when unknown). A report of the same workload without LoRA, when one was run for
  /// comparison, gives base_decode_tok_s.
  int32_t lora_rank = 0;
  int32_t lora_adapters = 0;
  std::vector<double> lora_load_seconds;
  /// Each load's phases (LoraBenchAdapters::load_phases), when the caller knows them.
  std::vector<Qwen3Model::LoraLoadTimes> lora_load_phases;
  std::optional<double> base_decode_tok_s;
  /// decode_tok_s / base_decode_tok_s (issue 19's targets: >= 0.85 with one r = 32 adapter,
  /// >= 0.80 with 8); absent without a base figure.
  std::optional<double> lora_fraction_of_base() const;
  /// The adapters' load times in milliseconds: min, median, max; absent without loads.
  struct LoadSpread {
    double min_ms = 0;
    double median_ms = 0;
    double max_ms = 0;
  };
  std::optional<LoadSpread> lora_load_ms() const;
  /// The loads' phases in milliseconds (Qwen3Model::LoraLoadTimes): the median image build
  /// and upload wait, and the largest pinning of the staging halves (only the engine's first
  /// staged load pins, or one with a block larger than a half); absent without phases.
  struct LoadPhasesMs {
    double image_median_ms = 0;
    double upload_median_ms = 0;
    double staging_max_ms = 0;
  };
  std::optional<LoadPhasesMs> lora_load_phases_ms() const;

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

// ---- sleep and wake (`pagellm bench --workload sleep-wake`) --------------------------------

/// The sleep-wake measurement's workload: the Qwen3-4B architecture with random bf16
/// weights (seed 0), 8 prompts of 128 random ids, 16 tokens each sampled at temperature 1
/// with fixed seeds, EOS ignored: the tokens checked before sleep and after each wake.
DecodeWorkload sleep_wake_workload();

/// One sleep and the wake after it, and whether the workload's tokens after the wake
/// equal those before the first sleep.
struct SleepWakeCycle {
  SleepReport sleep;
  WakeReport wake;
  bool tokens_match = false;
};

/// What run_sleep_wake_benchmark measured. Seconds and bytes.
struct SleepWakeReport {
  DecodeWorkload workload;
  std::string model;
  std::string backend;
  size_t weight_bytes = 0;    // Qwen3Model::weight_bytes
  size_t prepared_bytes = 0;  // Qwen3Model::prepared_bytes
  size_t kv_pool_bytes = 0;   // all layers' K and V pools
  SleepWakeCycle kv_only;     // SleepOptions{} (the KV cache only)
  SleepWakeCycle offload;     // SleepOptions{offload_weights = true}, the first time
  SleepWakeCycle offload_again;  // the same again (a backend may reuse its host buffers)
  // The alternative to fixed addresses: give the KV pools' memory back with the ordinary
  // free and take it again with the ordinary allocation (zero-filled like a wake's), then
  // capture every decode graph again. Measured while asleep, with pools of the same sizes.
  double free_seconds = 0;
  double reallocate_seconds = 0;
  double recapture_seconds = 0;
  size_t graphs = 0;                 // decode graphs recaptured (0: the backend has none)
  bool recapture_tokens_match = false;
  int64_t tokens_checked = 0;        // sampled tokens compared after each wake
  /// Whether every comparison matched.
  bool all_tokens_match() const {
    return kv_only.tokens_match && offload.tokens_match && offload_again.tokens_match &&
           recapture_tokens_match;
  }
};

/// Runs the workload's requests (must be idle; seeded sampling) to get reference tokens,
/// then: sleep (KV only), the free/reallocate alternative while asleep, wake, the tokens
/// again; twice: sleep with weight offload, wake, the tokens again; the graphs
/// recaptured, the tokens again. Throws Error when the backend cannot sleep or a request fails.
SleepWakeReport run_sleep_wake_benchmark(Engine& engine, const DecodeWorkload& workload);

/// The report as one JSON object on one line (no newline).
std::string sleep_wake_json_line(const SleepWakeReport& report);

/// The report as one JSON object on one line (no newline): model, backend, batch,
/// prompt_len, output_len, prefill_tok_s, decode_tok_s, e2e_tok_s, median_step_ms,
/// host_gap_us, bandwidth_gbs, fraction_of_limit, limit_tok_s (the last three null
/// without a bandwidth), prefix_hit_rate, lora_rank, lora_adapters, lora_load_ms ({min,
/// median, max} or null), base_decode_tok_s and lora_fraction_of_base (null without a
/// comparison run). What `pagellm bench --json-out` appends and the GPU suite reads.
std::string benchmark_json_line(const BenchmarkReport& report);

// ---- weight-update benchmark (`pagellm bench --workload weight-update`) --------------------

/// The engine config the weight-update benchmark needs beside the model: `base` with a
/// KV pool of 1 GiB when neither its bytes nor its pages are set (the benchmark holds a
/// second copy of every weight in device memory, which a default pool would leave no room
/// for).
EngineConfig weight_update_engine_config(EngineConfig base);

/// One source of the weight-update benchmark.
struct WeightUpdateTiming {
  std::string source;             // "pinned host" or "device"
  std::vector<double> seconds;    // each full update (WeightUpdateResult::seconds)
  double median_seconds = 0;
  double bytes_per_s = 0;         // bytes / median_seconds
  /// bytes_per_s against its limit: the measured host-to-device rate for pinned host
  /// memory; for device memory, half the device copy bandwidth (a copy reads and writes
  /// each byte). Absent without a measured limit.
  std::optional<double> fraction_of_limit;
};

/// The figures of the weight-update benchmark.
struct WeightUpdateBenchReport {
  std::string model;    // workload.model_name()
  std::string backend;  // Backend::name()
  int64_t tensors = 0;  // Hugging Face tensors per update
  uint64_t bytes = 0;   // bytes per update (the backend's weight dtype)
  double host_to_device_bytes_per_s = 0;  // Backend::measure_host_to_device_bandwidth
  double device_copy_bytes_per_s = 0;     // Backend::measure_copy_bandwidth (read + write)
  WeightUpdateTiming pinned;
  WeightUpdateTiming device;
};

/// Times full updates of every parameter of the engine's model (which must be idle): new
/// random weights (seed workload.seed + 1, the backend's weight dtype) laid out back to back
/// in one buffer, as a trainer's flat parameter buffer is, once in pinned host memory and
/// once in device memory; `repeats` updates from each (Engine::update_weights), median.
/// Checks afterwards that the engine serves the new weights (a short greedy request ends by
/// length). Throws Error for repeats < 1 or when the copies do not fit.
WeightUpdateBenchReport run_weight_update_benchmark(Engine& engine, const DecodeWorkload& workload,
                                                    int32_t repeats = 5);

/// The report as one JSON object on one line: model, backend, tensors, bytes, and per
/// source median_s, gbs, fraction_of_limit, plus h2d_gbs and copy_gbs.
std::string weight_update_json_line(const WeightUpdateBenchReport& report);

// ---- W2, the rollout benchmark (`pagellm bench --workload grpo`) -------------------------------

/// W2 (issue 16): a GRPO-style rollout. Each round, `prompts` prompts of uniformly drawn
/// lengths in [min_prompt_len, max_prompt_len] (random ids), each sampled n times at
/// `temperature`; sample j's output length is drawn from a log-normal with median
/// `median_output_len` and log-space deviation `output_len_sigma`, capped at
/// `max_output_len` (EOS ignored: it is the sample's max_tokens). Between rounds, one full
/// weight update from pinned host memory (new random weights). Everything from `seed`.
struct GrpoWorkload {
  std::string model_dir;            // empty: random bf16 weights of `preset`
  std::string preset = "qwen3-4b";
  int32_t prompts = 64;
  int32_t min_prompt_len = 256;
  int32_t max_prompt_len = 1024;
  int32_t n = 8;
  float temperature = 1.0f;
  double median_output_len = 512;
  double output_len_sigma = 1.0;
  int32_t max_output_len = 4096;
  int32_t rounds = 2;
  uint64_t seed = 0;

  /// Throws Error naming the field for a count or length out of range or an unknown preset.
  void validate() const;
  /// The decode workload that names the same model (for make_benchmark_engine).
  DecodeWorkload model_workload() const;
};

/// `base` widened so that every sample of a round runs at once: max_num_seqs >= prompts *
/// n, max_model_len (when 0) max_prompt_len + max_output_len.
EngineConfig grpo_engine_config(const GrpoWorkload& workload, EngineConfig base);

/// Adds one prompt's n = max_tokens.size() samples as one fan-out group
/// (Engine::add_request_group: one prefill, shared prompt pages) and returns their engine
/// ids: sample j has seed params.seed + j and max_tokens max_tokens[j].
std::vector<int64_t> add_prompt_samples(Engine& engine, const std::vector<int32_t>& prompt,
                                        const SamplingParams& params,
                                        const std::vector<int32_t>& max_tokens);

/// The figures of W2.
/// W2's steps of one kind (GrpoReport::step_classes): where the rollout's time goes.
struct GrpoStepClass {
  std::string name;         // "prefill + decode" or "decode 1-8 rows", "decode 9-32 rows", ...
  int64_t steps = 0;
  double seconds = 0;       // wall time of Engine::step() over these steps (a pipelined
                            // run's time shared evenly by its steps)
  double limit_seconds = 0; // their share of GrpoReport::limit_seconds
  double per_sample_limit_seconds = 0;  // their share of GrpoReport::per_sample_limit_seconds
  double roofline_seconds = 0;          // their share of GrpoReport::roofline_seconds
  int64_t decode_tokens = 0;
};

struct GrpoReport {
  GrpoWorkload workload;
  std::string model;
  std::string backend;
  int32_t batched_tokens = 0;     // the engine's chunked-prefill budget (tokens per step)
  int64_t samples = 0;            // per round: prompts * n
  int64_t prompt_tokens = 0;      // over all rounds (each sample's prompt counted once)
  int64_t generated_tokens = 0;   // over all rounds
  double rollout_seconds = 0;     // all rounds, the weight updates excluded
  double rollout_tok_s() const;   // generated_tokens / rollout_seconds
  int64_t steps = 0;
  int64_t pipelined_steps = 0;    // of them, launched ahead (pipelined decode)
  /// The step-by-step limit: the time every step would take at the copy bandwidth,
  /// reading every weight once plus each physical K/V page that a running sequence's
  /// context covers, once however many sequences share it (a prompt's samples share its
  /// prompt pages): the bytes a step must read at least.
  double limit_seconds = 0;
  /// The same with the K/V of every running sequence's whole context, shared pages counted
  /// once per sequence (how W2 was counted until 2026-12-06): the bytes if nothing shared
  /// were read once. A step can beat it (siblings' reads of a shared page come from L2).
  double per_sample_limit_seconds = 0;
  std::optional<double> bandwidth_bytes_per_s;
  /// limit_seconds / rollout_seconds (absent without a bandwidth).
  std::optional<double> fraction_of_limit() const;
  /// The FLOPs the rollout's steps do at least: per new token every layer's products and
  /// its attention over the keys it sees, per logits row the lm_head.
  double flops = 0;
  /// The rate of the backend's own products (Backend::measure_matmul_rate on the model's
  /// gate|up shape at matmul_rate_rows rows), measured with the bandwidth; absent without.
  std::optional<double> matmul_flops_per_s;
  int64_t matmul_rate_rows = 0;
  /// The step-by-step roofline: each step the longer of its limit (bytes at the copy
  /// rate) and its FLOPs at matmul_flops_per_s. A step of many rows with short contexts
  /// (a GRPO round's first steps) is bound by its FLOPs, which limit_seconds ignores.
  double roofline_seconds = 0;
  /// Engine host time while the device waited over the rollouts (EngineStats::host_gap's
  /// three parts: scheduling, batch building and bookkeeping of every step).
  HostGap host_gap;
  int64_t peak_kv_pages = 0;      // most KV pages in use at once
  int64_t usable_kv_pages = 0;
  int64_t preemptions = 0;
  /// Each update between rounds (WeightUpdateResult::seconds).
  std::vector<double> weight_update_seconds;
  /// Prefix cache over the rollouts: tokens looked up at admission and found cached (a
  /// group looks up its prompt once; preempted samples look up again when they resume).
  /// The rounds' steps by kind: steps that prefilled prompt tokens (beside any decode
  /// rows), then decode-only steps by their number of decode rows (1-8, 9-32, 33-64, 65-128,
  /// 129-256, 257 and more); the kinds no step fell into are left out.
  std::vector<GrpoStepClass> step_classes;
  int64_t prefix_queried_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  /// With trace_steps: the kernels of the last round's decode-only steps from the one after
  /// its first trace_after (by default its first decode-only steps after its prefill, the
  /// round's largest; the rollout figures include them), with their decode rows
  /// (trace_rows, summed over trace->steps forward steps) and the number of the round's
  /// decode-only steps run before them (trace_after_steps: at least trace_after, more when
  /// an engine step ran several). Absent when the backend cannot trace (trace_unavailable
  /// says why) or no step was traced.
  std::optional<BenchmarkTrace> trace;
  int64_t trace_rows = 0;
  int64_t trace_after_steps = 0;
  /// The bytes the traced forward steps read as the per-page limit counts them, summed over
  /// the steps: K/V (each page once a step) and weights. With the trace's kernel times
  /// they give the attention's and the products' fraction of the copy rate in those steps.
  double trace_kv_bytes = 0;
  double trace_weight_bytes = 0;
  std::string trace_unavailable;
  double prefix_hit_rate() const {
    return prefix_queried_tokens > 0
               ? static_cast<double>(prefix_hit_tokens) / static_cast<double>(prefix_queried_tokens)
               : 0.0;
  }
};

/// Runs W2 on an idle engine made for it (grpo_engine_config); throws Error when it cannot
/// hold a round or a sample ends other than by its length.
/// With trace_steps > 0 it records the kernels of that many forward steps (GrpoReport::trace;
/// with pipelined decode, up to the end of the engine step that reaches the count), once
/// trace_after (>= 1) of the last round's decode-only forward steps have run: later
/// windows show the round's steps with fewer, longer samples.
GrpoReport run_grpo_benchmark(Engine& engine, const GrpoWorkload& workload,
                              bool measure_bandwidth = true, int32_t trace_steps = 0,
                              int32_t trace_after = 1);

/// The report as one JSON line.
std::string grpo_json_line(const GrpoReport& report);

}  // namespace pagellm
