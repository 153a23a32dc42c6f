// The server's wire formats without sockets: each bad field is named with a 400 (404 for
// another model), the sampling fields reach SamplingParams, and responses, chunks and error
// objects have the shapes the openai client parses.
#include <gtest/gtest.h>

#include "pagellm/server/metrics.h"
#include "pagellm/server/protocol.h"

namespace pagellm::server {
namespace {

using nlohmann::json;

const ProtocolContext kCtx{"tiny", 256, {}, "", "", false};

HttpError error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const HttpError& e) {
    return e;
  }
  ADD_FAILURE() << "no HttpError thrown";
  return HttpError(0, "");
}

HttpError completion_error(const std::string& body) {
  return error_of([&] { parse_completion_request(body, kCtx); });
}

TEST(ServerProtocol, CompletionFieldsReachSamplingParams) {
  const OpenAiRequest r = parse_completion_request(
      R"({"model": "tiny", "prompt": "hi", "n": 3, "max_tokens": 7, "temperature": 0.5,
          "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1,
          "presence_penalty": 0.2, "frequency_penalty": 0.3, "seed": 18446744073709551615,
          "stop": ["a", "b"], "stop_token_ids": [5, 6], "logprobs": 3, "stream": true,
          "stream_options": {"include_usage": true}, "return_token_ids": true, "user": "x"})",
      kCtx);
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].kind, Prompt::Kind::kText);
  EXPECT_EQ(r.prompts[0].text, "hi");
  EXPECT_EQ(r.params.n, 3);
  EXPECT_EQ(r.params.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.params.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.params.top_p, 0.9f);
  EXPECT_EQ(r.params.top_k, 40);
  EXPECT_FLOAT_EQ(r.params.min_p, 0.05f);
  EXPECT_FLOAT_EQ(r.params.repetition_penalty, 1.1f);
  EXPECT_FLOAT_EQ(r.params.presence_penalty, 0.2f);
  EXPECT_FLOAT_EQ(r.params.frequency_penalty, 0.3f);
  EXPECT_EQ(r.params.seed, std::optional<uint64_t>(18446744073709551615ull));
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.params.stop_token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(r.params.logprobs, 3);
  EXPECT_EQ(r.logprobs, std::optional<int>(3));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.return_token_ids);
}

TEST(ServerProtocol, EveryPromptShape) {
  EXPECT_EQ(parse_completion_request(R"({"prompt": ["a", "b"]})", kCtx).prompts.size(), 2u);
  const OpenAiRequest ids = parse_completion_request(R"({"prompt": [1, 2, 3]})", kCtx);
  ASSERT_EQ(ids.prompts.size(), 1u);
  EXPECT_EQ(ids.prompts[0].token_ids, (std::vector<int32_t>{1, 2, 3}));
  const OpenAiRequest lists = parse_completion_request(R"({"prompt": [[1], [2, 3]]})", kCtx);
  ASSERT_EQ(lists.prompts.size(), 2u);
  EXPECT_EQ(lists.prompts[1].token_ids, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(parse_completion_request(R"({"prompt": "x"})", kCtx).params.max_tokens, 16);
}

TEST(ServerProtocol, BadFieldsAreNamed) {
  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({"prompt": "x", "temperature": "hot"})", "temperature"},
      {R"({"prompt": "x", "n": 0})", "n"},
      {R"({"prompt": "x", "n": 1.5})", "n"},
      {R"({"prompt": "x", "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": "x", "seed": -1})", "seed"},
      {R"({"prompt": "x", "stop": 3})", "stop"},
      {R"({"prompt": "x", "stop": [""]})", "stop"},
      {R"({"prompt": "x", "stop_token_ids": [-2]})", "stop_token_ids"},
      {R"({"prompt": "x", "logprobs": 21})", "logprobs"},
      {R"({"prompt": "x", "stream": "yes"})", "stream"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"prompt": "x", "logit_bias": {"1": 2}})", "logit_bias"},
      {R"({"prompt": "x", "prompt_logprobs": 21})", "prompt_logprobs"},
      {R"({"prompt": "x", "prompt_logprobs": -1})", "prompt_logprobs"},
      {R"({"prompt": []})", "prompt"},
      {R"({"prompt": [1, "a"]})", "prompt"},
      {R"({"prompt": {"a": 1}})", "prompt"},
      {R"({})", "prompt"},
  };
  for (const Case& c : cases) {
    const HttpError e = completion_error(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_NE(std::string(e.what()).find(c.param), std::string::npos) << e.what();
  }
  EXPECT_EQ(completion_error("not json").status, 400);
  EXPECT_EQ(completion_error("[1]").status, 400);
  const HttpError other = completion_error(R"({"model": "gpt-4", "prompt": "x"})");
  EXPECT_EQ(other.status, 404);
  EXPECT_EQ(other.param, "model");
}

