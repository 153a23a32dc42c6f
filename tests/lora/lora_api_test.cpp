// LoRA through the public API: LLM::generate with LoraRequests (loading on first use, one
// for all prompts or one per prompt), load / unload / list, and AsyncEngine::submit with an
// adapter giving what LLM gives.
#include <gtest/gtest.h>

#include "api/api_test_util.h"
#include "common/expect_error.h"
#include "model/model_test_util.h"
#include "pagellm/model/config.h"
#include "pagellm/model/lora.h"
#include "pagellm/pagellm.h"

namespace pagellm {
namespace {

testing::TinyModelCleanup cleanup;

EngineOptions small_engine() {
  EngineOptions o;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 128;
  o.max_model_len = 128;
  o.num_pages = 64;
  o.max_loras = 2;
  return o;
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 8;
  p.ignore_eos = true;
  return p;
}

TEST(LoraApi, GenerateWithAdapters) {
  const std::string model = testing::tiny_model_dir();
  const Qwen3Config mc = load_qwen3_config(model);
  testing::TempDir a, b;
  make_lora_adapter(a.path(), mc, testing::all_modules_lora_config(8), 1, DType::BF16, 0.5f);
  make_lora_adapter(b.path(), mc, testing::all_modules_lora_config(4), 2, DType::F32, 0.5f);
  LLM llm(model, small_engine());
  const std::vector<Prompt> prompts = {Prompt::from_token_ids({10, 20, 30, 40}),
                                       Prompt::from_token_ids({7, 8, 9})};
  const std::vector<SamplingParams> params = {greedy()};
  const auto base = llm.generate(prompts, params);

  // A request naming an adapter not loaded yet loads it from its path.
  const auto with_a = llm.generate(prompts, params, {LoraRequest{"a", 1, a.path()}});
  ASSERT_EQ(llm.list_lora_adapters().size(), 1u);
  EXPECT_EQ(llm.list_lora_adapters()[0].name, "a");
  EXPECT_EQ(llm.list_lora_adapters()[0].rank, 8);
  EXPECT_FLOAT_EQ(llm.list_lora_adapters()[0].scale, 2.0f);
  EXPECT_NE(with_a[0].outputs[0].token_ids, base[0].outputs[0].token_ids);

  // One per prompt: "" is the base model; a loaded name needs no path.
  const auto mixed =
      llm.generate(prompts, params, {LoraRequest{"", 0, ""}, LoraRequest{"a", 1, ""}});
  EXPECT_EQ(mixed[0].outputs[0].token_ids, base[0].outputs[0].token_ids);
  EXPECT_EQ(mixed[1].outputs[0].token_ids, with_a[1].outputs[0].token_ids);

  // Errors before any work: an unknown name without a path, a loaded name with another
  // path, a bad count, a bad folder.
  testing::expect_error(
      [&] { llm.generate(prompts, params, {LoraRequest{"nope", 0, ""}}); },
      "'nope' is not loaded and its request gives no path");
  testing::expect_error(
      [&] { llm.generate(prompts, params, {LoraRequest{"a", 1, b.path()}}); },
      "call load_lora_adapter to replace it");
  testing::expect_error(
      [&] {
        llm.generate(prompts, params,
                     {LoraRequest{"a", 1, ""}, LoraRequest{"a", 1, ""}, LoraRequest{"a", 1, ""}});
      },
      "3 LoRA requests for 2 prompts");
  testing::expect_error([&] { llm.load_lora_adapter({"c", 3, a.path() + "-absent"}); },
                        "is not a folder");

  // Replace in place, then unload.
  EXPECT_EQ(llm.load_lora_adapter({"a", 1, b.path()}).version, 2u);
  const auto replaced = llm.generate(prompts, params, {LoraRequest{"a", 1, ""}});
  EXPECT_NE(replaced[0].outputs[0].token_ids, with_a[0].outputs[0].token_ids);
  llm.unload_lora_adapter("a");
  EXPECT_TRUE(llm.list_lora_adapters().empty());
  testing::expect_error([&] { llm.unload_lora_adapter("a"); }, "no adapter named 'a'");
  EXPECT_EQ(llm.num_free_pages(), llm.num_usable_pages());

  // AsyncEngine: the same adapter gives the same tokens as LLM.
  AsyncEngine engine(model, small_engine());
  engine.load_lora_adapter({"b", 2, b.path()});
  auto stream = engine.submit(prompts[0], greedy(), "", "b");
  RequestOutput total, delta;
  while (stream->next(delta)) merge_delta(total, delta);
  EXPECT_EQ(total.outputs.at(0).token_ids, replaced[0].outputs[0].token_ids);
  auto unknown = engine.submit(prompts[0], greedy(), "", "zzz");
  RequestOutput bad;
  while (unknown->next(delta)) merge_delta(bad, delta);
  EXPECT_EQ(bad.outputs.at(0).finish_reason, FinishReason::kError);
  EXPECT_NE(bad.outputs.at(0).error.find("'zzz' is not loaded"), std::string::npos);
  ASSERT_EQ(engine.list_lora_adapters().size(), 1u);
  engine.unload_lora_adapter("b");
  EXPECT_TRUE(engine.list_lora_adapters().empty());
}

}  // namespace
}  // namespace pagellm
