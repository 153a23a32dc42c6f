// The chat output parser (reasoning and tool calls): each rule on whole texts, and every
// text fed in pieces (split at every position, and at random) giving the pieces of the
// whole text, so that a stream says what the whole response says.
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "pagellm/server/chat_output.h"

namespace pagellm::server {
namespace {

struct Options {
  bool reasoning = true;
  bool tools = true;
  bool opened = false;
};

ChatPieces whole(const std::string& text, Options o = {}) {
  ChatOutputParser p(o.reasoning, o.tools, o.opened, "id-");
  ChatPieces out = p.feed(text);
  out.append(p.finish());
  return out;
}

/// Fed at the given cut points (sorted positions inside text).
ChatPieces in_pieces(const std::string& text, const std::vector<size_t>& cuts, Options o = {}) {
  ChatOutputParser p(o.reasoning, o.tools, o.opened, "id-");
  ChatPieces out;
  size_t at = 0;
  for (size_t cut : cuts) {
    out.append(p.feed(text.substr(at, cut - at)));
    at = cut;
  }
  out.append(p.feed(text.substr(at)));
  out.append(p.finish());
  return out;
}

void expect_same(const ChatPieces& a, const ChatPieces& b, const std::string& where) {
  EXPECT_EQ(a.reasoning, b.reasoning) << where;
  EXPECT_EQ(a.content, b.content) << where;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << where;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].index, b.tool_calls[i].index) << where;
    EXPECT_EQ(a.tool_calls[i].id, b.tool_calls[i].id) << where;
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << where;
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments) << where;
  }
}

TEST(ChatOutput, ReasoningIsSplitFromTheContent) {
  const ChatPieces p = whole("<think>\nLet me think.\nStill thinking.\n</think>\n\nThe answer.");
  EXPECT_EQ(p.reasoning, "Let me think.\nStill thinking.");
  EXPECT_EQ(p.content, "The answer.");
  EXPECT_TRUE(p.tool_calls.empty());
  // enable_thinking false: the template wrote the empty block, the output is all content.
  const ChatPieces plain = whole("Just an answer.\n");
  EXPECT_EQ(plain.reasoning, "");
  EXPECT_EQ(plain.content, "Just an answer.\n");
  // An output cut inside its thinking (max_tokens) has reasoning and no content.
  const ChatPieces cut = whole("<think>\nhalf a tho");
  EXPECT_EQ(cut.reasoning, "half a tho");
  EXPECT_EQ(cut.content, "");
  // Newlines it ended on are not next to a </think>: they stay.
  EXPECT_EQ(whole("<think>\nhalf a line\n\n").reasoning, "half a line\n\n");
  EXPECT_EQ(in_pieces("<think>\nhalf a line\n\n", {15, 16}).reasoning, "half a line\n\n");
  // A prompt that left <think> open: the output starts inside the reasoning.
  const ChatPieces opened = whole("reasoned\n</think>\n\nsaid", {true, true, true});
  EXPECT_EQ(opened.reasoning, "reasoned");
  EXPECT_EQ(opened.content, "said");
  // Without the reasoning rule the tags stay in the content.
  const std::string raw = "<think>\nx\n</think>\n\ny";
  EXPECT_EQ(whole(raw, {false, true, false}).content, raw);
  EXPECT_EQ(whole(raw, {false, true, false}).reasoning, "");
  // Newlines inside the reasoning are kept; only those next to the tags go.
  EXPECT_EQ(whole("<think>\n\na\n\nb\n\n</think>c").reasoning, "a\n\nb");
  // Something that looks like a tag but is not one is text.
  EXPECT_EQ(whole("<thinking> aloud").content, "<thinking> aloud");
  EXPECT_EQ(whole("<think>a </thin b</think>c").reasoning, "a </thin b");
}

