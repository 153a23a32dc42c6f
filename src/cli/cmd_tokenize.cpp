// pagellm tokenize / detokenize / chat-template: the tokenizer library on the command line.
//
// All three read JSON and write JSON lines, so that scripts (and the Hugging Face parity
// tests in tests/tokenizer/) can drive them in bulk:
//   tokenize       in:  one JSON value per line: "text", {"text": "..."}, or
//                       {"text_hex": "68c3a9"} for arbitrary bytes (invalid UTF-8 included)
//                  out: {"ids": [...]} per line (plus "tokens" with --tokens)
//   detokenize     in:  one JSON value per line: [ids...] or {"ids": [...]}
//                  out: {"text": "..."} per line (plus "pieces", the streaming decoder's
//                       output per id, with --stream)
//   chat-template  in:  a chat request (a messages array, or {"messages": [...], "tools": [...],
//                       "add_generation_prompt": true, "enable_thinking": false, ...}) from
//                       --messages FILE or stdin
//                  out: the prompt text; with --jsonl, one request per input line and
//                       {"text": "..."} per output line
// A line that cannot be processed (not UTF-8, not JSON, not the expected shape) yields
// {"error": "line N: ..."} in its place; the following lines are still processed, and the
// exit status at the end is 1 when any line failed.
// This file depends only on CLI11 and pagellm_tokenizer.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "pagellm/common/check.h"
#include "pagellm/tokenizer/chat_template.h"
#include "pagellm/tokenizer/tokenizer.h"
#include "pagellm/tokenizer/utf8.h"

namespace pagellm::cli {
namespace {

std::string hex_to_bytes(const std::string& hex) {
  PAGELLM_CHECK(hex.size() % 2 == 0) << "\"text_hex\" must have an even number of hex digits";
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    PAGELLM_FAIL() << "\"text_hex\" has a non-hex character '" << c << "'";
  };
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    out.push_back(static_cast<char>(nibble(hex[i]) * 16 + nibble(hex[i + 1])));
  }
  return out;
}

std::string text_of(const nlohmann::json& line) {
  if (line.is_string()) return line.get<std::string>();
  if (line.is_object() && line.contains("text") && line["text"].is_string()) return line["text"].get<std::string>();
  if (line.is_object() && line.contains("text_hex") && line["text_hex"].is_string()) {
    return hex_to_bytes(line["text_hex"].get<std::string>());
  }
  PAGELLM_FAIL() << "expected a JSON string, {\"text\": \"...\"} or {\"text_hex\": \"...\"}";
}

std::vector<int32_t> ids_of(const nlohmann::json& line) {
  const nlohmann::json& ids = line.is_object() && line.contains("ids") ? line["ids"] : line;
  PAGELLM_CHECK(ids.is_array()) << "expected a JSON array of token ids or {\"ids\": [...]}";
  std::vector<int32_t> out;
  out.reserve(ids.size());
  for (const auto& id : ids) {
    PAGELLM_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() <= INT32_MAX)
        << "token ids must be integers in [0, 2^31), got " << id.dump();
    out.push_back(id.get<int32_t>());
  }
  return out;
}

