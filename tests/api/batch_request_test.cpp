// parse_batch_request: each prompt form, overrides over the defaults, and a clear error for
// each kind of bad line; format_batch_result's shape.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "pagellm/pagellm.h"

namespace pagellm {
namespace {

TEST(BatchRequest, PromptFormsAndOverrides) {
  SamplingParams defaults;
  defaults.max_tokens = 7;
  defaults.temperature = 0.5f;
  BatchRequest a = parse_batch_request(R"({"prompt": "hi", "id": "a", "n": 2, "seed": 9,
      "stop": "x", "temperature": 0})", defaults);
  EXPECT_EQ(a.id, "a");
  EXPECT_EQ(a.prompt.kind, Prompt::Kind::kText);
  EXPECT_EQ(a.prompt.text, "hi");
  EXPECT_EQ(a.params.n, 2);
  EXPECT_EQ(a.params.seed, std::optional<uint64_t>(9));
  EXPECT_EQ(a.params.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(a.params.temperature, 0.0f);
  EXPECT_EQ(a.params.max_tokens, 7) << "the default is kept";
  BatchRequest b = parse_batch_request(R"({"prompt_token_ids": [1, 2], "id": 4,
      "stop_token_ids": [3], "max_tokens": 3})", defaults);
  EXPECT_EQ(b.id, "4");
  EXPECT_EQ(b.prompt.token_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(b.params.stop_token_ids, (std::vector<int32_t>{3}));
  EXPECT_FALSE(b.params.seed.has_value());
  BatchRequest c = parse_batch_request(R"({"messages": [{"role": "user", "content": "q"}],
      "chat_template_kwargs": {"enable_thinking": false}})", defaults);
  EXPECT_EQ(c.prompt.kind, Prompt::Kind::kChat);
  EXPECT_EQ(nlohmann::json::parse(c.prompt.chat_template_kwargs_json)["enable_thinking"], false);
}

void expect_error(const std::string& line, const std::string& message) {
  try {
    parse_batch_request(line, SamplingParams{});
    ADD_FAILURE() << "accepted " << line;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos)
        << line << " -> " << e.what();
  }
}

TEST(BatchRequest, BadLinesNameTheProblem) {
  expect_error("{\"prompt\": ", "not a JSON object");
  expect_error("[1]", "a request must be a JSON object, got array");
  expect_error("{}", "exactly one of \"prompt\" (text), \"prompt_token_ids\" or \"messages\", got 0");
  expect_error(R"({"prompt": "a", "prompt_token_ids": [1]})", "got 2");
  expect_error(R"({"prompt": 5})", "\"prompt\" must be a string, got number");
  expect_error(R"({"prompt_token_ids": [1, -2]})", "\"prompt_token_ids[1]\" must be in [0, ");
  expect_error(R"({"prompt": "a", "temperature": -1})", "temperature must be a finite number >= 0");
  expect_error(R"({"prompt": "a", "top_p": 2})", "top_p must be in (0, 1]");
  expect_error(R"({"prompt": "a", "max_tokens": 0})", "\"max_tokens\" must be in [1, ");
  expect_error(R"({"prompt": "a", "n": 0})", "\"n\" must be in [1, 65536], got 0");
  expect_error(R"({"prompt": "a", "seed": -1})", "\"seed\" must be an integer in [0, 2^64 - 1], got -1");
  expect_error(R"({"prompt": "a", "max_tokens": 2.5})", "\"max_tokens\" must be an integer, got 2.5");
  expect_error(R"({"prompt": "a", "stop": [1]})", "\"stop\" must be a string or an array of strings");
  expect_error(R"({"prompt": "a", "temprature": 1})", "unknown key \"temprature\"");
  expect_error(R"({"prompt": "a", "chat_template_kwargs": {}})", "goes with \"messages\"");
  expect_error("{\"prompt\": \"\xff\"}", "not a JSON object");
}

TEST(BatchRequest, TopLogprobsKeyAndResult) {
  const BatchRequest r = parse_batch_request(R"({"prompt_token_ids": [1], "logprobs": 3})", {});
  EXPECT_EQ(r.params.logprobs, 3);
  expect_error(R"({"prompt": "a", "logprobs": 21})", "\"logprobs\" must be in [0, 20]");
  expect_error(R"({"prompt": "a", "logprobs": 99999999999})", "got 99999999999");
  expect_error(R"({"prompt": "a", "logprobs": true})", "\"logprobs\" must be an integer");

  RequestOutput out;
  CompletionOutput o;
  o.token_ids = {5};
  o.logprobs = {-0.5f};
  o.top_logprobs = {{{5, -0.5f}, {2, -1.5f}}};
  o.logprob_ranks = {1};
  out.outputs = {o};
  const auto j = nlohmann::json::parse(format_batch_result(out, false));
  EXPECT_EQ(j["outputs"][0]["top_logprobs"][0][1]["token_id"], 2);
  EXPECT_EQ(j["outputs"][0]["top_logprobs"][0][1]["logprob"], -1.5);
  EXPECT_EQ(j["outputs"][0]["logprob_ranks"], nlohmann::json::parse("[1]"));
  EXPECT_FALSE(j["outputs"][0].contains("processed_top_logprobs"));
}

TEST(BatchRequest, ResultLineShape) {
  RequestOutput r;
  r.request_id = "q";
  r.prompt_token_ids = {1};
  CompletionOutput o;
  o.text = "hi";
  o.token_ids = {5, 6};
  o.logprobs = {-0.5f, -0.25f};
  o.cumulative_logprob = -0.75;
  o.finish_reason = FinishReason::kContextLimit;
  r.outputs = {o};
  r.finished = true;
  const auto j = nlohmann::json::parse(format_batch_result(r, false));
  EXPECT_EQ(j["id"], "q");
  EXPECT_EQ(j["outputs"][0]["finish_reason"], "length");
  EXPECT_EQ(j["outputs"][0]["finish_detail"], "context_limit");
  EXPECT_EQ(j["outputs"][0]["token_ids"], nlohmann::json::parse("[5,6]"));
  EXPECT_FALSE(j["outputs"][0].contains("processed_logprobs"));
  const auto e = nlohmann::json::parse(format_batch_error("7", 3, "bad"));
  EXPECT_EQ(e["error"]["line"], 3);
  EXPECT_EQ(e["error"]["message"], "bad");
}

}  // namespace
}  // namespace pagellm