TEST(ServerProtocol, ChatRequest) {
  const OpenAiRequest r = parse_chat_request(
      R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5,
          "logprobs": true, "top_logprobs": 2,
          "chat_template_kwargs": {"enable_thinking": false}})",
      kCtx);
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].kind, Prompt::Kind::kChat);
  EXPECT_EQ(json::parse(r.prompts[0].chat_template_kwargs_json)["enable_thinking"], false);
  EXPECT_EQ(r.params.max_tokens, 5);
  EXPECT_EQ(r.logprobs, std::optional<int>(2));
  // Without a limit: up to max_model_len (the engine ends the sample at the context limit).
  EXPECT_EQ(parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}]})", kCtx)
                .params.max_tokens,
            256);
  const auto chat_error = [](const std::string& body) {
    return error_of([&] { parse_chat_request(body, kCtx); });
  };
  EXPECT_EQ(chat_error(R"({"messages": []})").param, "messages");
  EXPECT_EQ(chat_error(R"({"messages": [{"content": "x"}]})").param, "messages");
  EXPECT_EQ(chat_error(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})")
                .param,
            "top_logprobs");
  EXPECT_EQ(chat_error(R"({"messages": [{"role": "user", "content": "x"}],
                          "chat_template_kwargs": 1})")
                .param,
            "chat_template_kwargs");
}

TEST(ServerProtocol, GenerateRequest) {
  const GenerateRequest g = parse_generate_request(
      R"({"prompt_token_ids": [4, 5], "stream": true,
          "sampling_params": {"max_tokens": 3, "logprobs": 2, "processed_logprobs": true}})");
  EXPECT_EQ(g.prompt_token_ids, (std::vector<int32_t>{4, 5}));
  EXPECT_TRUE(g.stream);
  EXPECT_EQ(g.params.max_tokens, 3);
  EXPECT_EQ(g.params.logprobs, 2);
  EXPECT_TRUE(g.params.processed_logprobs);
  const HttpError e = error_of([] {
    parse_generate_request(R"({"prompt_token_ids": [1], "sampling_params": {"top_k": "a"}})");
  });
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "sampling_params.top_k");
  EXPECT_EQ(error_of([] { parse_generate_request(R"({"prompt_token_ids": "abc"})"); }).param,
            "prompt_token_ids");
}

DecodeFn fake_decode() {
  return [](const std::vector<int32_t>& ids, bool) {
    std::string s;
    for (int32_t id : ids) s += "<" + std::to_string(id) + ">";
    return s;
  };
}

RequestOutput sample_output() {
  RequestOutput o;
  o.prompt_token_ids = {1, 2};
  o.prompt = "P";
  for (int i = 0; i < 2; ++i) {
    CompletionOutput c;
    c.index = 1 - i;  // out of order: the response sorts choices by index
    c.text = i == 0 ? "B" : "A";
    c.token_ids = {10 + i};
    c.logprobs = {-0.5f};
    c.top_logprobs = {{{10 + i, -0.5f}, {7, -1.0f}}};
    c.finish_reason = FinishReason::kLength;
    o.outputs.push_back(c);
  }
  return o;
}

