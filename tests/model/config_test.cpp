// config.json parsing, validation and writing.
#include <gtest/gtest.h>

#include <limits>

#include <nlohmann/json.hpp>

#include "model/model_test_util.h"
#include "pagellm/model/config.h"

namespace pagellm {
namespace {

using testing::error_of;
using json = nlohmann::json;

// Qwen3-0.6B's config.json as released (transformers 4.51).
const char* kQwen3_06B = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

json base() { return json::parse(kQwen3_06B); }
Qwen3Config parse(const json& j) { return parse_qwen3_config(j.dump(), "test/config.json"); }
std::string parse_error(const json& j) {
  return error_of([&] { parse(j); });
}

TEST(Qwen3Config, ParsesReleasedQwen3Config) {
  Qwen3Config c = parse_qwen3_config(kQwen3_06B, "config.json");
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.intermediate_size, 3072);
  EXPECT_EQ(c.num_hidden_layers, 28);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_EQ(c.torch_dtype, DType::BF16);
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.eos_token_id, 151645);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151645});
  EXPECT_EQ(c.pad_token_id, -1);
  EXPECT_EQ(c.q_size(), 2048);  // != hidden_size: Qwen3 projects up for attention
  EXPECT_EQ(c.kv_size(), 1024);
  EXPECT_EQ(c.qkv_size(), 4096);
  // 0.6B = 596M parameters with the tied embedding counted once.
  EXPECT_EQ(c.num_parameters(), 596049920);
}

TEST(Qwen3Config, ParsesTransformers5Spelling) {
  json j = base();
  j.erase("torch_dtype");
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["dtype"] = "float16";
  j["rope_parameters"] = {{"rope_theta", 5000000.0}, {"rope_type", "default"}};
  j["layer_types"] = json::array();
  for (int i = 0; i < 28; ++i) j["layer_types"].push_back("full_attention");
  j["pad_token_id"] = nullptr;
  Qwen3Config c = parse(j);
  EXPECT_EQ(c.torch_dtype, DType::F16);
  EXPECT_DOUBLE_EQ(c.rope_theta, 5e6);
  EXPECT_EQ(c.pad_token_id, -1);
}

TEST(Qwen3Config, DtypeSpellings) {
  json j = base();
  j["torch_dtype"] = "float32";
  EXPECT_EQ(parse(j).torch_dtype, DType::F32);
  j["torch_dtype"] = "torch.float16";
  EXPECT_EQ(parse(j).torch_dtype, DType::F16);
  j["dtype"] = "bfloat16";  // "dtype" wins over "torch_dtype"
  EXPECT_EQ(parse(j).torch_dtype, DType::BF16);
  j.erase("dtype");
  j.erase("torch_dtype");
  EXPECT_EQ(parse(j).torch_dtype, DType::BF16);  // absent: bfloat16
  j["torch_dtype"] = "int8";
  std::string err = parse_error(j);
  EXPECT_NE(err.find("test/config.json"), std::string::npos) << err;
  EXPECT_NE(err.find("\"int8\""), std::string::npos) << err;
  EXPECT_NE(err.find("bfloat16"), std::string::npos) << err;
}

TEST(Qwen3Config, MissingHeadDimIsHiddenOverHeads) {
  json j = base();
  j.erase("head_dim");
  EXPECT_EQ(parse(j).head_dim, 1024 / 16);
  j["hidden_size"] = 1000;
  j["num_attention_heads"] = 16;
  std::string err = parse_error(j);
  EXPECT_NE(err.find("head_dim"), std::string::npos) << err;
}

TEST(Qwen3Config, MissingKvHeadsMeansMultiHeadAttention) {
  json j = base();
  j.erase("num_key_value_heads");
  EXPECT_EQ(parse(j).num_key_value_heads, 16);
}

