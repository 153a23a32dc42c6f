#include "pagellm/engine/benchmark.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <utility>

#include "pagellm/common/check.h"
#include "pagellm/model/lora.h"
#include "pagellm/model/make_model.h"
#include "pagellm/model/qwen3_weights.h"
#include "pagellm/model/random_weights.h"

namespace pagellm {
namespace {

/// One of the engine's hooks (Engine::set_step_observer, Engine::set_run_interrupt) for a
/// scope: removed however the scope ends, so that an error inside a benchmark leaves no
/// hook pointing at its locals.
template <class Hook, void (Engine::*kSet)(Hook)>
class EngineHookScope {
 public:
  EngineHookScope(Engine& engine, Hook hook) : engine_(engine) {
    (engine_.*kSet)(std::move(hook));
  }
  ~EngineHookScope() { (engine_.*kSet)(nullptr); }
  EngineHookScope(const EngineHookScope&) = delete;
  EngineHookScope& operator=(const EngineHookScope&) = delete;

 private:
  Engine& engine_;
};
using StepObserverScope = EngineHookScope<Engine::StepObserver, &Engine::set_step_observer>;
using RunInterruptScope = EngineHookScope<std::function<bool()>, &Engine::set_run_interrupt>;

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
    // The weight-update benchmark runs run_weight_update_benchmark, not a decode; its
    // workload only names the model (and a short request to check the engine after).
    DecodeWorkload update = w1;
    update.name = kWeightUpdateWorkload;
    update.batch = 1;
    update.prompt_len = 4;
    update.output_len = 4;
    return std::vector<NamedWorkload>{
        {"w1",
         "decode of Qwen3-4B (random bf16 weights), 32 prompts of 256 random ids, 512 new "
         "tokens each, greedy, EOS ignored",
         w1},
        {kWeightUpdateWorkload,
         "in-place update of every Qwen3-4B parameter (random bf16 weights) from pinned host "
         "memory and from device memory, median of --repeats each, against the measured "
         "host-to-device and device copy bandwidths",
         update},
        {kGrpoWorkload,
         "W2, GRPO rollouts on Qwen3-4B (random bf16 weights): 2 rounds of 64 prompts of "
         "256-1,024 random ids, n = 8 at temperature 1.0, output lengths log-normal (median "
         "512, capped at 4,096; EOS ignored), one weight update between the rounds",
         GrpoWorkload{}.model_workload()},
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
  if (config.max_num_batched_tokens > 0) {  // 0: the backend's choice (raised by the engine)
    config.max_num_batched_tokens = std::max(config.max_num_batched_tokens, config.max_num_seqs);
  }
  return config;
}

std::unique_ptr<Engine> make_benchmark_engine(const DecodeWorkload& workload,
                                              const EngineConfig& base,
                                              const ProgressFn& progress) {
  workload.validate();
  const EngineConfig config = benchmark_engine_config(workload, base);
  if (!workload.model_dir.empty()) return Engine::create(workload.model_dir, config, progress);
  // Random weights made in memory: no files, the same values make-model would write.
  if (config.tensor_parallel_size != 1) {
    tp::ModelSource source;
    source.preset = workload.preset;
    source.seed = workload.seed;
    source.dtype = DType::BF16;
    return Engine::create_tensor_parallel(source, config, progress);
  }
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
  // The window's tokens at the time its steps' bytes take at the copy rate.
  const double limit_seconds =
      (weight_read_bytes + kv_read_bytes) * static_cast<double>(decode_steps) / *bandwidth_bytes_per_s;
  return limit_seconds > 0 ? static_cast<double>(decode_tokens) / limit_seconds : 0.0;
}

BenchmarkReport run_benchmark(Engine& engine, const DecodeWorkload& workload,
                              const BenchmarkOptions& options) {
  workload.validate();
  PAGELLM_CHECK(options.trace_steps >= 0)
      << "trace steps must be non-negative, got " << options.trace_steps;
  PAGELLM_CHECK(!(options.trace_prefill && options.trace_steps > 0))
      << "trace either the prefill phase or decode steps, not both";
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
  r.batched_tokens = engine.config().max_num_batched_tokens;
  if (options.measure_bandwidth) r.bandwidth_bytes_per_s = backend.measure_copy_bandwidth();

  const size_t batch = static_cast<size_t>(workload.batch);
  const auto lora_of = [&](size_t request) -> std::string {
    return options.lora_adapters.empty()
               ? std::string()
               : options.lora_adapters[request % options.lora_adapters.size()];
  };
  // Warm-up outside the timed region: the first time a matrix shape is seen the CUDA
  // backend autotunes cuBLASLt for it, and the cuDNN plans are built; neither belongs in
  // the figures.
  {
    SamplingParams warm;
    warm.temperature = 0.0f;
    warm.max_tokens = 2;
    warm.ignore_eos = true;
    std::vector<int64_t> warm_ids;
    for (size_t b = 0; b < batch; ++b) {
      warm_ids.push_back(engine.add_request(
          std::vector<int32_t>(static_cast<size_t>(workload.prompt_len), 1), warm, lora_of(b)));
    }
    while (engine.has_unfinished()) engine.step();
    std::string failed;  // the first request that did not end by its length
    for (int64_t id : warm_ids) {
      const Sequence& s = engine.request(id);
      if (failed.empty() && s.finish_reason != FinishReason::kLength) {
        failed = "benchmark warm-up request " + std::to_string(id) + " ended with " +
                 finish_reason_name(s.finish_reason) + (s.error.empty() ? "" : ": ") + s.error;
      }
      engine.release(id);
    }
    PAGELLM_CHECK(failed.empty()) << failed;
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
    ids.push_back(engine.add_request(std::move(prompt), greedy, lora_of(b)));
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
  BenchmarkTrace trace;
  bool tracing = false;
  if (options.trace_prefill) {
    r.trace_unavailable = backend.begin_kernel_trace();
    tracing = r.trace_unavailable.empty();
    trace.prefill = true;
  }
  while (!all_started()) {
    const int64_t steps_before = engine.stats().steps;
    engine.step();
    if (tracing) trace.steps += static_cast<int32_t>(engine.stats().steps - steps_before);
  }
  if (tracing) {
    trace.spans = backend.end_kernel_trace();
    tracing = false;
  }
  const auto t1 = Clock::now();
  const EngineStats before = engine.stats();

  // The trace covers trace_steps decode steps in the middle of the decode, where the
  // context is the run's average.
  const int64_t trace_from =
      options.trace_steps > 0
          ? std::max<int64_t>(0, (workload.output_len - 1 - options.trace_steps) / 2)
          : -1;
  std::vector<double> step_seconds;
  // Honest counts (issue 20): with chunked prefill the first requests decode while later
  // ones still prefill, so phase 1 already produces tokens and phase 2 is not `batch`
  // tokens a step. Count the tokens sampled inside the window and the K/V each step really
  // reads: a sequence a step advances reads its whole context, num_computed after the step.
  // Per forward step (Engine::set_step_observer): with pipelined decode one engine step
  // runs several, and a row kept for a sequence finished already reads nothing it needs.
  const size_t kv_token_bytes = 2 * static_cast<size_t>(mc.num_hidden_layers) *
                                mc.num_key_value_heads * mc.head_dim * dtype_size(backend.kv_dtype());
  int64_t window_first_tokens = 0;
  for (int64_t id : ids) {
    window_first_tokens += static_cast<int64_t>(engine.request(id).output.size());
  }
  double window_kv_tokens = 0;
  const auto count_kv = [&](const SchedulerOutput& out) {
    for (const ScheduledSeq& s : out.scheduled) {
      if (!s.seq->finished()) window_kv_tokens += s.seq->num_computed + s.num_new_tokens;
    }
  };
  std::optional<StepObserverScope> observer;
  observer.emplace(engine, count_kv);
  bool trace_begun = false;
  int64_t trace_begun_at = 0;
  // A pipelined run must end where the trace begins and ends, so that it covers exactly
  // trace_steps forward steps: the interrupt is asked before each step a run plans ahead,
  // and a run launches one step more than the interrupts it was refused.
  int64_t run_first = 0;
  int64_t run_launched = 0;
  const auto boundary = [&]() -> int64_t {
    if (!trace_begun && trace_from >= 0) return trace_from;
    if (tracing) return trace_begun_at + options.trace_steps;
    return std::numeric_limits<int64_t>::max();
  };
  std::optional<RunInterruptScope> interrupt;
  interrupt.emplace(engine, [&] {
    if (run_first + run_launched >= boundary()) return true;
    ++run_launched;
    return false;
  });
  while (engine.has_unfinished()) {
    if (!trace_begun && trace_from >= 0 &&
        static_cast<int64_t>(step_seconds.size()) >= trace_from) {
      trace_begun = true;
      trace_begun_at = static_cast<int64_t>(step_seconds.size());
      r.trace_unavailable = backend.begin_kernel_trace();
      tracing = r.trace_unavailable.empty();
    }
    const int64_t steps_before = engine.stats().steps;
    const auto s0 = Clock::now();
    run_first = static_cast<int64_t>(step_seconds.size());
    run_launched = 1;
    engine.step();
    // A pipelined run of n forward steps counts as n steps of its mean duration.
    const int64_t n = std::max<int64_t>(1, engine.stats().steps - steps_before);
    const double call_seconds = seconds_between(s0, Clock::now());
    for (int64_t k = 0; k < n; ++k) step_seconds.push_back(call_seconds / n);
    if (tracing && (trace.steps += static_cast<int32_t>(n)) >= options.trace_steps) {
      trace.spans = backend.end_kernel_trace();
      tracing = false;
    }
  }
  observer.reset();
  interrupt.reset();
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
  r.decode_tokens = r.generated_tokens - window_first_tokens;
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
  r.pipelined_steps = after.pipelined_steps - before.pipelined_steps;
  r.host_gap_seconds =
      r.decode_steps > 0 ? (after.host_gap - before.host_gap).total() / r.decode_steps : 0.0;
  std::sort(step_seconds.begin(), step_seconds.end());
  r.median_step_seconds = step_seconds.empty() ? 0.0 : step_seconds[step_seconds.size() / 2];

  r.weight_bytes = engine.model().weight_bytes();
  r.prepared_bytes = engine.model().prepared_bytes();
  const size_t embed_bytes =
      static_cast<size_t>(mc.vocab_size * mc.hidden_size) * dtype_size(backend.weight_dtype());
  r.weight_read_bytes =
      static_cast<double>(mc.tie_word_embeddings ? r.weight_bytes : r.weight_bytes - embed_bytes);
  r.kv_read_bytes = r.decode_steps > 0 ? window_kv_tokens * static_cast<double>(kv_token_bytes) /
                                             static_cast<double>(r.decode_steps)
                                       : 0.0;
  const double mean_step = r.decode_steps > 0 ? r.decode_seconds / r.decode_steps : 0.0;
  r.achieved_bytes_per_s = mean_step > 0 ? (r.weight_read_bytes + r.kv_read_bytes) / mean_step : 0.0;

  if ((options.trace_steps > 0 || options.trace_prefill) && trace.steps > 0) {
    trace.timeline = summarize_kernel_timeline(trace.spans);
    r.trace = std::move(trace);
  }
  if (!options.lora_adapters.empty()) {
    for (const LoraAdapterInfo& a : engine.lora_adapters()) {
      if (a.name == options.lora_adapters.front()) r.lora_rank = static_cast<int32_t>(a.rank);
    }
    std::vector<std::string> distinct = options.lora_adapters;
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    r.lora_adapters = static_cast<int32_t>(distinct.size());
  }
  return r;
}

std::optional<double> BenchmarkReport::lora_fraction_of_base() const {
  if (!base_decode_tok_s || *base_decode_tok_s <= 0) return std::nullopt;
  return decode_tok_s() / *base_decode_tok_s;
}

std::optional<BenchmarkReport::LoadSpread> BenchmarkReport::lora_load_ms() const {
  if (lora_load_seconds.empty()) return std::nullopt;
  std::vector<double> ms = lora_load_seconds;
  std::sort(ms.begin(), ms.end());
  for (double& v : ms) v *= 1e3;
  const size_t n = ms.size();
  return LoadSpread{ms.front(), 0.5 * (ms[(n - 1) / 2] + ms[n / 2]), ms.back()};
}

std::optional<BenchmarkReport::LoadPhasesMs> BenchmarkReport::lora_load_phases_ms() const {
  if (lora_load_phases.empty()) return std::nullopt;
  const auto sorted_ms = [&](double Qwen3Model::LoraLoadTimes::*phase) {
    std::vector<double> ms;
    for (const Qwen3Model::LoraLoadTimes& t : lora_load_phases) ms.push_back(1e3 * (t.*phase));
    std::sort(ms.begin(), ms.end());
    return ms;
  };
  const auto median = [](const std::vector<double>& v) {
    return 0.5 * (v[(v.size() - 1) / 2] + v[v.size() / 2]);
  };
  return LoadPhasesMs{median(sorted_ms(&Qwen3Model::LoraLoadTimes::image_seconds)),
                      median(sorted_ms(&Qwen3Model::LoraLoadTimes::upload_seconds)),
                      sorted_ms(&Qwen3Model::LoraLoadTimes::staging_seconds).back()};
}

void LoraBenchConfig::validate(int32_t max_loras, int32_t max_lora_rank) const {
  PAGELLM_CHECK(rank >= 0 && rank <= kMaxLoraRank)
      << "--lora-rank must be 0 (no LoRA) or 1.." << kMaxLoraRank
      << " (the largest rank the engine serves), got " << rank;
  PAGELLM_CHECK(adapters >= 1) << "--lora-adapters must be at least 1, got " << adapters;
  if (enabled()) {
    PAGELLM_CHECK(adapters <= max_loras)
        << "--lora-adapters " << adapters << " is more than the engine's " << max_loras
        << " adapter slots (max_loras; raise it with --max-loras)";
    PAGELLM_CHECK(rank <= max_lora_rank)
        << "--lora-rank " << rank << " is more than the engine's max_lora_rank "
        << max_lora_rank << " (raise it with --max-lora-rank)";
  }
}

LoraBenchAdapters make_benchmark_lora_adapters(Engine& engine, const LoraBenchConfig& config,
                                               const std::string& dir, uint64_t seed) {
  config.validate(engine.config().max_loras, engine.config().max_lora_rank);
  PAGELLM_CHECK(config.enabled()) << "make_benchmark_lora_adapters needs a rank of at least 1";
  LoraConfig lora;
  lora.rank = config.rank;
  lora.alpha = 2.0 * config.rank;
  for (int m = 0; m < kNumLoraModules; ++m) lora.target_modules.push_back(static_cast<LoraModule>(m));
  const Qwen3Config& model = engine.model().config();
  std::filesystem::create_directories(dir);
  LoraBenchAdapters out;
  for (int32_t i = 0; i < config.adapters; ++i) {
    const std::string name = "bench-lora-" + std::to_string(i);
    const std::string path = (std::filesystem::path(dir) / name).string();
    make_lora_adapter(path, model, lora, seed + 1 + static_cast<uint64_t>(i), DType::BF16);
    engine.backend().synchronize();
    const auto t0 = Clock::now();
    engine.load_lora_adapter(LoraRequest{name, i + 1, path});
    engine.backend().synchronize();
    out.load_seconds.push_back(seconds_between(t0, Clock::now()));
    out.load_phases.push_back(engine.model().last_lora_load());
    out.names.push_back(name);
  }
  return out;
}

DecodeWorkload sleep_wake_workload() {
  DecodeWorkload w;
  w.name = "sleep-wake";
  w.preset = "qwen3-4b";
  w.batch = 8;
  w.prompt_len = 128;
  w.output_len = 16;
  w.seed = 0;
  return w;
}

namespace {

// The workload's requests, seeded sampling at temperature 1; their output tokens.
std::vector<std::vector<int32_t>> sample_tokens(Engine& engine, const DecodeWorkload& w) {
  std::mt19937 rng(static_cast<uint32_t>(w.seed));
  std::uniform_int_distribution<int32_t> token(
      0, static_cast<int32_t>(engine.model().config().vocab_size) - 1);
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(w.batch));
  std::vector<SamplingParams> params(prompts.size());
  for (size_t b = 0; b < prompts.size(); ++b) {
    prompts[b].resize(static_cast<size_t>(w.prompt_len));
    for (int32_t& t : prompts[b]) t = token(rng);
    params[b].temperature = 1.0f;
    params[b].seed = w.seed * 1000 + b;
    params[b].max_tokens = w.output_len;
    params[b].ignore_eos = true;
  }
  std::vector<std::vector<int32_t>> tokens;
  for (const Sequence* s : engine.generate(prompts, params)) {
    PAGELLM_CHECK(s->finish_reason == FinishReason::kLength)
        << "sleep-wake request " << s->id << " ended with "
        << finish_reason_name(s->finish_reason) << (s->error.empty() ? "" : ": ") << s->error;
    tokens.push_back(s->output);
    engine.release(s->id);
  }
  return tokens;
}

}  // namespace

SleepWakeReport run_sleep_wake_benchmark(Engine& engine, const DecodeWorkload& workload) {
  workload.validate();
  PAGELLM_CHECK(!engine.has_unfinished())
      << "run_sleep_wake_benchmark needs an idle engine; this one has unfinished requests";
  Backend& backend = engine.backend();
  const Qwen3Config& mc = engine.model().config();
  SleepWakeReport r;
  r.workload = workload;
  r.model = workload.model_name();
  r.backend = backend.name();
  r.weight_bytes = engine.model().weight_bytes();
  r.prepared_bytes = engine.model().prepared_bytes();
  const int64_t pool_elements =
      engine.num_pages() * mc.num_key_value_heads * engine.config().page_size * mc.head_dim;
  const size_t pool_bytes = static_cast<size_t>(pool_elements) * dtype_size(backend.kv_dtype());
  const size_t num_pools = 2 * static_cast<size_t>(mc.num_hidden_layers);
  r.kv_pool_bytes = pool_bytes * num_pools;

  const std::vector<std::vector<int32_t>> reference = sample_tokens(engine, workload);
  for (const auto& t : reference) r.tokens_checked += static_cast<int64_t>(t.size());

  // KV cache only; while asleep, the ordinary free/allocate alternative on the same sizes.
  r.kv_only.sleep = engine.sleep();
  {
    std::vector<DeviceBuffer> pools;
    const auto t0 = Clock::now();
    for (size_t i = 0; i < num_pools; ++i) {
      pools.emplace_back(&backend, pool_bytes);
      Tensor t = pools.back().tensor(backend.kv_dtype(), {pool_elements});
      backend.fill(t, 0.0f);  // page 0 must read as zeros, as after a wake
    }
    backend.synchronize();
    const auto t1 = Clock::now();
    pools.clear();
    backend.synchronize();
    r.reallocate_seconds = seconds_between(t0, t1);
    r.free_seconds = seconds_between(t1, Clock::now());
  }
  r.kv_only.wake = engine.wake_up();
  r.kv_only.tokens_match = sample_tokens(engine, workload) == reference;

  for (SleepWakeCycle* cycle : {&r.offload, &r.offload_again}) {
    cycle->sleep = engine.sleep(SleepOptions{/*offload_weights=*/true});
    cycle->wake = engine.wake_up();
    cycle->tokens_match = sample_tokens(engine, workload) == reference;
  }

  backend.synchronize();
  const auto c0 = Clock::now();
  r.graphs = engine.recapture_graphs();
  backend.synchronize();
  r.recapture_seconds = seconds_between(c0, Clock::now());
  // Like the runs after each wake (sleep resets the prefix cache): every prompt prefilled
  // in full, so the comparison sees the same batches as the reference run. With the pages
  // the last run cached, the prompts would hit and the rest be computed in other batches,
  // which changes the last bits of bf16 logits (not the graphs' doing).
  engine.reset_prefix_cache();
  r.recapture_tokens_match = sample_tokens(engine, workload) == reference;
  return r;
}

std::string sleep_wake_json_line(const SleepWakeReport& r) {
  const auto cycle = [](const SleepWakeCycle& c) {
    return nlohmann::json{{"sleep_s", c.sleep.seconds},
                          {"wake_s", c.wake.seconds},
                          {"kv_bytes_released", c.sleep.kv_bytes_released},
                          {"weight_bytes_offloaded", c.sleep.weight_bytes_offloaded},
                          {"prepared_bytes_released", c.sleep.prepared_bytes_released},
                          {"free_bytes_before", c.sleep.free_memory_before},
                          {"free_bytes_asleep", c.sleep.free_memory_after},
                          {"free_bytes_after_wake", c.wake.free_memory_after},
                          {"tokens_match", c.tokens_match}};
  };
  const nlohmann::json j = {
      {"workload", "sleep-wake"},
      {"model", r.model},
      {"backend", r.backend},
      {"weight_bytes", r.weight_bytes},
      {"prepared_bytes", r.prepared_bytes},
      {"kv_pool_bytes", r.kv_pool_bytes},
      {"kv_only", cycle(r.kv_only)},
      {"offload", cycle(r.offload)},
      {"offload_again", cycle(r.offload_again)},
      {"free_s", r.free_seconds},
      {"reallocate_s", r.reallocate_seconds},
      {"recapture_s", r.recapture_seconds},
      {"graphs", r.graphs},
      {"recapture_tokens_match", r.recapture_tokens_match},
      {"tokens_checked", r.tokens_checked},
  };
  return j.dump();
}

std::string benchmark_json_line(const BenchmarkReport& r) {
  const auto or_null = [](const std::optional<double>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  nlohmann::json j = {
      {"model", r.model},
      {"backend", r.backend},
      {"batch", r.workload.batch},
      {"prompt_len", r.workload.prompt_len},
      {"output_len", r.workload.output_len},
      {"batched_tokens", r.batched_tokens},
      {"prefill_tok_s", r.prefill_tok_s()},
      {"decode_tok_s", r.decode_tok_s()},
      {"e2e_tok_s", r.e2e_tok_s()},
      {"median_step_ms", r.median_step_seconds * 1e3},
      {"pipelined_steps", r.pipelined_steps},
      {"host_gap_us", r.host_gap_seconds * 1e6},
      {"bandwidth_gbs",
       r.bandwidth_bytes_per_s ? nlohmann::json(*r.bandwidth_bytes_per_s / 1e9) : nullptr},
      {"fraction_of_limit", or_null(r.fraction_of_limit())},
      {"limit_tok_s", or_null(r.limit_tok_s())},
      {"prefix_hit_rate", r.prefix_cache.hit_rate()},
      {"lora_rank", r.lora_rank},
      {"lora_adapters", r.lora_adapters},
      {"lora_load_ms", nullptr},
      {"base_decode_tok_s", or_null(r.base_decode_tok_s)},
      {"lora_fraction_of_base", or_null(r.lora_fraction_of_base())},
  };
  if (const auto ms = r.lora_load_ms()) {
    j["lora_load_ms"] = {{"min", ms->min_ms}, {"median", ms->median_ms}, {"max", ms->max_ms}};
  }
  return j.dump();
}

EngineConfig weight_update_engine_config(EngineConfig base) {
  if (base.kv_cache_bytes == 0 && base.num_pages == 0) base.kv_cache_bytes = size_t{1} << 30;
  return base;
}

namespace {

// A pinned host or device buffer of the backend, freed on scope exit.
struct SourceBuffer {
  Backend& backend;
  bool pinned;
  void* ptr = nullptr;
  SourceBuffer(Backend& b, bool is_pinned, size_t bytes) : backend(b), pinned(is_pinned) {
    ptr = pinned ? backend.allocate_host_pinned(bytes) : backend.allocate(bytes);
  }
  ~SourceBuffer() {
    if (pinned) {
      backend.free_host_pinned(ptr);
    } else {
      backend.deallocate(ptr);
    }
  }
  SourceBuffer(const SourceBuffer&) = delete;
  SourceBuffer& operator=(const SourceBuffer&) = delete;
};

TensorDType tensor_dtype_of(DType t) {
  switch (t) {
    case DType::F32: return TensorDType::kFloat32;
    case DType::BF16: return TensorDType::kBFloat16;
    case DType::F16: return TensorDType::kFloat16;
    default: PAGELLM_FAIL() << "weights of dtype " << dtype_name(t) << " cannot be updated";
  }
}

// A full random checkpoint (every tensor of the config, the backend's weight dtype) laid
// out back to back, as a trainer's flat parameter buffer is: in pinned host memory, and
// also in device memory when asked.
struct StagedWeights {
  DType dtype;
  std::vector<ExpectedWeight> expected;
  std::vector<size_t> offsets;  // bytes into the buffers, per tensor
  uint64_t bytes = 0;
  std::unique_ptr<SourceBuffer> host, device;

  StagedWeights(Backend& backend, const Qwen3Config& config, uint64_t seed, bool on_device)
      : dtype(backend.weight_dtype()), expected(expected_qwen3_weights(config)) {
    for (const ExpectedWeight& w : expected) {
      offsets.push_back(bytes);
      bytes += static_cast<uint64_t>(numel(w.shape)) * dtype_size(dtype);
    }
    host = std::make_unique<SourceBuffer>(backend, /*pinned=*/true, bytes);
    const WeightLookup lookup = random_weight_lookup(config, seed, dtype);
    for (size_t i = 0; i < expected.size(); ++i) {
      const WeightView v = lookup(expected[i].name);
      std::memcpy(static_cast<char*>(host->ptr) + offsets[i], v.data,
                  static_cast<size_t>(numel(v.shape)) * dtype_size(dtype));
    }
    if (on_device) {
      device = std::make_unique<SourceBuffer>(backend, /*pinned=*/false, bytes);
      backend.copy_to_device(device->ptr, host->ptr, bytes);
    }
  }

  std::vector<NamedTensor> tensors(TensorMemory memory) const {
    const SourceBuffer& buffer = memory == TensorMemory::kDevice ? *device : *host;
    std::vector<NamedTensor> out;
    for (size_t i = 0; i < expected.size(); ++i) {
      out.push_back({expected[i].name, static_cast<const char*>(buffer.ptr) + offsets[i],
                     tensor_dtype_of(dtype), expected[i].shape, memory});
    }
    return out;
  }

  static int64_t numel(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

}  // namespace

WeightUpdateBenchReport run_weight_update_benchmark(Engine& engine, const DecodeWorkload& workload,
                                                    int32_t repeats) {
  PAGELLM_CHECK(repeats >= 1) << "weight-update repeats must be at least 1, got " << repeats;
  PAGELLM_CHECK(!engine.has_unfinished())
      << "the weight-update benchmark needs an idle engine; this one has unfinished requests";
  Backend& backend = engine.backend();
  WeightUpdateBenchReport r;
  r.model = workload.model_name();
  r.backend = backend.name();
  r.host_to_device_bytes_per_s = backend.measure_host_to_device_bandwidth();
  r.device_copy_bytes_per_s = backend.measure_copy_bandwidth();

  const StagedWeights staged(backend, engine.model().config(), workload.seed + 1,
                             /*on_device=*/true);
  r.bytes = staged.bytes;
  r.tensors = static_cast<int64_t>(staged.expected.size());
  const auto time_updates = [&](const std::vector<NamedTensor>& tensors, const char* source,
                                double limit_bytes_per_s) {
    WeightUpdateTiming t;
    t.source = source;
    for (int32_t i = 0; i < repeats; ++i) {
      t.seconds.push_back(engine.update_weights(tensors, PauseMode::kWait).seconds);
    }
    std::vector<double> sorted = t.seconds;
    std::sort(sorted.begin(), sorted.end());
    t.median_seconds = sorted[sorted.size() / 2];
    t.bytes_per_s = static_cast<double>(r.bytes) / t.median_seconds;
    if (limit_bytes_per_s > 0) t.fraction_of_limit = t.bytes_per_s / limit_bytes_per_s;
    return t;
  };
  r.pinned = time_updates(staged.tensors(TensorMemory::kHostPinned), "pinned host",
                          r.host_to_device_bytes_per_s);
  r.device = time_updates(staged.tensors(TensorMemory::kDevice), "device",
                          r.device_copy_bytes_per_s / 2.0);

  // The engine still serves (the graphs captured before the updates replay on new weights).
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 4;
  greedy.ignore_eos = true;
  const Sequence* s = engine.generate({{1, 2, 3, 4}}, {greedy})[0];
  PAGELLM_CHECK(s->finish_reason == FinishReason::kLength && s->output.size() == 4)
      << "after the weight updates a request ended with " << finish_reason_name(s->finish_reason)
      << ": " << s->error;
  engine.release(s->id);
  return r;
}

std::string weight_update_json_line(const WeightUpdateBenchReport& r) {
  const auto source = [](const WeightUpdateTiming& t) {
    return nlohmann::json{
        {"median_s", t.median_seconds},
        {"gbs", t.bytes_per_s / 1e9},
        {"fraction_of_limit",
         t.fraction_of_limit ? nlohmann::json(*t.fraction_of_limit) : nlohmann::json(nullptr)}};
  };
  const nlohmann::json j = {
      {"workload", "weight-update"},
      {"model", r.model},
      {"backend", r.backend},
      {"tensors", r.tensors},
      {"bytes", r.bytes},
      {"h2d_gbs", r.host_to_device_bytes_per_s / 1e9},
      {"copy_gbs", r.device_copy_bytes_per_s / 1e9},
      {"pinned", source(r.pinned)},
      {"device", source(r.device)},
  };
  return j.dump();
}

void GrpoWorkload::validate() const {
  model_workload().validate();
  PAGELLM_CHECK(prompts >= 1) << "grpo prompts must be at least 1, got " << prompts;
  PAGELLM_CHECK(n >= 1) << "grpo n must be at least 1, got " << n;
  PAGELLM_CHECK(min_prompt_len >= 1 && max_prompt_len >= min_prompt_len)
      << "grpo prompt lengths must satisfy 1 <= min <= max, got [" << min_prompt_len << ", "
      << max_prompt_len << "]";
  PAGELLM_CHECK(max_output_len >= 1 && median_output_len > 0 && output_len_sigma >= 0)
      << "grpo output lengths need max >= 1, median > 0 and sigma >= 0, got max "
      << max_output_len << ", median " << median_output_len << ", sigma " << output_len_sigma;
  PAGELLM_CHECK(rounds >= 1) << "grpo rounds must be at least 1, got " << rounds;
  PAGELLM_CHECK(temperature >= 0.0f) << "grpo temperature must be >= 0, got " << temperature;
}

DecodeWorkload GrpoWorkload::model_workload() const {
  DecodeWorkload w;
  w.name = "grpo";
  w.model_dir = model_dir;
  w.preset = preset;
  w.batch = prompts * n;
  w.prompt_len = max_prompt_len;
  w.output_len = std::max(max_output_len, 2);
  w.seed = seed;
  return w;
}

EngineConfig grpo_engine_config(const GrpoWorkload& workload, EngineConfig config) {
  if (config.max_model_len <= 0) config.max_model_len = workload.max_prompt_len + workload.max_output_len;
  config.max_num_seqs = std::max(config.max_num_seqs, workload.prompts * workload.n);
  if (config.max_num_batched_tokens > 0) {  // 0: the backend's choice (raised by the engine)
    config.max_num_batched_tokens = std::max(config.max_num_batched_tokens, config.max_num_seqs);
  }
  return config;
}

std::vector<int64_t> add_prompt_samples(Engine& engine, const std::vector<int32_t>& prompt,
                                        const SamplingParams& params,
                                        const std::vector<int32_t>& max_tokens) {
  SamplingParams group = params;
  group.n = static_cast<int>(max_tokens.size());
  return engine.add_request_group(prompt, group, max_tokens);  // one prefill, n samples
}

double GrpoReport::rollout_tok_s() const {
  return rollout_seconds > 0 ? static_cast<double>(generated_tokens) / rollout_seconds : 0.0;
}

std::optional<double> GrpoReport::fraction_of_limit() const {
  if (!bandwidth_bytes_per_s || *bandwidth_bytes_per_s <= 0 || rollout_seconds <= 0)
    return std::nullopt;
  return limit_seconds / rollout_seconds;
}

GrpoReport run_grpo_benchmark(Engine& engine, const GrpoWorkload& workload,
                              bool measure_bandwidth, int32_t trace_steps,
                              int32_t trace_after) {
  workload.validate();
  PAGELLM_CHECK(trace_steps >= 0) << "trace steps must be non-negative, got " << trace_steps;
  PAGELLM_CHECK(trace_after >= 1)
      << "the trace begins after at least one decode-only step (the one that shows the "
         "round's prefill is over), got trace_after " << trace_after;
  PAGELLM_CHECK(!engine.has_unfinished())
      << "the grpo benchmark needs an idle engine; this one has unfinished requests";
  const SchedulerConfig& sc = engine.scheduler_config();
  PAGELLM_CHECK(sc.max_model_len >= workload.max_prompt_len + 1)
      << "the engine's max_model_len is " << sc.max_model_len << " but grpo prompts reach "
      << workload.max_prompt_len << " tokens";
  Backend& backend = engine.backend();
  const Qwen3Config& mc = engine.model().config();
  GrpoReport r;
  r.workload = workload;
  r.model = workload.model_workload().model_name();
  r.backend = backend.name();
  r.batched_tokens = engine.config().max_num_batched_tokens;
  r.samples = static_cast<int64_t>(workload.prompts) * workload.n;
  r.usable_kv_pages = engine.allocator().num_usable();
  if (measure_bandwidth) {
    r.bandwidth_bytes_per_s = backend.measure_copy_bandwidth();
    // The model's widest product (gate|up) at 8,192 rows: the products' ceiling.
    const Backend::MatmulRate rate =
        backend.measure_matmul_rate(8192, 2 * mc.intermediate_size, mc.hidden_size);
    if (rate.flops_per_s > 0) {
      r.matmul_flops_per_s = rate.flops_per_s;
      r.matmul_rate_rows = rate.rows;
    }
  }
  // FLOPs a step does at least: per new token every layer's products (2 per weight) and
  // its attention (4 x heads x head_dim per key it attends), per logits row the lm_head.
  const double layer_weights = static_cast<double>(
      mc.hidden_size * mc.qkv_size() + mc.q_size() * mc.hidden_size +
      mc.hidden_size * 2 * mc.intermediate_size + mc.intermediate_size * mc.hidden_size);
  const double token_flops = 2.0 * layer_weights * static_cast<double>(mc.num_hidden_layers);
  const double key_flops = 4.0 * static_cast<double>(mc.q_size() * mc.num_hidden_layers);
  const double logits_flops = 2.0 * static_cast<double>(mc.vocab_size * mc.hidden_size);

  // Bytes every step reads at least: each weight once (an untied embedding table is only
  // gathered), plus per running sequence the K/V of its context.
  const size_t embed_bytes =
      static_cast<size_t>(mc.vocab_size * mc.hidden_size) * dtype_size(backend.weight_dtype());
  const double weight_read_bytes = static_cast<double>(
      mc.tie_word_embeddings ? engine.model().weight_bytes()
                             : engine.model().weight_bytes() - embed_bytes);
  const double kv_per_token = 2.0 * mc.num_hidden_layers * mc.num_key_value_heads * mc.head_dim *
                              dtype_size(backend.kv_dtype());

  // Warm-up outside the timed region (autotuning, plans).
  {
    SamplingParams warm;
    warm.temperature = workload.temperature;
    warm.max_tokens = 2;
    warm.ignore_eos = true;
    warm.seed = workload.seed;
    std::vector<std::vector<int32_t>> prompts(8, std::vector<int32_t>(4, 1));
    for (const Sequence* s : engine.generate(prompts, {warm})) engine.release(s->id);
  }

  std::mt19937_64 rng(workload.seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(mc.vocab_size) - 1);
  std::uniform_int_distribution<int32_t> prompt_len(workload.min_prompt_len,
                                                    workload.max_prompt_len);
  std::lognormal_distribution<double> output_len(std::log(workload.median_output_len),
                                                 workload.output_len_sigma);
  std::unique_ptr<StagedWeights> next_weights;
  if (workload.rounds > 1) {
    next_weights = std::make_unique<StagedWeights>(backend, mc, workload.seed + 1,
                                                   /*on_device=*/false);
  }
  const int64_t used_before = engine.allocator().num_usable() - engine.allocator().num_free();
  // The step observer's page counts (each physical page's most tokens in the step's
  // contexts), zero between steps; `touched` lists the pages set in the current step.
  const int64_t page_size = engine.config().page_size;
  std::vector<int32_t> page_tokens(static_cast<size_t>(engine.num_pages()), 0);
  std::vector<int32_t> touched;
  const int64_t preemptions_before = engine.stats().preemptions;
  const int64_t steps_before = engine.stats().steps;
  const int64_t pipelined_before = engine.stats().pipelined_steps;

  // Step kinds (GrpoReport::step_classes): 0 prefill, then decode-only by rows up to each bound.
  const int64_t row_bounds[] = {8, 32, 64, 128, 256, std::numeric_limits<int64_t>::max()};
  std::vector<GrpoStepClass> classes(1 + std::size(row_bounds));
  classes[0].name = "prefill + decode";
  for (size_t c = 0; c < std::size(row_bounds); ++c) {
    const int64_t lo = c == 0 ? 1 : row_bounds[c - 1] + 1;
    const bool last = c + 1 == std::size(row_bounds);
    classes[c + 1].name = "decode " + std::to_string(lo) +
                          (last ? std::string("+") : "-" + std::to_string(row_bounds[c])) +
                          " rows";
  }
  const PrefixCacheStats prefix_before = engine.prefix_cache_stats();
  // The trace (trace_steps > 0): the last round's decode-only steps once trace_after of them
  // have run (1: its first after its prefill).
  BenchmarkTrace trace;
  bool tracing = false;
  int64_t decode_only_run = 0;  // the last round's decode-only forward steps so far
  for (int32_t round = 0; round < workload.rounds; ++round) {
    if (round > 0) {
      r.weight_update_seconds.push_back(
          engine.update_weights(next_weights->tensors(TensorMemory::kHostPinned)).seconds);
    }
    SamplingParams params;
    params.temperature = workload.temperature;
    params.ignore_eos = true;
    std::vector<int64_t> ids;
    std::vector<int32_t> wanted;
    for (int32_t p = 0; p < workload.prompts; ++p) {
      std::vector<int32_t> prompt(static_cast<size_t>(prompt_len(rng)));
      for (int32_t& t : prompt) t = token(rng);
      const int32_t room = sc.max_model_len - static_cast<int32_t>(prompt.size());
      std::vector<int32_t> lengths;
      for (int32_t j = 0; j < workload.n; ++j) {
        const double drawn = std::round(output_len(rng));
        lengths.push_back(static_cast<int32_t>(std::clamp<double>(
            drawn, 1.0, std::min(workload.max_output_len, room))));
      }
      params.seed = workload.seed * 1000003 + static_cast<uint64_t>(round) * 100003 +
                    static_cast<uint64_t>(p) * workload.n;
      for (int64_t id : add_prompt_samples(engine, prompt, params, lengths)) ids.push_back(id);
      wanted.insert(wanted.end(), lengths.begin(), lengths.end());
      r.prompt_tokens += static_cast<int64_t>(prompt.size()) * workload.n;
    }
    // Per forward step (Engine::set_step_observer; one engine step may run several with
    // pipelined decode): whether it prefilled, its decode rows, and the K/V it read, the
    // context after the step of every sequence it advanced: each physical page once
    // (`kv_tokens`: the most tokens any of those contexts hold in it) and per sequence
    // (`per_sample_kv_tokens`).
    struct StepRecord {
      bool prefill = false;
      int64_t rows = 0;
      double kv_tokens = 0;
      double per_sample_kv_tokens = 0;
      double flops = 0;  // token_flops, key_flops and logits_flops as the step needs them
    };
    std::vector<StepRecord> records;
    const StepObserverScope observer(engine, [&](const SchedulerOutput& out) {
      StepRecord rec;
      for (const ScheduledSeq& s : out.scheduled) {
        const Sequence& seq = *s.seq;
        if (seq.finished()) continue;  // a row kept one step more: nothing it needs
        if (seq.num_computed + s.num_new_tokens > static_cast<int32_t>(seq.prompt.size())) {
          rec.rows += s.num_new_tokens;
        } else {
          rec.prefill = true;
        }
        const int64_t context = seq.num_computed + s.num_new_tokens;
        rec.per_sample_kv_tokens += static_cast<double>(context);
        // New token i (1-based) attends num_computed + i keys; a chunk that reaches past
        // the prompt gives one logits row.
        const double n_new = static_cast<double>(s.num_new_tokens);
        rec.flops += n_new * token_flops +
                     key_flops * (n_new * static_cast<double>(seq.num_computed) +
                                  n_new * (n_new + 1.0) / 2.0);
        if (context > static_cast<int64_t>(seq.prompt.size())) rec.flops += logits_flops;
        const int64_t pages =
            std::min<int64_t>((context + page_size - 1) / page_size,
                              static_cast<int64_t>(seq.pages.size()));
        for (int64_t i = 0; i < pages; ++i) {
          const int32_t page = seq.pages[static_cast<size_t>(i)];
          const auto held =
              static_cast<int32_t>(std::min<int64_t>(page_size, context - i * page_size));
          int32_t& most = page_tokens.at(static_cast<size_t>(page));
          if (most == 0) touched.push_back(page);
          most = std::max(most, held);
        }
      }
      for (int32_t page : touched) {
        rec.kv_tokens += page_tokens[static_cast<size_t>(page)];
        page_tokens[static_cast<size_t>(page)] = 0;
      }
      touched.clear();
      records.push_back(rec);
    });
    backend.synchronize();
    const HostGap host_before = engine.stats().host_gap;
    // Armed in the last round; begins once trace_after of its decode-only steps have run.
    bool trace_armed = trace_steps > 0 && round == workload.rounds - 1;
    const auto t0 = Clock::now();
    while (engine.has_unfinished()) {
      if (trace_armed && !records.empty() &&
          std::none_of(records.begin(), records.end(),
                       [](const StepRecord& rec) { return rec.prefill || rec.rows == 0; })) {
        decode_only_run += static_cast<int64_t>(records.size());
        if (decode_only_run >= trace_after) {
          trace_armed = false;
          r.trace_after_steps = decode_only_run;
          r.trace_unavailable = backend.begin_kernel_trace();
          tracing = r.trace_unavailable.empty();
        }
      }
      records.clear();
      const auto step_start = Clock::now();
      engine.step();
      const double call_seconds = seconds_between(step_start, Clock::now());
      const int64_t used = engine.allocator().num_usable() - engine.allocator().num_free();
      r.peak_kv_pages = std::max(r.peak_kv_pages, used - used_before);
      // A pipelined run's forward steps share its time evenly.
      for (const StepRecord& rec : records) {
        double step_limit = 0, per_sample_limit = 0;
        const double step_kv_bytes = rec.kv_tokens * kv_per_token;
        if (r.bandwidth_bytes_per_s) {
          step_limit = (weight_read_bytes + step_kv_bytes) / *r.bandwidth_bytes_per_s;
          per_sample_limit = (weight_read_bytes + rec.per_sample_kv_tokens * kv_per_token) /
                             *r.bandwidth_bytes_per_s;
          r.limit_seconds += step_limit;
          r.per_sample_limit_seconds += per_sample_limit;
        }
        // The roofline: the longer of the step's bytes and its FLOPs.
        const double step_roofline =
            r.matmul_flops_per_s ? std::max(step_limit, rec.flops / *r.matmul_flops_per_s) : 0.0;
        r.roofline_seconds += step_roofline;
        r.flops += rec.flops;
        size_t c = 0;
        if (!rec.prefill) {
          while (rec.rows > row_bounds[c]) ++c;
          ++c;
        }
        classes[c].steps += 1;
        classes[c].seconds += call_seconds / static_cast<double>(records.size());
        classes[c].limit_seconds += step_limit;
        classes[c].per_sample_limit_seconds += per_sample_limit;
        classes[c].roofline_seconds += step_roofline;
        classes[c].decode_tokens += rec.rows;
        if (tracing) {
          ++trace.steps;
          r.trace_rows += rec.rows;
          r.trace_kv_bytes += step_kv_bytes;
          r.trace_weight_bytes += weight_read_bytes;
        }
      }
      if (tracing && trace.steps >= trace_steps) {
        trace.spans = backend.end_kernel_trace();
        tracing = false;
      }
    }
    if (tracing) {  // the round ended first
      trace.spans = backend.end_kernel_trace();
      tracing = false;
    }
    backend.synchronize();
    r.rollout_seconds += seconds_between(t0, Clock::now());
    r.host_gap += engine.stats().host_gap - host_before;
    for (size_t i = 0; i < ids.size(); ++i) {
      const Sequence& s = engine.request(ids[i]);
      PAGELLM_CHECK(s.finish_reason == FinishReason::kLength &&
                    static_cast<int32_t>(s.output.size()) == wanted[i])
          << "grpo sample " << ids[i] << " ended with " << finish_reason_name(s.finish_reason)
          << " after " << s.output.size() << " of " << wanted[i] << " tokens"
          << (s.error.empty() ? "" : ": ") << s.error;
      r.generated_tokens += static_cast<int64_t>(s.output.size());
      engine.release(ids[i]);
    }
  }
  for (GrpoStepClass& c : classes) {
    if (c.steps > 0) r.step_classes.push_back(std::move(c));
  }
  r.steps = engine.stats().steps - steps_before;
  r.pipelined_steps = engine.stats().pipelined_steps - pipelined_before;
  r.preemptions = engine.stats().preemptions - preemptions_before;
  const PrefixCacheStats prefix_after = engine.prefix_cache_stats();
  r.prefix_queried_tokens = prefix_after.queried_tokens - prefix_before.queried_tokens;
  r.prefix_hit_tokens = prefix_after.hit_tokens - prefix_before.hit_tokens;
  if (trace.steps > 0) {
    trace.timeline = summarize_kernel_timeline(trace.spans);
    r.trace = std::move(trace);
  }
  return r;
}

std::string grpo_json_line(const GrpoReport& r) {
  const nlohmann::json j = {
      {"workload", "grpo"},
      {"model", r.model},
      {"backend", r.backend},
      {"samples_per_round", r.samples},
      {"batched_tokens", r.batched_tokens},
      {"rounds", r.workload.rounds},
      {"generated_tokens", r.generated_tokens},
      {"rollout_s", r.rollout_seconds},
      {"rollout_tok_s", r.rollout_tok_s()},
      {"fraction_of_limit",
       r.fraction_of_limit() ? nlohmann::json(*r.fraction_of_limit()) : nlohmann::json(nullptr)},
      {"limit_s", r.limit_seconds},
      {"per_sample_limit_s", r.per_sample_limit_seconds},
      {"matmul_tflops", r.matmul_flops_per_s ? nlohmann::json(*r.matmul_flops_per_s / 1e12)
                                             : nlohmann::json(nullptr)},
      {"roofline_s", r.matmul_flops_per_s ? nlohmann::json(r.roofline_seconds)
                                          : nlohmann::json(nullptr)},
      {"tflop", r.flops / 1e12},
      {"peak_kv_pages", r.peak_kv_pages},
      {"preemptions", r.preemptions},
      {"weight_update_s", r.weight_update_seconds},
      {"prefix_hit_rate", r.prefix_hit_rate()},
      {"host_gap_s", r.host_gap.total()},
      {"host_schedule_s", r.host_gap.schedule},
      {"host_launch_s", r.host_gap.launch},
      {"host_finish_s", r.host_gap.finish},
      {"steps", r.steps},
      {"pipelined_steps", r.pipelined_steps},
  };
  nlohmann::json classes = nlohmann::json::array();
  for (const GrpoStepClass& c : r.step_classes) {
    classes.push_back({{"name", c.name},
                       {"steps", c.steps},
                       {"seconds", c.seconds},
                       {"limit_s", c.limit_seconds},
                       {"per_sample_limit_s", c.per_sample_limit_seconds},
                       {"roofline_s", c.roofline_seconds},
                       {"decode_tokens", c.decode_tokens}});
  }
  nlohmann::json out = j;
  out["step_classes"] = classes;
  return out.dump();
}

}  // namespace pagellm
