// Weight updates through the public API: LLM::update_weights / load_weights give what an
// LLM loaded with the new weights gives; AsyncEngine's pause modes treat in-flight requests
// as documented (wait, abort, keep), requests submitted while paused run after resume, and
// every token reports the version it was sampled under; a bad update is refused whole.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <filesystem>

#include "api/api_test_util.h"
#include "pagellm/model/make_model.h"
#include "pagellm/model/weight_store.h"
#include "pagellm/pagellm.h"

namespace pagellm {
namespace {

EngineOptions options() {
  EngineOptions o;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 64;
  o.max_model_len = 128;
  o.num_pages = 96;
  return o;
}

// A second tiny model (other seed), same architecture as tiny_model_dir's, made on first
// use only (listing the tests must not make it).
std::string other_dir;  // defined before `cleanup`, so it outlives it

const std::string& other_weights_dir() {
  if (other_dir.empty()) {
    const std::filesystem::path d = std::filesystem::temp_directory_path() /
                                    ("pagellm-api-wu-" + std::to_string(::getpid()));
    MakeModelOptions opt;
    opt.preset = "tiny";
    opt.out_dir = d.string();
    opt.seed = 6;
    opt.dtype = DType::F32;
    make_model(opt);
    other_dir = d.string();
  }
  return other_dir;
}

struct Cleanup {
  ~Cleanup() {
    std::error_code ec;
    if (!other_dir.empty()) std::filesystem::remove_all(other_dir, ec);
  }
} cleanup;
testing::TinyModelCleanup tiny_cleanup;

std::vector<std::vector<int32_t>> prompts() { return {{5, 17, 300, 41}, {900, 2, 2, 2, 7}}; }

SamplingParams greedy(int max_tokens = 10) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

// An LLM over tiny_model_dir's config and tokenizer with the other model's weights: the
// reference that an updated engine must equal.
std::vector<RequestOutput> reference_outputs() {
  // Copy tiny_model_dir (tokenizer, aligned config) and replace its weights.
  const std::filesystem::path d = std::filesystem::temp_directory_path() /
                                  ("pagellm-api-wu-ref-" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::copy(testing::tiny_model_dir(), d);
  std::filesystem::copy_file(std::filesystem::path(other_weights_dir()) / "model.safetensors",
                             d / "model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  std::vector<RequestOutput> out;
  {
    LLM llm(d.string(), options());
    out = llm.generate(prompts(), greedy());
  }
  std::filesystem::remove_all(d);
  return out;
}

void expect_same_tokens(const std::vector<RequestOutput>& got,
                        const std::vector<RequestOutput>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].outputs[0].token_ids, want[i].outputs[0].token_ids) << "prompt " << i;
    EXPECT_EQ(got[i].outputs[0].logprobs, want[i].outputs[0].logprobs) << "prompt " << i;
  }
}

TEST(LlmWeightUpdate, LoadWeightsFromAFolderEqualsAFreshLoad) {
  const std::vector<RequestOutput> want = reference_outputs();
  LLM llm(testing::tiny_model_dir(), options());
  const std::vector<RequestOutput> before = llm.generate(prompts(), greedy());
  ASSERT_NE(before[0].outputs[0].token_ids, want[0].outputs[0].token_ids);
  for (uint64_t v : before[0].outputs[0].weights_versions) EXPECT_EQ(v, 0u);

  const WeightUpdateResult r = llm.load_weights(other_weights_dir());
  EXPECT_EQ(r.weights_version, 1u);
  EXPECT_EQ(llm.weights_version(), 1u);
  const std::vector<RequestOutput> after = llm.generate(prompts(), greedy());
  expect_same_tokens(after, want);
  EXPECT_EQ(after[0].weights_version, 1u);
  for (uint64_t v : after[0].outputs[0].weights_versions) EXPECT_EQ(v, 1u);
  EXPECT_EQ(llm.num_free_pages(), llm.num_usable_pages());
}

TEST(LlmWeightUpdate, NamedTensorsInTwoSubsetsEqualAFreshLoad) {
  const std::vector<RequestOutput> want = reference_outputs();
  const WeightStore store = WeightStore::open(other_weights_dir());
  std::vector<NamedTensor> first, second;
  for (const std::string& name : store.names()) {
    const HostTensor& t = store.get(name);
    NamedTensor n{name, t.data, TensorDType::kFloat32, t.shape, TensorMemory::kHost};
    (name.find("mlp") != std::string::npos ? first : second).push_back(n);
  }
  LLM llm(testing::tiny_model_dir(), options());
  EXPECT_EQ(llm.update_weights(first).tensors_updated, static_cast<int64_t>(first.size()));
  EXPECT_EQ(llm.update_weights(second).weights_version, 2u);
  expect_same_tokens(llm.generate(prompts(), greedy()), want);
}

TEST(LlmWeightUpdate, BadUpdateNamesEachProblemAndKeepsServing) {
  LLM llm(testing::tiny_model_dir(), options());
  const std::vector<RequestOutput> before = llm.generate(prompts(), greedy());
  const WeightStore store = WeightStore::open(other_weights_dir());
  const HostTensor& q = store.get("model.layers.0.self_attn.q_proj.weight");
  std::vector<NamedTensor> bad = {
      {q.name, q.data, TensorDType::kFloat32, q.shape, TensorMemory::kHost},  // fine alone
      {"model.layers.0.self_attn.qkv_proj.weight", q.data, TensorDType::kFloat32, q.shape,
       TensorMemory::kHost},
      {"model.layers.0.self_attn.k_proj.weight", q.data, TensorDType::kFloat32, q.shape,
       TensorMemory::kHost},
      {"model.norm.weight", q.data, TensorDType::kInt64, {64}, TensorMemory::kHost},
      {"model.layers.1.self_attn.o_proj.weight", q.data, TensorDType::kFloat32, {64, 128},
       static_cast<TensorMemory>(9)},
  };
  std::string msg;
  try {
    llm.update_weights(bad);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("4 problems"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'model.layers.0.self_attn.qkv_proj.weight': not a parameter"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("'model.layers.0.self_attn.k_proj.weight': shape [128, 64], expected [64, 64]"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("'model.norm.weight': dtype int64"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown memory kind 9"), std::string::npos) << msg;
  EXPECT_THROW(llm.load_weights("/nonexistent/folder"), Error);
  EXPECT_EQ(llm.weights_version(), 0u);
  expect_same_tokens(llm.generate(prompts(), greedy()), before);
  EXPECT_EQ(llm.num_free_pages(), llm.num_usable_pages());
}

// Submits long requests and waits until each has produced a token.
std::vector<std::shared_ptr<RequestStream>> start(AsyncEngine& engine, int count,
                                                  int max_tokens) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < count; ++i) {
    SamplingParams p = greedy(max_tokens);
    streams.push_back(engine.submit(Prompt::from_token_ids({int32_t(10 + i), 20, 30}), p));
  }
  return streams;
}

