#include "pagellm/server/chat_output.h"

#include <algorithm>
#include <utility>

#include <nlohmann/json.hpp>

namespace pagellm::server {

namespace {

const std::string kThinkOpen = "<think>";
const std::string kThinkClose = "</think>";
const std::string kCallOpen = "<tool_call>";
const std::string kCallClose = "</tool_call>";
const char* const kNewlines = "\n";
const char* const kWhitespace = " \t\r\n";

/// The length of the longest proper prefix of `tag` that `s` ends with: text that may be
/// the start of the tag, which the next piece of text completes or not.
size_t tag_start_at_end(const std::string& s, const std::string& tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (s.compare(s.size() - n, n, tag, 0, n) == 0) return n;
  }
  return 0;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

void ChatPieces::append(ChatPieces more) {
  reasoning += more.reasoning;
  content += more.content;
  for (ToolCall& c : more.tool_calls) tool_calls.push_back(std::move(c));
}

ChatOutputParser::ChatOutputParser(bool reasoning, bool tool_calls, bool prompt_opened_thinking,
                                   std::string id_prefix)
    : tools_(tool_calls), id_prefix_(std::move(id_prefix)) {
  if (reasoning && prompt_opened_thinking) {
    state_ = State::kReasoning;
    strip_ = kNewlines;
  } else {
    state_ = reasoning ? State::kStart : State::kContent;
  }
}

ChatPieces ChatOutputParser::feed(const std::string& text) {
  ChatPieces out;
  pending_ += text;
  run(out, /*end=*/false);
  return out;
}

ChatPieces ChatOutputParser::finish() {
  ChatPieces out;
  run(out, /*end=*/true);
  return out;
}

/// Says `text` into `field` after the whitespace held before it, except its trailing run of
/// `chars`, which is held in turn: the text after it decides whether it is said or dropped
/// (clearing held_ws_ after this call drops it).
void ChatOutputParser::say(std::string& field, const std::string& text, const char* chars) {
  const size_t last = text.find_last_not_of(chars);
  if (last == std::string::npos) {
    held_ws_ += text;
    return;
  }
  field += held_ws_;
  field.append(text, 0, last + 1);
  held_ws_ = text.substr(last + 1);
}

/// At the end of the output: the whitespace held for a tag that never came (when
/// `keep_held`) and the text still pending go to `field`.
void ChatOutputParser::settle_at_end(std::string& field, bool keep_held) {
  if (keep_held) field += held_ws_;
  field += pending_;
  held_ws_.clear();
  pending_.clear();
}

/// Drops the characters of strip_ at the start of pending_; true when some text is left
/// (the field has started, so nothing more is stripped).
bool ChatOutputParser::strip_leading() {
  if (strip_ == nullptr) return !pending_.empty();
  const size_t first = pending_.find_first_not_of(strip_);
  if (first == std::string::npos) {
    pending_.clear();
    return false;
  }
  pending_.erase(0, first);
  strip_ = nullptr;
  return true;
}

void ChatOutputParser::run(ChatPieces& out, bool end) {
  for (;;) {
    switch (state_) {
      case State::kStart: {
        if (starts_with(pending_, kThinkOpen)) {
          pending_.erase(0, kThinkOpen.size());
          state_ = State::kReasoning;
          strip_ = kNewlines;
          continue;
        }
        if (!end && starts_with(kThinkOpen, pending_)) return;  // "<thi": wait for more
        state_ = State::kContent;
        continue;
      }
      case State::kReasoning: {
        if (!strip_leading()) {
          // The output ended while thinking: newlines held for a </think> are its own.
          if (end) settle_at_end(out.reasoning, /*keep_held=*/true);
          return;
        }
        const size_t close = pending_.find(kThinkClose);
        if (close != std::string::npos) {
          // Newlines before </think> are dropped with the newlines held before them.
          say(out.reasoning, pending_.substr(0, close), kNewlines);
          held_ws_.clear();
          pending_.erase(0, close + kThinkClose.size());
          state_ = State::kContent;
          strip_ = kNewlines;
          continue;
        }
        if (end) {  // the output ended while thinking: all of it is reasoning
          settle_at_end(out.reasoning, /*keep_held=*/true);
          return;
        }
        const size_t keep = tag_start_at_end(pending_, kThinkClose);
        say(out.reasoning, pending_.substr(0, pending_.size() - keep), kNewlines);
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      case State::kContent: {
        // Trailing whitespace stays with plain content, and goes with tool calls.
        if (!strip_leading()) {
          if (end) settle_at_end(out.content, /*keep_held=*/calls_ == 0);
          return;
        }
        if (!tools_) {
          out.content += pending_;
          pending_.clear();
          return;
        }
        const size_t open = pending_.find(kCallOpen);
        if (open != std::string::npos) {
          // Whitespace before a tool call is dropped.
          say(out.content, pending_.substr(0, open), kWhitespace);
          held_ws_.clear();
          pending_.erase(0, open + kCallOpen.size());
          call_body_.clear();
          state_ = State::kToolCall;
          continue;
        }
        const size_t keep = end ? 0 : tag_start_at_end(pending_, kCallOpen);
        say(out.content, pending_.substr(0, pending_.size() - keep), kWhitespace);
        pending_.erase(0, pending_.size() - keep);
        if (end) settle_at_end(out.content, /*keep_held=*/calls_ == 0);
        return;
      }
      case State::kToolCall: {
        const size_t close = pending_.find(kCallClose);
        if (close != std::string::npos) {
          call_body_ += pending_.substr(0, close);
          pending_.erase(0, close + kCallClose.size());
          close_tool_call(out);
          state_ = State::kContent;
          strip_ = kWhitespace;
          continue;
        }
        if (end) {  // never closed: the block stays in the content as written
          out.content += kCallOpen + call_body_ + pending_;
          call_body_.clear();
          pending_.clear();
          return;
        }
        const size_t keep = tag_start_at_end(pending_, kCallClose);
        call_body_ += pending_.substr(0, pending_.size() - keep);
        pending_.erase(0, pending_.size() - keep);
        return;
      }
    }
  }
}

void ChatOutputParser::close_tool_call(ChatPieces& out) {
  // ordered_json keeps the arguments' keys in the order the model wrote them.
  const nlohmann::ordered_json call =
      nlohmann::ordered_json::parse(call_body_, nullptr, /*allow_exceptions=*/false);
  std::string name, arguments = "{}";
  bool ok = call.is_object() && call.contains("name") && call["name"].is_string();
  if (ok) {
    name = call["name"].get<std::string>();
    if (call.contains("arguments")) {
      const nlohmann::ordered_json& a = call["arguments"];
      if (a.is_object()) {
        arguments = a.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
      } else if (a.is_string()) {
        arguments = a.get<std::string>();
      } else {
        ok = false;
      }
    }
  }
  if (!ok) {
    out.content += kCallOpen + call_body_ + kCallClose;
  } else {
    out.tool_calls.push_back({calls_, id_prefix_ + std::to_string(calls_), name, arguments});
    ++calls_;
  }
  call_body_.clear();
}

bool prompt_opens_thinking(const std::string& prompt_text) {
  const size_t open = prompt_text.rfind(kThinkOpen);
  if (open == std::string::npos) return false;
  const size_t close = prompt_text.rfind(kThinkClose);
  return close == std::string::npos || close < open;
}

}  // namespace pagellm::server