TEST(ChatOutput, ToolCallsBecomeCalls) {
  const ChatPieces p = whole(
      "<think>\nI need the weather.\n</think>\n\nLet me check.\n<tool_call>\n"
      R"({"name": "get_weather", "arguments": {"city": "Paris", "unit": "c", "days": [1, 2]}})"
      "\n</tool_call>\n<tool_call>\n"
      R"({"name": "get_time", "arguments": "{\"zone\": \"CET\"}"})"
      "\n</tool_call>\n<tool_call>\n{\"name\": \"noop\"}\n</tool_call>");
  EXPECT_EQ(p.reasoning, "I need the weather.");
  EXPECT_EQ(p.content, "Let me check.");
  ASSERT_EQ(p.tool_calls.size(), 3u);
  EXPECT_EQ(p.tool_calls[0].index, 0);
  EXPECT_EQ(p.tool_calls[0].id, "id-0");
  EXPECT_EQ(p.tool_calls[0].name, "get_weather");
  // Keys in the order the model wrote them; the arguments are JSON text.
  EXPECT_EQ(p.tool_calls[0].arguments, R"({"city":"Paris","unit":"c","days":[1,2]})");
  EXPECT_EQ(p.tool_calls[1].name, "get_time");
  EXPECT_EQ(p.tool_calls[1].arguments, R"({"zone": "CET"})");
  EXPECT_EQ(p.tool_calls[2].id, "id-2");
  EXPECT_EQ(p.tool_calls[2].arguments, "{}");
  // A block that does not parse stays in the content as written, and is not a call.
  const std::string bad = "<tool_call>\n{\"name\": 3}\n</tool_call>";
  const ChatPieces kept = whole(bad);
  EXPECT_TRUE(kept.tool_calls.empty());
  EXPECT_EQ(kept.content, bad);
  EXPECT_EQ(whole("<tool_call>not json</tool_call>").content, "<tool_call>not json</tool_call>");
  // An output that ends inside a block (max_tokens) keeps it as text.
  const ChatPieces open = whole("Sure.\n<tool_call>\n{\"name\": \"f\", \"argu");
  EXPECT_TRUE(open.tool_calls.empty());
  EXPECT_EQ(open.content, "Sure.<tool_call>\n{\"name\": \"f\", \"argu");
  // Without the tool rule the blocks are content.
  const std::string call = "<tool_call>\n{\"name\": \"f\"}\n</tool_call>";
  EXPECT_EQ(whole(call, {true, false, false}).content, call);
  // Text after the calls stays content; whitespace around the calls goes.
  const ChatPieces after = whole(call + "\n\nDone.\n");
  ASSERT_EQ(after.tool_calls.size(), 1u);
  EXPECT_EQ(after.content, "Done.");
  // Without calls, trailing whitespace is the content's own.
  EXPECT_EQ(whole("Done.\n\n").content, "Done.\n\n");
}

TEST(ChatOutput, PiecesFedOneByOneSayWhatTheWholeTextSays) {
  const std::vector<std::string> texts = {
      "<think>\nLet me think.\n\n</think>\n\nThe answer.\n",
      "<think>\n\n</think>\n\nHi",
      "<think>\nnever closed\n",
      "plain <think> later </think> text",
      "Checking.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"</tool\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"g\"}\n</tool_call>\n\nAfter.  \n",
      "<tool_call>broken</tool_call> then <tool_call>\n{\"name\": \"h\"}</tool_call>",
      "ends inside <tool_call>\n{\"name\"",
      "a < b <t <tool <tool_cal > c\n",
      "<thi",
      "",
  };
  for (const Options o : {Options{true, true, false}, Options{true, true, true},
                          Options{false, true, false}, Options{true, false, false}}) {
    for (const std::string& text : texts) {
      const ChatPieces expected = whole(text, o);
      for (size_t cut = 0; cut <= text.size(); ++cut) {
        expect_same(in_pieces(text, {cut}, o), expected, text + " cut at " + std::to_string(cut));
      }
      std::vector<size_t> every;
      for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
      expect_same(in_pieces(text, every, o), expected, text + " byte by byte");
      std::mt19937 rng(static_cast<unsigned>(text.size()));
      for (int trial = 0; trial < 20 && text.size() > 2; ++trial) {
        std::vector<size_t> cuts;
        for (size_t i = 1; i < text.size(); ++i) {
          if (rng() % 3 == 0) cuts.push_back(i);
        }
        expect_same(in_pieces(text, cuts, o), expected, text + " random cuts");
      }
    }
  }
}

