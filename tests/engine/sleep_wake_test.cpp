// Sleep and wake on the CPU backend: the KV pools' pages go back to the system at the same
// addresses and read as zeros afterwards; the engine refuses to sleep while requests run,
// refuses a second sleep or a wake while awake, rejects requests while asleep, leaks no
// page, and after wake gives exactly the outputs it gave before sleeping.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "common/reference_qwen3.h"
#include "pagellm/cpu/cpu_backend.h"
#include "pagellm/engine/engine.h"

namespace pagellm {
namespace {

// Resident set size of this process, bytes (/proc/self/statm's second field).
size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t total_pages = 0, resident_pages = 0;
  statm >> total_pages >> resident_pages;
  return resident_pages * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// A CPU backend that cannot sleep (the Backend default).
class SleeplessCpuBackend : public CpuBackend {
 public:
  bool supports_sleep() const override { return false; }
  BackendSleepResult sleep(bool offload_weights) override {
    return Backend::sleep(offload_weights);
  }
  void wake() override { Backend::wake(); }
};

std::unique_ptr<Engine> make_engine(int64_t num_pages = 64,
                                    std::unique_ptr<Backend> backend = nullptr) {
  const Qwen3Config c = testing::small_config(false);
  const testing::HostWeights w = testing::random_weights(c, 777);
  if (!backend) backend = std::make_unique<CpuBackend>();
  auto model = std::make_unique<Qwen3Model>(*backend, c, w.lookup());
  EngineConfig ec;
  ec.page_size = 4;
  ec.num_pages = num_pages;
  ec.max_num_seqs = 4;
  ec.max_num_batched_tokens = 24;
  ec.max_model_len = 64;
  return std::make_unique<Engine>(std::move(backend), std::move(model), ec);
}

struct Outputs {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logprobs;
};

// Five requests (greedy and seeded sampling, prompts of different lengths), run to the end.
Outputs run_workload(Engine& engine) {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
  for (int i = 0; i < 5; ++i) {
    std::vector<int32_t> prompt;
    for (int j = 0; j < 3 + 5 * i; ++j) prompt.push_back((j * 11 + i * 7) % 90 + 1);
    prompts.push_back(prompt);
    SamplingParams sp;
    sp.max_tokens = 12;
    sp.ignore_eos = true;
    if (i % 2 == 1) {
      sp.temperature = 0.8f;
      sp.top_k = 30;
      sp.seed = 40 + i;
    } else {
      sp.temperature = 0.0f;
    }
    params.push_back(sp);
  }
  Outputs out;
  for (const Sequence* s : engine.generate(prompts, params)) {
    EXPECT_EQ(s->finish_reason, FinishReason::kLength) << s->error;
    out.tokens.push_back(s->output);
    std::vector<float> lp;
    for (const SampledToken& t : s->sampled) lp.push_back(t.logprob);
    out.logprobs.push_back(lp);
  }
  return out;
}

void expect_all_pages_free(const Engine& engine) {
  engine.check_invariants();
  EXPECT_EQ(engine.allocator().num_free(), engine.allocator().num_usable());
}

TEST(CpuSleep, KvPoolsReleasedAtSameAddressAndZeroAfterWake) {
  CpuBackend backend;
  const size_t bytes = size_t{8} << 20;
  DeviceBuffer pool(&backend, bytes, MemoryRole::kKvCache);
  DeviceBuffer weights(&backend, 4096, MemoryRole::kWeights);
  Tensor kv = pool.tensor(DType::F32, {static_cast<int64_t>(bytes / 4)});
  Tensor w = weights.tensor(DType::F32, {1024});
  backend.fill(kv, 3.5f);
  backend.fill(w, -1.25f);
  void* const address = pool.get();

  const size_t resident_before = resident_bytes();
  const BackendSleepResult released = backend.sleep(/*offload_weights=*/true);
  const size_t resident_after = resident_bytes();
  EXPECT_EQ(released.kv_bytes, bytes);
  EXPECT_EQ(released.weight_bytes, 0u) << "cpu weights stay in host memory";
  // The pool's pages went back to the system (allow for other allocations meanwhile).
  EXPECT_GE(resident_before, resident_after + bytes * 9 / 10)
      << "resident " << resident_before << " -> " << resident_after;

  EXPECT_THROW(backend.sleep(false), Error);
  backend.wake();
  EXPECT_THROW(backend.wake(), Error);
  EXPECT_EQ(pool.get(), address);
  const std::vector<float> kv_after = backend.download_f32(kv);
  for (size_t i = 0; i < kv_after.size(); i += 4099) ASSERT_EQ(kv_after[i], 0.0f) << i;
  EXPECT_EQ(kv_after.back(), 0.0f);
  for (float x : backend.download_f32(w)) ASSERT_EQ(x, -1.25f) << "weights must be kept";
  // The memory is usable again.
  backend.fill(kv, 2.0f);
  EXPECT_EQ(backend.download_f32(kv)[12345], 2.0f);
}

TEST(EngineSleep, OutputsAfterWakeEqualOutputsBeforeSleep) {
  auto engine = make_engine(/*num_pages=*/4096);  // 4 pools of 2 MiB: measurable
  const Outputs before = run_workload(*engine);
  expect_all_pages_free(*engine);

  const size_t resident_before = resident_bytes();
  const SleepReport report = engine->sleep();
  const size_t resident_after = resident_bytes();
  EXPECT_TRUE(engine->asleep());
  // 2 layers x (K, V) x 4096 pages x Hkv 2 x page 4 x D 16 x float32.
  EXPECT_EQ(report.kv_bytes_released, size_t{4} * 4096 * 2 * 4 * 16 * 4);
  EXPECT_EQ(report.weight_bytes_offloaded, 0u);
  EXPECT_GE(resident_before, resident_after + report.kv_bytes_released * 9 / 10);
  EXPECT_GT(report.free_memory_before, 0u);
  EXPECT_GT(report.free_memory_after, 0u);
  expect_all_pages_free(*engine);

  const WakeReport woke = engine->wake_up();
  EXPECT_FALSE(engine->asleep());
  EXPECT_GE(woke.seconds, 0.0);
  const Outputs after = run_workload(*engine);
  EXPECT_EQ(after.tokens, before.tokens);
  EXPECT_EQ(after.logprobs, before.logprobs);
  expect_all_pages_free(*engine);

  // A second cycle, with the weight-offload option (a no-op on the CPU), behaves the same.
  engine->sleep(SleepOptions{/*offload_weights=*/true});
  engine->wake_up();
  const Outputs again = run_workload(*engine);
  EXPECT_EQ(again.tokens, before.tokens);
  EXPECT_EQ(again.logprobs, before.logprobs);
}

TEST(EngineSleep, RefusesWhileRequestsWaitOrRun) {
  auto engine = make_engine();
  SamplingParams sp;
  sp.max_tokens = 6;
  sp.ignore_eos = true;
  const int64_t id = engine->add_request({5, 6, 7, 8, 9}, sp);
  try {
    engine->sleep();
    FAIL() << "sleep with a waiting request must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 waiting"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(engine->asleep());
  engine->step();  // now running, holding pages
  EXPECT_LT(engine->allocator().num_free(), engine->allocator().num_usable());
  try {
    engine->sleep();
    FAIL() << "sleep with a running request must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 running"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(engine->asleep());
  // Nothing changed: the request finishes as usual, then sleep works.
  while (engine->has_unfinished()) engine->step();
  EXPECT_EQ(engine->request(id).output.size(), 6u);
  expect_all_pages_free(*engine);
  engine->sleep();
  EXPECT_TRUE(engine->asleep());
}

TEST(EngineSleep, WakeWhileAwakeAndSleepTwiceAreErrors) {
  auto engine = make_engine();
  EXPECT_THROW(engine->wake_up(), Error);
  engine->sleep();
  try {
    engine->sleep();
    FAIL() << "a second sleep must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already asleep"), std::string::npos) << e.what();
  }
  engine->wake_up();
  try {
    engine->wake_up();
    FAIL() << "waking twice must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("awake"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(engine->asleep());
  expect_all_pages_free(*engine);
}

TEST(EngineSleep, RequestsWhileAsleepAreRejectedAndStepIsHarmless) {
  auto engine = make_engine();
  const Outputs before = run_workload(*engine);
  engine->sleep();
  SamplingParams sp;
  sp.max_tokens = 4;
  const int64_t id = engine->add_request({1, 2, 3}, sp);
  const Sequence& rejected = engine->request(id);
  EXPECT_TRUE(rejected.finished());
  EXPECT_EQ(rejected.finish_reason, FinishReason::kError);
  EXPECT_NE(rejected.error.find("asleep"), std::string::npos) << rejected.error;
  EXPECT_FALSE(engine->has_unfinished());
  EXPECT_TRUE(engine->step().empty());
  EXPECT_TRUE(engine->step().empty());
  expect_all_pages_free(*engine);
  engine->release(id);
  engine->wake_up();
  const Outputs after = run_workload(*engine);
  EXPECT_EQ(after.tokens, before.tokens);
  EXPECT_EQ(after.logprobs, before.logprobs);
}

TEST(EngineSleep, WeightUpdatesWhileAsleepAreRefusedAndChangeNothing) {
  auto engine = make_engine();
  const Outputs before = run_workload(*engine);
  for (bool offload : {false, true}) {
    engine->sleep(SleepOptions{offload});
    const std::vector<float> ones(static_cast<size_t>(engine->model().config().hidden_size), 1.0f);
    const NamedTensor norm{"model.norm.weight", ones.data(), TensorDType::kFloat32,
                           {engine->model().config().hidden_size}, TensorMemory::kHost};
    try {
      engine->update_weights({norm});
      ADD_FAILURE() << "an update while asleep must be refused (offload " << offload << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("call wake_up() first"), std::string::npos) << e.what();
    }
    EXPECT_EQ(engine->weights_version(), 0u);
    EXPECT_FALSE(engine->paused());
    engine->wake_up();
    const Outputs after = run_workload(*engine);
    EXPECT_EQ(after.tokens, before.tokens) << "offload " << offload;
    EXPECT_EQ(after.logprobs, before.logprobs) << "offload " << offload;
  }
}

TEST(EngineSleep, ScoringWhileAsleepIsRefusedAndWorksAfterWake) {
  auto engine = make_engine();
  const std::vector<std::vector<int32_t>> seqs = {{3, 1, 4, 1, 5}, {9, 2, 6}};
  const std::vector<ScoreOutput> before = engine->score(seqs);
  engine->sleep();
  try {
    engine->score(seqs);
    ADD_FAILURE() << "scoring while asleep must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("asleep"), std::string::npos) << e.what();
  }
  expect_all_pages_free(*engine);
  engine->wake_up();
  const std::vector<ScoreOutput> after = engine->score(seqs);
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i].logprobs, before[i].logprobs);
}

TEST(EngineSleep, BackendWithoutSleepSaysSo) {
  auto engine = make_engine(64, std::make_unique<SleeplessCpuBackend>());
  try {
    engine->sleep();
    FAIL() << "sleep on a backend without it must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot release"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(engine->asleep());
  EXPECT_THROW(engine->backend().sleep(false), Error);
  EXPECT_THROW(engine->backend().wake(), Error);
  run_workload(*engine);  // still serves
}

}  // namespace
}  // namespace pagellm
