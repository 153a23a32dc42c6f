#include "pagellm/tokenizer/tokenizer.h"

#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_map>

#include "pagellm/common/check.h"
#include "pagellm/tokenizer/bpe.h"
#include "pagellm/tokenizer/byte_level.h"
#include "pagellm/tokenizer/chat_template.h"
#include "pagellm/tokenizer/pre_tokenizer.h"
#include "pagellm/tokenizer/utf8.h"

namespace pagellm {

struct Tokenizer::Impl {
  std::string source;

  // Vocabulary and added tokens.
  std::vector<std::string> id_to_token;  // byte-level strings; "" where no token
  std::vector<bool> has_token;
  std::unordered_map<std::string, int32_t> token_to_id;
  std::vector<AddedToken> added;
  std::vector<bool> special;             // per id
  std::vector<uint32_t> bytes_offset;    // per id + 1: decoded bytes in bytes_arena
  std::string bytes_arena;

  // Encoding pipeline.
  bool nfc = false;
  AddedTokenMatcher raw_matcher;         // added tokens with normalized=false
  AddedTokenMatcher normalized_matcher;  // added tokens with normalized=true
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> bpe;
  mutable BpeCachePool caches;

  // tokenizer_config.json.
  std::optional<int32_t> eos_id, bos_id, pad_id;
  nlohmann::ordered_json special_tokens_map = nlohmann::ordered_json::object();
  std::unique_ptr<ChatTemplate> chat_template;
  std::string chat_template_error;  // why chat_template is null

  std::string_view bytes_of(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) + 1 >= bytes_offset.size()) return {};
    return std::string_view(bytes_arena).substr(bytes_offset[id], bytes_offset[id + 1] - bytes_offset[id]);
  }
  bool skipped(int32_t id, const DecodeOptions& options) const {
    return options.skip_special_tokens && id >= 0 && static_cast<size_t>(id) < special.size() &&
           special[id];
  }

  void encode_text(std::string_view text, std::vector<int32_t>& out,
                   const EncodeOptions& options) const;
  void encode_normalized(std::string_view text, std::vector<int32_t>& out, BpeCache* cache,
                         BpeWorkspace& ws, std::vector<TextPiece>& pieces,
                         std::vector<TextPiece>& scratch) const;
};

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PAGELLM_CHECK(in.good()) << "cannot open " << path;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

bool file_exists(const std::string& path) { return std::ifstream(path).good(); }

// tokenizer_config.json writes a special token either as a string or as an AddedToken
// object {"content": ..., "__type": "AddedToken", ...}.
std::optional<std::string> token_name(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  PAGELLM_FAIL() << "tokenizer_config.json: \"" << key
                 << "\" must be a string or an object with \"content\"";
}

void check_supported_model(const nlohmann::json& model, const std::string& source) {
  const std::string type = model.value("type", "BPE");
  PAGELLM_CHECK(type == "BPE") << source << ": model type \"" << type
                               << "\" is not supported (supported: byte-level BPE)";
  auto empty_or_null = [&](const char* key) {
    auto it = model.find(key);
    return it == model.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty());
  };
  PAGELLM_CHECK(empty_or_null("continuing_subword_prefix") && empty_or_null("end_of_word_suffix"))
      << source << ": BPE continuing_subword_prefix/end_of_word_suffix are not supported "
      << "(byte-level BPE leaves them empty)";
  auto dropout = model.find("dropout");
  PAGELLM_CHECK(dropout == model.end() || dropout->is_null() ||
                (dropout->is_number() && dropout->get<double>() == 0.0))
      << source << ": BPE dropout is not supported (it must be null for inference)";
  PAGELLM_CHECK(!model.value("byte_fallback", false))
      << source << ": BPE byte_fallback is not supported (byte-level BPE needs none)";
}

void check_normalizer(const nlohmann::json& normalizer, const std::string& source, bool& nfc) {
  nfc = false;
  if (normalizer.is_null()) return;
  const std::string type = normalizer.value("type", "");
  if (type == "NFC") {
    nfc = true;
    return;
  }
  if (type == "Sequence") {
    for (const auto& child : normalizer.at("normalizers")) {
      bool child_nfc = false;
      check_normalizer(child, source, child_nfc);
      nfc = nfc || child_nfc;
    }
    return;
  }
  PAGELLM_FAIL() << source << ": normalizer \"" << type << "\" is not supported (supported: NFC, null)";
}

