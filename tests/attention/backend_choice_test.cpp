// `--attention-backend` below the CLI: Backend::set_attention_backend's default (every
// backend without cuDNN) accepts auto and native and refuses cudnn clearly, and the engine
// passes EngineConfig::attention_backend to its backend before anything runs.
#include <gtest/gtest.h>

#include <string>

#include "common/expect_error.h"
#include "common/reference_qwen3.h"
#include "pagellm/backend/backend.h"
#include "pagellm/engine/engine.h"

namespace pagellm {
namespace {

using testing::error_of;

TEST(AttentionBackendChoice, CpuAcceptsAutoAndNativeAndRefusesCudnn) {
  auto backend = create_backend("cpu");
  EXPECT_EQ(error_of([&] { backend->set_attention_backend("auto"); }), "");
  EXPECT_EQ(error_of([&] { backend->set_attention_backend("native"); }), "");
  const std::string cudnn = error_of([&] { backend->set_attention_backend("cudnn"); });
  EXPECT_NE(cudnn.find("--attention-backend cudnn needs the cuda backend"), std::string::npos)
      << cudnn;
  EXPECT_NE(cudnn.find("the cpu backend"), std::string::npos) << cudnn;
  EXPECT_NE(cudnn.find("use auto or native"), std::string::npos) << cudnn;
  const std::string unknown = error_of([&] { backend->set_attention_backend("Native"); });
  EXPECT_NE(unknown.find("unknown attention backend 'Native' (expected auto, native or cudnn)"),
            std::string::npos)
      << unknown;
}

Engine make_engine(const std::string& attention_backend) {
  Qwen3Config c = testing::small_config();
  static const testing::HostWeights w = testing::random_weights(c, 11);
  auto backend = create_backend("cpu");
  auto model = std::make_unique<Qwen3Model>(*backend, c, w.lookup());
  EngineConfig ec;
  ec.num_pages = 64;
  ec.max_num_seqs = 4;
  ec.max_num_batched_tokens = 64;
  ec.max_model_len = 128;
  ec.attention_backend = attention_backend;
  return Engine(std::move(backend), std::move(model), ec);
}

TEST(AttentionBackendChoice, EnginePassesTheChoiceToItsBackend) {
  EXPECT_EQ(EngineConfig{}.attention_backend, "auto");
  const std::string cudnn = error_of([] { make_engine("cudnn"); });
  EXPECT_NE(cudnn.find("needs the cuda backend"), std::string::npos) << cudnn;
  const std::string unknown = error_of([] { make_engine("fast"); });
  EXPECT_NE(unknown.find("expected auto, native or cudnn"), std::string::npos) << unknown;
  // native and auto run the CPU backend's own attention: the same greedy tokens.
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 6;
  greedy.ignore_eos = true;
  std::vector<std::vector<int32_t>> outputs;
  for (const char* choice : {"native", "auto"}) {
    Engine engine = make_engine(choice);
    const auto done = engine.generate({{1, 2, 3, 4, 5}}, {greedy});
    ASSERT_EQ(done.size(), 1u);
    outputs.push_back(done[0]->output);
  }
  EXPECT_EQ(outputs[0].size(), 6u);
  EXPECT_EQ(outputs[0], outputs[1]);
}

}  // namespace
}  // namespace pagellm
