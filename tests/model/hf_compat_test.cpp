// Compatibility with Hugging Face's own libraries, both ways:
//  - folders written by Python (transformers' config classes, safetensors.numpy,
//    huggingface_hub's shard splitter) load in pagellm with the same values;
//  - folders written by make_model load in transformers and safetensors.
// Skipped when python3 or those modules are missing (the scripts exit with status 3).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "model/model_test_util.h"
#include "pagellm/model/make_model.h"
#include "pagellm/model/qwen3_weights.h"

namespace pagellm {
namespace {

using json = nlohmann::json;
using testing::TempDir;

std::string script(const char* name) {
  return std::string(PAGELLM_SOURCE_DIR) + "/tests/oracles/model/" + name;
}

// Runs a shell command; returns its exit status and stdout.
int run(const std::string& command, std::string* out) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out->append(buf, n);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Runs a python script; GTEST_SKIPs the calling test when Python or a module is missing.
#define RUN_PYTHON_OR_SKIP(args, out)                                                      \
  do {                                                                                     \
    const int rc_ = run("python3 " + std::string(args) + " 2>/dev/null", out);            \
    if (rc_ == 3 || rc_ == 127) GTEST_SKIP() << "python3 with transformers/safetensors missing"; \
    ASSERT_EQ(rc_, 0) << "python3 " << (args) << " failed:\n" << *(out);                  \
  } while (0)

double sum_f32(const HostTensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  convert_to_f32(t.data, t.dtype, v.data(), v.size());
  double s = 0;
  for (float x : v) s += x;
  return s;
}

void check_python_folder(const std::string& dir, bool tied) {
  const Qwen3Config c = load_qwen3_config(dir);
  EXPECT_EQ(c.vocab_size, 256);
  EXPECT_EQ(c.hidden_size, 32);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.tie_word_embeddings, tied);
  EXPECT_EQ(c.torch_dtype, DType::F16);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.bos_token_id, 253);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{255, 253}));  // merged from generation_config

  WeightStore store = WeightStore::open(dir);
  EXPECT_NO_THROW(validate_qwen3_weights(store, c));
  EXPECT_EQ(store.has("lm_head.weight"), !tied);
  const json checksums = json::parse(testing::read_file(dir + "/checksums.json"));
  EXPECT_EQ(checksums.size(), store.size());
  for (auto it = checksums.begin(); it != checksums.end(); ++it) {
    ASSERT_TRUE(store.has(it.key())) << it.key();
    const HostTensor& t = store.get(it.key());
    EXPECT_EQ(safetensors_dtype_name(t.dtype), (*it)["dtype"].get<std::string>()) << it.key();
    EXPECT_EQ(t.shape, (*it)["shape"].get<std::vector<int64_t>>()) << it.key();
    EXPECT_NEAR(sum_f32(t), (*it)["sum"].get<double>(), 1e-3) << it.key();
    std::vector<float> first(static_cast<size_t>(std::min<int64_t>(8, t.numel())));
    convert_to_f32(t.data, t.dtype, first.data(), first.size());
    for (size_t i = 0; i < first.size(); ++i)
      EXPECT_EQ(first[i], (*it)["first"][i].get<float>()) << it.key() << "[" << i << "]";
  }
}

TEST(HfCompat, LoadsAFolderWrittenByPython) {
  TempDir dir;
  std::string out;
  RUN_PYTHON_OR_SKIP(script("write_hf_style_folder.py") + " --untied --seed 1 --out " + dir.path(),
                     &out);
  check_python_folder(dir.path(), /*tied=*/false);
}

TEST(HfCompat, LoadsATiedShardedFolderWrittenByPython) {
  TempDir dir;
  std::string out;
  RUN_PYTHON_OR_SKIP(
      script("write_hf_style_folder.py") + " --shard-bytes 30000 --seed 2 --out " + dir.path(),
      &out);
  ASSERT_TRUE(std::filesystem::exists(dir.file("model.safetensors.index.json")));
  EXPECT_GT(WeightStore::open(dir.path()).files().size(), 1u);
  check_python_folder(dir.path(), /*tied=*/true);
}

