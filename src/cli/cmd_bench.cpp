// bench: a named workload (default W1) or any preset / batch / lengths through the engine,
// with prefill, decode and end-to-end throughput and decode's fraction of the bandwidth
// limit. The workload and its measurement are library calls (engine/benchmark.h); this
// file parses flags and prints.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "pagellm/common/progress.h"
#include "pagellm/engine/benchmark.h"
#include "pagellm/model/lora.h"

namespace pagellm::cli {
namespace {

std::string lower_case(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

/// The flags. Unset workload fields keep the named workload's values.
struct BenchArgs {
  std::string workload = "w1";
  std::optional<std::string> model;
  std::optional<std::string> preset;
  std::optional<int32_t> batch;
  std::optional<int32_t> prompt_len;
  std::optional<int32_t> output_len;
  std::optional<uint64_t> seed;
  std::string json_out;
  int trace_steps = 0;
  int trace_after = 1;
  bool trace_prefill = false;
  std::string trace_out;
  int repeats = 5;  // weight-update: full updates per source
  LoraBenchConfig lora;    // --lora-rank, --lora-adapters
  bool lora_compare = false;  // run the workload without LoRA first and print the fraction
  EngineSettings engine = offline_engine_settings();
};

/// A folder made under the system's temporary directory, removed with everything in it
/// when this goes out of scope (the bench's adapters live only as long as the run).
class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    PAGELLM_CHECK(mkdtemp(pattern.data()) != nullptr)
        << "cannot make a temporary folder like " << pattern;
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// `--workload sleep-wake`: the sleep and wake measurement instead of a decode benchmark.
bool is_sleep_wake(const BenchArgs& a) { return a.workload == "sleep-wake"; }

DecodeWorkload workload_of(const BenchArgs& a) {
  DecodeWorkload w = is_sleep_wake(a) ? sleep_wake_workload() : named_workload(a.workload);
  const bool custom = a.model || a.preset || a.batch || a.prompt_len || a.output_len || a.seed;
  if (custom) w.name.clear();
  if (a.model) w.model_dir = *a.model;
  if (a.preset) w.preset = *a.preset;
  if (a.batch) w.batch = *a.batch;
  if (a.prompt_len) w.prompt_len = *a.prompt_len;
  if (a.output_len) w.output_len = *a.output_len;
  if (a.seed) w.seed = *a.seed;
  return w;
}

/// Prints where the traced steps' device time went (common/kernel_timeline.h).
void print_trace(const KernelTimeline& t, int steps, const char* phase) {
  if (t.kernels == 0 || steps <= 0) {
    std::printf("  kernel trace: no kernels recorded\n");
    return;
  }
  const double per_step = 1e-3 / steps;  // ns over all steps -> us per step
  std::printf("  kernel trace over %d %s steps: %lld kernels and copies (%.1f per step), %.1f us per "
              "step, of which the device is busy %.1f us and idle %.1f us (%.1f %%; tracing "
              "slows graph launches, so idle time between steps is larger than untraced)\n",
              steps, phase, static_cast<long long>(t.kernels), static_cast<double>(t.kernels) / steps,
              t.wall_ns * per_step, (t.wall_ns - t.idle_ns) * per_step, t.idle_ns * per_step,
              100.0 * t.idle_ns / t.wall_ns);
  std::printf("    %-44s %9s %12s %7s %12s\n", "kernel (attributed: instants it is the oldest "
              "running)", "per step", "us/step", "share", "mean us");
  for (const TimelineRow& r : t.by_name) {
    std::printf("    %-44s %9.1f %12.1f %6.1f%% %12.2f\n", r.label.c_str(),
                static_cast<double>(r.count) / steps, r.attributed_ns * per_step,
                100.0 * r.attributed_ns / t.wall_ns, r.duration_ns / r.count * 1e-3);
  }
  if (t.period > 0 && t.period_repeats > 0) {
    std::printf("    repeating unit (a layer): %d kernels, %lld repeats; per repeat:\n", t.period,
                static_cast<long long>(t.period_repeats));
    double total = 0;
    for (const TimelineRow& r : t.by_position) total += r.attributed_ns;
    for (size_t j = 0; j < t.by_position.size(); ++j) {
      const TimelineRow& r = t.by_position[j];
      std::printf("    %2zu %-41s attributed %8.2f us   duration %8.2f us\n", j, r.label.c_str(),
                  r.attributed_ns / t.period_repeats * 1e-3, r.duration_ns / t.period_repeats * 1e-3);
    }
    std::printf("       %-41s attributed %8.2f us\n", "unit total", total / t.period_repeats * 1e-3);
  }
  // The host's runtime calls: what the host thread was doing (waiting in a synchronise,
  // launching the graph) while the device idled.
  if (!t.host_calls.empty()) {
    std::printf("    host runtime calls %32s %9s %12s\n", "", "per step", "us/step");
    for (const TimelineRow& r : t.host_calls) {
      std::printf("    %-51s %9.1f %12.1f\n", r.label.c_str(), static_cast<double>(r.count) / steps,
                  r.duration_ns * per_step);
    }
  }
}

/// Every span as CSV: kind, name, start and end in us from the first start.
void write_trace_csv(const std::vector<KernelSpan>& spans, const std::string& path) {
  std::ofstream out(path);
  PAGELLM_CHECK(out.good()) << "--trace-out: cannot write " << path;
  out << "kind,name,start_us,end_us\n";
  uint64_t t0 = UINT64_MAX;
  for (const KernelSpan& s : spans) t0 = std::min(t0, s.start_ns);
  for (const KernelSpan& s : spans) {
    const char* kind = s.kind == KernelSpan::Kind::kKernel ? "kernel"
                       : s.kind == KernelSpan::Kind::kCopy ? "copy"
                                                           : "host";
    out << kind << ",\"" << s.name << "\"," << (static_cast<double>(s.start_ns) - t0) * 1e-3
        << ',' << (static_cast<double>(s.end_ns) - t0) * 1e-3 << '\n';
  }
}

void print_report(const BenchmarkReport& r) {
  const DecodeWorkload& w = r.workload;
  std::printf("pagellm bench: %s on %s, batch %d, prompt %d, output %d, page %d, chunk %d\n",
              r.model.c_str(), r.backend.c_str(), w.batch, w.prompt_len, w.output_len,
              r.page_size, r.batched_tokens);
  std::printf("  prefill     %10.1f tok/s  (%.3f s)\n", r.prefill_tok_s(), r.prefill_seconds);
  std::printf("  decode      %10.1f tok/s  (%lld steps, %.3f s, median step %.3f ms, "
              "%lld in graphs, %lld launched ahead)\n",
              r.decode_tok_s(), static_cast<long long>(r.decode_steps), r.decode_seconds,
              r.median_step_seconds * 1e3, static_cast<long long>(r.graph_steps),
              static_cast<long long>(r.pipelined_steps));
  std::printf("  host gap    %10.1f us per decode step (scheduling, batch upload, bookkeeping "
              "while the GPU waits: %.1f %% of the step)\n",
              r.host_gap_seconds * 1e6, r.host_gap_fraction() * 100.0);
  std::printf("  end-to-end  %10.1f tok/s  (%.3f s)\n", r.e2e_tok_s(),
              r.prefill_seconds + r.decode_seconds);
  if (r.bandwidth_bytes_per_s) {
    std::printf("  decode step reads %.2f GB weights + %.2f GB KV; achieved %.0f GB/s of %.0f GB/s "
                "measured copy bandwidth = %.1f %% (limit %.0f tok/s)\n",
                r.weight_read_bytes / 1e9, r.kv_read_bytes / 1e9, r.achieved_bytes_per_s / 1e9,
                *r.bandwidth_bytes_per_s / 1e9, 100.0 * r.fraction_of_limit().value_or(0.0),
                r.limit_tok_s().value_or(0.0));
  }
  std::printf("  weights     %.2f GB, plus %.2f GB packed for the decode kernel "
              "(PAGELLM_PACKED_WEIGHTS)\n",
              static_cast<double>(r.weight_bytes) / 1e9, static_cast<double>(r.prepared_bytes) / 1e9);
  std::printf("  prefix hit  %10.1f %%  (%lld of %lld prompt tokens found cached, %lld evictions)\n",
              100.0 * r.prefix_cache.hit_rate(), static_cast<long long>(r.prefix_cache.hit_tokens),
              static_cast<long long>(r.prefix_cache.queried_tokens),
              static_cast<long long>(r.prefix_cache.evictions));
  if (r.lora_rank > 0) {
    std::printf("  lora        rank %d on q, k, v, o, gate, up, down (alpha %d, bf16), %d adapter%s: "
                "request i runs with adapter i %% %d\n",
                r.lora_rank, 2 * r.lora_rank, r.lora_adapters, r.lora_adapters == 1 ? "" : "s",
                r.lora_adapters);
    if (const auto ms = r.lora_load_ms()) {
      // One line: the load spread, then (when known) where the median load's time went.
      std::string phases;
      if (const auto p = r.lora_load_phases_ms()) {
        char text[200];
        std::snprintf(text, sizeof text,
                      "; median image build %.1f ms, upload %.1f ms, at most %.1f ms pinning a "
                      "staging buffer",
                      p->image_median_ms, p->upload_median_ms, p->staging_max_ms);
        phases = text;
      }
      std::printf("  lora load   min %.1f ms, median %.1f ms, max %.1f ms per adapter (reading the "
                  "folder, building the image, uploading%s; issue 19's target for r = 32 on "
                  "Qwen3-4B: <= 50 ms)\n",
                  ms->min_ms, ms->median_ms, ms->max_ms, phases.c_str());
    }
    if (const std::optional<double> f = r.lora_fraction_of_base()) {
      std::printf("  lora / base %10.1f %%  of the decode tok/s without LoRA (%.1f of %.1f tok/s; "
                  "issue 19's target: >= 85 %% with one r = 32 adapter, >= 80 %% with 8)\n",
                  100.0 * *f, r.decode_tok_s(), *r.base_decode_tok_s);
    }
  }
  if (r.trace) {
    const char* phase = r.trace->prefill ? "prefill" : "decode";
    std::printf("  (the %s figures above include the %d traced steps)\n", phase, r.trace->steps);
    print_trace(r.trace->timeline, r.trace->steps, phase);
  }
}

void print_weight_update(const WeightUpdateBenchReport& r, int repeats) {
  std::printf("weight update: %s on %s, %lld tensors, %.2f GB per update, median of %d\n",
              r.model.c_str(), r.backend.c_str(), static_cast<long long>(r.tensors),
              static_cast<double>(r.bytes) / 1e9, repeats);
  const auto line = [](const WeightUpdateTiming& t, const char* limit, double limit_gbs) {
    std::printf("  from %-12s %8.3f s  %7.1f GB/s", t.source.c_str(), t.median_seconds,
                t.bytes_per_s / 1e9);
    if (t.fraction_of_limit) {
      std::printf("  %5.1f %% of %s %.1f GB/s", 100.0 * *t.fraction_of_limit, limit, limit_gbs);
    }
    std::printf("\n");
  };
  line(r.pinned, "host-to-device", r.host_to_device_bytes_per_s / 1e9);
  line(r.device, "device copy (read+write / 2)", r.device_copy_bytes_per_s / 2e9);
}

void print_grpo(const GrpoReport& r) {
  const GrpoWorkload& w = r.workload;
  std::printf("W2 (grpo): %s on %s, %d rounds of %d prompts x n = %d (seed %llu), chunk %d\n",
              r.model.c_str(), r.backend.c_str(), w.rounds, w.prompts, w.n,
              static_cast<unsigned long long>(w.seed), r.batched_tokens);
  std::printf("  rollout     %lld tokens in %.2f s = %.0f tok/s over %lld steps "
              "(%lld launched ahead, %lld preemptions)\n",
              static_cast<long long>(r.generated_tokens), r.rollout_seconds, r.rollout_tok_s(),
              static_cast<long long>(r.steps), static_cast<long long>(r.pipelined_steps),
              static_cast<long long>(r.preemptions));
  if (r.fraction_of_limit()) {
    std::printf("  limit       %.2f s step by step at %.0f GB/s: %.1f %% of the bandwidth limit "
                "(each K/V page once a step)\n",
                r.limit_seconds, *r.bandwidth_bytes_per_s / 1e9, 100.0 * *r.fraction_of_limit());
    std::printf("  per sample  %.2f s: %.1f %% if every sample read its whole context, shared "
                "prompt pages included (W2's limit before 2026-12-06)\n",
                r.per_sample_limit_seconds, 100.0 * r.per_sample_limit_seconds / r.rollout_seconds);
    if (r.matmul_flops_per_s) {
      std::printf("  roofline    %.2f s step by step: %.1f %% (each step the longer of its bytes "
                  "and its %.4g TFLOP in all at %.4g TFLOP/s, the backend's products at %lld "
                  "rows)\n",
                  r.roofline_seconds, 100.0 * r.roofline_seconds / r.rollout_seconds,
                  r.flops / 1e12, *r.matmul_flops_per_s / 1e12,
                  static_cast<long long>(r.matmul_rate_rows));
    }
  }
  std::printf("  host gap    %.2f s (%.1f %% of the rollout: the engine's host work while the "
              "device waits): schedule %.2f s, batch build and launch %.2f s, after the "
              "tokens %.2f s\n",
              r.host_gap.total(),
              r.rollout_seconds > 0 ? 100.0 * r.host_gap.total() / r.rollout_seconds : 0.0,
              r.host_gap.schedule, r.host_gap.launch, r.host_gap.finish);
  for (const GrpoStepClass& c : r.step_classes) {
    std::printf("  steps       %-18s %6lld steps, %7.2f s (%4.1f %% of the rollout)",
                c.name.c_str(), static_cast<long long>(c.steps), c.seconds,
                r.rollout_seconds > 0 ? 100.0 * c.seconds / r.rollout_seconds : 0.0);
    if (r.bandwidth_bytes_per_s && c.seconds > 0) {
      std::printf(", limit %6.2f s = %4.1f %% (per sample %5.1f %%)", c.limit_seconds,
                  100.0 * c.limit_seconds / c.seconds,
                  100.0 * c.per_sample_limit_seconds / c.seconds);
      if (r.matmul_flops_per_s) {
        std::printf(", roofline %5.1f %%", 100.0 * c.roofline_seconds / c.seconds);
      }
    }
    std::printf(", %lld decode tokens\n", static_cast<long long>(c.decode_tokens));
  }
  std::printf("  KV pages    peak %lld of %lld\n", static_cast<long long>(r.peak_kv_pages),
              static_cast<long long>(r.usable_kv_pages));
  for (double s : r.weight_update_seconds) std::printf("  weight update %.3f s\n", s);
  std::printf("  prefix hit  %.1f %%  (%lld of %lld looked-up prompt tokens found cached)\n",
              100.0 * r.prefix_hit_rate(), static_cast<long long>(r.prefix_hit_tokens),
              static_cast<long long>(r.prefix_queried_tokens));
  if (!r.trace_unavailable.empty()) {
    std::printf("  kernel trace unavailable: %s\n", r.trace_unavailable.c_str());
  }
  if (r.trace) {
    std::printf("  (the rollout figures above include the %d traced steps: the last round's "
                "decode-only steps after its first %lld, %.1f decode rows a step)\n",
                r.trace->steps, static_cast<long long>(r.trace_after_steps),
                static_cast<double>(r.trace_rows) / r.trace->steps);
    const double kv = r.trace_kv_bytes / r.trace->steps;
    const double weights = r.trace_weight_bytes / r.trace->steps;
    std::printf("  (they read %.2f GB of K/V a step, each page once, and %.2f GB of weights",
                kv / 1e9, weights / 1e9);
    if (r.bandwidth_bytes_per_s) {
      std::printf(": %.0f us and %.0f us at the copy rate", 1e6 * kv / *r.bandwidth_bytes_per_s,
                  1e6 * weights / *r.bandwidth_bytes_per_s);
    }
    std::printf(")\n");
    print_trace(r.trace->timeline, r.trace->steps, "decode");
  }
}

void print_sleep_wake(const SleepWakeReport& r) {
  const auto gib = [](size_t b) { return static_cast<double>(b) / double(size_t{1} << 30); };
  std::printf("pagellm bench --workload sleep-wake: %s on %s; weights %.2f GiB (+%.2f GiB "
              "packed), KV pools %.2f GiB\n",
              r.model.c_str(), r.backend.c_str(), gib(r.weight_bytes), gib(r.prepared_bytes),
              gib(r.kv_pool_bytes));
  const auto cycle = [&](const char* what, const SleepWakeCycle& c) {
    const SleepReport& s = c.sleep;
    std::printf("  %-22s sleep %8.1f ms, wake %8.1f ms; released %.2f GiB KV + %.2f GiB "
                "weights + %.2f GiB packed; free %.2f -> %.2f GiB asleep -> %.2f GiB awake; "
                "tokens after wake %s\n",
                what, s.seconds * 1e3, c.wake.seconds * 1e3, gib(s.kv_bytes_released),
                gib(s.weight_bytes_offloaded), gib(s.prepared_bytes_released),
                gib(s.free_memory_before), gib(s.free_memory_after),
                gib(c.wake.free_memory_after), c.tokens_match ? "match" : "DIFFER");
  };
  cycle("KV cache only", r.kv_only);
  cycle("with weight offload", r.offload);
  cycle("offload, second time", r.offload_again);
  std::printf("  alternative (ordinary free + allocate of the KV pools, then re-capture of %zu "
              "decode graphs): free %.1f ms, allocate and zero %.1f ms, re-capture %.1f ms; "
              "tokens after re-capture %s\n",
              r.graphs, r.free_seconds * 1e3, r.reallocate_seconds * 1e3,
              r.recapture_seconds * 1e3, r.recapture_tokens_match ? "match" : "DIFFER");
  std::printf("  %lld sampled tokens compared after each wake: %s\n",
              static_cast<long long>(r.tokens_checked),
              r.all_tokens_match() ? "all equal to those before sleep" : "MISMATCH");
}

/// The LoRA flags checked before any work: a decode workload, a rank and count the
/// engine can serve, and --lora-compare only with LoRA.
void check_lora_flags(const BenchArgs& args) {
  args.lora.validate(args.engine.config.max_loras, args.engine.config.max_lora_rank);
  const std::string w = lower_case(args.workload);
  const bool decode = w != kGrpoWorkload && w != kWeightUpdateWorkload && !is_sleep_wake(args);
  PAGELLM_CHECK(decode || (!args.lora.enabled() && !args.lora_compare))
      << "--lora-rank and --lora-compare apply to decode workloads (w1 or a custom one), not "
      << "to --workload " << args.workload;
  PAGELLM_CHECK(!args.lora_compare || args.lora.enabled())
      << "--lora-compare needs --lora-rank R (1.." << kMaxLoraRank << "): it compares LoRA with the "
      << "base model";
}

void append_json(const std::string& path, const std::string& line) {
  std::ofstream out(path, std::ios::app);
  PAGELLM_CHECK(out.good()) << "--json-out: cannot append to " << path;
  out << line << "\n";
}

void run_bench(const BenchArgs& args) {
  check_lora_flags(args);
  if (lower_case(args.workload) == kGrpoWorkload) {
    GrpoWorkload grpo;
    if (args.model) grpo.model_dir = *args.model;
    if (args.preset) grpo.preset = *args.preset;
    if (args.seed) grpo.seed = *args.seed;
    grpo.validate();
    PAGELLM_CHECK(!args.trace_prefill)
        << "--trace-prefill applies to decode workloads, not to --workload grpo (its "
           "--trace-steps N traces the last round's first N decode-only steps)";
    PAGELLM_CHECK(args.trace_after == 1 || args.trace_steps > 0)
        << "--trace-after " << args.trace_after << " places a trace: give --trace-steps too";
    EngineConfig config = args.engine.config;
    if (args.engine.kv_cache_gb > 0) {
      config.kv_cache_bytes = static_cast<size_t>(args.engine.kv_cache_gb * 1e9);
    }
    std::unique_ptr<Engine> engine;
    {
      ProgressBar bar(grpo.model_dir.empty() ? "building " + grpo.preset : "loading " + grpo.model_dir);
      engine = make_benchmark_engine(grpo.model_workload(), grpo_engine_config(grpo, config),
                                     [&](size_t done, size_t total) {
                                       if (total > (size_t{256} << 20)) bar.update(done, total);
                                     });
    }
    const GrpoReport report = run_grpo_benchmark(*engine, grpo, /*measure_bandwidth=*/true,
                                                 args.trace_steps, args.trace_after);
    print_grpo(report);
    if (report.trace && !args.trace_out.empty()) {
      write_trace_csv(report.trace->spans, args.trace_out);
    }
    if (!args.json_out.empty()) append_json(args.json_out, grpo_json_line(report));
    return;
  }
  PAGELLM_CHECK(args.trace_after == 1)
      << "--trace-after applies to --workload grpo (a decode workload's --trace-steps window "
         "is the middle of its decode)";
  const DecodeWorkload workload = workload_of(args);
  workload.validate();
  const bool weight_update = lower_case(args.workload) == kWeightUpdateWorkload;
  EngineConfig config = args.engine.config;
  if (args.engine.kv_cache_gb > 0) {
    config.kv_cache_bytes = static_cast<size_t>(args.engine.kv_cache_gb * 1e9);
  }
  if (weight_update) config = weight_update_engine_config(config);
  std::unique_ptr<Engine> engine;
  {
    ProgressBar bar(workload.model_dir.empty() ? "building " + workload.preset
                                               : "loading " + workload.model_dir);
    engine = make_benchmark_engine(workload, config, [&](size_t done, size_t total) {
      if (total > (size_t{256} << 20)) bar.update(done, total);
    });
  }
  if (weight_update) {
    const WeightUpdateBenchReport report =
        run_weight_update_benchmark(*engine, workload, args.repeats);
    print_weight_update(report, args.repeats);
    if (!args.json_out.empty()) append_json(args.json_out, weight_update_json_line(report));
    return;
  }
  if (is_sleep_wake(args)) {
    const SleepWakeReport report = run_sleep_wake_benchmark(*engine, workload);
    print_sleep_wake(report);
    if (!args.json_out.empty()) append_json(args.json_out, sleep_wake_json_line(report));
    PAGELLM_CHECK(report.all_tokens_match())
        << "sleep-wake: the tokens sampled after a wake differ from those before sleep";
    return;
  }
  BenchmarkOptions options;
  std::optional<BenchmarkReport> base;
  if (args.lora_compare) {
    // The same workload on the same engine without adapters first, untraced.
    base = run_benchmark(*engine, workload, options);
    std::printf("pagellm bench: without LoRA (for --lora-compare)\n");
    print_report(*base);
    if (!args.json_out.empty()) append_json(args.json_out, benchmark_json_line(*base));
    std::printf("pagellm bench: with LoRA\n");
  }
  std::optional<TempDir> lora_dir;
  LoraBenchAdapters adapters;
  if (args.lora.enabled()) {
    lora_dir.emplace("pagellm-bench-lora-");
    adapters = make_benchmark_lora_adapters(*engine, args.lora, lora_dir->path(), workload.seed);
    options.lora_adapters = adapters.names;
  }
  options.trace_steps = args.trace_steps;
  options.trace_prefill = args.trace_prefill;
  BenchmarkReport report = run_benchmark(*engine, workload, options);
  report.lora_load_seconds = adapters.load_seconds;
  report.lora_load_phases = adapters.load_phases;
  if (base) report.base_decode_tok_s = base->decode_tok_s();
  if (!report.trace_unavailable.empty()) {
    std::printf("  kernel trace unavailable: %s\n", report.trace_unavailable.c_str());
  }
  if (config.batch_invariant) {
    std::printf("pagellm bench: batch-invariant mode (--batch-invariant; compare with a run "
                "without it for the mode's cost)\n");
  }
  print_report(report);
  if (report.trace && !args.trace_out.empty()) write_trace_csv(report.trace->spans, args.trace_out);
  if (!args.json_out.empty()) append_json(args.json_out, benchmark_json_line(report));
}

}  // namespace

void register_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  a->engine.config.backend = available_backends().back();  // cuda when built
  std::string names;
  for (const NamedWorkload& w : named_workloads()) {
    names += "\n  " + w.name + ": " + w.description;
  }
  const DecodeWorkload w1 = named_workload("w1");
  CLI::App* cmd = app.add_subcommand(
      "bench", "throughput benchmark (default: the W1 workload)");
  cmd->add_option("--workload", a->workload,
                  "named workload; the flags below override its fields. Known:" + names +
                      "\n  sleep-wake: sleep and wake timed (KV only, with weight offload), "
                      "bytes freed, against free + reallocate + graph re-capture; tokens "
                      "checked after each wake (Qwen3-4B shape, 8 x 128-token prompts, 16 "
                      "tokens)")
      ->capture_default_str();
  const auto from_workload = [](const std::string& what, const std::string& w1_value) {
    return what + " (default: the workload's; W1: " + w1_value + ")";
  };
  cmd->add_option("--model", a->model, "model folder (default: random weights of --preset)");
  cmd->add_option("--preset", a->preset, from_workload("architecture for random weights", w1.preset));
  cmd->add_option("--batch", a->batch, from_workload("concurrent requests", std::to_string(w1.batch)));
  cmd->add_option("--prompt-len", a->prompt_len,
                  from_workload("prompt tokens", std::to_string(w1.prompt_len)));
  cmd->add_option("--output-len", a->output_len,
                  from_workload("generated tokens", std::to_string(w1.output_len)));
  cmd->add_option("--seed", a->seed, from_workload("weights and prompts seed", std::to_string(w1.seed)));
  cmd->add_option("--json-out", a->json_out, "append a JSON line with the figures");
  cmd->add_option("--trace-steps", a->trace_steps,
                  "record this many decode steps' kernels (CUPTI) and print where the time "
                  "goes (grpo: the last round's first decode-only steps)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--trace-after", a->trace_after,
                  "grpo with --trace-steps: begin the trace once this many of the last "
                  "round's decode-only steps have run (1: right after its prefill)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--trace-prefill", a->trace_prefill,
                "record the prefill phase's kernels (every step until each request has its "
                "first token) and print where the time goes; not with --trace-steps");
  cmd->add_option("--trace-out", a->trace_out,
                  "with --trace-steps or --trace-prefill: write the kernels as CSV");
  cmd->add_option("--repeats", a->repeats, "weight-update: full updates timed per source")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_flag_function(
      "--dense-page-table",
      [a](int64_t) { a->engine.config.persistent_page_table = false; },
      "send each step's whole page-table rows instead of the changed entries (an ablation)");
  cmd->add_option("--lora-rank", a->lora.rank,
                  "LoRA: random PEFT adapters of this rank (1..64) on all seven modules, alpha "
                  "2R, bf16, each load timed; 0: none")
      ->capture_default_str();
  cmd->add_option("--lora-adapters", a->lora.adapters,
                  "LoRA: this many different adapters; request i runs with adapter i % N")
      ->capture_default_str();
  cmd->add_flag("--lora-compare", a->lora_compare,
                "run the workload without LoRA first and print the LoRA decode tok/s as a "
                "fraction of it (issue 19's targets)");
  add_engine_options(cmd, a->engine);
  cmd->callback([a] { run_bench(*a); });
}

}  // namespace pagellm::cli