TEST(AsyncEngineWeightUpdate, PauseWaitLetsRunningRequestsFinishAndQueuesNewOnes) {
  AsyncEngine engine(testing::tiny_model_dir(), options());
  auto streams = start(engine, 3, 40);
  RequestOutput delta;
  ASSERT_TRUE(streams[0]->next(delta));  // running
  engine.pause(PauseMode::kWait);
  for (auto& s : streams) {
    // Finished and delivered before pause returned.
    const RequestOutput out = s->collect();
    EXPECT_EQ(out.outputs[0].finish_reason, FinishReason::kLength);
    EXPECT_EQ(out.outputs[0].token_ids.size(), 40u);
  }
  auto late = engine.submit(Prompt::from_token_ids({1, 2, 3}), greedy(4));
  EXPECT_FALSE(late->next(delta, std::chrono::milliseconds(200))) << "ran while paused";
  const WeightUpdateResult r = engine.load_weights(other_weights_dir());
  EXPECT_EQ(r.weights_version, 1u);
  EXPECT_EQ(engine.weights_version(), 1u);
  EXPECT_FALSE(late->next(delta, std::chrono::milliseconds(50))) << "the update resumed a pause it did not make";
  engine.resume();
  const RequestOutput out = late->collect();
  EXPECT_EQ(out.outputs[0].token_ids.size(), 4u);
  for (uint64_t v : out.outputs[0].weights_versions) EXPECT_EQ(v, 1u);
  EXPECT_EQ(engine.check_invariants_and_count_free_pages(), engine.num_usable_pages());
}

TEST(AsyncEngineWeightUpdate, AbortModeEndsInFlightRequests) {
  AsyncEngine engine(testing::tiny_model_dir(), options());
  auto streams = start(engine, 3, 100);
  RequestOutput delta;
  for (auto& s : streams) ASSERT_TRUE(s->next(delta));
  const WeightUpdateResult r = engine.load_weights(other_weights_dir(), PauseMode::kAbort);
  EXPECT_EQ(r.mode, PauseMode::kAbort);
  EXPECT_EQ(r.requests_aborted, 3);
  for (auto& s : streams) {
    const RequestOutput out = s->collect();
    EXPECT_EQ(out.outputs[0].finish_reason, FinishReason::kAborted);
    for (uint64_t v : out.outputs[0].weights_versions) EXPECT_EQ(v, 0u);
  }
  EXPECT_EQ(engine.check_invariants_and_count_free_pages(), engine.num_usable_pages());
  // Not paused afterwards: new requests run on the new weights.
  const RequestOutput fresh = engine.submit(Prompt::from_token_ids({1, 2}), greedy(3))->collect();
  for (uint64_t v : fresh.outputs[0].weights_versions) EXPECT_EQ(v, 1u);
}

