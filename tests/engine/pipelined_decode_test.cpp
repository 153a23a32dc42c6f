// Pipelined decode (EngineOptions::pipelined_decode_steps; docs/design.md, "Pipelined
// decode") on the CPU backend, a small random model: a step launched before the previous
// step's tokens reached the host, its input tokens fed by the backend, gives every request
// the same tokens and log-probabilities, bit for bit, as running step by step. Requests end
// inside a run of steps by length and by stop token (at positions taken from a first run),
// with min_tokens, aborted between steps, joined by a new request, short of pages; the
// bookkeeping is checked after every step and every page is free at the end.
//
// Both engines run in batch-invariant mode: a request that ends by a stop token keeps its
// row one step more when pipelined, so the batches have other row counts, and only the mode
// makes a row's bits independent of them.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <memory>
#include <utility>
#include <vector>

#include "common/reference_qwen3.h"
#include "pagellm/cpu/cpu_backend.h"
#include "pagellm/engine/engine.h"

namespace pagellm {
namespace {

/// Counts the tokens fed from a step in flight (Backend::feed_sampled_tokens).
class FeedCountingBackend : public CpuBackend {
 public:
  void feed_sampled_tokens(const SampleTicket& ticket, const std::vector<int32_t>& src_rows,
                           Tensor& token_ids) override {
    fed += static_cast<int64_t>(src_rows.size());
    CpuBackend::feed_sampled_tokens(ticket, src_rows, token_ids);
  }
  int64_t fed = 0;
};

struct EngineShape {
  int32_t pipelined = 1;
  int64_t num_pages = 512;
  int32_t page_size = 4;
  int32_t max_num_seqs = 8;
};

std::unique_ptr<Engine> make_engine(const EngineShape& s, FeedCountingBackend** backend_out) {
  Qwen3Config c = testing::small_config(false);
  c.max_position_embeddings = 4096;
  c.eos_token_id = 0;
  c.eos_token_ids = {0};
  testing::HostWeights w = testing::random_weights(c, 4242);
  auto backend = std::make_unique<FeedCountingBackend>();
  if (backend_out != nullptr) *backend_out = backend.get();
  auto model = std::make_unique<Qwen3Model>(*backend, c, w.lookup());
  EngineConfig ec;
  ec.page_size = s.page_size;
  ec.num_pages = s.num_pages;
  ec.max_num_seqs = s.max_num_seqs;
  ec.max_num_batched_tokens = 64;
  ec.max_model_len = 96;
  ec.batch_invariant = true;
  ec.pipelined_decode_steps = s.pipelined;
  return std::make_unique<Engine>(std::move(backend), std::move(model), ec);
}

std::vector<int32_t> prompt_of(int32_t length, int salt) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < length; ++i) p.push_back((i * 13 + salt * 29) % 90 + 1);
  return p;
}

SamplingParams params_of(int i, int max_tokens) {
  SamplingParams p;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  if (i % 2 == 1) {  // seeded sampling: the output index enters the random stream
    p.temperature = 0.8f;
    p.top_k = 20;
    p.seed = 100 + static_cast<uint64_t>(i);
  } else {
    p.temperature = 0.0f;
  }
  return p;
}

struct Result {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  FinishReason reason = FinishReason::kNone;
};

/// Steps `engine` until nothing is unfinished, checking the bookkeeping after each step;
/// `between(step)` runs between steps. Returns the results by request id, releasing each
/// request as soon as it finishes.
template <class Fn>
std::map<int64_t, Result> run(Engine& engine, Fn between) {
  std::map<int64_t, Result> results;
  for (int step = 0; engine.has_unfinished(); ++step) {
    if (step == 2000) {
      ADD_FAILURE() << "no progress after 2,000 steps";
      break;
    }
    between(step);
    for (int64_t id : engine.step()) {
      const Sequence& seq = engine.request(id);
      Result& r = results[id];
      r.tokens = seq.output;
      for (const SampledToken& t : seq.sampled) r.logprobs.push_back(t.logprob);
      r.reason = seq.finish_reason;
      engine.release(id);
    }
    engine.check_invariants();
  }
  EXPECT_EQ(engine.allocator().num_referenced(), 0) << "pages still held at the end";
  return results;
}

std::map<int64_t, Result> run(Engine& engine) {
  return run(engine, [](int) {});
}

void expect_same(const std::map<int64_t, Result>& want, const std::map<int64_t, Result>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [id, w] : want) {
    const auto it = got.find(id);
    ASSERT_NE(it, got.end()) << "request " << id << " never finished";
    EXPECT_EQ(w.tokens, it->second.tokens) << "request " << id;
    EXPECT_EQ(w.logprobs, it->second.logprobs) << "request " << id << " (bits)";
    EXPECT_EQ(w.reason, it->second.reason) << "request " << id;
  }
}

