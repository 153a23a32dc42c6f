#include "pagellm/engine/benchmark.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <random>

#include "pagellm/common/check.h"
#include "pagellm/model/make_model.h"
#include "pagellm/model/random_weights.h"

namespace pagellm {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

void DecodeWorkload::validate() const {
  PAGELLM_CHECK(batch >= 1) << "benchmark batch must be at least 1, got " << batch;
  PAGELLM_CHECK(prompt_len >= 1) << "benchmark prompt length must be at least 1, got "
                                 << prompt_len;
  PAGELLM_CHECK(output_len >= 2)
      << "benchmark output length must be at least 2 (the first token comes from prefill, "
         "the rest are the decode being measured), got "
      << output_len;
  if (model_dir.empty()) {
    const std::vector<std::string> presets = model_presets();
    if (std::find(presets.begin(), presets.end(), preset) == presets.end()) {
      std::string list;
      for (const std::string& p : presets) list += (list.empty() ? "" : ", ") + p;
      PAGELLM_FAIL() << "unknown preset '" << preset << "' (known: " << list << ")";
    }
  }
}

std::string DecodeWorkload::model_name() const {
  return model_dir.empty() ? preset + " (random weights)" : model_dir;
}

const std::vector<NamedWorkload>& named_workloads() {
  static const std::vector<NamedWorkload> all = [] {
    DecodeWorkload w1;
    w1.name = "w1";
    w1.preset = "qwen3-4b";
    w1.batch = 32;
    w1.prompt_len = 256;
    w1.output_len = 512;
    w1.seed = 0;
    return std::vector<NamedWorkload>{
        {"w1",
         "decode of Qwen3-4B (random bf16 weights), 32 prompts of 256 random ids, 512 new "
         "tokens each, greedy, EOS ignored",
         w1},
    };
  }();
  return all;
}

DecodeWorkload named_workload(const std::string& name) {
  const std::string key = lower(name);
  std::string list;
  for (const NamedWorkload& w : named_workloads()) {
    if (w.name == key) return w.workload;
    list += (list.empty() ? "" : ", ") + w.name;
  }
  PAGELLM_FAIL() << "unknown workload '" << name << "' (known: " << list << ")";
}

EngineConfig benchmark_engine_config(const DecodeWorkload& workload, EngineConfig config) {
  if (config.max_model_len <= 0) config.max_model_len = workload.prompt_len + workload.output_len;
  config.max_num_seqs = std::max(config.max_num_seqs, workload.batch);
  config.max_num_batched_tokens = std::max(config.max_num_batched_tokens, config.max_num_seqs);
  return config;
}

std::unique_ptr<Engine> make_benchmark_engine(const DecodeWorkload& workload,
                                              const EngineConfig& base,
                                              const ProgressFn& progress) {
  workload.validate();
  const EngineConfig config = benchmark_engine_config(workload, base);
  if (!workload.model_dir.empty()) return Engine::create(workload.model_dir, config, progress);
  // Random weights made in memory: no files, the same values make-model would write.
  std::unique_ptr<Backend> backend = create_backend(config.backend);
  const Qwen3Config model_config = preset_config(workload.preset);
  auto model = std::make_unique<Qwen3Model>(
      *backend, model_config, random_weight_lookup(model_config, workload.seed, DType::BF16),
      progress);
  return std::make_unique<Engine>(std::move(backend), std::move(model), config);
}

double BenchmarkReport::prefill_tok_s() const {
  return static_cast<double>(prompt_tokens) / prefill_seconds;
}
double BenchmarkReport::decode_tok_s() const {
  return static_cast<double>(decode_tokens) / decode_seconds;
}
double BenchmarkReport::e2e_tok_s() const {
  return static_cast<double>(generated_tokens) / (prefill_seconds + decode_seconds);
}
double BenchmarkReport::host_gap_fraction() const {
  return median_step_seconds > 0 ? host_gap_seconds / median_step_seconds : 0.0;
}
std::optional<double> BenchmarkReport::fraction_of_limit() const {
  if (!bandwidth_bytes_per_s || *bandwidth_bytes_per_s <= 0) return std::nullopt;
  return achieved_bytes_per_s / *bandwidth_bytes_per_s;
}
std::optional<double> BenchmarkReport::limit_tok_s() const {
  if (!bandwidth_bytes_per_s || *bandwidth_bytes_per_s <= 0) return std::nullopt;
  return *bandwidth_bytes_per_s / (weight_read_bytes + kv_read_bytes) * workload.batch;
}

BenchmarkReport run_benchmark(Engine& engine, const DecodeWorkload& workload,
                              const BenchmarkOptions& options) {
  workload.validate();
  PAGELLM_CHECK(options.trace_steps >= 0)
      << "trace steps must be non-negative, got " << options.trace_steps;
  PAGELLM_CHECK(!engine.has_unfinished())
      << "run_benchmark needs an idle engine; this one has unfinished requests";
  const SchedulerConfig& sc = engine.scheduler_config();
  PAGELLM_CHECK(sc.max_num_seqs >= workload.batch)
      << "the engine runs at most " << sc.max_num_seqs << " sequences at once but the workload's "
      << "batch is " << workload.batch << " (make its config with benchmark_engine_config)";
  PAGELLM_CHECK(sc.max_model_len >= workload.prompt_len + workload.output_len)
      << "the engine's max_model_len is " << sc.max_model_len << " but the workload needs "
      << workload.prompt_len << " prompt + " << workload.output_len << " output tokens";

  const Qwen3Config& mc = engine.model().config();
  Backend& backend = engine.backend();
  BenchmarkReport r;
  r.workload = workload;
  r.model = workload.model_name();
  r.backend = backend.name();
  r.page_size = engine.config().page_size;
  if (options.measure_bandwidth) r.bandwidth_bytes_per_s = backend.measure_copy_bandwidth();

  const size_t batch = static_cast<size_t>(workload.batch);
  // Warm-up outside the timed region: the first time a matrix shape is seen the CUDA
  // backend autotunes cuBLASLt for it, and the cuDNN plans are built; neither belongs in
  // the figures.
  {
    SamplingParams warm;
    warm.temperature = 0.0f;
    warm.max_tokens = 2;
    warm.ignore_eos = true;
    std::vector<std::vector<int32_t>> prompts(
        batch, std::vector<int32_t>(static_cast<size_t>(workload.prompt_len), 1));
    for (const Sequence* s : engine.generate(prompts, {warm})) engine.release(s->id);
    engine.reset_prefix_cache();  // the timed requests must not find the warm-up's pages
  }
  const PrefixCacheStats prefix_before = engine.prefix_cache_stats();

  std::mt19937 rng(static_cast<uint32_t>(workload.seed));
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(mc.vocab_size) - 1);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = workload.output_len;
  greedy.ignore_eos = true;
  std::vector<int64_t> ids;
  for (size_t b = 0; b < batch; ++b) {
    std::vector<int32_t> prompt(static_cast<size_t>(workload.prompt_len));
    for (int32_t& t : prompt) t = token(rng);
    ids.push_back(engine.add_request(std::move(prompt), greedy));
  }

