// libFuzzer target: config.json parsing never crashes, and what it accepts is sound.
//
// Input: config.json text (any bytes). parse_qwen3_config either throws pagellm::Error or
// returns a config that
//   - passes validate_qwen3_config (every size positive, heads divisible, ids in range);
//   - has a parameter count that the loader can compute (num_parameters() is what
//     Qwen3Model sizes its weights from; UBSan reports a signed overflow in it);
//   - survives a round trip: qwen3_config_to_json then parse gives the same fields.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "pagellm/common/check.h"
#include "pagellm/model/config.h"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "config_fuzz: property violated: %s\n", what);
  std::abort();
}

bool same(const pagellm::Qwen3Config& a, const pagellm::Qwen3Config& b) {
  return a.vocab_size == b.vocab_size && a.hidden_size == b.hidden_size &&
         a.intermediate_size == b.intermediate_size &&
         a.num_hidden_layers == b.num_hidden_layers &&
         a.num_attention_heads == b.num_attention_heads &&
         a.num_key_value_heads == b.num_key_value_heads && a.head_dim == b.head_dim &&
         a.rope_theta == b.rope_theta && a.rms_norm_eps == b.rms_norm_eps &&
         a.tie_word_embeddings == b.tie_word_embeddings &&
         a.max_position_embeddings == b.max_position_embeddings &&
         a.torch_dtype == b.torch_dtype && a.bos_token_id == b.bos_token_id &&
         a.eos_token_id == b.eos_token_id && a.eos_token_ids == b.eos_token_ids &&
         a.pad_token_id == b.pad_token_id;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  pagellm::Qwen3Config config;
  try {
    config = pagellm::parse_qwen3_config(text, "config.json");
  } catch (const pagellm::Error&) {
    return 0;  // rejected with a message: fine
  }
  try {
    pagellm::validate_qwen3_config(config, "parsed");
  } catch (const pagellm::Error&) {
    fail("a parsed config does not validate");
  }
  if (config.num_parameters() <= 0) fail("num_parameters() is not positive");
  pagellm::Qwen3Config again;
  try {
    again = pagellm::parse_qwen3_config(pagellm::qwen3_config_to_json(config), "round trip");
  } catch (const pagellm::Error& e) {
    std::fprintf(stderr, "config_fuzz: %s\n", e.what());
    fail("the serialized config does not parse");
  }
  if (!same(config, again)) fail("parse(to_json(config)) != config");
  return 0;
}
