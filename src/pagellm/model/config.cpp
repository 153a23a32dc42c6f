#include "pagellm/model/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "pagellm/common/check.h"

namespace pagellm {

namespace {

using json = nlohmann::json;

std::string read_text_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  PAGELLM_CHECK(in.good()) << "cannot open " << path << " (" << what << ")";
  std::ostringstream text;
  text << in.rdbuf();
  PAGELLM_CHECK(!in.bad()) << "cannot read " << path;
  return text.str();
}

// Field readers: each names the source file and the field in its error.
class FieldReader {
 public:
  FieldReader(const json& root, const std::string& source) : root_(root), source_(source) {}

  bool present(const char* key) const {
    auto it = root_.find(key);
    return it != root_.end() && !it->is_null();
  }
  const json& at(const char* key) const { return root_.at(key); }

  int64_t required_int(const char* key) const {
    PAGELLM_CHECK(present(key)) << source_ << ": missing field \"" << key
                                << "\" (a positive integer)";
    return as_int(key, at(key));
  }
  int64_t optional_int(const char* key, int64_t fallback) const {
    return present(key) ? as_int(key, at(key)) : fallback;
  }
  double optional_number(const char* key, double fallback) const {
    if (!present(key)) return fallback;
    const json& v = at(key);
    PAGELLM_CHECK(v.is_number()) << source_ << ": field \"" << key
                                 << "\" must be a number, got " << v.dump();
    return v.get<double>();
  }
  bool optional_bool(const char* key, bool fallback) const {
    if (!present(key)) return fallback;
    const json& v = at(key);
    PAGELLM_CHECK(v.is_boolean()) << source_ << ": field \"" << key
                                  << "\" must be true or false, got " << v.dump();
    return v.get<bool>();
  }
  std::string optional_string(const char* key, const std::string& fallback) const {
    if (!present(key)) return fallback;
    const json& v = at(key);
    PAGELLM_CHECK(v.is_string()) << source_ << ": field \"" << key
                                 << "\" must be a string, got " << v.dump();
    return v.get<std::string>();
  }
  /// A token id field: absent/null, an integer, or a list of integers.
  std::vector<int64_t> token_ids(const char* key) const {
    std::vector<int64_t> ids;
    if (!present(key)) return ids;
    const json& v = at(key);
    if (v.is_array()) {
      for (const json& e : v) ids.push_back(as_int(key, e));
    } else {
      ids.push_back(as_int(key, v));
    }
    return ids;
  }

  int64_t as_int(const char* key, const json& v) const {
    PAGELLM_CHECK(v.is_number_integer())
        << source_ << ": field \"" << key << "\" must be an integer, got " << v.dump();
    return v.get<int64_t>();
  }
  const std::string& source() const { return source_; }

 private:
  const json& root_;
  const std::string& source_;
};

void check_rope_type(const json& rope, const char* key, const std::string& source) {
  std::string type = "default";
  if (rope.contains("rope_type") && rope["rope_type"].is_string())
    type = rope["rope_type"].get<std::string>();
  else if (rope.contains("type") && rope["type"].is_string())
    type = rope["type"].get<std::string>();
  PAGELLM_CHECK(type == "default")
      << source << ": \"" << key << "\" asks for rope_type \"" << type
      << "\"; pagellm implements only the default rotary embedding (rope_scaling null)";
}

// The parameter count in int64 arithmetic that reports overflow: a config.json may hold any
// sizes, and the count (which sizes the weights) must not wrap. False on overflow.
bool checked_num_parameters(const Qwen3Config& c, int64_t* out) {
  bool over = false;
  auto mul = [&over](int64_t a, int64_t b) {
    int64_t r = 0;
    over |= __builtin_mul_overflow(a, b, &r);
    return r;
  };
  auto add = [&over](int64_t a, int64_t b) {
    int64_t r = 0;
    over |= __builtin_add_overflow(a, b, &r);
    return r;
  };
  const int64_t H = c.hidden_size;
  const int64_t q = mul(c.num_attention_heads, c.head_dim);
  const int64_t kv = mul(c.num_key_value_heads, c.head_dim);
  const int64_t attention =
      add(add(mul(H, q), mul(2, mul(H, kv))), add(mul(q, H), mul(2, c.head_dim)));
  const int64_t mlp = mul(3, mul(H, c.intermediate_size));
  const int64_t layer = add(add(attention, mlp), mul(2, H));
  const int64_t embed = mul(c.vocab_size, H);
  *out = add(add(add(embed, mul(c.num_hidden_layers, layer)), H),
             c.tie_word_embeddings ? 0 : embed);
  return !over;
}

}  // namespace