TEST(ServerProtocol, ModelSelectsALoadedAdapter) {
  ProtocolContext ctx = kCtx;
  ctx.has_adapter = [](const std::string& name) { return name == "sql"; };
  EXPECT_EQ(parse_completion_request(R"({"model": "sql", "prompt": "hi"})", ctx).lora, "sql");
  EXPECT_EQ(parse_chat_request(R"({"model": "sql", "messages": [{"role": "user", "content": "x"}]})",
                               ctx).lora,
            "sql");
  EXPECT_EQ(parse_completion_request(R"({"model": "tiny", "prompt": "hi"})", ctx).lora, "");
  EXPECT_EQ(parse_completion_request(R"({"prompt": "hi"})", ctx).lora, "");
  const HttpError e =
      error_of([&] { parse_completion_request(R"({"model": "math", "prompt": "hi"})", ctx); });
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.param, "model");
  EXPECT_NE(std::string(e.what()).find("`math`"), std::string::npos) << e.what();
}

TEST(ServerProtocol, LoraControlBodies) {
  const LoadLoraRequest r =
      parse_load_lora_request(R"({"lora_name": "sql", "lora_path": "/a/b", "lora_int_id": 7})");
  EXPECT_EQ(r.name, "sql");
  EXPECT_EQ(r.path, "/a/b");
  EXPECT_EQ(r.id, 7);
  EXPECT_EQ(parse_unload_lora_request(R"({"lora_name": "sql"})"), "sql");
  struct Case {
    std::string body, param;
  };
  for (const Case& c : std::vector<Case>{{R"({"lora_path": "/a"})", "lora_name"},
                                         {R"({"lora_name": "", "lora_path": "/a"})", "lora_name"},
                                         {R"({"lora_name": 3, "lora_path": "/a"})", "lora_name"},
                                         {R"({"lora_name": "x"})", "lora_path"},
                                         {R"({"lora_name": "x", "lora_path": "/a", "lora_int_id": "1"})",
                                          "lora_int_id"}}) {
    const HttpError e = error_of([&] { parse_load_lora_request(c.body); });
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_NE(std::string(e.what()).find(c.param), std::string::npos) << e.what();
  }
  EXPECT_EQ(error_of([] { parse_unload_lora_request("{}"); }).param, "lora_name");
  EXPECT_EQ(error_of([] { parse_unload_lora_request("[1]"); }).status, 400);
}

TEST(ServerProtocol, GenerateLoraName) {
  EXPECT_EQ(parse_generate_request(R"({"prompt_token_ids": [1], "lora_name": "sql"})").lora_name, "sql");
  EXPECT_EQ(parse_generate_request(R"({"prompt_token_ids": [1], "lora_name": null})").lora_name, "");
  EXPECT_EQ(error_of([] { parse_generate_request(R"({"prompt_token_ids": [1], "lora_name": 2})"); })
                .param,
            "lora_name");
}

TEST(ServerProtocol, CompletionResponseShape) {
  OpenAiRequest r = parse_completion_request(
      R"({"prompt": "P", "n": 2, "logprobs": 1, "return_token_ids": true})", kCtx);
  const json j = format_response(r, {"cmpl-1", 5, "tiny"}, {sample_output()}, fake_decode());
  EXPECT_EQ(j["object"], "text_completion");
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["text"], "A");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][0]["prompt_token_ids"], json({1, 2}));
  EXPECT_EQ(j["choices"][0]["token_ids"], json({11}));
  EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"], json({"<11>"}));
  EXPECT_EQ(j["choices"][0]["logprobs"]["top_logprobs"][0]["<7>"], -1.0f);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 2);
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);
  EXPECT_EQ(j["usage"]["total_tokens"], 4);

  r.echo = true;
  r.logprobs.reset();
  const json echoed = format_response(r, {"cmpl-1", 5, "tiny"}, {sample_output()}, fake_decode());
  EXPECT_EQ(echoed["choices"][0]["text"], "PA");
}

