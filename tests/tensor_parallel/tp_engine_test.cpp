// Tensor parallelism across processes (docs/design.md, "Tensor parallelism"): an Engine of
// tensor_parallel_size 2 and 4 on the cpu backend (this process is rank 0, pagellm-worker
// processes the others, HostCommunicator between them) generates what one rank generates
// and scores the same; what cannot work is refused before any process starts; a worker that
// is missing, exits, never joins or is killed mid-run gives an Error naming the rank, and no
// worker process outlives its engine.
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

#include "common/expect_error.h"
#include "pagellm/engine/engine.h"
#include "pagellm/model/make_model.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;

const std::string& model_dir() {
  static const std::string dir = [] {
    const fs::path d = fs::temp_directory_path() / ("pagellm-tp-test-" + std::to_string(::getpid()));
    MakeModelOptions opt;
    opt.preset = "tiny";  // Hq 4, Hkv 2, I 192, V 1024: TP 2 divides KV heads, TP 4 replicates them
    opt.out_dir = d.string();
    opt.seed = 9;
    opt.dtype = DType::F32;
    make_model(opt);
    return d.string();
  }();
  return dir;
}

struct Cleanup : ::testing::Environment {
  void SetUp() override { ::setenv("PAGELLM_WORKER", PAGELLM_WORKER_PATH, 1); }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(fs::temp_directory_path() / ("pagellm-tp-test-" + std::to_string(::getpid())), ec);
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
  EXPECT_NE(error_of([&] { engine->update_weights({}); })
                .find("a weight update is not available with tensor parallelism"),
            std::string::npos);
  EXPECT_NE(error_of([&] { engine->load_weights(model_dir()); })
                .find("a weight update is not available with tensor parallelism"),
            std::string::npos);
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

}  // namespace
}  // namespace pagellm