/// Eight requests of different lengths and sampling; request i's stop token (when
/// `stops`) is the token its first unstopped run produced at position 3 + 2i, so that
/// the requests end at different steps inside runs of pipelined steps.
void add_requests(Engine& engine, const std::map<int64_t, Result>* stops_from) {
  for (int i = 0; i < 8; ++i) {
    SamplingParams p = params_of(i, 10 + 5 * i);
    if (i == 5) p.min_tokens = 12;  // the ban depends on the output index
    if (stops_from != nullptr) {
      const Result& first = stops_from->at(i + 1);
      const size_t at = static_cast<size_t>(3 + 2 * i);
      if (at < first.tokens.size()) p.stop_token_ids = {first.tokens[at]};
    }
    const int64_t id = engine.add_request(prompt_of(3 + 7 * i, i), p);
    ASSERT_EQ(id, i + 1);
  }
}

TEST(PipelinedDecode, SameBitsAsStepByStepWhenRequestsEndInsideARun) {
  auto plain = make_engine({}, nullptr);
  add_requests(*plain, nullptr);
  const std::map<int64_t, Result> unstopped = run(*plain);

  for (int32_t steps : {2, 8}) {
    SCOPED_TRACE(::testing::Message() << "pipelined_decode_steps " << steps);
    auto sync = make_engine({}, nullptr);
    add_requests(*sync, &unstopped);
    const std::map<int64_t, Result> want = run(*sync);
    int stopped = 0;
    for (const auto& [id, r] : want) stopped += r.reason == FinishReason::kStopToken ? 1 : 0;
    ASSERT_GE(stopped, 3) << "the scenario needs requests that end by a stop token";
    EXPECT_EQ(sync->stats().pipelined_steps, 0);

    FeedCountingBackend* backend = nullptr;
    EngineShape s;
    s.pipelined = steps;
    auto piped = make_engine(s, &backend);
    add_requests(*piped, &unstopped);
    const std::map<int64_t, Result> got = run(*piped);
    expect_same(want, got);
    // Pipelining happened: steps launched ahead, their tokens fed on the "device", and
    // fewer engine steps than device steps.
    EXPECT_GT(piped->stats().pipelined_steps, 5);
    EXPECT_GE(backend->fed, piped->stats().pipelined_steps);
    EXPECT_GE(piped->stats().steps, sync->stats().steps);  // rows kept one step more
  }
}

TEST(PipelinedDecode, OutputsArriveSeveralTokensAStep) {
  EngineShape s;
  s.pipelined = 4;
  auto engine = make_engine(s, nullptr);
  SamplingParams p = params_of(0, 40);
  const int64_t id = engine->add_request(prompt_of(5, 1), p);
  size_t before = 0;
  size_t most = 0;
  while (engine->has_unfinished()) {
    engine->step();
    const size_t now = engine->request(id).output.size();
    most = std::max(most, now - before);
    before = now;
    engine->check_invariants();
  }
  EXPECT_EQ(engine->request(id).output.size(), 40u);
  EXPECT_EQ(most, 4u) << "a step runs up to pipelined_decode_steps decode steps";
}

// Engine::set_run_interrupt: asked before each step planned ahead; the run ends at the
// first true (AsyncEngine answers true while new requests, aborts or calls wait).
TEST(PipelinedDecode, AnInterruptEndsTheRunBeforeTheNextStepAhead) {
  EngineShape s;
  s.pipelined = 16;
  auto engine = make_engine(s, nullptr);
  const int64_t id = engine->add_request(prompt_of(5, 1), params_of(0, 60));
  while (engine->request(id).output.empty()) engine->step();  // the prefill
  int asked = 0;
  engine->set_run_interrupt([&] { return ++asked == 3; });
  const int64_t steps_before = engine->stats().steps;
  const size_t tokens_before = engine->request(id).output.size();
  engine->step();
  EXPECT_EQ(asked, 3);
  EXPECT_EQ(engine->stats().steps - steps_before, 3) << "two steps ahead, then the interrupt";
  EXPECT_EQ(engine->request(id).output.size(), tokens_before + 3);
  engine->set_run_interrupt(nullptr);
  engine->step();
  EXPECT_EQ(engine->request(id).output.size(), tokens_before + 3 + 16);
  engine->check_invariants();
}