/// The score of sample_output()'s prompt {1, 2} with top 2: token 2 at -0.25, rank 1.
ScoreOutput prompt_score() {
  ScoreOutput s;
  s.token_ids = {1, 2};
  s.logprobs = {-0.25f};
  s.ranks = {1};
  s.top_logprobs = {{{2, -0.25f}, {9, -2.0f}}};
  return s;
}

TEST(ServerProtocol, EchoWithLogprobsPutsThePromptsLogprobsFirst) {
  // lm-evaluation-harness's loglikelihood request: echo, logprobs 1, the prompt as ids.
  OpenAiRequest r = parse_completion_request(
      R"({"prompt": [[1, 2]], "echo": true, "logprobs": 1, "max_tokens": 1})", kCtx);
  EXPECT_EQ(r.prompt_score_top_k(), std::optional<int>(1));
  const json j = format_response(r, {"cmpl-1", 5, "tiny"}, {sample_output()}, fake_decode(),
                                 {prompt_score()});
  const json& c = j["choices"][0];
  EXPECT_EQ(c["text"], "PA");
  const json& lp = c["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"<1>", "<2>", "<11>"}));
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());  // nothing precedes the first token
  EXPECT_EQ(lp["token_logprobs"][1], -0.25f);
  EXPECT_EQ(lp["token_logprobs"][2], -0.5f);
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["top_logprobs"][1], json({{"<2>", -0.25f}, {"<9>", -2.0f}}));
  EXPECT_EQ(lp["top_logprobs"][2]["<7>"], -1.0f);
  // Offsets: the prompt's tokens from 0, the completion's after the prompt's text.
  EXPECT_EQ(lp["text_offset"], json({0, 3, 1}));
  EXPECT_FALSE(c.contains("prompt_logprobs"));
  // A one-token prompt: its only token has null logprobs.
  ScoreOutput none;
  none.token_ids = {1};
  RequestOutput one = sample_output();
  one.prompt_token_ids = {1};
  const json single = format_response(r, {"cmpl-1", 5, "tiny"}, {one}, fake_decode(), {none});
  EXPECT_EQ(single["choices"][0]["logprobs"]["tokens"], json({"<1>", "<11>"}));
  EXPECT_TRUE(single["choices"][0]["logprobs"]["token_logprobs"][0].is_null());
  // Streamed: the prompt's logprobs ride on each choice's first chunk only.
  r.stream = true;
  CompletionOutput delta = sample_output().outputs[1];
  const ScoreOutput score = prompt_score();
  ChunkExtras extras;
  extras.prompt_score = &score;
  const json first =
      format_chunk(r, {"cmpl-1", 5, "tiny"}, 0, delta, {1, 2}, true, "P", fake_decode(), extras);
  EXPECT_EQ(first["choices"][0]["logprobs"]["tokens"], json({"<1>", "<2>", "<11>"}));
  const json later =
      format_chunk(r, {"cmpl-1", 5, "tiny"}, 0, delta, {1, 2}, false, "P", fake_decode(), extras);
  EXPECT_EQ(later["choices"][0]["logprobs"]["tokens"], json({"<11>"}));
  EXPECT_EQ(later["choices"][0]["text"], "A");
  // Echo without logprobs scores nothing.
  EXPECT_FALSE(parse_completion_request(R"({"prompt": "x", "echo": true})", kCtx)
                   .prompt_score_top_k()
                   .has_value());
}