TEST(Qwen3Config, TokenIdsMayBeListsOrNull) {
  json j = base();
  j["eos_token_id"] = {151645, 151643};
  j["bos_token_id"] = {151643, 7};
  j["pad_token_id"] = 151643;
  Qwen3Config c = parse(j);
  EXPECT_EQ(c.eos_token_id, 151645);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645, 151643}));
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.pad_token_id, 151643);
  j["eos_token_id"] = nullptr;
  j.erase("bos_token_id");
  c = parse(j);
  EXPECT_EQ(c.eos_token_id, -1);
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_EQ(c.bos_token_id, -1);
  j["eos_token_id"] = 151936;  // == vocab_size
  EXPECT_NE(parse_error(j).find("outside the vocabulary"), std::string::npos);
  j["eos_token_id"] = "151645";
  EXPECT_NE(parse_error(j).find("must be an integer"), std::string::npos);
}

TEST(Qwen3Config, MissingOrMistypedFieldsNameTheField) {
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "max_position_embeddings"}) {
    json j = base();
    j.erase(key);
    std::string err = parse_error(j);
    EXPECT_NE(err.find(std::string("\"") + key + "\""), std::string::npos) << err;
    EXPECT_NE(err.find("missing"), std::string::npos) << err;
    EXPECT_NE(err.find("test/config.json"), std::string::npos) << err;
  }
  json j = base();
  j["hidden_size"] = "1024";
  EXPECT_NE(parse_error(j).find("\"hidden_size\" must be an integer"), std::string::npos);
  j = base();
  j["hidden_size"] = 1024.5;
  EXPECT_NE(parse_error(j).find("\"hidden_size\" must be an integer"), std::string::npos);
  j = base();
  j["tie_word_embeddings"] = 1;
  EXPECT_NE(parse_error(j).find("tie_word_embeddings"), std::string::npos);
  j = base();
  j["rms_norm_eps"] = "small";
  EXPECT_NE(parse_error(j).find("rms_norm_eps"), std::string::npos);
}

TEST(Qwen3Config, RejectsInconsistentSizes) {
  json j = base();
  j["num_key_value_heads"] = 6;
  std::string err = parse_error(j);
  EXPECT_NE(err.find("multiple of num_key_value_heads"), std::string::npos) << err;
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "num_key_value_heads", "head_dim",
                          "max_position_embeddings"}) {
    j = base();
    j[key] = 0;
    err = parse_error(j);
    EXPECT_NE(err.find(std::string("\"") + key + "\" must be a positive integer"),
              std::string::npos)
        << err;
    j[key] = -4;
    EXPECT_NE(parse_error(j).find("positive"), std::string::npos);
  }
  j = base();
  j["head_dim"] = 127;
  EXPECT_NE(parse_error(j).find("even"), std::string::npos);
  j = base();
  j["rope_theta"] = 0;
  EXPECT_NE(parse_error(j).find("rope_theta"), std::string::npos);
}

// Found by config_fuzz: sizes whose parameter count overflows int64 were accepted, and
// num_parameters() (which the model sizes its weights from) then overflowed, undefined
// behaviour. They are refused, naming the sizes.
TEST(Qwen3Config, RejectsSizesWhoseParameterCountOverflows) {
  json j = base();
  j["hidden_size"] = int64_t{1} << 40;
  j["intermediate_size"] = int64_t{1} << 40;
  j["head_dim"] = 128;
  std::string err = parse_error(j);
  EXPECT_NE(err.find("give more parameters than a 64-bit count holds"), std::string::npos) << err;
  j = base();
  j["num_hidden_layers"] = int64_t{1} << 62;  // each size fine, the product not
  err = parse_error(j);
  EXPECT_NE(err.find("num_hidden_layers 4611686018427387904"), std::string::npos) << err;
  Qwen3Config c = parse(base());
  c.vocab_size = int64_t{1} << 62;
  EXPECT_NE(error_of([&] { c.num_parameters(); }).find("overflows"), std::string::npos);
  EXPECT_EQ(parse(base()).num_parameters(), 596049920);  // Qwen3-0.6B, tied
}

