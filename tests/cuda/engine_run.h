// The CUDA engine tests' engine (a small random model with decode graphs) and a seeded run
// of it: six prompts of different lengths sampled at temperature 1 with fixed seeds, 20
// tokens each; the tokens and their log-probabilities.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "common/reference_qwen3.h"
#include "pagellm/engine/engine.h"
#include "pagellm/weight_broadcast.h"

namespace pagellm::test {

/// A cuda engine of config `c` with weights `w` on `device`: 16-token pages, 200 of them,
/// 8 sequences.
inline std::unique_ptr<Engine> make_cuda_engine(const Qwen3Config& c, const testing::HostWeights& w,
                                                int device = 0) {
  auto backend = create_backend("cuda", device);
  auto model = std::make_unique<Qwen3Model>(*backend, c, w.lookup());
  EngineConfig ec;
  ec.backend = "cuda";
  ec.page_size = 16;
  ec.num_pages = 200;
  ec.max_num_seqs = 8;
  ec.max_num_batched_tokens = 256;
  ec.max_model_len = 256;
  return std::make_unique<Engine>(std::move(backend), std::move(model), ec);
}

struct EngineRun {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logprobs;
};

/// Every tensor of `w` (float32 host data) as a trainer lists it for a broadcast and as the
/// same update given directly.
struct WeightUpdateOf {
  explicit WeightUpdateOf(const testing::HostWeights& w) {
    for (const auto& [name, values] : w.data) {
      list.push_back({name, TensorDType::kFloat32, w.shapes.at(name)});
      data.push_back(values.data());
      direct.push_back({name, values.data(), TensorDType::kFloat32, w.shapes.at(name),
                        TensorMemory::kHost});
    }
  }
  std::vector<BroadcastTensor> list;
  std::vector<const void*> data;
  std::vector<NamedTensor> direct;
};

inline EngineRun run_seeded(Engine& engine) {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p;
    for (int j = 0; j < 5 + 7 * i; ++j) p.push_back((j * 31 + i * 17) % 380 + 1);
    prompts.push_back(p);
    SamplingParams sp;
    sp.temperature = 1.0f;
    sp.seed = 900 + i;
    sp.max_tokens = 20;
    sp.ignore_eos = true;
    params.push_back(sp);
  }
  EngineRun run;
  for (const Sequence* s : engine.generate(prompts, params)) {
    EXPECT_EQ(s->finish_reason, FinishReason::kLength) << s->error;
    run.tokens.push_back(s->output);
    std::vector<float> lp;
    for (const SampledToken& t : s->sampled) lp.push_back(t.logprob);
    run.logprobs.push_back(lp);
    engine.release(s->id);
  }
  return run;
}

}  // namespace pagellm::test
