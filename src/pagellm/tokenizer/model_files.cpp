#include "pagellm/tokenizer/model_files.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "pagellm/common/check.h"
#include "pagellm/tokenizer/byte_level.h"
#include "pagellm/tokenizer/pre_tokenizer.h"
#include "pagellm/tokenizer/tokenizer.h"

namespace pagellm {
namespace {

// Qwen3's pre-tokenizer split pattern (from its tokenizer.json).
const char* const kQwen3SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Text the small tokenizer learns its merges from: English prose about the engine, a little
// code and JSON, digits, and some Chinese, Japanese and Korean, so that common pieces of
// all of these get multi-byte tokens.
const char* const kTrainingText = R"TRAIN(pagellm is a small inference engine for Qwen3 language models. It keeps the key and value
cache in fixed-size pages, so that many requests can share one pool of memory without copying.
The scheduler admits a request when there are enough free pages for its prompt, and it preempts
the newest request when the pool runs out. Each step, the engine builds one batch: prefill chunks
for new requests and one token for each running request. The model runs the batch, the sampler
picks the next tokens, and the detokenizer turns them into text that streams back to the user.
The tokenizer is a byte-level BPE: any text, in any language, becomes a list of token ids, and the
ids decode back to the same text. Special tokens such as <|im_start|> and <|im_end|> mark the
turns of a conversation: the system message, the user's question, and the assistant's answer.
When thinking is enabled, the assistant first writes its reasoning between <think> and </think>.
A tool call is a JSON object with a name and arguments, written between <tool_call> tags; the
tool's answer comes back between <tool_response> tags in the next user turn.

def attention(query, key, value, scale):
    scores = (query @ key.transpose(-1, -2)) * scale
    weights = scores.softmax(dim=-1)
    return weights @ value

for (int i = 0; i < num_tokens; ++i) {
  const float* row = input + i * hidden_size;
  output[i] = dot(row, weight, hidden_size);
}

{"role": "user", "content": "What is the weather in Paris today?"}
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}

The numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024 3.14159 and 42 appear often in text and code.
Hello, world! How are you? I'm fine, thanks. It's a good day; we'll see what they've done.
你好，世界！今天天气很好。我们一起学习人工智能和语言模型。
こんにちは、世界。今日はいい天気ですね。トークナイザーのテストです。
안녕하세요, 세계! 오늘 날씨가 좋네요.
)TRAIN";

struct AddedSpec {
  const char* content;
  bool special;
};
constexpr AddedSpec kAddedTokens[] = {
    {"<|endoftext|>", true},  {"<|im_start|>", true},     {"<|im_end|>", true},
    {"<think>", false},       {"</think>", false},        {"<tool_call>", false},
    {"</tool_call>", false},  {"<tool_response>", false}, {"</tool_response>", false},
};
constexpr int64_t kNumAdded = sizeof(kAddedTokens) / sizeof(kAddedTokens[0]);
constexpr int64_t kMaxMerges = 512;

struct SmallVocab {
  std::vector<std::string> tokens;  // raw bytes per id
  std::vector<std::pair<int32_t, int32_t>> merges;
};

