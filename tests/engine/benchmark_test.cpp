// The benchmark workloads as library calls (engine/benchmark.h), run on the CPU backend
// with the tiny preset: exact token and step counts, finite positive rates, the bandwidth
// figures and the JSON line that `pagellm bench --json-out` appends.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "pagellm/common/check.h"
#include "pagellm/cpu/cpu_backend.h"
#include "pagellm/engine/benchmark.h"
#include "pagellm/model/lora.h"
#include "pagellm/model/make_model.h"
#include "pagellm/model/random_weights.h"

namespace pagellm {
namespace {

DecodeWorkload tiny_workload() {
  DecodeWorkload w;
  w.preset = "tiny";
  w.batch = 3;
  w.prompt_len = 5;
  w.output_len = 6;
  w.seed = 7;
  return w;
}

// fraction_of_limit and limit_tok_s as defined from the report's counts: the step's bytes
// (weights + the window's mean KV) over the mean step time, against the measured bandwidth;
// the limit is the window's tokens at the time those bytes take at that bandwidth.
void expect_limit_figures_consistent(const BenchmarkReport& r) {
  ASSERT_TRUE(r.bandwidth_bytes_per_s.has_value());
  ASSERT_GT(*r.bandwidth_bytes_per_s, 0.0);
  ASSERT_GT(r.decode_steps, 0);
  const double step_bytes = r.weight_read_bytes + r.kv_read_bytes;
  const double mean_step = r.decode_seconds / static_cast<double>(r.decode_steps);
  EXPECT_NEAR(r.achieved_bytes_per_s, step_bytes / mean_step, 1e-9 * r.achieved_bytes_per_s);
  ASSERT_TRUE(r.fraction_of_limit().has_value());
  const double fraction = *r.fraction_of_limit();
  EXPECT_GT(fraction, 0.0);
  EXPECT_NEAR(fraction, r.achieved_bytes_per_s / *r.bandwidth_bytes_per_s, 1e-12 * fraction);
  ASSERT_TRUE(r.limit_tok_s().has_value());
  const double limit_seconds = step_bytes * r.decode_steps / *r.bandwidth_bytes_per_s;
  EXPECT_NEAR(*r.limit_tok_s(), r.decode_tokens / limit_seconds, 1e-9 * *r.limit_tok_s());
  EXPECT_NEAR(*r.limit_tok_s() * fraction, r.decode_tok_s(), 1e-9 * r.decode_tok_s());
}

EngineConfig cpu_config() {
  EngineConfig c;
  c.backend = "cpu";
  c.max_num_seqs = 1;  // benchmark_engine_config widens it to the batch
  return c;
}

TEST(BenchmarkTest, W1IsTheDocumentedWorkload) {
  const DecodeWorkload w = named_workload("w1");
  EXPECT_EQ(w.name, "w1");
  EXPECT_TRUE(w.model_dir.empty());
  EXPECT_EQ(w.preset, "qwen3-4b");
  EXPECT_EQ(w.batch, 32);
  EXPECT_EQ(w.prompt_len, 256);
  EXPECT_EQ(w.output_len, 512);
  EXPECT_EQ(w.seed, 0u);
  EXPECT_EQ(w.model_name(), "qwen3-4b (random weights)");
  EXPECT_EQ(named_workload("W1").batch, 32);  // names are case-insensitive
  EXPECT_NO_THROW(w.validate());
}

TEST(BenchmarkTest, UnknownWorkloadNamesTheKnownOnes) {
  try {
    named_workload("grpo-later");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown workload 'grpo-later' (known: w1"),
              std::string::npos)
        << e.what();
  }
}

TEST(BenchmarkTest, ValidateNamesTheBadField) {
  const auto message = [](DecodeWorkload w) {
    try {
      w.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  DecodeWorkload w = tiny_workload();
  w.batch = 0;
  EXPECT_NE(message(w).find("batch must be at least 1, got 0"), std::string::npos) << message(w);
  w = tiny_workload();
  w.prompt_len = -1;
  EXPECT_NE(message(w).find("prompt length must be at least 1, got -1"), std::string::npos);
  w = tiny_workload();
  w.output_len = 1;
  EXPECT_NE(message(w).find("output length must be at least 2"), std::string::npos);
  w = tiny_workload();
  w.preset = "qwen9";
  EXPECT_NE(message(w).find("unknown preset 'qwen9' (known: "), std::string::npos);
  w.model_dir = "/some/folder";  // a model folder makes the preset irrelevant
  EXPECT_EQ(message(w), "no error");
}

TEST(BenchmarkTest, EngineConfigHoldsTheWorkloadAsOneBatch) {
  DecodeWorkload w = tiny_workload();
  w.batch = 300;
  EngineConfig base;
  base.max_num_seqs = 8;
  base.max_num_batched_tokens = 16;
  const EngineConfig c = benchmark_engine_config(w, base);
  EXPECT_EQ(c.max_num_seqs, 300);
  EXPECT_EQ(c.max_num_batched_tokens, 300);
  EXPECT_EQ(c.max_model_len, 11);
  base.max_model_len = 64;  // an explicit length is kept
  EXPECT_EQ(benchmark_engine_config(w, base).max_model_len, 64);
}

// --trace-prefill records the prefill phase; on the cpu backend there is no trace and the
// run goes on (the reason kept); asking for both traces is refused before any work.
TEST(BenchmarkTest, PrefillTraceIsExclusiveWithDecodeTraceAndOptional) {
  const DecodeWorkload w = tiny_workload();
  std::unique_ptr<Engine> engine = make_benchmark_engine(w, cpu_config());
  BenchmarkOptions options;
  options.trace_prefill = true;
  const BenchmarkReport r = run_benchmark(*engine, w, options);
  EXPECT_FALSE(r.trace.has_value());
  EXPECT_NE(r.trace_unavailable.find("cpu backend has no kernel trace"), std::string::npos)
      << r.trace_unavailable;
  EXPECT_EQ(r.generated_tokens, 18);
  options.trace_steps = 2;
  try {
    run_benchmark(*engine, w, options);
    ADD_FAILURE() << "both traces accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("trace either the prefill phase or decode steps"),
              std::string::npos) << e.what();
  }
  EXPECT_FALSE(engine->has_unfinished());
}

// max_num_batched_tokens 0 (the default) is the backend's preferred chunk, raised to
// max_num_seqs; an explicit value is kept, a negative one refused by name.
TEST(BenchmarkTest, ZeroBatchedTokensIsTheBackendsChunk) {
  DecodeWorkload w = tiny_workload();
  EngineConfig c = cpu_config();
  ASSERT_EQ(c.max_num_batched_tokens, 0) << "the documented default";
  EXPECT_EQ(benchmark_engine_config(w, c).max_num_batched_tokens, 0) << "left to the engine";
  std::unique_ptr<Engine> engine = make_benchmark_engine(w, c);
  const int32_t preferred = engine->backend().preferred_batched_tokens(false);
  EXPECT_EQ(preferred, 2048);
  EXPECT_EQ(engine->backend().preferred_batched_tokens(true), 2048) << "cpu: one chunk";
  EXPECT_EQ(engine->scheduler_config().max_num_batched_tokens, preferred);
  EXPECT_EQ(engine->config().max_num_batched_tokens, preferred);
  w.batch = 3000;  // more sequences than the backend's chunk: the budget follows them
  c.max_num_seqs = 3000;
  EXPECT_EQ(make_benchmark_engine(w, c)->scheduler_config().max_num_batched_tokens, 3000);
  c.max_num_seqs = 1;
  w.batch = 3;
  c.max_num_batched_tokens = 7;
  EXPECT_EQ(make_benchmark_engine(w, c)->scheduler_config().max_num_batched_tokens, 7);
  c.max_num_batched_tokens = -1;
  try {
    make_benchmark_engine(w, c);
    ADD_FAILURE() << "max_num_batched_tokens -1 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_num_batched_tokens must be >= 0"), std::string::npos)
        << e.what();
  }
}

TEST(BenchmarkTest, TinyRunOnCpuHasExactCountsAndConsistentRates) {
  const DecodeWorkload w = tiny_workload();
  std::unique_ptr<Engine> engine = make_benchmark_engine(w, cpu_config());
  BenchmarkOptions options;
  options.trace_steps = 2;  // the CPU backend has no trace: the run goes on without
  const BenchmarkReport r = run_benchmark(*engine, w, options);

  EXPECT_EQ(r.model, "tiny (random weights)");
  EXPECT_EQ(r.backend, "cpu");
  EXPECT_EQ(r.page_size, 16);
  EXPECT_EQ(r.prompt_tokens, 15);
  EXPECT_EQ(r.generated_tokens, 18);
  EXPECT_EQ(r.decode_tokens, 15);
  // One prefill step gives every request its first token; then one step per token.
  EXPECT_EQ(r.decode_steps, 5);
  EXPECT_EQ(r.graph_steps, 0);
  EXPECT_FALSE(r.trace.has_value());
  EXPECT_NE(r.trace_unavailable.find("cpu backend has no kernel trace"), std::string::npos)
      << r.trace_unavailable;

  for (double v : {r.prefill_seconds, r.decode_seconds, r.median_step_seconds, r.prefill_tok_s(),
                   r.decode_tok_s(), r.e2e_tok_s(), r.achieved_bytes_per_s}) {
    EXPECT_TRUE(std::isfinite(v) && v > 0) << v;
  }
  EXPECT_NEAR(r.decode_tok_s(), 15 / r.decode_seconds, 1e-9 * r.decode_tok_s());
  EXPECT_NEAR(r.e2e_tok_s(), 18 / (r.prefill_seconds + r.decode_seconds), 1e-9 * r.e2e_tok_s());
  EXPECT_GE(r.host_gap_seconds, 0.0);
  EXPECT_TRUE(std::isfinite(r.host_gap_fraction()));

  // Bytes a step must read: the tiny model's weights (untied: the embedding table is only
  // gathered) and the K/V of the average context, 5 + 6 / 2 = 8 tokens.
  const Qwen3Config& mc = engine->model().config();
  const double weight_size = static_cast<double>(dtype_size(engine->backend().weight_dtype()));
  const double kv_size = static_cast<double>(dtype_size(engine->backend().kv_dtype()));
  EXPECT_EQ(r.weight_bytes, engine->model().weight_bytes());
  ASSERT_FALSE(mc.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(r.weight_read_bytes,
                   static_cast<double>(r.weight_bytes) - mc.vocab_size * mc.hidden_size * weight_size);
  EXPECT_DOUBLE_EQ(r.kv_read_bytes,
                   2.0 * mc.num_hidden_layers * mc.num_key_value_heads * mc.head_dim * kv_size * 8 * 3);
  ASSERT_TRUE(r.bandwidth_bytes_per_s.has_value());
  EXPECT_GT(*r.bandwidth_bytes_per_s, 0);
  // The limit figures follow from the counted bytes and the measured bandwidth. (Whether
  // they stay under 1 is the GPU's physics; a tiny model decoding out of the CPU's caches can
  // beat a memcpy measured while other processes load the machine.)
  expect_limit_figures_consistent(r);

  // The engine is idle again and holds no page.
  EXPECT_FALSE(engine->has_unfinished());
  engine->check_invariants();
  EXPECT_EQ(engine->allocator().num_free(), engine->allocator().num_usable());

  const nlohmann::json j = nlohmann::json::parse(benchmark_json_line(r));
  EXPECT_EQ(j.at("model"), "tiny (random weights)");
  EXPECT_EQ(j.at("backend"), "cpu");
  EXPECT_EQ(j.at("batch"), 3);
  EXPECT_EQ(j.at("prompt_len"), 5);
  EXPECT_EQ(j.at("output_len"), 6);
  EXPECT_EQ(r.batched_tokens, engine->config().max_num_batched_tokens);
  EXPECT_EQ(j.at("batched_tokens"), r.batched_tokens);
  EXPECT_DOUBLE_EQ(j.at("decode_tok_s").get<double>(), r.decode_tok_s());
  EXPECT_DOUBLE_EQ(j.at("prefill_tok_s").get<double>(), r.prefill_tok_s());
  EXPECT_DOUBLE_EQ(j.at("e2e_tok_s").get<double>(), r.e2e_tok_s());
  EXPECT_DOUBLE_EQ(j.at("median_step_ms").get<double>(), r.median_step_seconds * 1e3);
  EXPECT_DOUBLE_EQ(j.at("host_gap_us").get<double>(), r.host_gap_seconds * 1e6);
  EXPECT_DOUBLE_EQ(j.at("bandwidth_gbs").get<double>(), *r.bandwidth_bytes_per_s / 1e9);
  EXPECT_DOUBLE_EQ(j.at("fraction_of_limit").get<double>(), *r.fraction_of_limit());
  EXPECT_DOUBLE_EQ(j.at("limit_tok_s").get<double>(), *r.limit_tok_s());
  // Random prompts share nothing, and the warm-up's pages were forgotten: each request
  // looked up its prompt less the last token and found nothing.
  EXPECT_EQ(r.prefix_cache.queried_tokens, 3 * 4);
  EXPECT_EQ(r.prefix_cache.hit_tokens, 0);
  EXPECT_DOUBLE_EQ(j.at("prefix_hit_rate").get<double>(), 0.0);
  // Without LoRA the LoRA fields say so.
  EXPECT_EQ(j.at("lora_rank"), 0);
  EXPECT_EQ(j.at("lora_adapters"), 0);
  EXPECT_TRUE(j.at("lora_load_ms").is_null());
  EXPECT_TRUE(j.at("base_decode_tok_s").is_null());
  EXPECT_TRUE(j.at("lora_fraction_of_base").is_null());
  EXPECT_EQ(j.at("pipelined_steps"), 0);  // off by default
  EXPECT_EQ(j.size(), 21u);
}

// `pagellm bench --lora-rank 4 --lora-adapters 2`: random bf16 adapters on all seven
// modules (alpha 2R), each load timed, the requests spread over them.
TEST(BenchmarkTest, LoraAdaptersAreMadeLoadedTimedAndUsedRoundRobin) {
  const DecodeWorkload w = tiny_workload();
  std::unique_ptr<Engine> engine = make_benchmark_engine(w, cpu_config());
  const std::string dir = ::testing::TempDir() + "/bench-lora";
  LoraBenchConfig lora;
  lora.rank = 4;
  lora.adapters = 2;
  const LoraBenchAdapters adapters = make_benchmark_lora_adapters(*engine, lora, dir, w.seed);
  ASSERT_EQ(adapters.names.size(), 2u);
  ASSERT_EQ(adapters.load_seconds.size(), 2u);
  for (double s : adapters.load_seconds) EXPECT_TRUE(std::isfinite(s) && s > 0) << s;
  // The CPU backend builds the image in place: no staging, no upload.
  ASSERT_EQ(adapters.load_phases.size(), 2u);
  for (const Qwen3Model::LoraLoadTimes& t : adapters.load_phases) {
    EXPECT_GT(t.image_seconds, 0.0);
    EXPECT_EQ(t.upload_seconds, 0.0);
    EXPECT_EQ(t.staging_seconds, 0.0);
  }
  const std::vector<LoraAdapterInfo> loaded = engine->lora_adapters();
  ASSERT_EQ(loaded.size(), 2u);
  for (const LoraAdapterInfo& a : loaded) {
    EXPECT_EQ(a.rank, 4);
    EXPECT_FLOAT_EQ(a.scale, 2.0f);  // alpha = 2R
  }
  // The folders are PEFT's, bf16, all seven modules.
  const LoraAdapter read = read_lora_adapter(dir + "/" + adapters.names[1], engine->model().config());
  EXPECT_EQ(read.config.target_modules.size(), static_cast<size_t>(kNumLoraModules));
  EXPECT_DOUBLE_EQ(read.config.alpha, 8.0);

  BenchmarkOptions options;
  const BenchmarkReport base = run_benchmark(*engine, w, options);
  options.lora_adapters = adapters.names;
  BenchmarkReport r = run_benchmark(*engine, w, options);
  EXPECT_EQ(r.generated_tokens, 18);
  EXPECT_EQ(r.lora_rank, 4);
  EXPECT_EQ(r.lora_adapters, 2);
  r.lora_load_seconds = {0.003, 0.001, 0.002, 0.004};
  r.lora_load_phases = {{0.010, 0.002, 0.001}, {0.0, 0.004, 0.003}, {0.0, 0.006, 0.002}};
  ASSERT_TRUE(r.lora_load_phases_ms().has_value());
  EXPECT_DOUBLE_EQ(r.lora_load_phases_ms()->image_median_ms, 4.0);
  EXPECT_DOUBLE_EQ(r.lora_load_phases_ms()->upload_median_ms, 2.0);
  EXPECT_DOUBLE_EQ(r.lora_load_phases_ms()->staging_max_ms, 10.0);
  r.base_decode_tok_s = base.decode_tok_s();
  ASSERT_TRUE(r.lora_fraction_of_base().has_value());
  EXPECT_DOUBLE_EQ(*r.lora_fraction_of_base(), r.decode_tok_s() / base.decode_tok_s());
  const nlohmann::json j = nlohmann::json::parse(benchmark_json_line(r));
  EXPECT_EQ(j.at("lora_rank"), 4);
  EXPECT_EQ(j.at("lora_adapters"), 2);
  EXPECT_DOUBLE_EQ(j.at("lora_load_ms").at("min").get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j.at("lora_load_ms").at("median").get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(j.at("lora_load_ms").at("max").get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(j.at("base_decode_tok_s").get<double>(), base.decode_tok_s());
  EXPECT_DOUBLE_EQ(j.at("lora_fraction_of_base").get<double>(), *r.lora_fraction_of_base());
  // The names reach the requests: one that is not loaded fails the run, naming it.
  options.lora_adapters = {"bench-lora-0", "not-loaded"};
  try {
    run_benchmark(*engine, w, options);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not-loaded"), std::string::npos) << e.what();
  }
  // ... and leaves the engine idle, holding no page.
  EXPECT_FALSE(engine->has_unfinished());
  engine->check_invariants();
  EXPECT_EQ(engine->allocator().num_free(), engine->allocator().num_usable());
}

TEST(BenchmarkTest, LoraConfigValidationNamesTheFlag) {
  const auto message = [](int32_t rank, int32_t adapters, int32_t max_loras) -> std::string {
    LoraBenchConfig c;
    c.rank = rank;
    c.adapters = adapters;
    try {
      c.validate(max_loras);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(message(0, 1, 8), "");
  EXPECT_EQ(message(64, 8, 8), "");
  EXPECT_EQ(message(0, 20, 8), "");  // no LoRA: the count is not used
  EXPECT_NE(message(-1, 1, 8).find("--lora-rank must be 0 (no LoRA) or 1..64"), std::string::npos);
  EXPECT_NE(message(65, 1, 8).find("got 65"), std::string::npos);
  EXPECT_NE(message(4, 0, 8).find("--lora-adapters must be at least 1, got 0"), std::string::npos);
  {
    LoraBenchConfig c;
    c.rank = 32;
    EXPECT_NO_THROW(c.validate(8, 32));
    c.rank = 33;
    try {
      c.validate(8, 32);
      ADD_FAILURE() << "rank 33 over max_lora_rank 32 accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--lora-rank 33 is more than the engine's max_lora_rank 32"),
                std::string::npos) << e.what();
    }
  }
  EXPECT_NE(message(4, 9, 8).find("--lora-adapters 9 is more than the engine's 8 adapter slots"),
            std::string::npos);
}

// Issue 20's honest count: with prefill chunked over several steps the first request
// decodes while the others still prefill. Those tokens come before the decode window and
// must not be divided by its time, and the bytes are the steps' own.
TEST(BenchmarkTest, ChunkedPrefillCountsOnlyTheWindowsTokensAndBytes) {
  DecodeWorkload w = tiny_workload();
  w.prompt_len = 12;
  w.output_len = 6;
  EngineConfig c = cpu_config();
  c.max_num_batched_tokens = 4;  // widened to the batch (3): prompts of 12 take many steps
  c.enable_prefix_caching = false;
  std::unique_ptr<Engine> engine = make_benchmark_engine(w, c);
  ASSERT_EQ(engine->scheduler_config().max_num_batched_tokens, 4);
  const BenchmarkReport r = run_benchmark(*engine, w);
  EXPECT_EQ(r.generated_tokens, 18);
  // Some tokens were sampled before the last request had its first one ...
  EXPECT_LT(r.decode_tokens, r.generated_tokens - 3);
  EXPECT_GT(r.decode_tokens, 0);
  // ... and in the window every step samples one token per unfinished request, no more.
  EXPECT_LE(r.decode_tokens, 3 * r.decode_steps);
  EXPECT_NEAR(r.decode_tok_s(), r.decode_tokens / r.decode_seconds, 1e-9 * r.decode_tok_s());
  // Each window step reads at most the three full contexts (prompt + output).
  const Qwen3Config& mc = engine->model().config();
  const double kv_token = 2.0 * mc.num_hidden_layers * mc.num_key_value_heads * mc.head_dim *
                          dtype_size(engine->backend().kv_dtype());
  EXPECT_GT(r.kv_read_bytes, 0.0);
  EXPECT_LE(r.kv_read_bytes, kv_token * 3 * (12 + 6));
  expect_limit_figures_consistent(r);
  engine->check_invariants();
  EXPECT_EQ(engine->allocator().num_free(), engine->allocator().num_usable());
}

TEST(BenchmarkTest, WithoutBandwidthTheLimitFiguresAreAbsent) {
  DecodeWorkload w = tiny_workload();
  w.batch = 1;
  w.output_len = 2;
  std::unique_ptr<Engine> engine = make_benchmark_engine(w, cpu_config());
  BenchmarkOptions options;
  options.measure_bandwidth = false;
  const BenchmarkReport r = run_benchmark(*engine, w, options);
  EXPECT_EQ(r.decode_steps, 1);
  EXPECT_EQ(r.decode_tokens, 1);
  EXPECT_FALSE(r.bandwidth_bytes_per_s.has_value());
  EXPECT_FALSE(r.fraction_of_limit().has_value());
  EXPECT_FALSE(r.limit_tok_s().has_value());
  const nlohmann::json j = nlohmann::json::parse(benchmark_json_line(r));
  EXPECT_TRUE(j.at("fraction_of_limit").is_null());
  EXPECT_TRUE(j.at("bandwidth_gbs").is_null());
  EXPECT_TRUE(j.at("limit_tok_s").is_null());
  // The same engine runs a second workload (it was left idle) ...
  w.prompt_len = 3;
  w.output_len = 3;
  const BenchmarkReport again = run_benchmark(*engine, w, options);
  EXPECT_EQ(again.generated_tokens, 3);
  EXPECT_EQ(again.decode_steps, 2);
  // ... but not one wider than it was made for: the figures would be of several waves.
  w.batch = 2;
  try {
    run_benchmark(*engine, w, options);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the engine runs at most 1 sequences at once but the "
                                         "workload's batch is 2"),
              std::string::npos)
        << e.what();
  }
}

TEST(BenchmarkTest, AnEngineTooSmallForTheWorkloadIsAnError) {
  const DecodeWorkload w = tiny_workload();
  EngineConfig c = cpu_config();
  c.max_model_len = 8;  // the workload needs 5 + 6
  std::unique_ptr<Engine> engine = make_benchmark_engine(w, c);
  try {
    run_benchmark(*engine, w);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_model_len is 8 but the workload needs 5 prompt + 6 "
                                         "output tokens"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(engine->has_unfinished());
}


TEST(BenchmarkTest, WeightUpdateTimesFullUpdatesFromBothSources) {
  DecodeWorkload w = named_workload("weight-update");
  EXPECT_EQ(w.name, "weight-update");
  EXPECT_EQ(w.preset, "qwen3-4b");
  w.preset = "tiny";
  // A 1 GiB pool unless the pool is sized (room beside the device copy of the weights).
  EXPECT_EQ(weight_update_engine_config(cpu_config()).kv_cache_bytes, size_t{1} << 30);
  EngineConfig sized = cpu_config();
  sized.num_pages = 32;
  EXPECT_EQ(weight_update_engine_config(sized).kv_cache_bytes, 0u);
  std::unique_ptr<Engine> engine = make_benchmark_engine(w, weight_update_engine_config(sized));
  const WeightUpdateBenchReport r = run_weight_update_benchmark(*engine, w, 3);
  const Qwen3Config c = preset_config("tiny");
  EXPECT_EQ(r.tensors, 3 + 11 * c.num_hidden_layers);  // embed, norm, lm_head (untied)
  EXPECT_EQ(r.bytes, static_cast<uint64_t>(c.num_parameters()) * 4);  // float32 on the CPU
  EXPECT_EQ(engine->weights_version(), 6u);  // 3 updates from each source
  for (const WeightUpdateTiming* t : {&r.pinned, &r.device}) {
    ASSERT_EQ(t->seconds.size(), 3u);
    EXPECT_GT(t->median_seconds, 0.0);
    EXPECT_DOUBLE_EQ(t->bytes_per_s, static_cast<double>(r.bytes) / t->median_seconds);
    ASSERT_TRUE(t->fraction_of_limit.has_value());
    EXPECT_GT(*t->fraction_of_limit, 0.0);
  }
  EXPECT_DOUBLE_EQ(*r.pinned.fraction_of_limit, r.pinned.bytes_per_s / r.host_to_device_bytes_per_s);
  EXPECT_DOUBLE_EQ(*r.device.fraction_of_limit,
                   r.device.bytes_per_s / (r.device_copy_bytes_per_s / 2.0));
  const nlohmann::json j = nlohmann::json::parse(weight_update_json_line(r));
  EXPECT_EQ(j.at("workload"), "weight-update");
  EXPECT_EQ(j.at("bytes").get<uint64_t>(), r.bytes);
  EXPECT_DOUBLE_EQ(j.at("device").at("median_s").get<double>(), r.device.median_seconds);
  EXPECT_THROW(run_weight_update_benchmark(*engine, w, 0), Error);
}


GrpoWorkload tiny_grpo() {
  GrpoWorkload g;
  g.preset = "tiny";
  g.prompts = 3;
  g.n = 2;
  g.min_prompt_len = 4;
  g.max_prompt_len = 9;
  g.median_output_len = 5;
  g.max_output_len = 12;
  g.seed = 3;
  return g;
}

/// The engine config of tiny_grpo's runs: the cpu config with 64 pages.
EngineConfig tiny_grpo_config(const GrpoWorkload& g) {
  EngineConfig base = cpu_config();
  base.num_pages = 64;
  return grpo_engine_config(g, base);
}

TEST(BenchmarkTest, GrpoRunsTwoSeededRoundsAroundAWeightUpdate) {
  const GrpoWorkload g = tiny_grpo();
  const EngineConfig config = tiny_grpo_config(g);
  EXPECT_EQ(config.max_num_seqs, 6);
  EXPECT_EQ(config.max_model_len, 9 + 12);
  std::unique_ptr<Engine> engine = make_benchmark_engine(g.model_workload(), config);
  const GrpoReport r = run_grpo_benchmark(*engine, g);
  EXPECT_EQ(r.samples, 6);
  EXPECT_GE(r.prompt_tokens, 2 * 6 * 4);  // two rounds of 6 samples of >= 4 prompt tokens
  EXPECT_GE(r.generated_tokens, 12);   // every sample at least one token, two rounds
  EXPECT_LE(r.generated_tokens, 12 * 12);
  ASSERT_EQ(r.weight_update_seconds.size(), 1u);
  EXPECT_GT(r.weight_update_seconds[0], 0.0);
  EXPECT_EQ(engine->weights_version(), 1u);
  EXPECT_GT(r.peak_kv_pages, 0);
  EXPECT_LE(r.peak_kv_pages, r.usable_kv_pages);
  EXPECT_GT(r.rollout_tok_s(), 0.0);
  ASSERT_TRUE(r.fraction_of_limit().has_value());
  EXPECT_GT(*r.fraction_of_limit(), 0.0);
  EXPECT_EQ(engine->allocator().num_free(), engine->allocator().num_usable());
  // Seeded: the same workload on a fresh engine draws the same lengths.
  std::unique_ptr<Engine> again = make_benchmark_engine(g.model_workload(), config);
  EXPECT_EQ(run_grpo_benchmark(*again, g, false).generated_tokens, r.generated_tokens);
  // Every step falls in exactly one kind: the kinds add up to the rounds' steps, limit and
  // decode tokens (every generated token but each sample's first, sampled by its prefill),
  // and their wall time to at most the rollout's.
  ASSERT_FALSE(r.step_classes.empty());
  EXPECT_EQ(r.step_classes.front().name, "prefill + decode");
  int64_t class_steps = 0, class_tokens = 0;
  double class_seconds = 0, class_limit = 0, class_per_sample = 0;
  for (const GrpoStepClass& c : r.step_classes) {
    EXPECT_GT(c.steps, 0) << c.name;
    class_steps += c.steps;
    class_tokens += c.decode_tokens;
    class_seconds += c.seconds;
    class_limit += c.limit_seconds;
    class_per_sample += c.per_sample_limit_seconds;
    EXPECT_LE(c.limit_seconds, c.per_sample_limit_seconds * (1 + 1e-12)) << c.name;
  }
  EXPECT_EQ(class_steps, r.steps);
  EXPECT_EQ(class_tokens, r.generated_tokens - g.rounds * r.samples);
  EXPECT_LE(class_seconds, r.rollout_seconds);
  EXPECT_NEAR(class_limit, r.limit_seconds, 1e-9 * r.limit_seconds);
  EXPECT_NEAR(class_per_sample, r.per_sample_limit_seconds, 1e-9 * r.per_sample_limit_seconds);
  // The host gap's three parts are each measured, and the JSON gives them and their sum.
  EXPECT_GT(r.host_gap.schedule, 0.0);
  EXPECT_GT(r.host_gap.launch, 0.0);
  EXPECT_GT(r.host_gap.finish, 0.0);
  const nlohmann::json j = nlohmann::json::parse(grpo_json_line(r));
  EXPECT_EQ(j.at("generated_tokens").get<int64_t>(), r.generated_tokens);
  EXPECT_GT(r.batched_tokens, 0);
  EXPECT_EQ(j.at("batched_tokens"), r.batched_tokens);
  EXPECT_EQ(j.at("step_classes").size(), r.step_classes.size());
  EXPECT_DOUBLE_EQ(j.at("host_schedule_s").get<double>(), r.host_gap.schedule);
  EXPECT_DOUBLE_EQ(j.at("host_launch_s").get<double>(), r.host_gap.launch);
  EXPECT_DOUBLE_EQ(j.at("host_finish_s").get<double>(), r.host_gap.finish);
  EXPECT_DOUBLE_EQ(j.at("host_gap_s").get<double>(), r.host_gap.total());
  EXPECT_DOUBLE_EQ(j.at("limit_s").get<double>(), r.limit_seconds);
  EXPECT_DOUBLE_EQ(j.at("per_sample_limit_s").get<double>(), r.per_sample_limit_seconds);
  GrpoWorkload bad = g;
  bad.n = 0;
  EXPECT_THROW(bad.validate(), Error);
}

// W2's limit counts each physical K/V page once a step: a prompt's samples share its full
// prompt pages, so with n > 1 it is shorter than the per-sample count, and with n = 1
// (nothing shared: distinct random prompts) the two are the same sums of contexts.
TEST(BenchmarkTest, GrpoLimitCountsASharedPageOncePerStep) {
  for (int32_t n : {1, 4}) {
    GrpoWorkload g = tiny_grpo();
    g.n = n;
    g.min_prompt_len = 40;  // two full pages of 16 and a part of a third
    g.max_prompt_len = 40;
    EngineConfig base = cpu_config();
    base.num_pages = 128;
    base.page_size = 16;
    const EngineConfig config = grpo_engine_config(g, base);
    std::unique_ptr<Engine> engine = make_benchmark_engine(g.model_workload(), config);
    const GrpoReport r = run_grpo_benchmark(*engine, g);
    SCOPED_TRACE("n = " + std::to_string(n));
    ASSERT_TRUE(r.fraction_of_limit().has_value());
    ASSERT_GT(r.limit_seconds, 0.0);
    if (n == 1) {
      EXPECT_NEAR(r.limit_seconds, r.per_sample_limit_seconds, 1e-9 * r.per_sample_limit_seconds);
    } else {
      EXPECT_LT(r.limit_seconds, r.per_sample_limit_seconds);
    }
    EXPECT_EQ(engine->allocator().num_free(), engine->allocator().num_usable());
  }
}

/// A cpu backend whose products run at a rate the test chooses (measure_matmul_rate).
class FixedRateBackend : public CpuBackend {
 public:
  explicit FixedRateBackend(double flops_per_s) : rate_(flops_per_s) {}
  MatmulRate measure_matmul_rate(int64_t rows, int64_t n, int64_t k) override {
    EXPECT_GT(n, 0);
    EXPECT_GT(k, 0);
    return {rate_, rows};
  }

 private:
  double rate_;
};

// W2's roofline: each step the longer of its bytes at the copy rate and its FLOPs at the
// products' rate. At a rate no step can be bound by, it is the limit; at 1 kFLOP/s every
// step is bound by its FLOPs, so it is the FLOPs over the rate. The FLOPs are at least
// every generated token's forward after the first (one per sample from the prefill).
TEST(BenchmarkTest, GrpoRooflineIsEachStepsLongerBound) {
  const GrpoWorkload g = tiny_grpo();
  const EngineConfig config = tiny_grpo_config(g);
  const Qwen3Config mc = preset_config(g.preset);
  const double token_flops =
      2.0 * static_cast<double>(mc.num_hidden_layers) *
      static_cast<double>(mc.hidden_size * mc.qkv_size() + mc.q_size() * mc.hidden_size +
                          3 * mc.hidden_size * mc.intermediate_size);
  for (double rate : {1e30, 1e3}) {
    SCOPED_TRACE("rate " + std::to_string(rate));
    auto backend = std::make_unique<FixedRateBackend>(rate);
    auto model = std::make_unique<Qwen3Model>(*backend, mc,
                                              random_weight_lookup(mc, g.seed, DType::BF16));
    Engine engine(std::move(backend), std::move(model), config);
    const GrpoReport r = run_grpo_benchmark(engine, g);
    ASSERT_TRUE(r.matmul_flops_per_s.has_value());
    EXPECT_EQ(*r.matmul_flops_per_s, rate);
    EXPECT_EQ(r.matmul_rate_rows, 8192);
    EXPECT_GE(r.flops, token_flops * static_cast<double>(r.generated_tokens - r.samples *
                                                                             g.rounds));
    double classes = 0;
    for (const GrpoStepClass& c : r.step_classes) {
      EXPECT_GE(c.roofline_seconds, c.limit_seconds) << c.name;
      classes += c.roofline_seconds;
    }
    EXPECT_NEAR(classes, r.roofline_seconds, 1e-9 * r.roofline_seconds);
    if (rate > 1e20) {
      EXPECT_NEAR(r.roofline_seconds, r.limit_seconds, 1e-9 * r.limit_seconds);
    } else {
      EXPECT_NEAR(r.roofline_seconds, r.flops / rate, 1e-9 * r.roofline_seconds);
      EXPECT_GT(r.roofline_seconds, r.limit_seconds);
    }
  }
}

// The generic measurement runs the backend's own matmul: a positive rate on the cpu
// backend, at the rows asked for when they fit.
TEST(BenchmarkTest, MatmulRateIsMeasuredWithTheBackendsProduct) {
  CpuBackend backend;
  const Backend::MatmulRate rate = backend.measure_matmul_rate(64, 96, 32);
  EXPECT_GT(rate.flops_per_s, 0.0);
  EXPECT_EQ(rate.rows, 64);
  EXPECT_THROW(backend.measure_matmul_rate(0, 96, 32), Error);
}

TEST(BenchmarkTest, PromptSamplesAreRequestsWithSeedsSPlusJ) {
  DecodeWorkload w = tiny_workload();
  std::unique_ptr<Engine> engine = make_benchmark_engine(w, cpu_config());
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 40;
  p.ignore_eos = true;
  const std::vector<int64_t> ids = add_prompt_samples(*engine, {5, 6, 7}, p, {4, 2, 3});
  ASSERT_EQ(ids.size(), 3u);
  while (engine->has_unfinished()) engine->step();
  for (size_t j = 0; j < ids.size(); ++j) {
    const Sequence& s = engine->request(ids[j]);
    EXPECT_EQ(s.seed, 40u + j);
    EXPECT_EQ(s.output.size(), std::vector<size_t>({4, 2, 3})[j]);
    SamplingParams one = p;
    one.seed = 40 + j;
    one.max_tokens = static_cast<int32_t>(s.output.size());
    const int64_t alone = engine->add_request({5, 6, 7}, one);
    while (engine->has_unfinished()) engine->step();
    EXPECT_EQ(engine->request(alone).output, s.output) << "sample " << j;
  }
}

TEST(BenchmarkTest, SleepWakeMeasuresBothCyclesAndChecksTokens) {
  const DecodeWorkload named = sleep_wake_workload();
  EXPECT_EQ(named.name, "sleep-wake");
  EXPECT_EQ(named.preset, "qwen3-4b");
  EXPECT_EQ(named.batch, 8);
  DecodeWorkload w = tiny_workload();
  EngineConfig c = cpu_config();
  c.num_pages = 512;
  std::unique_ptr<Engine> engine = make_benchmark_engine(w, c);
  const SleepWakeReport r = run_sleep_wake_benchmark(*engine, w);
  EXPECT_EQ(r.backend, "cpu");
  EXPECT_TRUE(r.all_tokens_match());
  EXPECT_EQ(r.tokens_checked, int64_t{w.batch} * w.output_len);
  // The pools' bytes, page-rounded per pool by the cpu backend's mappings.
  EXPECT_GE(r.kv_only.sleep.kv_bytes_released, r.kv_pool_bytes);
  EXPECT_LT(r.kv_only.sleep.kv_bytes_released, r.kv_pool_bytes + 4 * size_t{65536});
  EXPECT_EQ(r.offload.sleep.kv_bytes_released, r.kv_only.sleep.kv_bytes_released);
  EXPECT_EQ(r.offload.sleep.weight_bytes_offloaded, 0u);  // cpu weights stay
  EXPECT_EQ(r.offload_again.sleep.kv_bytes_released, r.kv_only.sleep.kv_bytes_released);
  EXPECT_TRUE(r.offload_again.tokens_match);
  EXPECT_EQ(r.graphs, 0u);                                // the cpu backend has no graphs
  EXPECT_GE(r.kv_only.sleep.seconds, 0.0);
  EXPECT_GE(r.reallocate_seconds, 0.0);
  EXPECT_FALSE(engine->asleep());
  EXPECT_FALSE(engine->has_unfinished());
  engine->check_invariants();
  EXPECT_EQ(engine->allocator().num_free(), engine->allocator().num_usable());
  const nlohmann::json j = nlohmann::json::parse(sleep_wake_json_line(r));
  EXPECT_EQ(j["workload"], "sleep-wake");
  EXPECT_EQ(j["kv_only"]["tokens_match"], true);
  EXPECT_EQ(j["offload_again"]["tokens_match"], true);
  EXPECT_EQ(j["kv_pool_bytes"].get<size_t>(), r.kv_pool_bytes);
}

// Pipelined decode runs several forward steps in one engine step: the benchmarks count
// them one by one (Engine::set_step_observer), so the steps, tokens and bytes read are
// those of the same workload step by step, exactly.
TEST(BenchmarkTest, PipelinedDecodeCountsEveryForwardStep) {
  DecodeWorkload w = tiny_workload();
  w.output_len = 24;
  EngineConfig c = cpu_config();
  std::unique_ptr<Engine> plain = make_benchmark_engine(w, c);
  const BenchmarkReport want = run_benchmark(*plain, w);
  c.pipelined_decode_steps = 5;
  std::unique_ptr<Engine> piped = make_benchmark_engine(w, c);
  const BenchmarkReport got = run_benchmark(*piped, w);
  EXPECT_GT(piped->stats().pipelined_steps, 0);
  EXPECT_EQ(got.decode_steps, want.decode_steps);
  EXPECT_EQ(got.decode_tokens, want.decode_tokens);
  EXPECT_EQ(got.generated_tokens, want.generated_tokens);
  EXPECT_DOUBLE_EQ(got.kv_read_bytes, want.kv_read_bytes);
  EXPECT_GT(got.median_step_seconds, 0.0);
  expect_limit_figures_consistent(got);

  const GrpoWorkload g = tiny_grpo();
  EngineConfig base = cpu_config();
  base.num_pages = 64;
  EngineConfig config = grpo_engine_config(g, base);
  std::unique_ptr<Engine> grpo_plain = make_benchmark_engine(g.model_workload(), config);
  const GrpoReport a = run_grpo_benchmark(*grpo_plain, g);
  config.pipelined_decode_steps = 5;
  std::unique_ptr<Engine> grpo_piped = make_benchmark_engine(g.model_workload(), config);
  const GrpoReport b = run_grpo_benchmark(*grpo_piped, g);
  EXPECT_GT(grpo_piped->stats().pipelined_steps, 0);
  EXPECT_EQ(b.steps, a.steps);
  EXPECT_EQ(b.generated_tokens, a.generated_tokens);
  ASSERT_TRUE(a.bandwidth_bytes_per_s && b.bandwidth_bytes_per_s);
  const double bytes_a = a.limit_seconds * *a.bandwidth_bytes_per_s;
  const double bytes_b = b.limit_seconds * *b.bandwidth_bytes_per_s;
  EXPECT_NEAR(bytes_b, bytes_a, 1e-9 * bytes_a);
  ASSERT_EQ(b.step_classes.size(), a.step_classes.size());
  for (size_t k = 0; k < a.step_classes.size(); ++k) {
    EXPECT_EQ(b.step_classes[k].name, a.step_classes[k].name);
    EXPECT_EQ(b.step_classes[k].steps, a.step_classes[k].steps) << a.step_classes[k].name;
    EXPECT_EQ(b.step_classes[k].decode_tokens, a.step_classes[k].decode_tokens);
  }
}

/// A CPU backend that prefers a larger chunk offline, as the cuda backend does on large
/// devices.
class OfflineChunkBackend : public CpuBackend {
 public:
  int32_t preferred_batched_tokens(bool offline) const override { return offline ? 96 : 48; }
};

// max_num_batched_tokens 0 takes the backend's chunk for EngineOptions::offline (the CLI's
// generate, bench and score and Python's LLM set it; the server does not), and steps busy
// with decodes keep the online chunk; an explicit budget is kept either way, for every
// step, and max_num_seqs still raises the chunk.
TEST(BenchmarkTest, OfflineEnginesTakeTheBackendsOfflineChunk) {
  const DecodeWorkload w = tiny_workload();
  const Qwen3Config mc = preset_config(w.preset);
  auto chunks_of = [&](bool offline, int32_t configured, int32_t max_num_seqs) {
    EngineConfig c = benchmark_engine_config(w, cpu_config());
    c.offline = offline;
    c.max_num_batched_tokens = configured;
    c.max_num_seqs = max_num_seqs;
    auto backend = std::make_unique<OfflineChunkBackend>();
    auto model = std::make_unique<Qwen3Model>(*backend, mc,
                                              random_weight_lookup(mc, w.seed, DType::BF16));
    Engine engine(std::move(backend), std::move(model), c);
    const SchedulerConfig& sc = engine.scheduler_config();
    EXPECT_EQ(engine.config().max_num_batched_tokens, sc.max_num_batched_tokens);
    return std::make_pair(sc.max_num_batched_tokens, sc.busy_batched_tokens);
  };
  using Chunks = std::pair<int32_t, int32_t>;
  EXPECT_EQ(chunks_of(false, 0, 8), Chunks(48, 0));
  EXPECT_EQ(chunks_of(true, 0, 8), Chunks(96, 48));
  EXPECT_EQ(chunks_of(true, 0, 60), Chunks(96, 60)) << "busy steps: at least max_num_seqs";
  EXPECT_EQ(chunks_of(true, 40, 8), Chunks(40, 0)) << "an explicit budget is the caller's";
  EXPECT_EQ(chunks_of(false, 40, 8), Chunks(40, 0));
  EXPECT_EQ(chunks_of(true, 0, 200), Chunks(200, 0)) << "raised to max_num_seqs";
  EXPECT_FALSE(EngineOptions{}.offline) << "the library's default is online";
}

/// A CPU backend whose kernel trace "records" one span per sampled step: what a traced
/// window covers, counted without a GPU.
class StepTracingBackend : public CpuBackend {
 public:
  std::string begin_kernel_trace() override {
    spans_.clear();
    tracing_ = true;
    return "";
  }
  std::vector<KernelSpan> end_kernel_trace() override {
    tracing_ = false;
    return std::move(spans_);
  }
  // Every step samples once: step by step through sample(), pipelined through the default
  // sample_async(), which calls sample().
  std::vector<SampledToken> sample(const Tensor& logits,
                                   const std::vector<SamplingRow>& rows) override {
    if (tracing_) spans_.push_back(KernelSpan{"step", 0, 0});
    return CpuBackend::sample(logits, rows);
  }

 private:
  bool tracing_ = false;
  std::vector<KernelSpan> spans_;
};

// --trace-steps with pipelined decode: the runs end where the trace begins and ends (the
// engine's run interrupt), so the trace holds exactly the steps asked for, as step by step.
TEST(BenchmarkTest, PipelinedRunsEndAtTheTraceWindow) {
  DecodeWorkload w = tiny_workload();
  w.output_len = 40;
  for (int32_t steps : {1, 8}) {
    EngineConfig c = benchmark_engine_config(w, cpu_config());
    c.pipelined_decode_steps = steps;
    auto backend = std::make_unique<StepTracingBackend>();
    const Qwen3Config mc = preset_config(w.preset);
    auto model = std::make_unique<Qwen3Model>(*backend, mc,
                                              random_weight_lookup(mc, w.seed, DType::BF16));
    Engine engine(std::move(backend), std::move(model), c);
    BenchmarkOptions options;
    options.trace_steps = 5;
    const BenchmarkReport r = run_benchmark(engine, w, options);
    ASSERT_TRUE(r.trace.has_value()) << r.trace_unavailable;
    EXPECT_EQ(r.trace->steps, 5) << "pipelined_decode_steps " << steps;
    EXPECT_EQ(r.trace->spans.size(), 5u) << "pipelined_decode_steps " << steps;
    if (steps > 1) {
      EXPECT_GT(engine.stats().pipelined_steps, 0);
    }
    EXPECT_EQ(r.decode_steps, 39);
  }
}

// W2's --trace-steps: the last round's first decode-only steps after its prefill, each one
// recorded (StepTracingBackend's span per sampled step) and counted with its decode rows; a
// window longer than the round ends with it. The trace changes nothing W2 generates.
TEST(BenchmarkTest, GrpoTracesTheLastRoundsFirstDecodeSteps) {
  const GrpoWorkload g = tiny_grpo();
  const EngineConfig config = tiny_grpo_config(g);
  const auto engine_with_trace = [&] {
    auto backend = std::make_unique<StepTracingBackend>();
    const Qwen3Config mc = preset_config(g.preset);
    auto model = std::make_unique<Qwen3Model>(*backend, mc,
                                              random_weight_lookup(mc, g.seed, DType::BF16));
    return std::make_unique<Engine>(std::move(backend), std::move(model), config);
  };
  const GrpoReport plain = run_grpo_benchmark(*engine_with_trace(), g, false);
  EXPECT_FALSE(plain.trace.has_value());
  for (const int32_t steps : {3, 1000}) {
    const GrpoReport r = run_grpo_benchmark(*engine_with_trace(), g, false, steps);
    ASSERT_TRUE(r.trace.has_value()) << r.trace_unavailable;
    EXPECT_TRUE(r.trace_unavailable.empty());
    if (steps == 3) {
      EXPECT_EQ(r.trace->steps, 3);
    } else {
      EXPECT_GT(r.trace->steps, 0);
      EXPECT_LT(r.trace->steps, r.steps / 2) << "the window ends with the last round";
    }
    EXPECT_EQ(r.trace->spans.size(), static_cast<size_t>(r.trace->steps));
    // Decode-only steps: every traced step has decode rows, at most one per sample.
    EXPECT_GE(r.trace_rows, r.trace->steps);
    EXPECT_LE(r.trace_rows, r.trace->steps * r.samples);
    EXPECT_EQ(r.generated_tokens, plain.generated_tokens);
  }
  // A backend without a trace says so, and W2 still runs.
  std::unique_ptr<Engine> cpu = make_benchmark_engine(g.model_workload(), config);
  const GrpoReport none = run_grpo_benchmark(*cpu, g, false, 3);
  EXPECT_FALSE(none.trace.has_value());
  EXPECT_NE(none.trace_unavailable.find("trace"), std::string::npos) << none.trace_unavailable;
  EXPECT_EQ(none.generated_tokens, plain.generated_tokens);
  EXPECT_THROW(run_grpo_benchmark(*cpu, g, false, -1), Error);
}

// W2's trace_after: the window begins once that many of the last round's decode-only steps
// have run. Step by step (no pipelining), a window of n steps after a holds the rows of
// steps a + 1 .. a + n, so its rows are the sum of the one-step windows' rows there; the
// rows fall as samples finish, so a window in the wrong place would show it.
TEST(BenchmarkTest, GrpoTraceAfterPlacesTheWindow) {
  const GrpoWorkload g = tiny_grpo();
  EngineConfig config = tiny_grpo_config(g);
  config.pipelined_decode_steps = 1;
  const auto run = [&](int32_t steps, int32_t after) {
    auto backend = std::make_unique<StepTracingBackend>();
    const Qwen3Config mc = preset_config(g.preset);
    auto model = std::make_unique<Qwen3Model>(*backend, mc,
                                              random_weight_lookup(mc, g.seed, DType::BF16));
    Engine engine(std::move(backend), std::move(model), config);
    return run_grpo_benchmark(engine, g, false, steps, after);
  };
  std::vector<int64_t> rows;  // rows[a - 1]: the rows of the round's decode-only step a + 1
  std::vector<double> kv_bytes, weight_bytes;  // that step's K/V and weight bytes
  for (int32_t after = 1; after <= 8; ++after) {
    const GrpoReport r = run(1, after);
    if (!r.trace) break;  // the round has no step after `after`
    EXPECT_EQ(r.trace_after_steps, after);
    EXPECT_EQ(r.trace->steps, 1);
    rows.push_back(r.trace_rows);
    kv_bytes.push_back(r.trace_kv_bytes);
    weight_bytes.push_back(r.trace_weight_bytes);
    EXPECT_GT(r.trace_kv_bytes, 0.0);
    EXPECT_GT(r.trace_weight_bytes, 0.0);
  }
  ASSERT_GE(rows.size(), 4u) << "the tiny round has too few decode-only steps for the test";
  EXPECT_NE(*std::min_element(rows.begin(), rows.end()),
            *std::max_element(rows.begin(), rows.end()))
      << "every step has the same rows: the test could not tell windows apart";
  const GrpoReport window = run(3, 2);
  ASSERT_TRUE(window.trace.has_value());
  EXPECT_EQ(window.trace->steps, 3);
  EXPECT_EQ(window.trace_after_steps, 2);
  EXPECT_EQ(window.trace_rows, rows[1] + rows[2] + rows[3]);
  // The window's bytes are its steps' (whole numbers of bytes: exact in double).
  EXPECT_NE(*std::min_element(kv_bytes.begin(), kv_bytes.end()),
            *std::max_element(kv_bytes.begin(), kv_bytes.end()))
      << "every step read the same K/V: the test could not tell windows apart";
  EXPECT_EQ(window.trace_kv_bytes, kv_bytes[1] + kv_bytes[2] + kv_bytes[3]);
  EXPECT_EQ(window.trace_weight_bytes, weight_bytes[1] + weight_bytes[2] + weight_bytes[3]);
  const GrpoReport plain = run(0, 1);
  EXPECT_EQ(window.generated_tokens, plain.generated_tokens);
  EXPECT_THROW(run(3, 0), Error);
}

}  // namespace
}  // namespace pagellm