// make_model's folders, as transformers and safetensors read them.
void check_make_model_folder(const std::string& preset, DType dtype, uint64_t shard_bytes) {
  TempDir dir;
  MakeModelOptions opt;
  opt.preset = preset;
  opt.out_dir = dir.path();
  opt.seed = 11;
  opt.dtype = dtype;
  opt.shard_bytes = shard_bytes;
  make_model(opt);
  std::string out;
  RUN_PYTHON_OR_SKIP(script("read_with_transformers.py") + " " + dir.path(), &out);
  const json seen = json::parse(out);
  const Qwen3Config c = preset_config(preset);
  const json& cfg = seen["config"];
  EXPECT_EQ(cfg["model_type"], "qwen3");
  EXPECT_EQ(cfg["architectures"], json::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(cfg["vocab_size"], c.vocab_size);
  EXPECT_EQ(cfg["hidden_size"], c.hidden_size);
  EXPECT_EQ(cfg["intermediate_size"], c.intermediate_size);
  EXPECT_EQ(cfg["num_hidden_layers"], c.num_hidden_layers);
  EXPECT_EQ(cfg["num_attention_heads"], c.num_attention_heads);
  EXPECT_EQ(cfg["num_key_value_heads"], c.num_key_value_heads);
  EXPECT_EQ(cfg["head_dim"], c.head_dim);
  EXPECT_EQ(cfg["tie_word_embeddings"], c.tie_word_embeddings);
  EXPECT_EQ(cfg["max_position_embeddings"], c.max_position_embeddings);
  EXPECT_DOUBLE_EQ(cfg["rope_theta"].get<double>(), c.rope_theta);
  EXPECT_DOUBLE_EQ(cfg["rms_norm_eps"].get<double>(), c.rms_norm_eps);
  EXPECT_EQ(cfg["bos_token_id"], c.bos_token_id);
  EXPECT_EQ(cfg["eos_token_id"], c.eos_token_id);
  EXPECT_EQ(cfg["hidden_act"], "silu");
  EXPECT_EQ(cfg["attention_bias"], false);
  EXPECT_EQ(cfg["dtype"], dtype_name(dtype));
  EXPECT_EQ(seen["generation"]["eos_token_id"], c.eos_token_ids);
  EXPECT_EQ(seen["generation"]["bos_token_id"], c.bos_token_id);

  WeightStore store = WeightStore::open(dir.path());
  const json& tensors = seen["tensors"];
  EXPECT_EQ(tensors.size(), expected_qwen3_weights(c).size());
  for (const ExpectedWeight& w : expected_qwen3_weights(c)) {
    ASSERT_TRUE(tensors.contains(w.name)) << w.name;
    const json& t = tensors[w.name];
    EXPECT_EQ(t["dtype"], safetensors_dtype_name(dtype)) << w.name;
    EXPECT_EQ(t["shape"].get<std::vector<int64_t>>(), w.shape) << w.name;
    EXPECT_EQ(dir.file(t["file"].get<std::string>()), store.get(w.name).file) << w.name;
    if (t.contains("sum")) {
      EXPECT_NEAR(t["sum"].get<double>(), sum_f32(store.get(w.name)), 1e-3) << w.name;
    }
  }
}

TEST(HfCompat, MakeModelFolderLoadsInTransformers) {
  check_make_model_folder("tiny", DType::F32, 4ull << 30);
}

TEST(HfCompat, ShardedBf16MakeModelFolderLoadsInTransformers) {
  check_make_model_folder("tiny", DType::BF16, 100'000);
}

TEST(HfCompat, Float16MakeModelFolderLoadsInTransformers) {
  check_make_model_folder("tiny", DType::F16, 300'000);
}

// The reference script's presets (its config through transformers) are pagellm's presets.
TEST(HfCompat, ReferenceScriptPresetsMatchMakeModel) {
  std::string out;
  RUN_PYTHON_OR_SKIP(script("save_pretrained_reference.py") + " --print-config --preset all", &out);
  const json configs = json::parse(out);
  EXPECT_EQ(configs.size(), model_presets().size());
  for (const std::string& preset : model_presets()) {
    ASSERT_TRUE(configs.contains(preset)) << preset;
    const Qwen3Config seen =
        parse_qwen3_config(configs[preset].dump(), "save_pretrained_reference.py " + preset);
    const Qwen3Config c = preset_config(preset);
    EXPECT_EQ(seen.vocab_size, c.vocab_size) << preset;
    EXPECT_EQ(seen.hidden_size, c.hidden_size) << preset;
    EXPECT_EQ(seen.intermediate_size, c.intermediate_size) << preset;
    EXPECT_EQ(seen.num_hidden_layers, c.num_hidden_layers) << preset;
    EXPECT_EQ(seen.num_attention_heads, c.num_attention_heads) << preset;
    EXPECT_EQ(seen.num_key_value_heads, c.num_key_value_heads) << preset;
    EXPECT_EQ(seen.head_dim, c.head_dim) << preset;
    EXPECT_EQ(seen.tie_word_embeddings, c.tie_word_embeddings) << preset;
    EXPECT_EQ(seen.max_position_embeddings, c.max_position_embeddings) << preset;
    EXPECT_DOUBLE_EQ(seen.rope_theta, c.rope_theta) << preset;
    EXPECT_DOUBLE_EQ(seen.rms_norm_eps, c.rms_norm_eps) << preset;
    EXPECT_EQ(seen.bos_token_id, c.bos_token_id) << preset;
    EXPECT_EQ(seen.eos_token_id, c.eos_token_id) << preset;
  }
}

}  // namespace
}  // namespace pagellm