int64_t Qwen3Config::num_parameters() const {
  int64_t n = 0;
  PAGELLM_CHECK(checked_num_parameters(*this, &n))
      << "Qwen3 config: the parameter count overflows 64 bits";
  return n;
}

void validate_qwen3_config(const Qwen3Config& c, const std::string& source) {
  auto positive = [&](const char* key, int64_t v) {
    PAGELLM_CHECK(v > 0) << source << ": \"" << key << "\" must be a positive integer, got " << v;
  };
  positive("vocab_size", c.vocab_size);
  positive("hidden_size", c.hidden_size);
  positive("intermediate_size", c.intermediate_size);
  positive("num_hidden_layers", c.num_hidden_layers);
  positive("num_attention_heads", c.num_attention_heads);
  positive("num_key_value_heads", c.num_key_value_heads);
  positive("head_dim", c.head_dim);
  positive("max_position_embeddings", c.max_position_embeddings);
  int64_t parameters = 0;
  PAGELLM_CHECK(checked_num_parameters(c, &parameters))
      << source << ": the sizes (vocab_size " << c.vocab_size << ", hidden_size "
      << c.hidden_size << ", intermediate_size " << c.intermediate_size
      << ", num_hidden_layers " << c.num_hidden_layers << ", head_dim " << c.head_dim
      << ") give more parameters than a 64-bit count holds";
  PAGELLM_CHECK(c.num_attention_heads % c.num_key_value_heads == 0)
      << source << ": num_attention_heads (" << c.num_attention_heads
      << ") must be a multiple of num_key_value_heads (" << c.num_key_value_heads << ")";
  PAGELLM_CHECK(c.head_dim % 2 == 0)
      << source << ": head_dim must be even for rotary embeddings, got " << c.head_dim;
  // JSON numbers past the double range (1e400) parse as infinity.
  PAGELLM_CHECK(std::isfinite(c.rope_theta) && c.rope_theta > 0)
      << source << ": rope_theta must be a finite positive number, got " << c.rope_theta;
  PAGELLM_CHECK(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0)
      << source << ": rms_norm_eps must be a finite positive number, got " << c.rms_norm_eps;
  PAGELLM_CHECK(c.torch_dtype == DType::F32 || c.torch_dtype == DType::BF16 ||
                c.torch_dtype == DType::F16)
      << source << ": torch_dtype must be float32, bfloat16 or float16, got "
      << dtype_name(c.torch_dtype);
  auto token = [&](const char* key, int64_t id) {
    PAGELLM_CHECK(id >= -1 && id < c.vocab_size)
        << source << ": \"" << key << "\" " << id << " is outside the vocabulary [0, "
        << c.vocab_size << ")";
  };
  token("bos_token_id", c.bos_token_id);
  token("eos_token_id", c.eos_token_id);
  token("pad_token_id", c.pad_token_id);
  for (int64_t id : c.eos_token_ids) {
    PAGELLM_CHECK(id >= 0) << source << ": \"eos_token_id\" " << id << " is negative";
    token("eos_token_id", id);
  }
  PAGELLM_CHECK(c.eos_token_ids.empty() || c.eos_token_id == c.eos_token_ids.front())
      << source << ": eos_token_id (" << c.eos_token_id
      << ") must be the first of eos_token_ids (" << c.eos_token_ids.front() << ")";
}

