// Tensor parallelism across processes (docs/design.md, "Tensor parallelism"): an Engine of
// tensor_parallel_size 2 and 4 on the cpu backend (this process is rank 0, pagellm-worker
// processes the others, HostCommunicator between them) generates what one rank generates
// and scores the same; what cannot work is refused before any process starts; a worker that
// is missing, exits, never joins or is killed mid-run gives an Error naming the rank, and no
// worker process outlives its engine. Weight updates reach every rank: a folder that every
// rank loads, and a trainer's broadcast that every rank joins and receives, give what a fresh
// engine of those weights gives; a rejected update changes no rank.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <string>
#include <vector>

#include <thread>

#include "common/broadcast_update.h"
#include "common/expect_error.h"
#include "pagellm/engine/engine.h"
#include "pagellm/engine/weight_group.h"
#include "pagellm/model/make_model.h"
#include "pagellm/model/safetensors.h"
#include "pagellm/model/weight_store.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;

fs::path scratch_dir() {
  return fs::temp_directory_path() / ("pagellm-tp-test-" + std::to_string(::getpid()));
}

// A random tiny model under the scratch folder: Hq 4, Hkv 2, I 192, V 1024 (TP 2 divides the
// KV heads, TP 4 replicates them), an untied head.
std::string make_tiny(const std::string& name, uint64_t seed) {
  MakeModelOptions opt;
  opt.preset = "tiny";
  opt.out_dir = (scratch_dir() / name).string();
  opt.seed = seed;
  opt.dtype = DType::F32;
  make_model(opt);
  return opt.out_dir;
}

const std::string& model_dir() {
  static const std::string dir = make_tiny("a", 9);
  return dir;
}

// Other weights of the same architecture: what the weight updates load.
const std::string& other_model_dir() {
  static const std::string dir = make_tiny("b", 10);
  return dir;
}

struct Cleanup : ::testing::Environment {
  void SetUp() override { ::setenv("PAGELLM_WORKER", PAGELLM_WORKER_PATH, 1); }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(scratch_dir(), ec);
  }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new Cleanup);

EngineConfig config(int tp) {
  EngineConfig c;
  c.backend = "cpu";
  c.tensor_parallel_size = tp;
  c.num_pages = 64;
  c.page_size = 4;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 16;  // prompts of 20 tokens prefill in chunks
  c.max_model_len = 64;
  return c;
}

// No child process of this test is left, running or zombie.
void expect_no_children() {
  int status = 0;
  errno = 0;
  EXPECT_EQ(::waitpid(-1, &status, WNOHANG), -1) << "a child process is left";
  EXPECT_EQ(errno, ECHILD);
}

using testing::error_of;

struct RunResult {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logprobs;
  std::vector<ScoreOutput> scores;
};

// Greedy generation of ragged prompts (chunked prefill, decode, a fan-out of 3 samples that
// copies a shared page), then scoring.
RunResult run(int tp) {
  auto engine = Engine::create(model_dir(), config(tp));
  EXPECT_EQ(engine->tensor_parallel_size(), tp);
  EXPECT_EQ(engine->tensor_parallel_worker_pids().size(), static_cast<size_t>(tp - 1));
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 7;
  greedy.ignore_eos = true;
  std::vector<int64_t> ids;
  std::vector<int32_t> long_prompt;
  for (int i = 0; i < 20; ++i) long_prompt.push_back(5 + 37 * i % 900);
  ids.push_back(engine->add_request({3, 14, 15, 92}, greedy));
  ids.push_back(engine->add_request(long_prompt, greedy));
  ids.push_back(engine->add_request({7}, greedy));
  SamplingParams fan = greedy;
  fan.n = 3;
  for (int64_t id : engine->add_request_group({11, 12, 13, 14, 15, 16}, fan)) ids.push_back(id);
  while (engine->has_unfinished()) engine->step();
  EXPECT_GT(engine->stats().cow_page_copies, 0) << "the fan-out copied no page";
  RunResult r;
  for (int64_t id : ids) {
    const Sequence& s = engine->request(id);
    EXPECT_EQ(s.finish_reason, FinishReason::kLength) << s.error;
    r.tokens.push_back(s.output);
    std::vector<float> lp;
    for (const SampledToken& t : s.sampled) lp.push_back(t.logprob);
    r.logprobs.push_back(lp);
  }
  r.scores = engine->score({{1, 2, 3, 4, 5, 6, 7, 8, 9}, long_prompt}, {1, 5}, 3);
  return r;
}