// Stop strings pipeline (the API layer ends a sample at the token that completes one,
// however many a step brought: EngineCore.StopStringsEndPipelinedSamplesAtTheSameToken).
TEST(PipelinedDecode, RequestsThatNeedTheirTokensOnTheHostRunStepByStep) {
  for (int kind = 0; kind < 3; ++kind) {
    SCOPED_TRACE(::testing::Message() << "kind " << kind);
    EngineShape s;
    s.pipelined = 8;
    auto engine = make_engine(s, nullptr);
    SamplingParams p = params_of(0, 12);
    if (kind == 0) p.repetition_penalty = 1.3f;  // needs the previous token in its list
    if (kind == 1) p.logprobs = 3;               // top-k from the logits on the host
    if (kind == 2) p.stop = {"x"};               // the API layer's: pipelined all the same
    engine->add_request(prompt_of(6, 2), params_of(1, 12));
    engine->add_request(prompt_of(9, 3), p);
    run(*engine);
    if (kind == 2) {
      EXPECT_GT(engine->stats().pipelined_steps, 0);
    } else {
      EXPECT_EQ(engine->stats().pipelined_steps, 0);
    }
  }
}

TEST(PipelinedDecode, AbortsAndANewRequestBetweenSteps) {
  auto plain = make_engine({}, nullptr);
  add_requests(*plain, nullptr);
  const std::map<int64_t, Result> unstopped = run(*plain);

  // Between steps: request 3 aborted at step 3, a new request (id 9) added at step 5,
  // request 6 aborted at step 6. Engine steps mean other device steps in the two modes,
  // so the pipelined run is compared with each request run alone.
  EngineShape s;
  s.pipelined = 8;
  auto piped = make_engine(s, nullptr);
  add_requests(*piped, &unstopped);
  const std::map<int64_t, Result> got = run(*piped, [&](int step) {
    if (step == 3) piped->abort(3);
    if (step == 5) {
      EXPECT_EQ(piped->add_request(prompt_of(11, 9), params_of(9, 30)), 9);
    }
    if (step == 6) piped->abort(6);
  });
  EXPECT_GT(piped->stats().pipelined_steps, 0);
  EXPECT_EQ(got.count(3), 0u);
  EXPECT_EQ(piped->request(3).finish_reason, FinishReason::kAborted);
  EXPECT_EQ(got.size() + (got.count(6) ? 1 : 2), 9u);
  ASSERT_EQ(got.count(9), 1u);

  // Every request that was not aborted: the bits of the same request run alone.
  for (const auto& [id, r] : got) {
    if (r.reason == FinishReason::kAborted) continue;
    auto alone = make_engine({}, nullptr);
    SamplingParams p;
    std::vector<int32_t> prompt;
    if (id == 9) {
      p = params_of(9, 30);
      prompt = prompt_of(11, 9);
    } else {
      const int i = static_cast<int>(id - 1);
      p = params_of(i, 10 + 5 * i);
      if (i == 5) p.min_tokens = 12;
      const size_t at = static_cast<size_t>(3 + 2 * i);
      if (at < unstopped.at(id).tokens.size()) p.stop_token_ids = {unstopped.at(id).tokens[at]};
      prompt = prompt_of(3 + 7 * i, i);
    }
    const int64_t aid = alone->add_request(prompt, p);
    const std::map<int64_t, Result> want = run(*alone);
    EXPECT_EQ(want.at(aid).tokens, r.tokens) << "request " << id;
    EXPECT_EQ(want.at(aid).logprobs, r.logprobs) << "request " << id;
  }
}

TEST(PipelinedDecode, ShortOfPagesStillGivesTheSameTokens) {
  // 8 requests of 13 to 96 tokens (up to 24 pages of 4 tokens each), 49 usable pages:
  // preemptions.
  EngineShape small;
  small.num_pages = 50;
  auto sync = make_engine(small, nullptr);
  add_requests(*sync, nullptr);
  const std::map<int64_t, Result> want = run(*sync);
  ASSERT_GT(sync->stats().preemptions, 0) << "the pool is meant to be short";

  small.pipelined = 8;
  auto piped = make_engine(small, nullptr);
  add_requests(*piped, nullptr);
  const std::map<int64_t, Result> got = run(*piped);
  expect_same(want, got);
  EXPECT_GT(piped->stats().pipelined_steps, 0);
}

TEST(PipelinedDecode, RejectsAZeroStepCount) {
  EngineShape s;
  s.pipelined = 0;
  try {
    make_engine(s, nullptr);
    FAIL() << "pipelined_decode_steps = 0 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pipelined_decode_steps"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pagellm