Qwen3Config parse_qwen3_config(const std::string& json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    PAGELLM_FAIL() << source << ": not valid JSON: " << e.what();
  }
  PAGELLM_CHECK(root.is_object()) << source << ": expected a JSON object at the top level";
  FieldReader f(root, source);

  const std::string model_type = f.optional_string("model_type", "qwen3");
  PAGELLM_CHECK(model_type == "qwen3")
      << source << ": model_type is \"" << model_type
      << "\"; pagellm reads dense Qwen3 models (model_type \"qwen3\")"
      << (model_type == "qwen3_moe" ? ", not mixture-of-experts ones" : "");

  Qwen3Config c;
  c.vocab_size = f.required_int("vocab_size");
  c.hidden_size = f.required_int("hidden_size");
  c.intermediate_size = f.required_int("intermediate_size");
  c.num_hidden_layers = f.required_int("num_hidden_layers");
  c.num_attention_heads = f.required_int("num_attention_heads");
  c.num_key_value_heads = f.optional_int("num_key_value_heads", c.num_attention_heads);
  if (f.present("head_dim")) {
    c.head_dim = f.required_int("head_dim");
  } else {
    PAGELLM_CHECK(c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads == 0)
        << source << ": no \"head_dim\", and hidden_size (" << c.hidden_size
        << ") is not a multiple of num_attention_heads (" << c.num_attention_heads
        << ") to derive it from";
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  c.max_position_embeddings = f.required_int("max_position_embeddings");
  c.rms_norm_eps = f.optional_number("rms_norm_eps", c.rms_norm_eps);
  c.tie_word_embeddings = f.optional_bool("tie_word_embeddings", false);

  // Rotary embedding: transformers 4.x writes rope_theta (+ rope_scaling), 5.x writes
  // rope_parameters {rope_type, rope_theta}.
  c.rope_theta = f.optional_number("rope_theta", c.rope_theta);
  if (f.present("rope_scaling")) {
    PAGELLM_CHECK(f.at("rope_scaling").is_object())
        << source << ": \"rope_scaling\" must be null or an object";
    check_rope_type(f.at("rope_scaling"), "rope_scaling", source);
  }
  if (f.present("rope_parameters")) {
    const json& rope = f.at("rope_parameters");
    PAGELLM_CHECK(rope.is_object()) << source << ": \"rope_parameters\" must be an object";
    check_rope_type(rope, "rope_parameters", source);
    FieldReader rf(rope, source);
    c.rope_theta = rf.optional_number("rope_theta", c.rope_theta);
  }

  // Element type: "dtype" (transformers 5) or "torch_dtype" (4.x).
  const char* dtype_key = f.present("dtype") ? "dtype" : "torch_dtype";
  if (f.present(dtype_key)) {
    std::string name = f.optional_string(dtype_key, "bfloat16");
    if (name.rfind("torch.", 0) == 0) name = name.substr(6);
    try {
      c.torch_dtype = parse_dtype(name);
    } catch (const Error&) {
      PAGELLM_FAIL() << source << ": \"" << dtype_key << "\" is \"" << name
                     << "\"; expected \"bfloat16\", \"float16\" or \"float32\"";
    }
  }

  std::vector<int64_t> bos = f.token_ids("bos_token_id");
  c.bos_token_id = bos.empty() ? -1 : bos.front();
  c.eos_token_ids = f.token_ids("eos_token_id");
  c.eos_token_id = c.eos_token_ids.empty() ? -1 : c.eos_token_ids.front();
  std::vector<int64_t> pad = f.token_ids("pad_token_id");
  c.pad_token_id = pad.empty() ? -1 : pad.front();

  // Architecture features pagellm does not implement: refuse rather than run wrongly.
  PAGELLM_CHECK(!f.optional_bool("attention_bias", false))
      << source << ": \"attention_bias\" is true; Qwen3 has no attention biases and pagellm "
                   "does not implement them";
  const std::string act = f.optional_string("hidden_act", "silu");
  PAGELLM_CHECK(act == "silu") << source << ": \"hidden_act\" is \"" << act
                               << "\"; pagellm implements only \"silu\" (SwiGLU)";
  PAGELLM_CHECK(!f.optional_bool("use_sliding_window", false))
      << source << ": \"use_sliding_window\" is true; pagellm implements only full attention";
  if (f.present("layer_types")) {
    const json& types = f.at("layer_types");
    PAGELLM_CHECK(types.is_array()) << source << ": \"layer_types\" must be a list";
    for (size_t i = 0; i < types.size(); ++i) {
      PAGELLM_CHECK(types[i].is_string() && types[i].get<std::string>() == "full_attention")
          << source << ": layer_types[" << i << "] is " << types[i].dump()
          << "; pagellm implements only \"full_attention\" layers";
    }
  }

  validate_qwen3_config(c, source);
  return c;
}