void check_byte_level_stage(const nlohmann::json& node, const char* field, const std::string& source,
                            bool allow_null) {
  if (node.is_null()) {
    PAGELLM_CHECK(allow_null) << source << ": \"" << field
                              << "\" is null; a ByteLevel decoder is required";
    return;
  }
  const std::string type = node.value("type", "");
  PAGELLM_CHECK(type == "ByteLevel") << source << ": " << field << " \"" << type
                                     << "\" is not supported (supported: ByteLevel)";
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& model_dir) {
  const std::string json_path = model_dir + "/tokenizer.json";
  PAGELLM_CHECK(file_exists(json_path))
      << "no tokenizer.json in " << model_dir
      << " (a Hugging Face model folder with a byte-level BPE tokenizer.json is expected)";
  const std::string config_path = model_dir + "/tokenizer_config.json";
  const std::string template_path = model_dir + "/chat_template.jinja";
  return from_json(read_file(json_path),
                   file_exists(config_path) ? read_file(config_path) : std::string(), json_path,
                   file_exists(template_path) ? read_file(template_path) : std::string());
}

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view tokenizer_config_json,
                               const std::string& source, std::string_view chat_template) {
  auto impl = std::make_shared<Impl>();
  impl->source = source;
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(tokenizer_json.begin(), tokenizer_json.end());
  } catch (const nlohmann::json::exception& e) {
    PAGELLM_FAIL() << source << ": not valid JSON: " << e.what();
  }
  PAGELLM_CHECK(root.is_object() && root.contains("model"))
      << source << ": expected a tokenizer.json object with a \"model\" field";
  try {
    const nlohmann::json& model = root["model"];
    check_supported_model(model, source);
    check_normalizer(root.value("normalizer", nlohmann::json()), source, impl->nfc);
    check_byte_level_stage(root.value("decoder", nlohmann::json()), "decoder", source, false);
    check_byte_level_stage(root.value("post_processor", nlohmann::json()), "post_processor", source,
                           true);
    impl->pre_tokenizer = PreTokenizer::from_json(root.value("pre_tokenizer", nlohmann::json()));

    // Vocabulary.
    const nlohmann::json& vocab = model.at("vocab");
    PAGELLM_CHECK(vocab.is_object()) << source << ": model.vocab must be an object";
    // One pass over the (tree-backed) JSON object; everything else uses this list.
    std::vector<std::pair<const std::string*, int32_t>> entries;
    entries.reserve(vocab.size());
    int64_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      PAGELLM_CHECK(it.value().is_number_integer() && it.value().get<int64_t>() >= 0 &&
                    it.value().get<int64_t>() < std::numeric_limits<int32_t>::max())
          << source << ": vocab entry \"" << it.key() << "\" has an invalid id";
      entries.emplace_back(&it.key(), it.value().get<int32_t>());
      max_id = std::max<int64_t>(max_id, entries.back().second);
    }
    const nlohmann::json& added = root.value("added_tokens", nlohmann::json::array());
    for (const auto& token : added) {
      const int64_t id = token.at("id").get<int64_t>();
      PAGELLM_CHECK(id >= 0 && id < std::numeric_limits<int32_t>::max())
          << source << ": added token has an invalid id " << id;
      max_id = std::max(max_id, id);
    }
    const size_t size = static_cast<size_t>(max_id + 1);
    impl->id_to_token.assign(size, std::string());
    impl->has_token.assign(size, false);
    impl->special.assign(size, false);
    impl->token_to_id.reserve(entries.size() * 2);
    for (const auto& [token, id] : entries) {
      impl->id_to_token[id] = *token;
      impl->has_token[id] = true;
      impl->token_to_id.emplace(*token, id);
    }

    // Added tokens take precedence over the vocabulary for both directions.
    std::vector<AddedToken> raw_tokens, normalized_tokens;
    for (const auto& token : added) {
      AddedToken t;
      t.id = token.at("id").get<int32_t>();
      t.content = token.at("content").get<std::string>();
      t.special = token.value("special", false);
      t.single_word = token.value("single_word", false);
      t.lstrip = token.value("lstrip", false);
      t.rstrip = token.value("rstrip", false);
      t.normalized = token.value("normalized", !t.special);
      PAGELLM_CHECK(!t.content.empty()) << source << ": added token " << t.id << " is empty";
      impl->id_to_token[t.id] = t.content;
      impl->has_token[t.id] = true;
      impl->token_to_id[t.content] = t.id;
      impl->added.push_back(t);
      if (t.normalized) {
        AddedToken n = t;
        if (impl->nfc) n.content = utf8::nfc(t.content);
        normalized_tokens.push_back(std::move(n));
      } else {
        raw_tokens.push_back(t);
      }
    }
    // Hugging Face decides "special" by content, so a vocabulary id whose string equals a
    // special token's content is skipped as well.
    for (const AddedToken& t : impl->added) {
      if (!t.special) continue;
      impl->special[t.id] = true;
    }
    impl->raw_matcher = AddedTokenMatcher(std::move(raw_tokens));
    impl->normalized_matcher = AddedTokenMatcher(std::move(normalized_tokens));

    // Decoded bytes of every id (ByteLevel decoder rule).
    impl->bytes_offset.assign(size + 1, 0);
    impl->bytes_arena.reserve(size * 7);
    for (size_t id = 0; id < size; ++id) {
      impl->bytes_offset[id] = static_cast<uint32_t>(impl->bytes_arena.size());
      if (!impl->has_token[id]) continue;
      if (auto bytes = byte_level::decode(impl->id_to_token[id])) {
        impl->bytes_arena += *bytes;
      } else {
        impl->bytes_arena += impl->id_to_token[id];
      }
    }
    impl->bytes_offset[size] = static_cast<uint32_t>(impl->bytes_arena.size());

    // BPE: byte alphabet, merges, and (for ignore_merges) raw bytes -> id.
    std::vector<int32_t> byte_ids(256, -1);
    for (int b = 0; b < 256; ++b) {
      std::string ch;
      utf8::append_code_point(ch, byte_level::byte_to_char(static_cast<uint8_t>(b)));
      auto it = vocab.find(ch);
      if (it != vocab.end() && it.value().is_number_integer()) byte_ids[b] = it.value().get<int32_t>();
    }
    // Merges name tokens by string; look them up in a hash map of the vocabulary alone
    // (an added token with the same content must not capture a merge).
    std::unordered_map<std::string_view, int32_t> vocab_ids;
    vocab_ids.reserve(entries.size() * 2);
    for (const auto& [token, id] : entries) vocab_ids.emplace(*token, id);
    std::string joined;
    auto vocab_id = [&](std::string_view token) -> int32_t {
      auto it = vocab_ids.find(token);
      PAGELLM_CHECK(it != vocab_ids.end())
          << source << ": merge uses \"" << token << "\", which is not in the vocabulary";
      return it->second;
    };
    std::vector<BpeModel::Merge> merges;
    const nlohmann::json& merge_list = model.value("merges", nlohmann::json::array());
    merges.reserve(merge_list.size());
    for (const auto& merge : merge_list) {
      std::string_view left, right;
      if (merge.is_string()) {
        const std::string& line = merge.get_ref<const std::string&>();
        const size_t space = line.find(' ');
        PAGELLM_CHECK(space != std::string::npos && line.find(' ', space + 1) == std::string::npos)
            << source << ": merge \"" << line << "\" must be two tokens separated by one space";
        left = std::string_view(line).substr(0, space);
        right = std::string_view(line).substr(space + 1);
      } else {
        PAGELLM_CHECK(merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string())
            << source << ": a merge must be \"a b\" or [\"a\", \"b\"]";
        left = merge[0].get_ref<const std::string&>();
        right = merge[1].get_ref<const std::string&>();
      }
      joined.assign(left);
      joined.append(right);
      merges.push_back({vocab_id(left), vocab_id(right), vocab_id(joined)});
    }
    const bool ignore_merges = model.value("ignore_merges", false);
    std::unordered_map<std::string, int32_t> whole_pieces;
    if (ignore_merges) {
      for (const auto& [token, id] : entries) {
        if (auto bytes = byte_level::decode(*token)) whole_pieces[*bytes] = id;
      }
    }
    impl->bpe = std::make_unique<BpeModel>(std::move(byte_ids), merges, ignore_merges,
                                           std::move(whole_pieces));
  } catch (const nlohmann::json::exception& e) {
    PAGELLM_FAIL() << source << ": unexpected tokenizer.json layout: " << e.what();
  }

  // tokenizer_config.json: special token names and the chat template.
  std::string template_source(chat_template);
  if (!tokenizer_config_json.empty()) {
    nlohmann::json config;
    try {
      config = nlohmann::json::parse(tokenizer_config_json.begin(), tokenizer_config_json.end());
    } catch (const nlohmann::json::exception& e) {
      PAGELLM_FAIL() << source << ": tokenizer_config.json is not valid JSON: " << e.what();
    }
    PAGELLM_CHECK(config.is_object()) << source << ": tokenizer_config.json must be an object";
    for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                            "cls_token", "mask_token"}) {
      if (auto name = token_name(config, key)) impl->special_tokens_map[key] = *name;
    }
    auto id_of = [&](const char* key) -> std::optional<int32_t> {
      auto name = token_name(config, key);
      if (!name) return std::nullopt;
      auto it = impl->token_to_id.find(*name);
      PAGELLM_CHECK(it != impl->token_to_id.end())
          << source << ": tokenizer_config.json " << key << " \"" << *name
          << "\" is not a token of tokenizer.json";
      return it->second;
    };
    impl->eos_id = id_of("eos_token");
    impl->bos_id = id_of("bos_token");
    impl->pad_id = id_of("pad_token");
    if (template_source.empty() && config.contains("chat_template")) {
      const auto& t = config["chat_template"];
      if (t.is_string()) {
        template_source = t.get<std::string>();
      } else if (t.is_array()) {
        // A list of named templates: use "default".
        for (const auto& named : t) {
          if (named.value("name", "") == "default") template_source = named.value("template", "");
        }
        if (template_source.empty()) {
          impl->chat_template_error = source + ": tokenizer_config.json has named chat templates "
                                               "but none called \"default\"";
        }
      }
    }
  }
  if (!template_source.empty()) {
    try {
      impl->chat_template = std::make_unique<ChatTemplate>(template_source, impl->special_tokens_map);
    } catch (const Error& e) {
      // The tokenizer stays usable for encode/decode; using the template reports this.
      impl->chat_template_error = std::string("the model's chat template cannot be used: ") + e.what();
    }
  } else if (impl->chat_template_error.empty()) {
    impl->chat_template_error = source + ": the model has no chat_template (looked in "
                                         "tokenizer_config.json and chat_template.jinja)";
  }
  return Tokenizer(std::move(impl));
}

