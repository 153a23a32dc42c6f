// libFuzzer target: no request body crashes the server's parsers, and what they accept is
// sound.
//
// Input: one selector byte (0: POST /v1/completions, 1: POST /v1/chat/completions, 2: POST
// /generate (and /tokenize, /detokenize), 3: POST /init_weights_group or /update_weights
// {"broadcast"}; taken modulo 4)
// and the body (any bytes). Each parser either throws HttpError
// with a status of 400 or 404 and an error object that is valid JSON, or returns a request
// whose prompts are non-empty and whose sampling parameters hold what the engine's own
// validation checks next (n >= 1, max_tokens >= 1, logprobs in [0, 20]); the accepted
// request then formats a response and a stream chunk from a made-up output without a crash.
// The weight-group bodies (for an engine of 1 to 4 tensor-parallel ranks, from the selector
// byte's high bits) must give every engine rank in 1..world_size - 1, a 128-byte NCCL id or a tcp
// address, and broadcast tensors with names and sizes >= 0. The server's other bodies
// (/pause, /update_weights's path, /sleep) are single fields read through the same parser.
// For the OpenAI routes the selector's bit 2 starts the server with the chat output parsers
// (--reasoning-parser qwen3 --enable-auto-tool-choice --tool-call-parser hermes), the made-up
// output's text is the body itself, and the chat output parser, fed that text whole and cut
// at a point taken from the selector byte, must say the same pieces both ways.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "pagellm/server/protocol.h"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "http_body_fuzz: property violated: %s\n", what);
  std::abort();
}

void check_params(const pagellm::SamplingParams& p) {
  if (p.n < 1) fail("n < 1 accepted");
  if (p.max_tokens < 1) fail("max_tokens < 1 accepted");
  if (p.logprobs < 0 || p.logprobs > pagellm::SamplingParams::kMaxLogprobs) {
    fail("logprobs out of range accepted");
  }
  for (const std::string& s : p.stop) {
    if (s.empty()) fail("an empty stop string accepted");
  }
}

void check_error(const pagellm::server::HttpError& e) {
  if (e.status != 400 && e.status != 404) fail("a parser answered a status other than 400/404");
  const auto j = nlohmann::json::parse(pagellm::server::error_body(e), nullptr, false);
  if (j.is_discarded() || !j["error"]["message"].is_string()) fail("the error body is not JSON");
}