TEST(ServerProtocol, PromptLogprobsInVllmsShape) {
  const OpenAiRequest r =
      parse_completion_request(R"({"prompt": "P", "prompt_logprobs": 1, "n": 2})", kCtx);
  EXPECT_EQ(r.prompt_logprobs, std::optional<int>(1));
  EXPECT_EQ(r.prompt_score_top_k(), std::optional<int>(1));
  const json j = format_response(r, {"cmpl-1", 5, "tiny"}, {sample_output()}, fake_decode(),
                                 {prompt_score()});
  for (const json& c : j["choices"]) {
    const json& pl = c["prompt_logprobs"];
    ASSERT_EQ(pl.size(), 2u);
    EXPECT_TRUE(pl[0].is_null());
    // The token itself, and the top 1 (here the same token).
    EXPECT_EQ(pl[1], json({{"2", {{"logprob", -0.25f}, {"rank", 1}, {"decoded_token", "<2>"}}}}));
    EXPECT_TRUE(c["logprobs"].is_null());
  }
  EXPECT_EQ(error_of([] {
              parse_chat_request(
                  R"({"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 1})",
                  kCtx);
            }).param,
            "prompt_logprobs");
}

TEST(ServerProtocol, ToolChoiceAndParsersFollowTheServersFlags) {
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "f"}}])";
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  ProtocolContext parsing = kCtx;
  parsing.reasoning_parser = "qwen3";
  parsing.tool_call_parser = "hermes";
  parsing.enable_auto_tool_choice = true;
  // With the flags: tools parse unless tool_choice is "none"; reasoning always.
  OpenAiRequest r = parse_chat_request("{" + msgs + ", " + tools + "}", parsing);
  EXPECT_TRUE(r.parse_tool_calls);
  EXPECT_TRUE(r.parse_reasoning);
  EXPECT_FALSE(parse_chat_request("{" + msgs + "}", parsing).parse_tool_calls);
  EXPECT_FALSE(
      parse_chat_request("{" + msgs + ", " + tools + R"(, "tool_choice": "none"})", parsing)
          .parse_tool_calls);
  EXPECT_TRUE(
      parse_chat_request("{" + msgs + ", " + tools + R"(, "tool_choice": "auto"})", parsing)
          .parse_tool_calls);
  // Without them: the text as generated; an explicit "auto" is refused, as vLLM does.
  r = parse_chat_request("{" + msgs + ", " + tools + "}", kCtx);
  EXPECT_FALSE(r.parse_tool_calls);
  EXPECT_FALSE(r.parse_reasoning);
  const auto chat_error = [](const std::string& body, const ProtocolContext& ctx) {
    return error_of([&] { parse_chat_request(body, ctx); });
  };
  for (const ProtocolContext* ctx : std::vector<const ProtocolContext*>{&kCtx, &parsing}) {
    EXPECT_EQ(chat_error("{" + msgs + ", " + tools + R"(, "tool_choice": "required"})", *ctx)
                  .param,
              "tool_choice");
    EXPECT_EQ(chat_error("{" + msgs + ", " + tools +
                             R"(, "tool_choice": {"type": "function", "function": {"name": "f"}}})",
                         *ctx)
                  .param,
              "tool_choice");
    EXPECT_EQ(chat_error("{" + msgs + ", " + tools + R"(, "tool_choice": 3})", *ctx).param,
              "tool_choice");
    EXPECT_EQ(chat_error("{" + msgs + R"(, "tool_choice": "none"})", *ctx).param, "tool_choice");
  }
  const HttpError e =
      chat_error("{" + msgs + ", " + tools + R"(, "tool_choice": "auto"})", kCtx);
  EXPECT_EQ(e.param, "tool_choice");
  EXPECT_NE(std::string(e.what()).find("--enable-auto-tool-choice"), std::string::npos);
}