  // Phase 1: until every request has its first token (prefill). Phase 2: decode.
  backend.synchronize();
  const auto t0 = Clock::now();
  const auto all_started = [&] {
    for (int64_t id : ids) {
      const Sequence& s = engine.request(id);
      if (s.output.empty() && !s.finished()) return false;
    }
    return true;
  };
  while (!all_started()) engine.step();
  const auto t1 = Clock::now();
  const EngineStats before = engine.stats();

  // The trace covers trace_steps decode steps in the middle of the decode, where the
  // context is the run's average.
  const int64_t trace_from =
      options.trace_steps > 0
          ? std::max<int64_t>(0, (workload.output_len - 1 - options.trace_steps) / 2)
          : -1;
  bool tracing = false;
  BenchmarkTrace trace;
  std::vector<double> step_seconds;
  while (engine.has_unfinished()) {
    if (static_cast<int64_t>(step_seconds.size()) == trace_from) {
      r.trace_unavailable = backend.begin_kernel_trace();
      tracing = r.trace_unavailable.empty();
    }
    const auto s0 = Clock::now();
    engine.step();
    step_seconds.push_back(seconds_between(s0, Clock::now()));
    if (tracing && ++trace.steps == options.trace_steps) {
      trace.spans = backend.end_kernel_trace();
      tracing = false;
    }
  }
  if (tracing) trace.spans = backend.end_kernel_trace();
  backend.synchronize();
  const auto t2 = Clock::now();