TEST(TensorParallelEngine, GreedyOutputsAndScoresMatchOneRank) {
  const RunResult one = run(1);
  for (int tp : {2, 4}) {
    const RunResult split = run(tp);
    expect_no_children();
    ASSERT_EQ(split.tokens.size(), one.tokens.size());
    for (size_t i = 0; i < one.tokens.size(); ++i) {
      EXPECT_EQ(split.tokens[i], one.tokens[i]) << "TP " << tp << ", request " << i;
      ASSERT_EQ(split.logprobs[i].size(), one.logprobs[i].size());
      for (size_t k = 0; k < one.logprobs[i].size(); ++k) {
        EXPECT_NEAR(split.logprobs[i][k], one.logprobs[i][k], 1e-4)
            << "TP " << tp << ", request " << i << ", token " << k;
      }
    }
    ASSERT_EQ(split.scores.size(), one.scores.size());
    for (size_t i = 0; i < one.scores.size(); ++i) {
      EXPECT_EQ(split.scores[i].ranks, one.scores[i].ranks) << "TP " << tp;
      ASSERT_EQ(split.scores[i].logprobs.size(), one.scores[i].logprobs.size());
      for (size_t k = 0; k < one.scores[i].logprobs.size(); ++k) {
        EXPECT_NEAR(split.scores[i].logprobs[k], one.scores[i].logprobs[k], 1e-4)
            << "TP " << tp << ", score " << i << ", position " << k;
      }
      ASSERT_EQ(split.scores[i].top_logprobs.size(), one.scores[i].top_logprobs.size());
      for (size_t k = 0; k < one.scores[i].top_logprobs.size(); ++k) {
        for (size_t j = 0; j < one.scores[i].top_logprobs[k].size(); ++j) {
          EXPECT_EQ(split.scores[i].top_logprobs[k][j].token_id, one.scores[i].top_logprobs[k][j].token_id);
        }
      }
    }
  }
}

TEST(TensorParallelEngine, SizeThatDoesNotDivideIsRefusedBeforeSpawning) {
  // A worker path that would fail if anything were spawned: the error must be the plan's.
  ::setenv("PAGELLM_WORKER", "/nonexistent/pagellm-worker", 1);
  const std::string error = error_of([] { Engine::create(model_dir(), config(3)); });
  ::setenv("PAGELLM_WORKER", PAGELLM_WORKER_PATH, 1);
  EXPECT_NE(error.find("tensor parallel size 3 does not fit this model"), std::string::npos) << error;
  expect_no_children();
  // Refused options, before spawning too.
  EngineConfig f32 = config(2);
  f32.float32_head = true;
  EXPECT_NE(error_of([&] { Engine::create(model_dir(), f32); }).find("float32 head is not available"),
            std::string::npos);
  expect_no_children();
}

TEST(TensorParallelEngine, MissingWorkerIsAClearError) {
  ::setenv("PAGELLM_WORKER", "/nonexistent/pagellm-worker", 1);
  std::string error = error_of([] { Engine::create(model_dir(), config(2)); });
  EXPECT_NE(error.find("PAGELLM_WORKER=/nonexistent/pagellm-worker is not an executable file"),
            std::string::npos)
      << error;
  // Without the variable: the places searched are named (this test's folder has none).
  ::unsetenv("PAGELLM_WORKER");
  error = error_of([] { Engine::create(model_dir(), config(2)); });
  ::setenv("PAGELLM_WORKER", PAGELLM_WORKER_PATH, 1);
  EXPECT_NE(error.find("pagellm-worker program"), std::string::npos) << error;
  EXPECT_NE(error.find("was not found; looked for /"), std::string::npos) << error;
  EXPECT_NE(error.find("set PAGELLM_WORKER"), std::string::npos) << error;
  expect_no_children();
}

// A stand-in worker: a shell script.
std::string script(const std::string& name, const std::string& body) {
  const fs::path p = fs::temp_directory_path() /
                     ("pagellm-tp-" + name + "-" + std::to_string(::getpid()) + ".sh");
  std::ofstream(p) << "#!/bin/sh\n" << body << "\n";
  fs::permissions(p, fs::perms::owner_all);
  return p.string();
}

