// bench: a named workload (default W1) or any preset / batch / lengths through the engine,
// with prefill, decode and end-to-end throughput and decode's fraction of the bandwidth
// limit. The workload and its measurement are library calls (engine/benchmark.h); this
// file parses flags and prints.
#include <cstdio>
#include <fstream>
#include <optional>

#include "cli/commands.h"
#include "cli/common.h"
#include "pagellm/common/progress.h"
#include "pagellm/engine/benchmark.h"

namespace pagellm::cli {
namespace {

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
  std::string trace_out;
  EngineSettings engine;
};

DecodeWorkload workload_of(const BenchArgs& a) {
  DecodeWorkload w = named_workload(a.workload);
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

/// Prints where the traced decode steps' device time went (common/kernel_timeline.h).
void print_trace(const KernelTimeline& t, int steps) {
  if (t.kernels == 0 || steps <= 0) {
    std::printf("  kernel trace: no kernels recorded\n");
    return;
  }
  const double per_step = 1e-3 / steps;  // ns over all steps -> us per step
  std::printf("  kernel trace over %d decode steps: %lld kernels and copies (%.1f per step), %.1f us per "
              "step, of which the device is busy %.1f us and idle %.1f us (%.1f %%; tracing "
              "slows graph launches, so idle time between steps is larger than untraced)\n",
              steps, static_cast<long long>(t.kernels), static_cast<double>(t.kernels) / steps,
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
  std::printf("pagellm bench: %s on %s, batch %d, prompt %d, output %d, page %d\n",
              r.model.c_str(), r.backend.c_str(), w.batch, w.prompt_len, w.output_len,
              r.page_size);
  std::printf("  prefill     %10.1f tok/s  (%.3f s)\n", r.prefill_tok_s(), r.prefill_seconds);
  std::printf("  decode      %10.1f tok/s  (%lld steps, %.3f s, median step %.3f ms, %lld in graphs)\n",
              r.decode_tok_s(), static_cast<long long>(r.decode_steps), r.decode_seconds,
              r.median_step_seconds * 1e3, static_cast<long long>(r.graph_steps));
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
  if (r.trace) {
    std::printf("  (the decode figures above include the %d traced steps)\n", r.trace->steps);
    print_trace(r.trace->timeline, r.trace->steps);
  }
}

void run_bench(const BenchArgs& args) {
  const DecodeWorkload workload = workload_of(args);
  workload.validate();
  EngineConfig config = args.engine.config;
  if (args.engine.kv_cache_gb > 0) {
    config.kv_cache_bytes = static_cast<size_t>(args.engine.kv_cache_gb * 1e9);
  }
  std::unique_ptr<Engine> engine;
  {
    ProgressBar bar(workload.model_dir.empty() ? "building " + workload.preset
                                               : "loading " + workload.model_dir);
    engine = make_benchmark_engine(workload, config, [&](size_t done, size_t total) {
      if (total > (size_t{256} << 20)) bar.update(done, total);
    });
  }
  BenchmarkOptions options;
  options.trace_steps = args.trace_steps;
  const BenchmarkReport report = run_benchmark(*engine, workload, options);
  if (!report.trace_unavailable.empty()) {
    std::printf("  kernel trace unavailable: %s\n", report.trace_unavailable.c_str());
  }
  print_report(report);
  if (report.trace && !args.trace_out.empty()) write_trace_csv(report.trace->spans, args.trace_out);
  if (!args.json_out.empty()) {
    std::ofstream out(args.json_out, std::ios::app);
    PAGELLM_CHECK(out.good()) << "--json-out: cannot append to " << args.json_out;
    out << benchmark_json_line(report) << "\n";
  }
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
                  "named workload; the flags below override its fields. Known:" + names)
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
                  "record this many decode steps' kernels (CUPTI) and print where the time goes")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--trace-out", a->trace_out, "with --trace-steps: write the kernels as CSV");
  cmd->add_flag_function(
      "--dense-page-table",
      [a](int64_t) { a->engine.config.persistent_page_table = false; },
      "send each step's whole page-table rows instead of the changed entries (an ablation)");
  add_engine_options(cmd, a->engine);
  cmd->callback([a] { run_bench(*a); });
}

}  // namespace pagellm::cli
