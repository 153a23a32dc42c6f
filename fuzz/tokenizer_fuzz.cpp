// libFuzzer target: encode and decode never crash, and they agree with each other.
//
// Input: the first byte picks a mode, the rest is the payload.
//   even: payload is text (any bytes). Checks, with x' = the UTF-8 repair of x:
//     - decode(encode(x)) == NFC(x') when the encoding has no added token (with added
//       tokens, text is normalized piecewise between them, as in Hugging Face, so a
//       combining mark right after "<|im_end|>" is not composed with its '>');
//     - encode(decode(encode(x))) == encode(x);
//     - encode with split_special_tokens decodes to NFC(x') as well (no added specials);
//     - the streaming decoder's pieces are valid UTF-8 and add up to decode().
//   odd: payload is little-endian uint32 ids (taken modulo vocab_size + 512, so that ids
//     past the vocabulary occur). Checks that decode is valid UTF-8 and equals streaming.
// The tokenizer is Qwen3's when found (PAGELLM_QWEN3_TOKENIZER_DIR or data/qwen3-tokenizer
// in the checkout), else the small built-in one.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "pagellm/tokenizer/model_files.h"
#include "pagellm/tokenizer/tokenizer.h"
#include "pagellm/tokenizer/utf8.h"

namespace {

const pagellm::Tokenizer& tokenizer() {
  static const pagellm::Tokenizer tok = [] {
    const std::string source = std::filesystem::path(__FILE__).parent_path().parent_path().string();
    const std::string dir = pagellm::find_qwen3_tokenizer_dir(source);
    if (!dir.empty()) {
      std::fprintf(stderr, "tokenizer_fuzz: Qwen3 tokenizer from %s\n", dir.c_str());
      return pagellm::Tokenizer::load(dir);
    }
    std::fprintf(stderr, "tokenizer_fuzz: small built-in tokenizer\n");
    return pagellm::Tokenizer::from_json(pagellm::small_tokenizer_json(4096),
                                         pagellm::small_tokenizer_config_json(4096), "small");
  }();
  return tok;
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "tokenizer_fuzz: property violated: %s\n", what);
  std::abort();
}

bool has_added_token(const pagellm::Tokenizer& tok, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    for (const auto& added : tok.added_tokens()) {
      if (added.id == id) return true;
    }
  }
  return false;
}

void check_stream(const pagellm::Tokenizer& tok, const std::vector<int32_t>& ids, const std::string& full) {
  pagellm::StreamDecoder stream = tok.stream_decoder();
  std::string joined;
  for (int32_t id : ids) {
    const std::string piece = stream.push(id);
    if (!pagellm::utf8::is_valid(piece)) fail("a streamed piece is not valid UTF-8");
    joined += piece;
  }
  joined += stream.finish();
  if (joined != full) fail("streamed pieces do not add up to decode()");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const pagellm::Tokenizer& tok = tokenizer();
  const std::string payload(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    const std::vector<int32_t> ids = tok.encode(payload);
    const std::string text = tok.decode(ids);
    if (!pagellm::utf8::is_valid(text)) fail("decode() returned invalid UTF-8");
    const std::string expected = pagellm::utf8::nfc(pagellm::utf8::make_valid(payload));
    if (!has_added_token(tok, ids) && text != expected) fail("decode(encode(x)) != NFC(x)");
    if (tok.encode(text) != ids) fail("encode(decode(encode(x))) != encode(x)");
    pagellm::EncodeOptions split;
    split.split_special_tokens = true;
    const std::vector<int32_t> split_ids = tok.encode(payload, split);
    for (int32_t id : split_ids) {
      if (tok.is_special(id)) fail("split_special_tokens produced a special token");
    }
    if (!has_added_token(tok, split_ids) && tok.decode(split_ids) != expected) {
      fail("decode(encode(x, split_special_tokens)) != NFC(x)");
    }
    check_stream(tok, ids, text);
  } else {
    std::vector<int32_t> ids;
    const uint32_t range = static_cast<uint32_t>(tok.vocab_size()) + 512;
    for (size_t i = 0; i + 4 <= payload.size(); i += 4) {
      uint32_t v;
      std::memcpy(&v, payload.data() + i, 4);
      ids.push_back(static_cast<int32_t>(v % range));
    }
    for (bool skip : {false, true}) {
      pagellm::DecodeOptions options;
      options.skip_special_tokens = skip;
      const std::string text = tok.decode(ids, options);
      if (!pagellm::utf8::is_valid(text)) fail("decode() returned invalid UTF-8");
      if (!skip) check_stream(tok, ids, text);
    }
  }
  return 0;
}