std::string read_all(std::istream& in) {
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

void print_line(const nlohmann::json& j) {
  // strict: output that is not valid UTF-8 would be a bug, so it must fail loudly.
  const std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
}

// Prints {"error": "line N: ..."}. The message may quote the input's bytes, so bytes that
// are not UTF-8 are written as U+FFFD rather than failing the dump.
void print_error_line(size_t line_number, const std::string& message) {
  const nlohmann::json j = {{"error", "line " + std::to_string(line_number) + ": " + message}};
  const std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
}

// Runs `handle` on each non-empty stdin line; a line that fails prints an error line in its
// place (line numbers count every input line from 1) and the next lines go on. `utf8_hint`
// ends the message for a line that is not UTF-8.
template <class Handle>
void for_each_line(const char* utf8_hint, Handle&& handle) {
  std::string line;
  size_t line_number = 0;
  size_t failed = 0;
  while (std::getline(std::cin, line)) {
    ++line_number;
    if (line.empty()) continue;
    try {
      PAGELLM_CHECK(utf8::is_valid(line)) << "input is not valid UTF-8 (JSON text must be UTF-8" << utf8_hint << ")";
      handle(line);
    } catch (const std::exception& e) {
      print_error_line(line_number, e.what());
      ++failed;
    }
    std::fflush(stdout);
  }
  if (failed > 0) throw Error(std::to_string(failed) + " of the input lines failed (see the \"error\" lines)");
}

nlohmann::json parse_json_line(const std::string& line) {
  try {
    return nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    PAGELLM_FAIL() << "input line is not JSON: " << e.what();
  }
}

struct TokenizeArgs {
  std::string model;
  std::string text;
  bool split_special = false;
  bool tokens = false;
};

struct DetokenizeArgs {
  std::string model;
  std::string ids;
  bool skip_special = false;
  bool stream = false;
};

struct ChatArgs {
  std::string model;
  std::string template_file;
  std::string messages = "-";
  bool add_generation_prompt = false;
  std::string enable_thinking;  // "", "true" or "false"
  bool jsonl = false;
};

void run_tokenize(const TokenizeArgs& args) {
  const Tokenizer tokenizer = Tokenizer::load(args.model);
  EncodeOptions options;
  options.split_special_tokens = args.split_special;
  auto encode = [&](const std::string& text) {
    const std::vector<int32_t> ids = tokenizer.encode(text, options);
    nlohmann::json out = {{"ids", ids}};
    if (args.tokens) {
      nlohmann::json tokens = nlohmann::json::array();
      for (int32_t id : ids) tokens.push_back(tokenizer.id_to_token(id).value_or(""));
      out["tokens"] = tokens;
    }
    print_line(out);
  };
  if (!args.text.empty()) {
    encode(args.text);
    return;
  }
  for_each_line("; give arbitrary bytes as {\"text_hex\": \"...\"}",
                [&](const std::string& line) { encode(text_of(parse_json_line(line))); });
}

void run_detokenize(const DetokenizeArgs& args) {
  const Tokenizer tokenizer = Tokenizer::load(args.model);
  DecodeOptions options;
  options.skip_special_tokens = args.skip_special;
  auto decode = [&](const std::vector<int32_t>& ids) {
    nlohmann::json out = {{"text", tokenizer.decode(ids, options)}};
    if (args.stream) {
      StreamDecoder stream = tokenizer.stream_decoder(options);
      nlohmann::json pieces = nlohmann::json::array();
      for (int32_t id : ids) pieces.push_back(stream.push(id));
      pieces.push_back(stream.finish());
      out["pieces"] = pieces;
    }
    print_line(out);
  };
  if (!args.ids.empty()) {
    std::vector<int32_t> ids;
    std::stringstream list(args.ids);
    std::string item;
    while (std::getline(list, item, ',')) {
      try {
        ids.push_back(std::stoi(item));
      } catch (const std::exception&) {
        PAGELLM_FAIL() << "--ids must be comma-separated integers, got \"" << item << "\"";
      }
    }
    decode(ids);
    return;
  }
  for_each_line("", [&](const std::string& line) { decode(ids_of(parse_json_line(line))); });
}

ChatRequest make_request(const nlohmann::ordered_json& json, const ChatArgs& args) {
  ChatRequest request = ChatRequest::from_json(json);
  if (args.add_generation_prompt) request.add_generation_prompt = true;
  if (!args.enable_thinking.empty()) request.variables["enable_thinking"] = args.enable_thinking == "true";
  return request;
}

void run_chat_template(const ChatArgs& args) {
  const Tokenizer tokenizer = Tokenizer::load(args.model);
  std::unique_ptr<ChatTemplate> custom;
  if (!args.template_file.empty()) {
    std::ifstream in(args.template_file, std::ios::binary);
    PAGELLM_CHECK(in.good()) << "cannot open template file " << args.template_file;
    custom = std::make_unique<ChatTemplate>(read_all(in), tokenizer.special_tokens_map());
  }
  const ChatTemplate& chat = custom ? *custom : tokenizer.chat_template();
  if (args.jsonl) {
    for_each_line("", [&](const std::string& line) {
      nlohmann::ordered_json json;
      try {
        json = nlohmann::ordered_json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        PAGELLM_FAIL() << "input line is not JSON: " << e.what();
      }
      print_line({{"text", chat.render(make_request(json, args))}});
    });
    return;
  }
  std::string text;
  if (args.messages == "-") {
    text = read_all(std::cin);
  } else {
    std::ifstream in(args.messages, std::ios::binary);
    PAGELLM_CHECK(in.good()) << "cannot open messages file " << args.messages;
    text = read_all(in);
  }
  nlohmann::ordered_json json;
  try {
    json = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    PAGELLM_FAIL() << (args.messages == "-" ? std::string("stdin") : args.messages)
                   << " is not JSON: " << e.what();
  }
  const std::string prompt = chat.render(make_request(json, args));
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
}

}  // namespace