TEST(TensorParallelEngine, WorkerThatExitsOrNeverJoinsIsNamed) {
  const std::string exits = script("exits", "exit 3");
  ::setenv("PAGELLM_WORKER", exits.c_str(), 1);
  std::string error = error_of([] { Engine::create(model_dir(), config(2)); });
  EXPECT_NE(error.find("tensor-parallel rank 1 ("), std::string::npos) << error;
  EXPECT_NE(error.find("exited with status 3 before it joined"), std::string::npos) << error;
  expect_no_children();

  const std::string sleeps = script("sleeps", "sleep 30");
  ::setenv("PAGELLM_WORKER", sleeps.c_str(), 1);
  EngineConfig c = config(3);
  c.max_num_seqs = 2;
  c.tensor_parallel_join_timeout_ms = 400;
  c.tensor_parallel_size = 2;
  error = error_of([&] { Engine::create(model_dir(), c); });
  ::setenv("PAGELLM_WORKER", PAGELLM_WORKER_PATH, 1);
  EXPECT_NE(error.find("tensor-parallel rank(s) 1 (pid "), std::string::npos) << error;
  EXPECT_NE(error.find("did not join within 0.4 s"), std::string::npos) << error;
  expect_no_children();  // killed and reaped
  fs::remove(exits);
  fs::remove(sleeps);
}

TEST(TensorParallelEngine, KilledWorkerFailsTheNextStepNamingItsRank) {
  auto engine = Engine::create(model_dir(), config(2));
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 3;
  engine->generate({{1, 2, 3}}, {greedy});  // the group works
  const pid_t worker = engine->tensor_parallel_worker_pids().at(0);
  ASSERT_EQ(::kill(worker, SIGKILL), 0);
  engine->add_request({4, 5, 6}, greedy);
  const std::string error = error_of([&] {
    while (engine->has_unfinished()) engine->step();
  });
  EXPECT_NE(error.find("tensor-parallel rank 1"), std::string::npos) << error;
  EXPECT_NE(error.find("killed by signal 9"), std::string::npos) << error;
  // Later calls fail the same way, at once.
  const std::string again = error_of([&] { engine->step(); });
  EXPECT_NE(again.find("rank 1"), std::string::npos) << again;
  engine.reset();  // the leader survives, and reaps
  expect_no_children();
}

TEST(TensorParallelEngine, RefusesWhatIsNotBuiltForTensorParallelism) {
  auto engine = Engine::create(model_dir(), config(2));
  const std::vector<pid_t> pids = engine->tensor_parallel_worker_pids();
  ASSERT_EQ(pids.size(), 1u);
  EXPECT_EQ(::kill(pids[0], 0), 0) << "the worker runs";
  EXPECT_NE(error_of([&] { engine->load_lora_adapter(LoraRequest{"a", 1, "/tmp"}); })
                .find("LoRA is not available with tensor parallelism yet (this engine runs 2 ranks"),
            std::string::npos);
  EXPECT_NE(error_of([&] { engine->sleep(); }).find("sleep is not available with tensor parallelism"),
            std::string::npos);
  // Tensors in this process's memory cannot reach the workers (a folder or a broadcast can).
  const std::string memory = error_of([&] { engine->update_weights({}); });
  EXPECT_NE(memory.find("from tensors in this process's memory is not available with tensor "
                        "parallelism"),
            std::string::npos)
      << memory;
  EXPECT_NE(memory.find("load_weights"), std::string::npos) << memory;
  // The group still works after the refusals: nothing was sent.
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 2;
  EXPECT_EQ(engine->generate({{1, 2}}, {greedy})[0]->output.size(), 2u);
  engine.reset();
  // Reaped: the pid is no longer our child.
  errno = 0;
  EXPECT_EQ(::kill(pids[0], 0), -1);
  EXPECT_EQ(errno, ESRCH);
  expect_no_children();
}


// ---- weight updates at TP > 1 ------------------------------------------------------------

struct Greedy {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logprobs;
};

