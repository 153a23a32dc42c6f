#include "pagellm/model/qwen3_weights.h"

#include <cctype>
#include <sstream>

#include "pagellm/common/check.h"

namespace pagellm {

namespace {

constexpr const char* kLayerPrefix = "model.layers.";
// Problems listed in one error before "... and N more".
constexpr size_t kMaxListedProblems = 40;

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

}  // namespace

std::string qwen3_layer_weight(int64_t layer, const std::string& suffix) {
  return kLayerPrefix + std::to_string(layer) + "." + suffix;
}

std::vector<ExpectedWeight> expected_qwen3_weights(const Qwen3Config& c) {
  const int64_t V = c.vocab_size, H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  std::vector<ExpectedWeight> w;
  w.push_back({"model.embed_tokens.weight", {V, H}, WeightKind::kEmbedding});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    auto add = [&](const char* suffix, std::vector<int64_t> shape, WeightKind kind) {
      w.push_back({qwen3_layer_weight(i, suffix), std::move(shape), kind});
    };
    add("self_attn.q_proj.weight", {c.q_size(), H}, WeightKind::kLinear);
    add("self_attn.k_proj.weight", {c.kv_size(), H}, WeightKind::kLinear);
    add("self_attn.v_proj.weight", {c.kv_size(), H}, WeightKind::kLinear);
    add("self_attn.o_proj.weight", {H, c.q_size()}, WeightKind::kLinear);
    add("self_attn.q_norm.weight", {D}, WeightKind::kNorm);
    add("self_attn.k_norm.weight", {D}, WeightKind::kNorm);
    add("mlp.gate_proj.weight", {I, H}, WeightKind::kLinear);
    add("mlp.up_proj.weight", {I, H}, WeightKind::kLinear);
    add("mlp.down_proj.weight", {H, I}, WeightKind::kLinear);
    add("input_layernorm.weight", {H}, WeightKind::kNorm);
    add("post_attention_layernorm.weight", {H}, WeightKind::kNorm);
  }
  w.push_back({"model.norm.weight", {H}, WeightKind::kNorm});
  if (!c.tie_word_embeddings) w.push_back({"lm_head.weight", {V, H}, WeightKind::kLinear});
  return w;
}

void validate_qwen3_weights(const WeightStore& store, const Qwen3Config& c) {
  std::vector<std::string> problems;
  auto check_tensor = [&](const std::string& name, const std::vector<int64_t>& shape) {
    const HostTensor* t = store.find(name);
    if (t == nullptr) {
      problems.push_back("missing tensor '" + name + "' (expected shape " +
                         shape_to_string(shape) + ")" +
                         (name == "lm_head.weight"
                              ? "; config.json has tie_word_embeddings false, so the "
                                "checkpoint must hold its own lm_head.weight"
                              : ""));
      return;
    }
    if (t->shape != shape)
      problems.push_back(t->file + ": tensor '" + name + "' has shape " + t->shape_string() +
                         ", but config.json implies " + shape_to_string(shape));
    if (!is_float(t->dtype))
      problems.push_back(t->file + ": tensor '" + name + "' has dtype " +
                         safetensors_dtype_name(t->dtype) +
                         "; weights must be F32, BF16 or F16");
  };
  for (const ExpectedWeight& w : expected_qwen3_weights(c)) check_tensor(w.name, w.shape);
  // A tied checkpoint normally has no lm_head.weight; if one is there it must still fit.
  if (c.tie_word_embeddings && store.has("lm_head.weight"))
    check_tensor("lm_head.weight", {c.vocab_size, c.hidden_size});

  // Layers past the configured count mean config.json and the weights disagree.
  int64_t max_layer = -1;
  std::string max_layer_name;
  const std::string prefix = kLayerPrefix;
  for (const std::string& name : store.names()) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    size_t end = prefix.size();
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end == prefix.size() || end - prefix.size() > 9) continue;
    const int64_t layer = std::stoll(name.substr(prefix.size(), end - prefix.size()));
    if (layer > max_layer) {
      max_layer = layer;
      max_layer_name = name;
    }
  }
  if (max_layer >= c.num_hidden_layers)
    problems.push_back(store.get(max_layer_name).file + ": tensor '" + max_layer_name +
                       "' belongs to layer " + std::to_string(max_layer) +
                       ", but config.json has num_hidden_layers " +
                       std::to_string(c.num_hidden_layers));

  if (problems.empty()) return;
  std::ostringstream msg;
  msg << store.source() << ": the weights do not match config.json (" << problems.size()
      << (problems.size() == 1 ? " problem" : " problems") << "):";
  for (size_t i = 0; i < problems.size() && i < kMaxListedProblems; ++i)
    msg << "\n  " << problems[i];
  if (problems.size() > kMaxListedProblems)
    msg << "\n  ... and " << problems.size() - kMaxListedProblems << " more";
  PAGELLM_FAIL() << msg.str();
}

}  // namespace pagellm
