// bench: the W1 workload (or any preset / batch / lengths) through the engine, with
// prefill, decode and end-to-end throughput and decode's fraction of the bandwidth limit.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>

#include "cli/commands.h"
#include "cli/common.h"
#include "pagellm/common/progress.h"
#include "pagellm/engine/engine.h"
#include "pagellm/model/make_model.h"
#include "pagellm/model/random_weights.h"

namespace pagellm::cli {
namespace {

struct BenchArgs {
  std::string model;
  std::string preset = "qwen3-4b";
  int batch = 32;
  int prompt_len = 256;
  int output_len = 512;
  uint64_t seed = 0;
  std::string json_out;
  int trace_steps = 0;
  std::string trace_out;
  EngineSettings engine;
};

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

/// Prints where the traced decode steps' device time went (common/kernel_timeline.h) and,
/// with a path, writes every span as CSV (name, start and end in us from the first start).
void report_trace(const std::vector<KernelSpan>& spans, int steps, const std::string& csv) {
  const KernelTimeline t = summarize_kernel_timeline(spans);
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
  if (!csv.empty()) {
    std::ofstream out(csv);
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
}

void run_bench(BenchArgs args) {
  EngineSettings settings = args.engine;
  if (settings.config.max_model_len <= 0) {
    settings.config.max_model_len = args.prompt_len + args.output_len;
  }
  settings.config.max_num_seqs = std::max(settings.config.max_num_seqs, args.batch);
  settings.config.max_num_batched_tokens =
      std::max(settings.config.max_num_batched_tokens, settings.config.max_num_seqs);

  std::unique_ptr<Engine> engine;
  std::string model_name;
  if (!args.model.empty()) {
    engine = load_engine(args.model, settings);
    model_name = args.model;
  } else {
    // Random weights made in memory: no files, same values make-model would write.
    std::unique_ptr<Backend> backend = create_backend(settings.config.backend);
    const Qwen3Config config = preset_config(args.preset);
    ProgressBar bar("building " + args.preset);
    auto model = std::make_unique<Qwen3Model>(
        *backend, config, random_weight_lookup(config, args.seed, DType::BF16),
        [&](size_t done, size_t total) {
          if (total > (size_t{256} << 20)) bar.update(done, total);
        });
    bar.finish();
    engine = std::make_unique<Engine>(std::move(backend), std::move(model), settings.config);
    model_name = args.preset + " (random weights)";
  }
  const Qwen3Config& mc = engine->model().config();
  Backend& backend = engine->backend();
  const double bandwidth = backend.measure_copy_bandwidth();

  // Warm-up outside the timed region: the first time a matrix shape is seen the CUDA
  // backend autotunes cuBLASLt for it, and the cuDNN plans are built; neither belongs in
  // the figures.
  {
    SamplingParams warm;
    warm.temperature = 0.0f;
    warm.max_tokens = 2;
    warm.ignore_eos = true;
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(args.batch),
                                              std::vector<int32_t>(static_cast<size_t>(args.prompt_len), 1));
    for (const Sequence* s : engine->generate(prompts, {warm})) engine->release(s->id);
  }

  std::mt19937 rng(static_cast<uint32_t>(args.seed));
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(mc.vocab_size) - 1);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = args.output_len;
  greedy.ignore_eos = true;
  std::vector<int64_t> ids;
  for (int b = 0; b < args.batch; ++b) {
    std::vector<int32_t> prompt(static_cast<size_t>(args.prompt_len));
    for (auto& t : prompt) t = tok(rng);
    ids.push_back(engine->add_request(std::move(prompt), greedy));
  }

  // Phase 1: until every request has its first token (prefill). Phase 2: decode.
  backend.synchronize();
  const auto t0 = Clock::now();
  auto all_have = [&](size_t n) {
    for (int64_t id : ids)
      if (engine->request(id).output.size() < n && !engine->request(id).finished()) return false;
    return true;
  };
  while (!all_have(1)) engine->step();
  const auto t1 = Clock::now();
  const int64_t steps_before = engine->stats().steps;
  const int64_t graph_before = engine->stats().graph_steps;
  const double gap_before = engine->stats().host_gap_seconds;
  std::vector<double> step_times;
  // The trace covers trace_steps decode steps in the middle of the decode, where the
  // context is the run's average.
  const int64_t trace_from =
      args.trace_steps > 0 ? std::max(0, (args.output_len - 1 - args.trace_steps) / 2) : -1;
  bool tracing = false;
  std::vector<KernelSpan> trace;
  int traced_steps = 0;
  while (engine->has_unfinished()) {
    const int64_t index = static_cast<int64_t>(step_times.size());
    if (index == trace_from) {
      const std::string why = backend.begin_kernel_trace();
      tracing = why.empty();
      if (!tracing) std::printf("  kernel trace unavailable: %s\n", why.c_str());
    }
    const auto s0 = Clock::now();
    engine->step();
    step_times.push_back(seconds(s0, Clock::now()));
    if (tracing && ++traced_steps == args.trace_steps) {
      trace = backend.end_kernel_trace();
      tracing = false;
    }
  }
  if (tracing) trace = backend.end_kernel_trace();
  backend.synchronize();
  const auto t2 = Clock::now();

  int64_t generated = 0;
  for (int64_t id : ids) {
    const Sequence& s = engine->request(id);
    PAGELLM_CHECK(s.finish_reason == FinishReason::kLength)
        << "bench request " << id << " ended with " << finish_reason_name(s.finish_reason) << " "
        << s.error;
    generated += static_cast<int64_t>(s.output.size());
  }
  const double prefill_s = seconds(t0, t1), decode_s = seconds(t1, t2);
  const int64_t decode_tokens = generated - args.batch;
  const int64_t decode_steps = engine->stats().steps - steps_before;

