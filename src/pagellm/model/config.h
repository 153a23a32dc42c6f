// Qwen3 model configuration, as read from a Hugging Face config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagellm/common/dtype.h"

namespace pagellm {

/// The fields of a dense Qwen3 config.json that the engine uses.
///
/// Both spellings that transformers writes are read: 4.x ("torch_dtype", "rope_theta",
/// "rope_scaling": null) and 5.x ("dtype", "rope_parameters": {"rope_type": "default",
/// "rope_theta": ...}, "layer_types"). Features this engine does not implement (rope
/// scaling, sliding-window layers, attention bias, an activation other than SiLU, MoE) are
/// rejected with an error rather than silently ignored.
struct Qwen3Config {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // absent in config.json: hidden_size / num_attention_heads
  double rope_theta = 1000000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  DType torch_dtype = DType::BF16;  // absent in config.json: bfloat16
  int64_t bos_token_id = -1;        // -1: absent
  int64_t eos_token_id = -1;        // -1: absent; the first of eos_token_ids
  /// Every end-of-sequence id (config.json allows an int or a list); empty when absent.
  std::vector<int64_t> eos_token_ids;
  int64_t pad_token_id = -1;  // -1: absent

  int64_t q_size() const { return num_attention_heads * head_dim; }
  int64_t kv_size() const { return num_key_value_heads * head_dim; }
  int64_t qkv_size() const { return q_size() + 2 * kv_size(); }
  /// Number of parameters (counting a tied lm_head once).
  int64_t num_parameters() const;
};

/// Checks the sizes of a config built in code (parse_qwen3_config calls it too): every size
/// positive, num_attention_heads divisible by num_key_value_heads, a floating torch_dtype,
/// token ids inside the vocabulary. `source` names the origin in error messages.
void validate_qwen3_config(const Qwen3Config& config, const std::string& source);

/// Parses and validates config.json text. `source` names the file in error messages.
/// Throws Error naming the field and the problem for a missing, mistyped or inconsistent
/// field (for example heads not divisible by kv heads).
Qwen3Config parse_qwen3_config(const std::string& json_text, const std::string& source);
/// Reads DIR/config.json.
Qwen3Config load_qwen3_config(const std::string& model_dir);
/// Serialises to config.json text as transformers writes it for Qwen3ForCausalLM (the
/// layout of the released Qwen3 checkpoints: "torch_dtype", "rope_theta", keys sorted,
/// two-space indent), which both transformers 4.51+ and 5.x load.
std::string qwen3_config_to_json(const Qwen3Config& config);

}  // namespace pagellm