TEST(ServerProtocol, ChatTemplateArgumentsKeepTheClientsOrder) {
  // Tools reach the template in the order the client wrote their keys (tojson writes them
  // into the prompt), and the turn fields go with them.
  const OpenAiRequest r = parse_chat_request(
      R"({"messages": [{"role": "user", "content": "x"}],
          "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                     "parameters": {"type": "object", "properties": {}}}}],
          "continue_final_message": true, "add_generation_prompt": false})",
      kCtx);
  const nlohmann::ordered_json m = nlohmann::ordered_json::parse(r.prompts[0].messages_json);
  EXPECT_EQ(m["tools"][0].dump(),
            R"({"type":"function","function":{"name":"f","description":"d","parameters":)"
            R"({"type":"object","properties":{}}}})");
  EXPECT_EQ(m["messages"][0].dump(), R"({"role":"user","content":"x"})");
  EXPECT_EQ(m["continue_final_message"], true);
  EXPECT_EQ(m["add_generation_prompt"], false);
  // Without tools or turn fields: the messages alone (an array).
  const OpenAiRequest plain =
      parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}]})", kCtx);
  EXPECT_EQ(plain.prompts[0].messages_json, R"([{"role":"user","content":"x"}])");
  const HttpError both = error_of([] {
    parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}],
                           "continue_final_message": true, "add_generation_prompt": true})",
                       kCtx);
  });
  EXPECT_EQ(both.param, "continue_final_message");
  EXPECT_EQ(error_of([] {
              parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}],
                                     "continue_final_message": "yes"})",
                                 kCtx);
            }).param,
            "continue_final_message");
}