// A number past the double range (1e400) makes nlohmann throw out_of_range, which is not
// a parse_error: it escaped the reader as a foreign exception (a crash in the fuzzer, an
// unhelpful message in the CLI). Now it is the reader's "not valid JSON" Error.
TEST(Qwen3Config, NumberPastTheDoubleRangeIsAJsonError) {
  for (const char* key : {"rope_theta", "rms_norm_eps"}) {
    json j = base();
    j.erase(key);
    std::string text = j.dump();
    text.insert(1, std::string("\"") + key + "\": 1e400, ");
    const std::string err = error_of([&] { parse_qwen3_config(text, "test/config.json"); });
    EXPECT_NE(err.find("test/config.json: not valid JSON"), std::string::npos) << err;
    EXPECT_NE(err.find("number overflow"), std::string::npos) << err;
  }
  // A config built in code can still hold infinity; validation refuses it.
  Qwen3Config c = parse(base());
  c.rope_theta = std::numeric_limits<double>::infinity();
  EXPECT_NE(error_of([&] { validate_qwen3_config(c, "code"); })
                .find("rope_theta must be a finite positive number"),
            std::string::npos);
}

TEST(Qwen3Config, RejectsUnsupportedArchitectures) {
  json j = base();
  j["model_type"] = "qwen3_moe";
  std::string err = parse_error(j);
  EXPECT_NE(err.find("qwen3_moe"), std::string::npos) << err;
  EXPECT_NE(err.find("mixture-of-experts"), std::string::npos) << err;
  j["model_type"] = "llama";
  EXPECT_NE(parse_error(j).find("\"llama\""), std::string::npos);

  j = base();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  err = parse_error(j);
  EXPECT_NE(err.find("rope_scaling"), std::string::npos) << err;
  EXPECT_NE(err.find("yarn"), std::string::npos) << err;
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};  // the older spelling
  EXPECT_NE(parse_error(j).find("linear"), std::string::npos);
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_NO_THROW(parse(j));

  j = base();
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e6}, {"factor", 4.0}};
  EXPECT_NE(parse_error(j).find("rope_parameters"), std::string::npos);

  j = base();
  j["use_sliding_window"] = true;
  EXPECT_NE(parse_error(j).find("use_sliding_window"), std::string::npos);
  j = base();
  j["layer_types"] = {"full_attention", "sliding_attention"};
  err = parse_error(j);
  EXPECT_NE(err.find("layer_types[1]"), std::string::npos) << err;
  j = base();
  j["attention_bias"] = true;
  EXPECT_NE(parse_error(j).find("attention_bias"), std::string::npos);
  j = base();
  j["hidden_act"] = "gelu";
  EXPECT_NE(parse_error(j).find("gelu"), std::string::npos);
}

TEST(Qwen3Config, RejectsTextThatIsNotAJsonObject) {
  std::string err = error_of([] { parse_qwen3_config("{\"vocab_size\": 12,", "x/config.json"); });
  EXPECT_NE(err.find("x/config.json"), std::string::npos) << err;
  EXPECT_NE(err.find("not valid JSON"), std::string::npos) << err;
  err = error_of([] { parse_qwen3_config("[1, 2]", "x/config.json"); });
  EXPECT_NE(err.find("JSON object"), std::string::npos) << err;
}