// Byte-pair encoding training on kTrainingText, deterministic: the most frequent adjacent
// pair merges first, ties going to the smaller (left id, right id).
SmallVocab train_small_vocab(int64_t max_merges) {
  SmallVocab vocab;
  std::vector<int32_t> byte_id(256);
  {
    // GPT-2's order: the printable bytes first, then the rest (so " " is id 220).
    std::vector<int> order;
    for (int b = 0; b < 256; ++b) {
      if (byte_level::byte_to_char(static_cast<uint8_t>(b)) < 256) order.push_back(b);
    }
    for (int b = 0; b < 256; ++b) {
      if (byte_level::byte_to_char(static_cast<uint8_t>(b)) >= 256) order.push_back(b);
    }
    for (int b : order) {
      byte_id[b] = static_cast<int32_t>(vocab.tokens.size());
      vocab.tokens.emplace_back(1, static_cast<char>(b));
    }
  }
  std::map<std::string, int64_t> counts;
  {
    const std::string text = kTrainingText;
    RegexSplitter splitter(kQwen3SplitPattern, false);
    std::vector<TextPiece> pieces;
    splitter.split(text, {0, static_cast<uint32_t>(text.size())}, pieces);
    for (const TextPiece& p : pieces) ++counts[text.substr(p.begin, p.end - p.begin)];
  }
  std::vector<std::pair<std::vector<int32_t>, int64_t>> words;
  for (const auto& [word, count] : counts) {
    std::vector<int32_t> symbols;
    for (unsigned char b : word) symbols.push_back(byte_id[b]);
    words.emplace_back(std::move(symbols), count);
  }
  std::map<std::string, int32_t> existing;
  for (size_t id = 0; id < vocab.tokens.size(); ++id) existing[vocab.tokens[id]] = static_cast<int32_t>(id);
  while (static_cast<int64_t>(vocab.merges.size()) < max_merges) {
    std::map<std::pair<int32_t, int32_t>, int64_t> pairs;
    for (const auto& [symbols, count] : words) {
      for (size_t i = 0; i + 1 < symbols.size(); ++i) pairs[{symbols[i], symbols[i + 1]}] += count;
    }
    std::pair<int32_t, int32_t> best{-1, -1};
    int64_t best_count = 0;
    for (const auto& [pair, count] : pairs) {
      if (count > best_count) {
        best = pair;
        best_count = count;
      }
    }
    if (best.first < 0) break;
    const std::string merged = vocab.tokens[best.first] + vocab.tokens[best.second];
    int32_t merged_id;
    auto it = existing.find(merged);
    if (it != existing.end()) {
      merged_id = it->second;
    } else {
      merged_id = static_cast<int32_t>(vocab.tokens.size());
      vocab.tokens.push_back(merged);
      existing[merged] = merged_id;
    }
    vocab.merges.push_back(best);
    for (auto& [symbols, count] : words) {
      std::vector<int32_t> next;
      next.reserve(symbols.size());
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == best.first && symbols[i + 1] == best.second) {
          next.push_back(merged_id);
          ++i;
        } else {
          next.push_back(symbols[i]);
        }
      }
      symbols.swap(next);
    }
  }
  return vocab;
}

SmallVocab small_vocab_for(int64_t vocab_size) {
  PAGELLM_CHECK(vocab_size >= 256 + kNumAdded)
      << "vocab_size " << vocab_size << " is too small for a byte-level tokenizer: it needs at least "
      << 256 + kNumAdded << " ids (256 bytes and " << kNumAdded << " added tokens)";
  // Each merge adds at most one token.
  return train_small_vocab(std::min<int64_t>(kMaxMerges, vocab_size - 256 - kNumAdded));
}

nlohmann::ordered_json byte_level_stage() {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
}

nlohmann::ordered_json added_token_json(int32_t id, const AddedSpec& spec) {
  return {{"id", id},          {"content", spec.content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},   {"normalized", false},     {"special", spec.special}};
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  PAGELLM_CHECK(out.good()) << "cannot write " << path.string();
  out << text;
  out.close();
  PAGELLM_CHECK(out.good()) << "failed writing " << path.string();
}

bool has_tokenizer_json(const std::string& dir) {
  std::error_code ec;
  return !dir.empty() && std::filesystem::is_regular_file(std::filesystem::path(dir) / "tokenizer.json", ec);
}

}  // namespace

const std::string& qwen3_chat_template() {
  static const std::string text = R"QWEN3({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %})QWEN3";
  return text;
}

std::string small_tokenizer_json(int64_t vocab_size) {
  const SmallVocab vocab = small_vocab_for(vocab_size);
  nlohmann::ordered_json root;
  root["version"] = "1.0";
  root["truncation"] = nullptr;
  root["padding"] = nullptr;
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  const int32_t first_added = static_cast<int32_t>(vocab.tokens.size());
  for (int64_t i = 0; i < kNumAdded; ++i) {
    added.push_back(added_token_json(first_added + static_cast<int32_t>(i), kAddedTokens[i]));
  }
  root["added_tokens"] = added;
  root["normalizer"] = {{"type", "NFC"}};
  root["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", kQwen3SplitPattern}}}, {"behavior", "Isolated"}, {"invert", false}},
        byte_level_stage()}}};
  root["post_processor"] = byte_level_stage();
  root["decoder"] = byte_level_stage();
  nlohmann::ordered_json model;
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = nullptr;
  model["continuing_subword_prefix"] = "";
  model["end_of_word_suffix"] = "";
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  model["ignore_merges"] = false;
  nlohmann::ordered_json vocab_json = nlohmann::ordered_json::object();
  for (size_t id = 0; id < vocab.tokens.size(); ++id) vocab_json[byte_level::encode(vocab.tokens[id])] = id;
  model["vocab"] = vocab_json;
  nlohmann::ordered_json merges = nlohmann::ordered_json::array();
  for (const auto& [left, right] : vocab.merges) {
    merges.push_back({byte_level::encode(vocab.tokens[left]), byte_level::encode(vocab.tokens[right])});
  }
  model["merges"] = merges;
  root["model"] = model;
  return root.dump(2, ' ', false);
}