/// The rules again, on the whole text at once (find and cut, no state machine): the oracle
/// for random texts. Mirrors reference_parse in test_scoring_and_parsers.py.
ChatPieces reference(std::string text, bool tools) {
  const std::string ws = " \t\r\n";
  auto lstrip = [](const std::string& s, const std::string& chars) {
    const size_t i = s.find_first_not_of(chars);
    return i == std::string::npos ? std::string() : s.substr(i);
  };
  auto rstrip = [](const std::string& s, const std::string& chars) {
    const size_t i = s.find_last_not_of(chars);
    return i == std::string::npos ? std::string() : s.substr(0, i + 1);
  };
  ChatPieces out;
  if (text.rfind("<think>", 0) == 0) {
    const std::string body = text.substr(7);
    const size_t close = body.find("</think>");
    if (close == std::string::npos) {
      out.reasoning = lstrip(body, "\n");
      text.clear();
    } else {
      out.reasoning = rstrip(lstrip(body.substr(0, close), "\n"), "\n");
      text = lstrip(body.substr(close + 8), "\n");
    }
  }
  if (!tools) {
    out.content = text;
    return out;
  }
  size_t pos = 0;
  bool after_block = false;
  for (;;) {
    const size_t start = text.find("<tool_call>", pos);
    std::string segment = text.substr(pos, start == std::string::npos ? std::string::npos
                                                                        : start - pos);
    if (after_block) segment = lstrip(segment, ws);
    if (start == std::string::npos) {
      out.content += out.tool_calls.empty() ? segment : rstrip(segment, ws);
      return out;
    }
    out.content += rstrip(segment, ws);
    const size_t end = text.find("</tool_call>", start);
    if (end == std::string::npos) {
      out.content += text.substr(start);
      return out;
    }
    const std::string body = text.substr(start + 11, end - start - 11);
    const auto call = nlohmann::ordered_json::parse(body, nullptr, false);
    const bool named = call.is_object() && call.contains("name") && call["name"].is_string();
    const bool args_ok = named && (!call.contains("arguments") || call["arguments"].is_object() ||
                                   call["arguments"].is_string());
    if (args_ok) {
      const int index = static_cast<int>(out.tool_calls.size());
      std::string args = "{}";
      if (call.contains("arguments")) {
        args = call["arguments"].is_string() ? call["arguments"].get<std::string>()
                                             : call["arguments"].dump();
      }
      out.tool_calls.push_back({index, "id-" + std::to_string(index),
                                call["name"].get<std::string>(), args});
    } else {
      out.content += text.substr(start, end + 12 - start);
    }
    pos = end + 12;
    after_block = true;
  }
}

TEST(ChatOutput, RandomTextsFollowTheRulesAsWrittenAgain) {
  const std::vector<std::string> parts = {
      "<think>", "</think>", "<tool_call>", "</tool_call>", "\n", " ", "\t", "a", "b c", "<",
      "<thi", "</tool", R"({"name": "f", "arguments": {"x": 1}})", R"({"name": "g"})",
      R"({"name": 3})", R"({"name": "h", "arguments": "{}"})",
      R"({"name": "k", "arguments": [1]})", "x\n\n", "\n\n"};
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::string text;
    const int n = static_cast<int>(rng() % 13);
    for (int k = 0; k < n; ++k) text += parts[rng() % parts.size()];
    const bool tools = rng() % 10 < 7;
    Options o{true, tools, false};
    const ChatPieces expected = reference(text, tools);
    expect_same(whole(text, o), expected, text);
    const size_t cut = text.empty() ? 0 : rng() % (text.size() + 1);
    expect_same(in_pieces(text, {cut}, o), expected, text + " cut");
    if (HasFailure()) break;
  }
}

TEST(ChatOutput, NothingIsSaidBeforeItIsSettled) {
  ChatOutputParser p(true, true, false, "id-");
  // "<thi" may still become <think>: nothing yet.
  EXPECT_TRUE(p.feed("<thi").empty());
  EXPECT_TRUE(p.feed("nk>\n").empty());
  EXPECT_EQ(p.feed("step one").reasoning, "step one");
  // Newlines may be the ones before </think>: held.
  EXPECT_TRUE(p.feed("\n").empty());
  EXPECT_EQ(p.feed("step two\n</").reasoning, "\nstep two");
  EXPECT_TRUE(p.feed("think>\n\n").empty());
  EXPECT_EQ(p.feed("Answer ").content, "Answer");
  const ChatPieces call = p.feed("<tool_call>{\"name\": \"f\"}</tool_call>");
  ASSERT_EQ(call.tool_calls.size(), 1u);
  EXPECT_EQ(call.content, "");  // the space before the call went with it
  EXPECT_EQ(p.tool_calls(), 1);
  EXPECT_TRUE(p.finish().empty());
}

TEST(ChatOutput, PromptOpensThinking) {
  EXPECT_TRUE(prompt_opens_thinking("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_thinking("<|im_start|>assistant\n"));
  EXPECT_FALSE(prompt_opens_thinking(""));
  // An earlier turn's closed block does not count.
  EXPECT_FALSE(prompt_opens_thinking("<think>a</think>b<|im_start|>assistant\n"));
}

}  // namespace
}  // namespace pagellm::server
