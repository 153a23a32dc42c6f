// The tensors a Qwen3ForCausalLM checkpoint holds, by Hugging Face name, and their check.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagellm/model/config.h"
#include "pagellm/model/weight_store.h"

namespace pagellm {

/// What a weight is; make_model uses it to pick the initialisation.
enum class WeightKind : uint8_t {
  kEmbedding,  // [vocab, hidden]
  kLinear,     // [out_features, in_features]: y = x · Wᵀ
  kNorm,       // RMSNorm scale, [features]
};

/// One tensor a Qwen3 checkpoint must contain.
struct ExpectedWeight {
  std::string name;
  std::vector<int64_t> shape;
  WeightKind kind;
};

/// HF name of a per-layer weight: qwen3_layer_weight(3, "mlp.up_proj.weight") is
/// "model.layers.3.mlp.up_proj.weight".
std::string qwen3_layer_weight(int64_t layer, const std::string& suffix);

/// Every tensor of Qwen3ForCausalLM for this config, in state_dict order (the order
/// save_pretrained shards in). With V vocab, H hidden, I intermediate, D head_dim,
/// Hq/Hkv heads:
///   model.embed_tokens.weight                        [V, H]
///   model.layers.{i}.self_attn.q_proj.weight          [Hq·D, H]
///   model.layers.{i}.self_attn.k_proj.weight          [Hkv·D, H]
///   model.layers.{i}.self_attn.v_proj.weight          [Hkv·D, H]
///   model.layers.{i}.self_attn.o_proj.weight          [H, Hq·D]
///   model.layers.{i}.self_attn.q_norm.weight          [D]
///   model.layers.{i}.self_attn.k_norm.weight          [D]
///   model.layers.{i}.mlp.gate_proj.weight             [I, H]
///   model.layers.{i}.mlp.up_proj.weight               [I, H]
///   model.layers.{i}.mlp.down_proj.weight             [H, I]
///   model.layers.{i}.input_layernorm.weight           [H]
///   model.layers.{i}.post_attention_layernorm.weight  [H]
///   model.norm.weight                                 [H]
///   lm_head.weight                                    [V, H]   (only when not tied)
/// A tied model reuses model.embed_tokens.weight as the output projection, and
/// save_pretrained leaves lm_head.weight out of its files.
std::vector<ExpectedWeight> expected_qwen3_weights(const Qwen3Config& config);

/// Checks that the store holds every expected weight with the expected shape and a float
/// dtype (F32, BF16 or F16; mixed is fine), and no layers past num_hidden_layers. Reports
/// every problem at once, each naming the file, the tensor and what was expected, then
/// throws Error. Other tensors are ignored (a tied model's surplus lm_head.weight too, as
/// long as its shape is right).
void validate_qwen3_weights(const WeightStore& store, const Qwen3Config& config);

}  // namespace pagellm