  // Bytes a decode step must read: every weight once (the embedding table only as
  // lm_head when tied; an untied table is only gathered) plus the K/V of the context.
  const size_t wbytes = engine->model().weight_bytes();
  const size_t embed_bytes = static_cast<size_t>(mc.vocab_size * mc.hidden_size) *
                             dtype_size(backend.weight_dtype());
  const double weight_read = static_cast<double>(mc.tie_word_embeddings ? wbytes : wbytes - embed_bytes);
  const double kv_per_token = 2.0 * mc.num_hidden_layers * mc.num_key_value_heads * mc.head_dim *
                              dtype_size(backend.kv_dtype());
  const double avg_context = args.prompt_len + args.output_len / 2.0;
  const double kv_read = kv_per_token * avg_context * args.batch;
  const double step_bytes = weight_read + kv_read;
  const double step_s = decode_steps > 0 ? decode_s / decode_steps : 0.0;
  const double achieved = step_s > 0 ? step_bytes / step_s : 0.0;
  const double limit_tok_s = bandwidth / step_bytes * args.batch;
  std::sort(step_times.begin(), step_times.end());
  const double median_step = step_times.empty() ? 0.0 : step_times[step_times.size() / 2];

  std::printf("pagellm bench: %s on %s, batch %d, prompt %d, output %d, page %d\n",
              model_name.c_str(), backend.name().c_str(), args.batch, args.prompt_len,
              args.output_len, engine->config().page_size);
  std::printf("  prefill     %10.1f tok/s  (%.3f s)\n", args.batch * args.prompt_len / prefill_s,
              prefill_s);
  std::printf("  decode      %10.1f tok/s  (%lld steps, %.3f s, median step %.3f ms, %lld in graphs)\n",
              decode_tokens / decode_s, static_cast<long long>(decode_steps), decode_s,
              median_step * 1e3, static_cast<long long>(engine->stats().graph_steps - graph_before));
  const double gap_us = decode_steps > 0
                            ? (engine->stats().host_gap_seconds - gap_before) / decode_steps * 1e6
                            : 0.0;
  std::printf("  host gap    %10.1f us per decode step (scheduling, batch upload, bookkeeping "
              "while the GPU waits: %.1f %% of the step)\n",
              gap_us, median_step > 0 ? gap_us / (median_step * 1e6) * 100.0 : 0.0);
  std::printf("  end-to-end  %10.1f tok/s  (%.3f s)\n", generated / (prefill_s + decode_s),
              prefill_s + decode_s);
  std::printf("  decode step reads %.2f GB weights + %.2f GB KV; achieved %.0f GB/s of %.0f GB/s "
              "measured copy bandwidth = %.1f %% (limit %.0f tok/s)\n",
              weight_read / 1e9, kv_read / 1e9, achieved / 1e9, bandwidth / 1e9,
              100.0 * achieved / bandwidth, limit_tok_s);
  std::printf("  weights     %.2f GB, plus %.2f GB packed for the decode kernel "
              "(PAGELLM_PACKED_WEIGHTS)\n",
              static_cast<double>(wbytes) / 1e9,
              static_cast<double>(engine->model().prepared_bytes()) / 1e9);
  if (args.trace_steps > 0 && traced_steps > 0) {
    std::printf("  (the decode figures above include the %d traced steps)\n", traced_steps);
    report_trace(trace, traced_steps, args.trace_out);
  }
  if (!args.json_out.empty()) {
    nlohmann::json j = {{"model", model_name}, {"backend", backend.name()},
                        {"batch", args.batch}, {"prompt_len", args.prompt_len},
                        {"output_len", args.output_len},
                        {"prefill_tok_s", args.batch * args.prompt_len / prefill_s},
                        {"decode_tok_s", decode_tokens / decode_s},
                        {"e2e_tok_s", generated / (prefill_s + decode_s)},
                        {"median_step_ms", median_step * 1e3},
                        {"host_gap_us", gap_us},
                        {"bandwidth_gbs", bandwidth / 1e9},
                        {"fraction_of_limit", achieved / bandwidth},
                        {"limit_tok_s", limit_tok_s}};
    std::ofstream(args.json_out, std::ios::app) << j.dump() << "\n";
  }
}

}  // namespace

void register_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  a->engine.config.backend = available_backends().back();  // cuda when built
  CLI::App* cmd = app.add_subcommand("bench", "throughput benchmark (default: the W1 workload)");
  cmd->add_option("--model", a->model, "model folder (default: random weights of --preset)");
  cmd->add_option("--preset", a->preset, "architecture for random weights")->capture_default_str();
  cmd->add_option("--batch", a->batch, "concurrent requests")->capture_default_str();
  cmd->add_option("--prompt-len", a->prompt_len, "prompt tokens")->capture_default_str();
  cmd->add_option("--output-len", a->output_len, "generated tokens")->capture_default_str();
  cmd->add_option("--seed", a->seed, "weights and prompts seed")->capture_default_str();
  cmd->add_option("--json-out", a->json_out, "append a JSON line with the figures");
  cmd->add_option("--trace-steps", a->trace_steps,
                  "record this many decode steps' kernels (CUPTI) and print where the time goes")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--trace-out", a->trace_out, "with --trace-steps: write the kernels as CSV");
  add_engine_options(cmd, a->engine);
  cmd->callback([a] { run_bench(*a); });
}

}  // namespace pagellm::cli