  for (int64_t id : ids) {
    const Sequence& s = engine.request(id);
    PAGELLM_CHECK(s.finish_reason == FinishReason::kLength)
        << "benchmark request " << id << " ended with " << finish_reason_name(s.finish_reason)
        << (s.error.empty() ? "" : ": ") << s.error;
    r.generated_tokens += static_cast<int64_t>(s.output.size());
  }
  for (int64_t id : ids) engine.release(id);
  r.prompt_tokens = static_cast<int64_t>(batch) * workload.prompt_len;
  r.decode_tokens = r.generated_tokens - static_cast<int64_t>(batch);
  r.prefill_seconds = seconds_between(t0, t1);
  r.decode_seconds = seconds_between(t1, t2);
  const EngineStats& after = engine.stats();
  const PrefixCacheStats prefix_after = engine.prefix_cache_stats();
  r.prefix_cache = prefix_after;
  r.prefix_cache.queried_tokens -= prefix_before.queried_tokens;
  r.prefix_cache.hit_tokens -= prefix_before.hit_tokens;
  r.prefix_cache.evictions -= prefix_before.evictions;
  r.decode_steps = after.steps - before.steps;
  r.graph_steps = after.graph_steps - before.graph_steps;
  r.host_gap_seconds =
      r.decode_steps > 0 ? (after.host_gap_seconds - before.host_gap_seconds) / r.decode_steps
                         : 0.0;
  std::sort(step_seconds.begin(), step_seconds.end());
  r.median_step_seconds = step_seconds.empty() ? 0.0 : step_seconds[step_seconds.size() / 2];

  r.weight_bytes = engine.model().weight_bytes();
  r.prepared_bytes = engine.model().prepared_bytes();
  const size_t embed_bytes =
      static_cast<size_t>(mc.vocab_size * mc.hidden_size) * dtype_size(backend.weight_dtype());
  r.weight_read_bytes =
      static_cast<double>(mc.tie_word_embeddings ? r.weight_bytes : r.weight_bytes - embed_bytes);
  const double kv_per_token = 2.0 * mc.num_hidden_layers * mc.num_key_value_heads * mc.head_dim *
                              dtype_size(backend.kv_dtype());
  const double average_context = workload.prompt_len + workload.output_len / 2.0;
  r.kv_read_bytes = kv_per_token * average_context * workload.batch;
  const double mean_step = r.decode_steps > 0 ? r.decode_seconds / r.decode_steps : 0.0;
  r.achieved_bytes_per_s = mean_step > 0 ? (r.weight_read_bytes + r.kv_read_bytes) / mean_step : 0.0;

  if (options.trace_steps > 0 && trace.steps > 0) {
    trace.timeline = summarize_kernel_timeline(trace.spans);
    r.trace = std::move(trace);
  }
  return r;
}

std::string benchmark_json_line(const BenchmarkReport& r) {
  const auto or_null = [](const std::optional<double>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  const nlohmann::json j = {
      {"model", r.model},
      {"backend", r.backend},
      {"batch", r.workload.batch},
      {"prompt_len", r.workload.prompt_len},
      {"output_len", r.workload.output_len},
      {"prefill_tok_s", r.prefill_tok_s()},
      {"decode_tok_s", r.decode_tok_s()},
      {"e2e_tok_s", r.e2e_tok_s()},
      {"median_step_ms", r.median_step_seconds * 1e3},
      {"host_gap_us", r.host_gap_seconds * 1e6},
      {"bandwidth_gbs",
       r.bandwidth_bytes_per_s ? nlohmann::json(*r.bandwidth_bytes_per_s / 1e9) : nullptr},
      {"fraction_of_limit", or_null(r.fraction_of_limit())},
      {"limit_tok_s", or_null(r.limit_tok_s())},
      {"prefix_hit_rate", r.prefix_cache.hit_rate()},
  };
  return j.dump();
}

}  // namespace pagellm