Greedy greedy_run(Engine& engine) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 6;
  greedy.ignore_eos = true;
  std::vector<int32_t> long_prompt;
  for (int i = 0; i < 20; ++i) long_prompt.push_back(5 + 41 * i % 1000);
  Greedy g;
  for (const auto& seq : engine.generate({{3, 14, 15, 92}, long_prompt, {7}}, {greedy})) {
    EXPECT_EQ(seq->finish_reason, FinishReason::kLength) << seq->error;
    g.tokens.push_back(seq->output);
    std::vector<float> lp;
    for (const SampledToken& t : seq->sampled) lp.push_back(t.logprob);
    g.logprobs.push_back(lp);
  }
  return g;
}

void expect_same_run(const Greedy& got, const Greedy& want, const std::string& what) {
  ASSERT_EQ(got.tokens, want.tokens) << what;
  for (size_t i = 0; i < want.logprobs.size(); ++i) {
    for (size_t k = 0; k < want.logprobs[i].size(); ++k) {
      EXPECT_NEAR(got.logprobs[i][k], want.logprobs[i][k], 1e-4)
          << what << ", request " << i << ", token " << k;
    }
  }
}

TEST(TensorParallelWeights, LoadingAFolderEqualsAFreshEngineOfIt) {
  auto fresh = Engine::create(other_model_dir(), config(1));
  const Greedy want = greedy_run(*fresh);
  const size_t tensors = WeightStore::open(other_model_dir()).names().size();
  for (int tp : {2, 4}) {
    auto engine = Engine::create(model_dir(), config(tp));
    ASSERT_NE(greedy_run(*engine).tokens, want.tokens) << "the two models must differ";
    const WeightUpdateResult r = engine->load_weights(other_model_dir());
    EXPECT_EQ(r.weights_version, 1u);
    EXPECT_EQ(r.tensors_updated, static_cast<int64_t>(tensors));
    expect_same_run(greedy_run(*engine), want, "TP " + std::to_string(tp) + " after loading");
    engine.reset();
    expect_no_children();
  }
}

TEST(TensorParallelWeights, RejectedFolderChangesNoRank) {
  auto engine = Engine::create(model_dir(), config(2));
  const Greedy before = greedy_run(*engine);
  // One tensor of a wrong shape: rank 0's checks refuse the folder before any rank writes.
  const fs::path bad = scratch_dir() / "bad.safetensors";
  const std::vector<float> three = {1.0f, 2.0f, 3.0f};
  write_safetensors(bad.string(), {TensorToWrite::from_memory("model.norm.weight", DType::F32,
                                                              {3}, three.data())});
  const std::string error = error_of([&] { engine->load_weights(bad.string()); });
  EXPECT_NE(error.find("bad.safetensors"), std::string::npos) << error;
  EXPECT_NE(error.find("shape [3], expected"), std::string::npos) << error;
  EXPECT_EQ(engine->weights_version(), 0u);
  engine->reset_prefix_cache();
  expect_same_run(greedy_run(*engine), before, "after the rejected folder");
}

// A folder's tensors as a trainer sends them (host float32; the store keeps them).
struct TrainerTensors {
  explicit TrainerTensors(const std::string& dir) : store(WeightStore::open(dir)) {
    for (const NamedTensor& t : named_tensors_of(store)) {
      list.push_back({t.name, t.dtype, t.shape});
      data.push_back(t.data);
    }
  }
  WeightStore store;
  std::vector<BroadcastTensor> list;
  std::vector<const void*> data;
};