TEST(AsyncEngineWeightUpdate, KeepModeReportsTheVersionOfEveryToken) {
  AsyncEngine engine(testing::tiny_model_dir(), options());
  auto streams = start(engine, 3, 60);
  RequestOutput delta;
  for (auto& s : streams) ASSERT_TRUE(s->next(delta));
  engine.pause(PauseMode::kKeep);  // frozen mid-generation
  const WeightUpdateResult r = engine.load_weights(other_weights_dir(), PauseMode::kKeep);
  EXPECT_EQ(r.mode, PauseMode::kKeep);
  EXPECT_EQ(r.requests_kept, 3);
  engine.resume();
  for (auto& s : streams) {
    const RequestOutput out = s->collect();
    const CompletionOutput& o = out.outputs[0];
    EXPECT_EQ(o.finish_reason, FinishReason::kLength);
    ASSERT_EQ(o.weights_versions.size(), 60u);
    EXPECT_EQ(o.weights_versions.front(), 0u);
    EXPECT_EQ(o.weights_versions.back(), 1u);
    EXPECT_TRUE(std::is_sorted(o.weights_versions.begin(), o.weights_versions.end()));
    EXPECT_EQ(out.weights_version, 1u);
  }
  EXPECT_EQ(engine.check_invariants_and_count_free_pages(), engine.num_usable_pages());
}

TEST(AsyncEngineWeightUpdate, BadUpdateIsRefusedAndTheEngineKeepsServing) {
  AsyncEngine engine(testing::tiny_model_dir(), options());
  auto streams = start(engine, 2, 30);
  NamedTensor wrong{"model.embed_tokens.weight", nullptr, TensorDType::kFloat32, {3, 3},
                    TensorMemory::kHost};
  EXPECT_THROW(engine.update_weights({wrong}, PauseMode::kKeep), Error);
  EXPECT_THROW(engine.update_weights({wrong}, PauseMode::kWait), Error);
  EXPECT_EQ(engine.weights_version(), 0u);
  for (auto& s : streams) {
    const RequestOutput out = s->collect();
    EXPECT_EQ(out.outputs[0].finish_reason, FinishReason::kLength);
  }
  EXPECT_NO_THROW(engine.resume()) << "not paused: resume is a no-op";
}

TEST(AsyncEngineWeightUpdate, IpcOnTheCpuBackendIsRefusedAndChangesNothing) {
  AsyncEngine engine(testing::tiny_model_dir(), options());
  auto streams = start(engine, 2, 20);
  IpcTensor t;
  t.name = "model.norm.weight";
  t.dtype = TensorDType::kFloat32;
  t.shape = {64};
  try {
    engine.update_weights_from_ipc({t}, PauseMode::kKeep);
    ADD_FAILURE() << "the cpu backend opened a CUDA IPC handle";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open CUDA IPC"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda backend"), std::string::npos) << e.what();
  }
  EXPECT_EQ(engine.weights_version(), 0u);
  for (auto& s : streams) {
    EXPECT_EQ(s->collect().outputs[0].finish_reason, FinishReason::kLength);
  }
  EXPECT_FALSE(engine.load().paused);
  EXPECT_EQ(engine.check_invariants_and_count_free_pages(), engine.num_usable_pages());
}

// A loopback port where nothing listens (bound, then closed).
int closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), len), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

TEST(AsyncEngineWeightUpdate, InterruptEndsAJoinWaitingForTheTrainerAndShutdownToo) {
  using Clock = std::chrono::steady_clock;
  // A trainer that never listens: the join would retry for 300 s.
  WeightGroupSpec spec;
  spec.transport = "tcp";
  spec.address = "127.0.0.1:" + std::to_string(closed_port());
  spec.timeout_seconds = 300;
  auto join_and_time = [&](AsyncEngine& engine, const std::function<void()>& stop) {
    std::string error;
    std::thread joiner([&] {
      try {
        engine.init_weight_group(spec);
      } catch (const Error& e) {
        error = e.what();
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // it is retrying now
    const auto start = Clock::now();
    stop();
    joiner.join();
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5.0);
    return error;
  };
  {
    AsyncEngine engine(testing::tiny_model_dir(), options());
    const std::string error =
        join_and_time(engine, [&] { engine.interrupt_weight_transfers(); });
    EXPECT_NE(error.find("was interrupted (the engine is shutting down)"), std::string::npos)
        << error;
    EXPECT_FALSE(engine.has_weight_group());
  }
  {
    // shutdown() alone: it does not wait out the join.
    AsyncEngine engine(testing::tiny_model_dir(), options());
    const std::string error = join_and_time(engine, [&] { engine.shutdown(); });
    EXPECT_NE(error.find("interrupted"), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace pagellm