void register_tokenizer_commands(CLI::App& app) {
  auto tokenize_args = std::make_shared<TokenizeArgs>();
  CLI::App* tokenize = app.add_subcommand(
      "tokenize", "Text to token ids: JSON lines in (\"text\", {\"text\": ...} or {\"text_hex\": ...}), "
                  "{\"ids\": [...]} lines out; a bad line gives {\"error\": \"line N: ...\"}, the rest go on, "
                  "and the exit status is 1 if any line failed");
  tokenize->add_option("--model", tokenize_args->model, "Model folder with tokenizer.json")->required();
  tokenize->add_option("--text", tokenize_args->text, "Encode this text instead of reading stdin");
  tokenize->add_flag("--split-special-tokens", tokenize_args->split_special,
                     "Encode special tokens written in the text as plain text");
  tokenize->add_flag("--tokens", tokenize_args->tokens, "Also print the vocabulary strings");
  tokenize->callback([tokenize_args] { run_tokenize(*tokenize_args); });

  auto detokenize_args = std::make_shared<DetokenizeArgs>();
  CLI::App* detokenize = app.add_subcommand(
      "detokenize", "Token ids to text: JSON lines in ([ids] or {\"ids\": [...]}), {\"text\": ...} lines out; a bad line "
      "gives {\"error\": \"line N: ...\"}, the rest go on, and the exit status is 1 if any line failed");
  detokenize->add_option("--model", detokenize_args->model, "Model folder with tokenizer.json")->required();
  detokenize->add_option("--ids", detokenize_args->ids, "Decode these comma-separated ids instead of reading stdin");
  detokenize->add_flag("--skip-special-tokens", detokenize_args->skip_special, "Drop special tokens");
  detokenize->add_flag("--stream", detokenize_args->stream,
                       "Also print the streaming decoder's text per id (\"pieces\")");
  detokenize->callback([detokenize_args] { run_detokenize(*detokenize_args); });

  auto chat_args = std::make_shared<ChatArgs>();
  CLI::App* chat = app.add_subcommand(
      "chat-template", "Render the model's chat template for a messages JSON; prints the prompt text");
  chat->add_option("--model", chat_args->model, "Model folder with tokenizer_config.json")->required();
  chat->add_option("--template", chat_args->template_file,
                   "Jinja file to use instead of the model's chat template");
  chat->add_option("--messages", chat_args->messages,
                   "JSON file: an array of messages or {\"messages\": [...], \"tools\": [...], ...} ('-': stdin)");
  chat->add_flag("--add-generation-prompt", chat_args->add_generation_prompt,
                 "End with the assistant header so that the model answers");
  chat->add_option("--enable-thinking", chat_args->enable_thinking, "Set enable_thinking (Qwen3)")
      ->check(CLI::IsMember({"true", "false"}));
  chat->add_flag("--jsonl", chat_args->jsonl,
                 "One request per stdin line, {\"text\": ...} per output line; a bad line gives "
                 "{\"error\": \"line N: ...\"}, the rest go on, and the exit status is 1 if any line failed");
  chat->callback([chat_args] { run_chat_template(*chat_args); });
}

}  // namespace pagellm::cli