// A trainer (TcpWeightSender) whose group a TP 2 engine joins: the trainer and both ranks.
struct TcpTrainer {
  explicit TcpTrainer(Engine& engine) : sender("127.0.0.1", 0, 3, "rl") {
    WeightGroupSpec spec = this->spec();
    std::thread accept([&] { sender.accept(20'000); });
    engine.join_weight_group(spec);
    accept.join();
  }
  WeightGroupSpec spec() const {
    WeightGroupSpec spec;
    spec.transport = "tcp";
    spec.address = sender.address();
    spec.rank = 1;
    spec.world_size = 3;
    spec.name = "rl";
    spec.timeout_seconds = 20;
    return spec;
  }
  // The trainer sends `sent` while the engine receives `told` (the same list unless given).
  WeightUpdateResult update(Engine& engine, const TrainerTensors& sent, uint64_t bucket_bytes,
                            const std::vector<BroadcastTensor>* told = nullptr) {
    return testing::broadcast_update(engine, sender, sent.list, sent.data,
                                     told ? *told : sent.list, bucket_bytes);
  }
  TcpWeightSender sender;
};

TEST(TensorParallelWeights, BroadcastReachesEveryRankAndEqualsAFreshEngine) {
  auto fresh_b = Engine::create(other_model_dir(), config(1));
  const Greedy want_b = greedy_run(*fresh_b);
  auto engine = Engine::create(model_dir(), config(2));
  const Greedy want_a = greedy_run(*engine);

  // The trainer's world must hold both ranks (1 and 2): a world of 2 is refused up front.
  {
    TcpWeightSender small("127.0.0.1", 0, 2);
    WeightGroupSpec spec;
    spec.transport = "tcp";
    spec.address = small.address();
    const std::string error = error_of([&] { engine->join_weight_group(spec); });
    EXPECT_NE(error.find("2 tensor-parallel ranks join as ranks 1 .. 2 of world size 2"),
              std::string::npos)
        << error;
    EXPECT_EQ(engine->weight_group(), nullptr);
  }
  TcpTrainer trainer(*engine);
  ASSERT_NE(engine->weight_group(), nullptr);
  const TrainerTensors b(other_model_dir()), a(model_dir());
  // Small buckets: tensors split across many, o_proj and down whole in others.
  ASSERT_GT(plan_broadcast_buckets(b.list, 3000).size(), 10u);
  WeightUpdateResult r = trainer.update(*engine, b, 3000);
  EXPECT_EQ(r.weights_version, 1u);
  EXPECT_EQ(r.tensors_updated, static_cast<int64_t>(b.list.size()));
  expect_same_run(greedy_run(*engine), want_b, "after the broadcast");

  // A rejected update: every rank drains the buckets; nothing changes; the group stays in step.
  std::vector<BroadcastTensor> wrong = a.list;
  wrong[3].name = "model.layers.99.mlp.up_proj.weight";
  const std::string error = error_of([&] { trainer.update(*engine, a, 4096, &wrong); });
  EXPECT_NE(error.find("model.layers.99.mlp.up_proj.weight"), std::string::npos) << error;
  EXPECT_NE(error.find("received and dropped"), std::string::npos) << error;
  EXPECT_EQ(engine->weights_version(), 1u);
  engine->reset_prefix_cache();
  expect_same_run(greedy_run(*engine), want_b, "after the rejected broadcast");

  // Back to A in one bucket.
  EXPECT_EQ(trainer.update(*engine, a, uint64_t{1} << 30).weights_version, 2u);
  expect_same_run(greedy_run(*engine), want_a, "after the second broadcast");
  engine->leave_weight_group();
  EXPECT_EQ(engine->weight_group(), nullptr);
  engine.reset();
  expect_no_children();
}

TEST(TensorParallelWeights, TrainerLeavingMidwayLeavesEveryRankAtTheSameBucket) {
  auto engine = Engine::create(model_dir(), config(2));
  const TrainerTensors b(other_model_dir());
  {
    TcpTrainer trainer(*engine);
    // The trainer sends the first three tensors' buckets to both ranks, then goes away.
    TrainerTensors head(other_model_dir());
    head.list.resize(3);
    head.data.resize(3);
    std::thread sending([&] {
      trainer.sender.send(head.list, head.data, 1);  // bucket_bytes 1: a tensor per bucket
      trainer.sender.close();
    });
    const std::string error = error_of([&] { engine->update_weights_from_broadcast(b.list, 1); });
    sending.join();
    EXPECT_NE(error.find("after 3 of " + std::to_string(b.list.size()) + " buckets"),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("rank 0: weight group: the trainer at"), std::string::npos) << error;
    EXPECT_NE(error.find("rank 1: weight group: the trainer at"), std::string::npos) << error;
    EXPECT_EQ(engine->weights_version(), 1u);  // part of the weights changed, alike on both
    EXPECT_EQ(engine->weight_group(), nullptr);
  }
  // Not failed: the ranks agree, so the group generates, joins again and takes the update.
  greedy_run(*engine);
  TcpTrainer again(*engine);
  EXPECT_EQ(again.update(*engine, b, 1 << 20).weights_version, 2u);
  auto fresh = Engine::create(other_model_dir(), config(1));
  expect_same_run(greedy_run(*engine), greedy_run(*fresh), "after joining again");
}

}  // namespace
}  // namespace pagellm