TEST(Qwen3Config, ToJsonRoundTripsAndLooksLikeTransformers) {
  json j = base();
  j["eos_token_id"] = {151645, 151643};
  j["pad_token_id"] = 151643;
  j["tie_word_embeddings"] = false;
  j["torch_dtype"] = "float32";
  j["rope_theta"] = 2500000.0;
  j["rms_norm_eps"] = 1e-5;
  Qwen3Config c = parse(j);
  const std::string text = qwen3_config_to_json(c);
  Qwen3Config back = parse_qwen3_config(text, "roundtrip");
  EXPECT_EQ(back.vocab_size, c.vocab_size);
  EXPECT_EQ(back.hidden_size, c.hidden_size);
  EXPECT_EQ(back.intermediate_size, c.intermediate_size);
  EXPECT_EQ(back.num_hidden_layers, c.num_hidden_layers);
  EXPECT_EQ(back.num_attention_heads, c.num_attention_heads);
  EXPECT_EQ(back.num_key_value_heads, c.num_key_value_heads);
  EXPECT_EQ(back.head_dim, c.head_dim);
  EXPECT_DOUBLE_EQ(back.rope_theta, 2500000.0);
  EXPECT_DOUBLE_EQ(back.rms_norm_eps, 1e-5);
  EXPECT_FALSE(back.tie_word_embeddings);
  EXPECT_EQ(back.max_position_embeddings, c.max_position_embeddings);
  EXPECT_EQ(back.torch_dtype, DType::F32);
  EXPECT_EQ(back.bos_token_id, 151643);
  EXPECT_EQ(back.eos_token_ids, (std::vector<int64_t>{151645, 151643}));
  EXPECT_EQ(back.pad_token_id, 151643);

  json written = json::parse(text);
  EXPECT_EQ(written["architectures"], json::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(written["model_type"], "qwen3");
  EXPECT_EQ(written["attention_bias"], false);
  EXPECT_EQ(written["hidden_act"], "silu");
  EXPECT_EQ(written["torch_dtype"], "float32");
  EXPECT_TRUE(written["rope_scaling"].is_null());
  EXPECT_EQ(written["use_sliding_window"], false);
  EXPECT_EQ(written["max_window_layers"], 28);
  // Keys sorted and two-space indent, as json.dumps(indent=2, sort_keys=True).
  EXPECT_EQ(text.rfind("{\n  \"architectures\": [", 0), 0u) << text;
  EXPECT_LT(text.find("\"vocab_size\""), text.size());
  EXPECT_LT(text.find("\"attention_bias\""), text.find("\"vocab_size\""));
  EXPECT_EQ(text.back(), '\n');
}

TEST(Qwen3Config, ToJsonRejectsAnInvalidConfig) {
  Qwen3Config c = parse(base());
  c.num_key_value_heads = 3;
  EXPECT_NE(error_of([&] { qwen3_config_to_json(c); }).find("num_key_value_heads"),
            std::string::npos);
  c = parse(base());
  c.eos_token_ids = {5, 6};  // eos_token_id 151645 is not the first of them
  EXPECT_NE(error_of([&] { qwen3_config_to_json(c); }).find("first of eos_token_ids"),
            std::string::npos);
}

TEST(Qwen3Config, LoadMergesGenerationConfigStopTokens) {
  testing::TempDir dir;
  testing::write_file(dir.file("config.json"), kQwen3_06B);
  Qwen3Config c = load_qwen3_config(dir.path());
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151645});
  testing::write_file(dir.file("generation_config.json"),
                      R"({"bos_token_id": 151643, "eos_token_id": [151645, 151643]})");
  c = load_qwen3_config(dir.path());
  EXPECT_EQ(c.eos_token_id, 151645);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645, 151643}));

  testing::write_file(dir.file("generation_config.json"), R"({"eos_token_id": [999999]})");
  std::string err = error_of([&] { load_qwen3_config(dir.path()); });
  EXPECT_NE(err.find("generation_config.json"), std::string::npos) << err;
  testing::write_file(dir.file("generation_config.json"), "{oops");
  err = error_of([&] { load_qwen3_config(dir.path()); });
  EXPECT_NE(err.find("generation_config.json: not valid JSON"), std::string::npos) << err;

  testing::TempDir empty;
  err = error_of([&] { load_qwen3_config(empty.path()); });
  EXPECT_NE(err.find("no config.json in " + empty.path()), std::string::npos) << err;
}

}  // namespace
}  // namespace pagellm