TEST(ServerProtocol, TokenizeAndDetokenizeBodies) {
  const Prompt text = parse_tokenize_request(R"({"prompt": "hi", "add_special_tokens": true})");
  EXPECT_EQ(text.kind, Prompt::Kind::kText);
  EXPECT_EQ(text.text, "hi");
  // A chat: the same prompt /v1/chat/completions would build.
  const std::string chat = R"({"messages": [{"role": "user", "content": "x"}],
                               "tools": [{"type": "function", "function": {"name": "f"}}],
                               "add_generation_prompt": false,
                               "chat_template_kwargs": {"enable_thinking": false}})";
  const Prompt tokenized = parse_tokenize_request(chat);
  const OpenAiRequest completion = parse_chat_request(chat, kCtx);
  EXPECT_EQ(tokenized.kind, Prompt::Kind::kChat);
  EXPECT_EQ(tokenized.messages_json, completion.prompts[0].messages_json);
  EXPECT_EQ(tokenized.chat_template_kwargs_json, completion.prompts[0].chat_template_kwargs_json);
  const auto tokenize_error = [](const std::string& body) {
    return error_of([&] { parse_tokenize_request(body); });
  };
  EXPECT_EQ(tokenize_error(R"({})").param, "messages");
  EXPECT_EQ(tokenize_error(R"({"prompt": "a", "messages": []})").param, "prompt");
  EXPECT_EQ(tokenize_error(R"({"prompt": [1, 2]})").param, "prompt");
  EXPECT_EQ(tokenize_error(R"({"messages": [{"content": "x"}]})").param, "messages");
  EXPECT_EQ(tokenize_error(R"({"prompt": "a", "return_token_strs": true})").param,
            "return_token_strs");
  EXPECT_EQ(parse_detokenize_request(R"({"tokens": [3, 4]})"), (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(error_of([] { parse_detokenize_request(R"({"tokens": [-1]})"); }).param, "tokens");
  EXPECT_EQ(error_of([] { parse_detokenize_request(R"({})"); }).param, "tokens");
}

TEST(ServerProtocol, ParsedChatResponseAndChunks) {
  ProtocolContext parsing = kCtx;
  parsing.reasoning_parser = "qwen3";
  parsing.tool_call_parser = "hermes";
  parsing.enable_auto_tool_choice = true;
  OpenAiRequest r = parse_chat_request(
      R"({"messages": [{"role": "user", "content": "x"}],
          "tools": [{"type": "function", "function": {"name": "f"}}]})",
      parsing);
  RequestOutput out = sample_output();
  out.prompt = "<|im_start|>assistant\n";
  out.outputs.resize(1);
  out.outputs[0].index = 0;
  out.outputs[0].finish_reason = FinishReason::kStopToken;
  out.outputs[0].text =
      "<think>\nhm\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n"
      "</tool_call>";
  r.params.n = 1;
  const ResponseMeta meta{"chatcmpl-7", 5, "tiny"};
  const json j = format_response(r, meta, {out}, fake_decode());
  const json& c = j["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  const json& m = c["message"];
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_TRUE(m["content"].is_null());
  EXPECT_EQ(m["reasoning_content"], "hm");
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["id"], tool_call_id_prefix(meta, 0) + "0");
  EXPECT_EQ(m["tool_calls"][0]["type"], "function");
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], R"({"a":1})");
  // No tool call: a stop stays "stop", and plain content has no tool_calls.
  out.outputs[0].text = "<think>\nhm\n</think>\n\nfine";
  const json plain = format_response(r, meta, {out}, fake_decode());
  EXPECT_EQ(plain["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(plain["choices"][0]["message"]["content"], "fine");
  EXPECT_FALSE(plain["choices"][0]["message"].contains("tool_calls"));
  // A stream's deltas say only what they add; calls carry their index.
  r.stream = true;
  ChatPieces pieces;
  pieces.reasoning = "hm";
  ChunkExtras extras;
  extras.pieces = &pieces;
  CompletionOutput delta = out.outputs[0];
  delta.finish_reason = FinishReason::kNone;
  const json first = format_chunk(r, meta, 0, delta, {1, 2}, true, "", fake_decode(), extras);
  EXPECT_EQ(first["choices"][0]["delta"],
            json({{"role", "assistant"}, {"reasoning_content", "hm"}}));
  pieces = ChatPieces{};
  pieces.tool_calls.push_back({0, "id-0", "f", "{}"});
  extras.called_tools = true;
  delta.finish_reason = FinishReason::kStopToken;
  const json last = format_chunk(r, meta, 0, delta, {1, 2}, false, "", fake_decode(), extras);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(last["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
  EXPECT_EQ(last["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"], "{}");
  EXPECT_FALSE(last["choices"][0]["delta"].contains("content"));
  // A length finish is not turned into tool_calls.
  delta.finish_reason = FinishReason::kLength;
  EXPECT_EQ(format_chunk(r, meta, 0, delta, {1, 2}, false, "", fake_decode(), extras)
                ["choices"][0]["finish_reason"],
            "length");
}

TEST(ServerProtocol, ChatChunksAndUsage) {
  OpenAiRequest r = parse_chat_request(
      R"({"messages": [{"role": "user", "content": "x"}], "stream": true, "logprobs": true,
          "stream_options": {"include_usage": true}})",
      kCtx);
  CompletionOutput delta = sample_output().outputs[1];
  delta.finish_reason = FinishReason::kNone;
  const json first = format_chunk(r, {"chatcmpl-1", 5, "tiny"}, 0, delta, {1, 2}, true, "", fake_decode());
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "A");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(first["choices"][0]["logprobs"]["content"][0]["token"], "<11>");
  EXPECT_TRUE(first["usage"].is_null());
  delta.finish_reason = FinishReason::kStopString;
  const json later = format_chunk(r, {"chatcmpl-1", 5, "tiny"}, 0, delta, {1, 2}, false, "", fake_decode());
  EXPECT_FALSE(later["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(later["choices"][0]["finish_reason"], "stop");
  const json usage = format_usage_chunk(r, {"chatcmpl-1", 5, "tiny"}, 3, 4);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 7);
  EXPECT_EQ(sse_event(json{{"a", 1}}), "data: {\"a\":1}\n\n");
}

TEST(ServerProtocol, ErrorBodyIsAnOpenAiErrorObject) {
  const json j = json::parse(error_body(HttpError(400, "n: bad", "n")));
  EXPECT_EQ(j["error"]["message"], "n: bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "n");
  EXPECT_TRUE(json::parse(error_body(HttpError(503, "full")))["error"]["param"].is_null());
}

TEST(ServerProtocol, GenerateOutputCarriesLogprobsAndVersions) {
  RequestOutput o = sample_output();
  o.outputs[0].weights_versions = {3};
  SamplingParams p;
  p.logprobs = 2;
  const json j = format_generate(o, p);
  EXPECT_EQ(j["outputs"][0]["token_ids"], json({10}));
  EXPECT_EQ(j["outputs"][0]["weights_versions"], json({3}));
  EXPECT_EQ(j["outputs"][0]["top_logprobs"][0][1], json({7, -1.0f}));
  EXPECT_EQ(j["outputs"][0]["finish_reason"], "length");
  EXPECT_FALSE(j["outputs"][0].contains("processed_logprobs"));
}

TEST(ServerMetrics, PrometheusText) {
  ServerMetrics m;
  m.add_prompt_tokens(5);
  m.add_generation_tokens(7);
  m.time_to_first_token().observe(0.03);
  m.time_to_first_token().observe(100.0);
  m.finish_request("stop");
  EngineLoad load;
  load.running = 2;
  load.free_pages = 90;
  load.usable_pages = 100;
  PrefixCacheStats prefix;
  prefix.queried_tokens = 10;
  prefix.hit_tokens = 5;
  const std::string text = m.render(load, prefix, 4);
  EXPECT_NE(text.find("pagellm_num_requests_running 2\n"), std::string::npos);
  EXPECT_NE(text.find("pagellm_kv_pages_used 10\n"), std::string::npos);
  EXPECT_NE(text.find("pagellm_prefix_cache_hit_rate 0.5\n"), std::string::npos);
  EXPECT_NE(text.find("pagellm_prompt_tokens_total 5\n"), std::string::npos);
  EXPECT_NE(text.find("pagellm_generation_tokens_total 7\n"), std::string::npos);
  EXPECT_NE(text.find("pagellm_weights_version 4\n"), std::string::npos);
  EXPECT_NE(text.find("pagellm_time_to_first_token_seconds_bucket{le=\"0.04\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("pagellm_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("pagellm_request_success_total{finished_reason=\"stop\"} 1\n"),
            std::string::npos);
}

}  // namespace
}  // namespace pagellm::server

namespace pagellm::server {
namespace {

TEST(ServerProtocol, Base64) {
  EXPECT_EQ(decode_base64("aGVsbG8="), std::optional<std::string>("hello"));
  EXPECT_EQ(decode_base64("aGVsbG8"), std::optional<std::string>("hello"));
  EXPECT_EQ(decode_base64(""), std::optional<std::string>(""));
  EXPECT_FALSE(decode_base64("a$bc").has_value());
  EXPECT_FALSE(decode_base64("a").has_value());
}

TEST(ServerProtocol, IpcTensors) {
  const std::string handle64 = std::string(86, 'A') + "==";  // 64 zero bytes
  const json good = json::array({{{"name", "model.norm.weight"}, {"handle", handle64},
                                  {"offset", 512}, {"dtype", "float16"}, {"shape", {8}}}});
  const std::vector<IpcTensor> t = parse_ipc_tensors(good);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].name, "model.norm.weight");
  EXPECT_EQ(t[0].offset, 512u);
  EXPECT_EQ(t[0].dtype, TensorDType::kFloat16);
  EXPECT_EQ(t[0].shape, (std::vector<int64_t>{8}));
  const auto param_of = [&](const char* key, const json& value) {
    json bad = good;
    bad[0][key] = value;
    try {
      parse_ipc_tensors(bad);
    } catch (const HttpError& e) {
      EXPECT_EQ(e.status, 400);
      return e.param;
    }
    return std::string("accepted");
  };
  EXPECT_EQ(param_of("handle", "aGVsbG8="), "ipc_tensors[0].handle");  // 5 bytes
  EXPECT_EQ(param_of("dtype", "int8"), "ipc_tensors[0].dtype");
  EXPECT_EQ(param_of("shape", json::array({-1})), "ipc_tensors[0].shape");
  EXPECT_EQ(param_of("name", ""), "ipc_tensors[0].name");
  EXPECT_EQ(param_of("offset", -4), "offset");
  EXPECT_THROW(parse_ipc_tensors(json::array()), HttpError);
}

}  // namespace
}  // namespace pagellm::server
