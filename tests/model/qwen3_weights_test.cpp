// The Qwen3 weight list and its validation against a WeightStore.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "model/model_test_util.h"
#include "pagellm/model/make_model.h"
#include "pagellm/model/qwen3_weights.h"

namespace pagellm {
namespace {

using testing::error_of;
using testing::TempDir;

// A small config: V=32 H=8 I=16 L=2, 2 query heads and 1 KV head of D=6 (q_size 12).
Qwen3Config small_config(bool tied) {
  Qwen3Config c;
  c.vocab_size = 32;
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 6;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied;
  return c;
}

struct Tensor4Test {
  DType dtype;
  std::vector<int64_t> shape;
};

// Writes the given tensors (zero-filled) as one model.safetensors and opens the folder.
WeightStore write_store(const TempDir& dir, const std::map<std::string, Tensor4Test>& tensors) {
  std::vector<TensorToWrite> files;
  for (const auto& [name, spec] : tensors) {
    TensorToWrite t;
    t.name = name;
    t.dtype = spec.dtype;
    t.shape = spec.shape;
    const size_t elem = dtype_size(spec.dtype);
    t.fill = [elem](int64_t, int64_t count, void* dst) { std::memset(dst, 0, count * elem); };
    files.push_back(std::move(t));
  }
  write_safetensors(dir.file("model.safetensors"), files);
  return WeightStore::open(dir.path());
}

std::map<std::string, Tensor4Test> expected_tensors(const Qwen3Config& c,
                                                    DType dtype = DType::BF16) {
  std::map<std::string, Tensor4Test> out;
  for (const ExpectedWeight& w : expected_qwen3_weights(c)) out[w.name] = {dtype, w.shape};
  return out;
}

std::string validate_error(const WeightStore& store, const Qwen3Config& c) {
  return error_of([&] { validate_qwen3_weights(store, c); });
}

TEST(Qwen3Weights, NamesAndShapes) {
  const Qwen3Config c = preset_config("tiny");  // H=64, 4 heads x 32, 2 KV heads, I=192
  const auto weights = expected_qwen3_weights(c);
  ASSERT_EQ(weights.size(), 1u + 2 * 11 + 1 + 1);
  std::map<std::string, std::vector<int64_t>> shape;
  for (const auto& w : weights) shape[w.name] = w.shape;
  EXPECT_EQ(weights.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(weights.back().name, "lm_head.weight");
  using S = std::vector<int64_t>;
  EXPECT_EQ(shape["model.embed_tokens.weight"], (S{1024, 64}));
  EXPECT_EQ(shape["model.layers.1.self_attn.q_proj.weight"], (S{128, 64}));
  EXPECT_EQ(shape["model.layers.1.self_attn.k_proj.weight"], (S{64, 64}));
  EXPECT_EQ(shape["model.layers.1.self_attn.v_proj.weight"], (S{64, 64}));
  EXPECT_EQ(shape["model.layers.1.self_attn.o_proj.weight"], (S{64, 128}));
  EXPECT_EQ(shape["model.layers.0.self_attn.q_norm.weight"], (S{32}));
  EXPECT_EQ(shape["model.layers.0.self_attn.k_norm.weight"], (S{32}));
  EXPECT_EQ(shape["model.layers.0.input_layernorm.weight"], (S{64}));
  EXPECT_EQ(shape["model.layers.0.post_attention_layernorm.weight"], (S{64}));
  EXPECT_EQ(shape["model.layers.0.mlp.gate_proj.weight"], (S{192, 64}));
  EXPECT_EQ(shape["model.layers.0.mlp.up_proj.weight"], (S{192, 64}));
  EXPECT_EQ(shape["model.layers.0.mlp.down_proj.weight"], (S{64, 192}));
  EXPECT_EQ(shape["model.norm.weight"], (S{64}));
  EXPECT_EQ(shape["lm_head.weight"], (S{1024, 64}));
  EXPECT_EQ(qwen3_layer_weight(3, "mlp.up_proj.weight"), "model.layers.3.mlp.up_proj.weight");
}

TEST(Qwen3Weights, TiedModelsHaveNoLmHead) {
  Qwen3Config c = preset_config("qwen3-0.6b");
  const auto weights = expected_qwen3_weights(c);
  EXPECT_TRUE(std::none_of(weights.begin(), weights.end(),
                           [](const auto& w) { return w.name == "lm_head.weight"; }));
  // The element count of the list is the config's parameter count.
  for (const char* preset : {"qwen3-0.6b", "qwen3-8b", "tiny"}) {
    c = preset_config(preset);
    int64_t total = 0;
    for (const auto& w : expected_qwen3_weights(c)) {
      int64_t n = 1;
      for (int64_t d : w.shape) n *= d;
      total += n;
    }
    EXPECT_EQ(total, c.num_parameters()) << preset;
  }
}

TEST(Qwen3Weights, ValidStoresPass) {
  for (bool tied : {false, true}) {
    TempDir dir;
    const Qwen3Config c = small_config(tied);
    WeightStore store = write_store(dir, expected_tensors(c));
    EXPECT_NO_THROW(validate_qwen3_weights(store, c)) << "tied " << tied;
  }
  // Mixed float dtypes are fine; a tied checkpoint may carry a (right-shaped) lm_head.
  TempDir dir;
  const Qwen3Config c = small_config(true);
  auto tensors = expected_tensors(c);
  tensors["model.norm.weight"].dtype = DType::F32;
  tensors["model.embed_tokens.weight"].dtype = DType::F16;
  tensors["lm_head.weight"] = {DType::BF16, {32, 8}};
  tensors["model.rotary_emb.inv_freq"] = {DType::F32, {3}};  // unknown extras are ignored
  EXPECT_NO_THROW(validate_qwen3_weights(write_store(dir, tensors), c));
}

TEST(Qwen3Weights, UntiedModelWithoutLmHead) {
  TempDir dir;
  const Qwen3Config tied = small_config(true);
  WeightStore store = write_store(dir, expected_tensors(tied));
  std::string err = validate_error(store, small_config(false));
  EXPECT_NE(err.find("missing tensor 'lm_head.weight' (expected shape [32, 8])"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("tie_word_embeddings false"), std::string::npos) << err;
  EXPECT_NE(err.find("(1 problem)"), std::string::npos) << err;
}

TEST(Qwen3Weights, ReportsEveryProblemWithFileAndTensor) {
  TempDir dir;
  const Qwen3Config c = small_config(false);
  auto tensors = expected_tensors(c);
  tensors.erase("model.layers.1.mlp.down_proj.weight");
  tensors.erase("model.norm.weight");
  tensors["model.layers.0.self_attn.k_proj.weight"].shape = {8, 8};  // should be [6, 8]
  tensors["model.layers.0.self_attn.q_norm.weight"].dtype = DType::I32;
  WeightStore store = write_store(dir, tensors);
  const std::string err = validate_error(store, c);
  EXPECT_NE(err.find(dir.path() + ": the weights do not match config.json (4 problems)"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("missing tensor 'model.layers.1.mlp.down_proj.weight' (expected shape [8, 16])"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("missing tensor 'model.norm.weight'"), std::string::npos) << err;
  EXPECT_NE(err.find(dir.file("model.safetensors") +
                     ": tensor 'model.layers.0.self_attn.k_proj.weight' has shape [8, 8], but "
                     "config.json implies [6, 8]"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("tensor 'model.layers.0.self_attn.q_norm.weight' has dtype I32"),
            std::string::npos)
      << err;
}

TEST(Qwen3Weights, TiedModelWithAWrongLmHead) {
  TempDir dir;
  const Qwen3Config c = small_config(true);
  auto tensors = expected_tensors(c);
  tensors["lm_head.weight"] = {DType::BF16, {31, 8}};
  std::string err = validate_error(write_store(dir, tensors), c);
  EXPECT_NE(err.find("'lm_head.weight' has shape [31, 8]"), std::string::npos) << err;
}

TEST(Qwen3Weights, ConfigWithFewerLayersThanTheWeights) {
  TempDir dir;
  Qwen3Config c = small_config(false);
  WeightStore store = write_store(dir, expected_tensors(c));
  c.num_hidden_layers = 1;
  std::string err = validate_error(store, c);
  EXPECT_NE(err.find("belongs to layer 1, but config.json has num_hidden_layers 1"),
            std::string::npos)
      << err;
  c.num_hidden_layers = 3;  // more layers than the weights: the missing ones are listed
  err = validate_error(store, c);
  EXPECT_NE(err.find("(11 problems)"), std::string::npos) << err;
  EXPECT_NE(err.find("missing tensor 'model.layers.2.self_attn.q_proj.weight'"), std::string::npos)
      << err;
}

TEST(Qwen3Weights, LongReportsAreCut) {
  TempDir dir;
  Qwen3Config c = small_config(false);
  WeightStore store = write_store(dir, {{"unrelated", {DType::F32, {1}}}});
  c.num_hidden_layers = 10;
  std::string err = validate_error(store, c);
  EXPECT_NE(err.find("(113 problems)"), std::string::npos) << err;  // 1 + 10*11 + 1 + 1
  EXPECT_NE(err.find("... and 73 more"), std::string::npos) << err;
}

// A folder laid out byte for byte as transformers' save_pretrained writes it, built here
// without pagellm's writer: header {"__metadata__":{"format":"pt"}, tensors sorted by name
// (one dtype)}, compact JSON padded with spaces to 8 bytes, no lm_head (tied), and a
// config.json as transformers 5 writes it.
TEST(Qwen3Weights, SavePretrainedLayoutLoads) {
  TempDir dir;
  const Qwen3Config shape_config = small_config(true);
  std::map<std::string, std::vector<int64_t>> sorted;  // std::map: sorted by name
  for (const auto& w : expected_qwen3_weights(shape_config)) sorted[w.name] = w.shape;
  std::string header = R"({"__metadata__":{"format":"pt"})";
  std::string data;
  uint16_t counter = 0;
  std::map<std::string, uint16_t> first_value;
  for (const auto& [name, shape] : sorted) {
    int64_t n = 1;
    std::string dims;
    for (int64_t d : shape) {
      n *= d;
      dims += (dims.empty() ? "" : ",") + std::to_string(d);
    }
    const size_t begin = data.size();
    first_value[name] = counter;
    for (int64_t i = 0; i < n; ++i, ++counter) {
      const uint16_t bf16 = f32_to_bf16(static_cast<float>(counter % 251) / 251.0f);
      data.append(reinterpret_cast<const char*>(&bf16), 2);
    }
    header += ",\"" + name + "\":{\"dtype\":\"BF16\",\"shape\":[" + dims +
              "],\"data_offsets\":[" + std::to_string(begin) + "," +
              std::to_string(data.size()) + "]}";
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  testing::write_file(dir.file("model.safetensors"), testing::safetensors_bytes(header, data));
  testing::write_file(dir.file("config.json"), R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "dtype": "bfloat16",
  "eos_token_id": 2,
  "head_dim": 6,
  "hidden_act": "silu",
  "hidden_size": 8,
  "initializer_range": 0.02,
  "intermediate_size": 16,
  "layer_types": ["full_attention", "full_attention"],
  "max_position_embeddings": 64,
  "max_window_layers": 2,
  "model_type": "qwen3",
  "num_attention_heads": 2,
  "num_hidden_layers": 2,
  "num_key_value_heads": 1,
  "pad_token_id": null,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
  "sliding_window": null,
  "tie_word_embeddings": true,
  "transformers_version": "5.0.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 32
}
)");
  const Qwen3Config c = load_qwen3_config(dir.path());
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim, 6);
  WeightStore store = WeightStore::open(dir.path());
  EXPECT_NO_THROW(validate_qwen3_weights(store, c));
  EXPECT_FALSE(store.has("lm_head.weight"));
  const std::string name = "model.layers.1.mlp.up_proj.weight";
  const HostTensor& up = store.get(name);
  const auto* v = static_cast<const uint16_t*>(up.data);
  EXPECT_EQ(bf16_to_f32(v[5]),
            bf16_to_f32(f32_to_bf16(static_cast<float>((first_value[name] + 5) % 251) / 251.0f)));
}

}  // namespace
}  // namespace pagellm