std::string small_tokenizer_config_json(int64_t vocab_size) {
  const SmallVocab vocab = small_vocab_for(vocab_size);
  const int32_t first_added = static_cast<int32_t>(vocab.tokens.size());
  nlohmann::ordered_json config;
  config["add_bos_token"] = false;
  config["add_prefix_space"] = false;
  nlohmann::ordered_json decoder = nlohmann::ordered_json::object();
  for (int64_t i = 0; i < kNumAdded; ++i) {
    nlohmann::ordered_json entry = added_token_json(first_added + static_cast<int32_t>(i), kAddedTokens[i]);
    entry.erase("id");
    decoder[std::to_string(first_added + i)] = entry;
  }
  config["added_tokens_decoder"] = decoder;
  config["additional_special_tokens"] = {"<|im_start|>", "<|im_end|>"};
  config["bos_token"] = nullptr;
  config["chat_template"] = qwen3_chat_template();
  config["clean_up_tokenization_spaces"] = false;
  config["eos_token"] = "<|im_end|>";
  config["errors"] = "replace";
  config["model_max_length"] = 131072;
  config["pad_token"] = "<|endoftext|>";
  config["split_special_tokens"] = false;
  config["tokenizer_class"] = "Qwen2Tokenizer";
  config["unk_token"] = nullptr;
  return config.dump(2, ' ', false);
}

#ifndef PAGELLM_INSTALL_DATA_FROM_BIN
#define PAGELLM_INSTALL_DATA_FROM_BIN "../share/pagellm"
#endif
const char* const kInstalledQwen3TokenizerFromBin = PAGELLM_INSTALL_DATA_FROM_BIN "/qwen3-tokenizer";

std::string find_qwen3_tokenizer_dir(const std::string& source_dir, const std::string& executable_path) {
  if (const char* env = std::getenv("PAGELLM_QWEN3_TOKENIZER_DIR")) {
    if (has_tokenizer_json(env)) return env;
  }
  namespace fs = std::filesystem;
  if (!source_dir.empty()) {
    const std::string dir = (fs::path(source_dir) / "data" / "qwen3-tokenizer").lexically_normal().string();
    if (has_tokenizer_json(dir)) return dir;
  }
  if (!executable_path.empty()) {
    const std::string dir =
        (fs::path(executable_path).parent_path() / kInstalledQwen3TokenizerFromBin).lexically_normal().string();
    if (has_tokenizer_json(dir)) return dir;
  }
  return "";
}

std::string find_qwen3_tokenizer_dir(const std::string& source_dir) {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return find_qwen3_tokenizer_dir(source_dir, ec ? std::string() : exe.string());
}

std::string check_tokenizer_covers_vocab(const Tokenizer& tokenizer, int64_t vocab_size) {
  const int64_t ids = tokenizer.vocab_size();
  std::ostringstream msg;
  if (ids > vocab_size) {
    msg << "the tokenizer has ids up to " << ids - 1 << " but the model embeds only " << vocab_size
        << " (config.json vocab_size): text that encodes to ids >= " << vocab_size
        << " cannot be run; use the tokenizer the model was trained with";
  } else if (2 * ids < vocab_size) {
    msg << "the tokenizer covers only " << ids << " of the model's " << vocab_size
        << " token ids (config.json vocab_size): it is probably not the model's tokenizer (ids from "
        << ids << " up decode to no text)";
  }
  return msg.str();
}

bool write_tokenizer_for_model(const std::string& dir, int64_t vocab_size,
                               const std::string& qwen3_tokenizer_dir) {
  const std::filesystem::path out(dir);
  PAGELLM_CHECK(std::filesystem::is_directory(out)) << "model folder " << dir << " does not exist";
  if (has_tokenizer_json(qwen3_tokenizer_dir)) {
    const std::filesystem::path source(qwen3_tokenizer_dir);
    const Tokenizer real = Tokenizer::load(qwen3_tokenizer_dir);
    if (real.vocab_size() <= vocab_size) {
      for (const char* name : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
        if (!std::filesystem::exists(source / name)) continue;
        std::error_code ec;
        std::filesystem::copy_file(source / name, out / name, std::filesystem::copy_options::overwrite_existing, ec);
        PAGELLM_CHECK(!ec) << "cannot copy " << (source / name).string() << " to " << dir << ": " << ec.message();
      }
      return true;
    }
  }
  write_text(out / "tokenizer.json", small_tokenizer_json(vocab_size));
  write_text(out / "tokenizer_config.json", small_tokenizer_config_json(vocab_size));
  return false;
}

}  // namespace pagellm