Qwen3Config load_qwen3_config(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const std::string path = (fs::path(model_dir) / "config.json").string();
  PAGELLM_CHECK(fs::is_regular_file(path))
      << "no config.json in " << model_dir << " (expected a Hugging Face model folder)";
  Qwen3Config config = parse_qwen3_config(read_text_file(path, "model config"), path);

  // generation_config.json often lists more stop tokens than config.json (Qwen3: <|im_end|>
  // and <|endoftext|>); transformers' generate() stops on all of them, and so should we.
  const std::string gen_path = (fs::path(model_dir) / "generation_config.json").string();
  if (fs::is_regular_file(gen_path)) {
    json gen;
    try {
      gen = json::parse(read_text_file(gen_path, "generation config"));
    } catch (const json::exception& e) {
      PAGELLM_FAIL() << gen_path << ": not valid JSON: " << e.what();
    }
    PAGELLM_CHECK(gen.is_object()) << gen_path << ": expected a JSON object at the top level";
    for (int64_t id : FieldReader(gen, gen_path).token_ids("eos_token_id")) {
      PAGELLM_CHECK(id >= 0 && id < config.vocab_size)
          << gen_path << ": \"eos_token_id\" " << id << " is outside the vocabulary [0, "
          << config.vocab_size << ")";
      if (std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), id) ==
          config.eos_token_ids.end())
        config.eos_token_ids.push_back(id);
    }
    if (config.eos_token_id < 0 && !config.eos_token_ids.empty())
      config.eos_token_id = config.eos_token_ids.front();
  }
  return config;
}

std::string qwen3_config_to_json(const Qwen3Config& c) {
  validate_qwen3_config(c, "qwen3_config_to_json");
  json j;  // nlohmann's object keeps keys sorted, as json.dumps(sort_keys=True) does
  j["architectures"] = json::array({"Qwen3ForCausalLM"});
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = c.bos_token_id >= 0 ? json(c.bos_token_id) : json(nullptr);
  if (c.eos_token_ids.size() > 1)
    j["eos_token_id"] = c.eos_token_ids;  // transformers writes a list as a list
  else
    j["eos_token_id"] = c.eos_token_id >= 0 ? json(c.eos_token_id) : json(nullptr);
  if (c.pad_token_id >= 0) j["pad_token_id"] = c.pad_token_id;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.hidden_size;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = c.intermediate_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["max_window_layers"] = c.num_hidden_layers;
  j["model_type"] = "qwen3";
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_scaling"] = nullptr;
  j["rope_theta"] = c.rope_theta;
  j["sliding_window"] = nullptr;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["torch_dtype"] = dtype_name(c.torch_dtype);
  j["transformers_version"] = "4.51.0";
  j["use_cache"] = true;
  j["use_sliding_window"] = false;
  j["vocab_size"] = c.vocab_size;
  return j.dump(2) + "\n";
}

}  // namespace pagellm