/// A stream's pieces joined are the whole text's: the text fed whole, then cut in two.
void check_chat_parser(const std::string& text, size_t cut, bool reasoning, bool tools,
                       bool opened) {
  using pagellm::server::ChatOutputParser;
  using pagellm::server::ChatPieces;
  ChatOutputParser whole(reasoning, tools, opened, "c");
  ChatPieces a = whole.feed(text);
  a.append(whole.finish());
  ChatOutputParser cut_up(reasoning, tools, opened, "c");
  cut = text.empty() ? 0 : cut % (text.size() + 1);
  ChatPieces b = cut_up.feed(text.substr(0, cut));
  b.append(cut_up.feed(text.substr(cut)));
  b.append(cut_up.finish());
  if (a.reasoning != b.reasoning || a.content != b.content) fail("a cut text parsed otherwise");
  if (a.tool_calls.size() != b.tool_calls.size()) fail("a cut text made other tool calls");
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    if (a.tool_calls[i].name != b.tool_calls[i].name ||
        a.tool_calls[i].arguments != b.tool_calls[i].arguments ||
        a.tool_calls[i].index != static_cast<int>(i)) {
      fail("a cut text made another tool call");
    }
  }
  if (whole.tool_calls() != static_cast<int>(a.tool_calls.size())) fail("calls miscounted");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using namespace pagellm::server;
  const int route = data[0] % 4;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  ProtocolContext ctx{"tiny", 256};
  if (route != 3 && (data[0] & 4) != 0) {
    ctx.reasoning_parser = "qwen3";
    ctx.tool_call_parser = "hermes";
    ctx.enable_auto_tool_choice = true;
  }
  if (route < 2) {
    check_chat_parser(body, static_cast<size_t>(data[0]) * 7919u, (data[0] & 8) != 0,
                      (data[0] & 16) != 0, (data[0] & 32) != 0);
  }
  try {
    if (route == 3) {  // the weight-group control bodies
      const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
      if (!j.is_object()) return 0;
      if (j.contains("broadcast")) {
        const BroadcastUpdateRequest b = parse_broadcast_update(j["broadcast"]);
        if (b.tensors.empty() || b.bucket_bytes < 1) fail("an empty broadcast update accepted");
        for (const pagellm::BroadcastTensor& t : b.tensors) {
          if (t.name.empty()) fail("a broadcast tensor without a name accepted");
          for (int64_t d : t.shape) {
            if (d < 0) fail("a negative size accepted");
          }
        }
        return 0;
      }
      // The engine's tensor-parallel ranks (1..4), from the selector byte's high bits.
      const int ranks = 1 + (data[0] >> 2) % 4;
      const pagellm::WeightGroupSpec spec = parse_init_weights_group(j, ranks);
      if (spec.rank < 1 || spec.rank + ranks - 1 >= spec.world_size) {
        fail("an engine rank outside 1..world_size - 1");
      }
      if (spec.transport == "nccl" && spec.nccl_unique_id.size() != 128) fail("a short NCCL id");
      if (spec.transport == "tcp" && spec.address.empty()) fail("a tcp group without an address");
      if (spec.transport != "nccl" && spec.transport != "tcp") fail("an unknown transport");
      return 0;
    }
    if (route == 2) {
      // The tokenizer routes' bodies too: a prompt of some kind, ids >= 0, or a 400.
      for (int which = 0; which < 2; ++which) {
        try {
          if (which == 0) {
            const pagellm::Prompt p = parse_tokenize_request(body);
            if (p.kind == pagellm::Prompt::Kind::kTokenIds) fail("/tokenize took token ids");
          } else {
            for (int32_t id : parse_detokenize_request(body)) {
              if (id < 0) fail("/detokenize took a negative id");
            }
          }
        } catch (const HttpError& e) {
          check_error(e);
        }
      }
      const GenerateRequest g = parse_generate_request(body);
      check_params(g.params);
      pagellm::RequestOutput out;
      out.prompt_token_ids = g.prompt_token_ids;
      out.outputs.resize(1);
      out.outputs[0].token_ids = {1};
      out.outputs[0].logprobs = {-1.0f};
      (void)format_generate(out, g.params).dump();
      return 0;
    }
    const OpenAiRequest r =
        route == 0 ? parse_completion_request(body, ctx) : parse_chat_request(body, ctx);
    if (r.prompts.empty()) fail("no prompt accepted");
    check_params(r.params);
    const DecodeFn decode = [](const std::vector<int32_t>& ids, bool) {
      return std::string(ids.size(), 'x');
    };
    std::vector<pagellm::RequestOutput> outputs(r.prompts.size());
    for (pagellm::RequestOutput& o : outputs) {
      o.prompt_token_ids = {1, 2};
      pagellm::CompletionOutput c;
      c.text = body + "\xff\xfe";  // invalid UTF-8 must still format
      c.token_ids = {3};
      c.logprobs = {-0.5f};
      c.top_logprobs = {{{3, -0.5f}}};
      c.finish_reason = pagellm::FinishReason::kLength;
      o.outputs.push_back(c);
    }
    std::vector<pagellm::ScoreOutput> scores;
    if (r.prompt_score_top_k()) {
      pagellm::ScoreOutput s;
      s.token_ids = {1, 2};
      s.logprobs = {-0.25f};
      s.ranks = {1};
      s.top_logprobs = {{{2, -0.25f}}};
      scores.assign(outputs.size(), s);
    }
    (void)format_response(r, {"id", 0, "tiny"}, outputs, decode, scores).dump(
        -1, ' ', false, nlohmann::json::error_handler_t::replace);
    ChunkExtras extras;
    if (!scores.empty()) extras.prompt_score = &scores[0];
    (void)sse_event(format_chunk(r, {"id", 0, "tiny"}, 0, outputs[0].outputs[0], {1, 2}, true,
                                 "p", decode, extras));
  } catch (const HttpError& e) {
    check_error(e);
  }
  return 0;
}