void Tokenizer::Impl::encode_normalized(std::string_view text, std::vector<int32_t>& out,
                                        BpeCache* cache, BpeWorkspace& ws,
                                        std::vector<TextPiece>& pieces,
                                        std::vector<TextPiece>& scratch) const {
  pre_tokenizer->split(text, pieces, scratch);
  for (const TextPiece& piece : pieces) {
    const std::string_view bytes = text.substr(piece.begin, piece.end - piece.begin);
    if (cache != nullptr && bytes.size() <= BpeCache::kMaxPieceBytes) {
      const uint64_t hash = hash_bytes(bytes);
      uint32_t count = 0;
      if (const int32_t* ids = cache->find(bytes, hash, count)) {
        out.insert(out.end(), ids, ids + count);
        continue;
      }
      const size_t first = out.size();
      bpe->encode_piece(bytes, out, ws);
      cache->insert(bytes, hash, out.data() + first, static_cast<uint32_t>(out.size() - first));
    } else {
      bpe->encode_piece(bytes, out, ws);
    }
  }
}

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& out,
                                  const EncodeOptions& options) const {
  PAGELLM_CHECK(text.size() < (size_t{1} << 31))
      << "cannot encode " << text.size() << " bytes at once (the limit is 2 GiB)";
  BpeCachePool::Lease lease(caches);
  BpeWorkspace ws;
  std::vector<TextPiece> pieces, scratch;
  std::vector<AddedSegment> segments, inner;
  const bool match_special = !options.split_special_tokens;
  raw_matcher.split(text, match_special, segments);
  std::string normalized;
  for (const AddedSegment& segment : segments) {
    if (segment.token_id >= 0) {
      out.push_back(segment.token_id);
      continue;
    }
    std::string_view plain = text.substr(segment.begin, segment.end - segment.begin);
    if (nfc && !utf8::is_nfc_quick(plain)) {
      normalized = utf8::nfc(plain);
      plain = normalized;
    }
    if (normalized_matcher.empty()) {
      encode_normalized(plain, out, lease.get(), ws, pieces, scratch);
      continue;
    }
    normalized_matcher.split(plain, match_special, inner);
    for (const AddedSegment& part : inner) {
      if (part.token_id >= 0) {
        out.push_back(part.token_id);
      } else {
        encode_normalized(plain.substr(part.begin, part.end - part.begin), out, lease.get(), ws,
                          pieces, scratch);
      }
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (utf8::is_valid(text)) {
    impl_->encode_text(text, ids, options);
  } else {
    impl_->encode_text(utf8::make_valid(text), ids, options);
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, const DecodeOptions& options) const {
  return decode(ids.data(), ids.size(), options);
}

std::string Tokenizer::decode(const int32_t* ids, size_t count, const DecodeOptions& options) const {
  std::string bytes;
  bytes.reserve(count * 4);
  for (size_t i = 0; i < count; ++i) {
    if (impl_->skipped(ids[i], options)) continue;
    bytes += impl_->bytes_of(ids[i]);
  }
  if (utf8::is_valid(bytes)) return bytes;
  std::string text;
  utf8::append_lossy(text, bytes, /*final=*/true);
  return text;
}

StreamDecoder Tokenizer::stream_decoder(const DecodeOptions& options) const {
  return StreamDecoder(impl_, options);
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_to_token.size()); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->token_to_id.find(std::string(token));
  if (it == impl_->token_to_id.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !impl_->has_token[id]) return std::nullopt;
  return impl_->id_to_token[id];
}

std::string_view Tokenizer::token_bytes(int32_t id) const { return impl_->bytes_of(id); }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[id];
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }

std::optional<int32_t> Tokenizer::eos_token_id() const { return impl_->eos_id; }
std::optional<int32_t> Tokenizer::bos_token_id() const { return impl_->bos_id; }
std::optional<int32_t> Tokenizer::pad_token_id() const { return impl_->pad_id; }

std::vector<int32_t> Tokenizer::stop_token_ids() const {
  std::vector<int32_t> ids;
  auto add = [&](std::optional<int32_t> id) {
    if (id && std::find(ids.begin(), ids.end(), *id) == ids.end()) ids.push_back(*id);
  };
  add(impl_->eos_id);
  add(token_to_id("<|im_end|>"));
  add(token_to_id("<|endoftext|>"));
  return ids;
}

const nlohmann::ordered_json& Tokenizer::special_tokens_map() const { return impl_->special_tokens_map; }

bool Tokenizer::has_chat_template() const { return impl_->chat_template != nullptr; }

const ChatTemplate& Tokenizer::chat_template() const {
  PAGELLM_CHECK(impl_->chat_template != nullptr) << impl_->chat_template_error;
  return *impl_->chat_template;
}

std::string StreamDecoder::push(int32_t id) {
  if (impl_->skipped(id, options_)) return {};
  const std::string_view bytes = impl_->bytes_of(id);
  if (bytes.empty()) return {};
  std::string text;
  if (pending_.empty()) {
    const size_t used = utf8::append_lossy(text, bytes, /*final=*/false);
    pending_.assign(bytes.substr(used));
  } else {
    pending_.append(bytes);
    const size_t used = utf8::append_lossy(text, pending_, /*final=*/false);
    pending_.erase(0, used);
  }
  return text;
}

std::string StreamDecoder::finish() {
  std::string text;
  utf8::append_lossy(text, pending_, /*final=*/true);
  pending_.clear();
  return text;
}

}  // namespace pagellm
