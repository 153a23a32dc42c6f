#include "pagellm/model/lora.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "pagellm/common/check.h"
#include "pagellm/model/make_model.h"

namespace pagellm {
namespace {

using json = nlohmann::json;

std::string accepted_modules() {
  std::string s;
  for (LoraModule m : kAllLoraModules) s += std::string(s.empty() ? "" : ", ") + lora_module_name(m);
  return s;
}

bool module_from_name(const std::string& name, LoraModule* out) {
  for (LoraModule m : kAllLoraModules) {
    if (name == lora_module_name(m)) {
      *out = m;
      return true;
    }
  }
  return false;
}

// A PEFT field that must be absent, null, false or empty for the engine to serve the adapter.
bool field_unset(const json& root, const char* key) {
  if (!root.contains(key)) return true;
  const json& v = root.at(key);
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
         ((v.is_object() || v.is_array()) && v.empty());
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PAGELLM_CHECK(in.good()) << "cannot read " << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

const char* lora_module_name(LoraModule module) {
  switch (module) {
    case LoraModule::kQ: return "q_proj";
    case LoraModule::kK: return "k_proj";
    case LoraModule::kV: return "v_proj";
    case LoraModule::kO: return "o_proj";
    case LoraModule::kGate: return "gate_proj";
    case LoraModule::kUp: return "up_proj";
    case LoraModule::kDown: return "down_proj";
  }
  return "?";
}

const char* lora_module_parent(LoraModule module) {
  return static_cast<int>(module) <= static_cast<int>(LoraModule::kO) ? "self_attn" : "mlp";
}

std::array<int64_t, 2> lora_module_shape(const Qwen3Config& c, LoraModule module) {
  switch (module) {
    case LoraModule::kQ: return {c.q_size(), c.hidden_size};
    case LoraModule::kK:
    case LoraModule::kV: return {c.kv_size(), c.hidden_size};
    case LoraModule::kO: return {c.hidden_size, c.q_size()};
    case LoraModule::kGate:
    case LoraModule::kUp: return {c.intermediate_size, c.hidden_size};
    case LoraModule::kDown: return {c.hidden_size, c.intermediate_size};
  }
  return {0, 0};
}

float LoraFactor::at(int64_t index) const {
  PAGELLM_CHECK(index >= 0 && index < numel())
      << "LoraFactor::at: index " << index << " is outside the factor's " << numel()
      << " elements";
  const char* p = static_cast<const char*>(data) + index * static_cast<int64_t>(dtype_size(dtype));
  float v;
  convert_to_f32(p, dtype, &v, 1);
  return v;
}

std::vector<float> LoraFactor::to_f32() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  convert_to_f32(data, dtype, out.data(), out.size());
  return out;
}

float LoraConfig::scale() const {
  const double r = static_cast<double>(rank);
  return static_cast<float>(use_rslora ? alpha / std::sqrt(r) : alpha / r);
}

bool LoraConfig::targets(LoraModule module) const {
  return std::find(target_modules.begin(), target_modules.end(), module) !=
         target_modules.end();
}

LoraConfig parse_lora_config(const std::string& json_text, const std::string& source,
                             int64_t max_rank) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    PAGELLM_CHECK(false) << source << " is not valid JSON: " << e.what();
  }
  PAGELLM_CHECK(root.is_object()) << source << " must hold a JSON object";
  LoraConfig c;

  if (root.contains("peft_type") && !root.at("peft_type").is_null()) {
    PAGELLM_CHECK(root.at("peft_type") == "LORA")
        << source << ": peft_type " << root.at("peft_type").dump()
        << " is not supported; only \"LORA\" adapters are";
  }
  PAGELLM_CHECK(field_unset(root, "use_dora"))
      << source << ": use_dora is set; DoRA adapters are not supported (plain LoRA only)";
  if (root.contains("bias") && !root.at("bias").is_null()) {
    PAGELLM_CHECK(root.at("bias") == "none")
        << source << ": bias " << root.at("bias").dump()
        << " is not supported; only bias \"none\" (no trained biases) is";
  }
  for (const char* unsupported : {"fan_in_fan_out", "modules_to_save", "layers_to_transform",
                                  "layers_pattern", "rank_pattern", "alpha_pattern"}) {
    PAGELLM_CHECK(field_unset(root, unsupported))
        << source << ": " << unsupported << " " << root.at(unsupported).dump()
        << " is not supported; leave it unset (null, false or empty)";
  }

  PAGELLM_CHECK(root.contains("r") && root.at("r").is_number_integer())
      << source << ": \"r\" (the rank) must be an integer";
  c.rank = root.at("r").get<int64_t>();
  PAGELLM_CHECK(c.rank >= 1 && c.rank <= max_rank)
      << source << ": rank r = " << c.rank << " is outside the supported 1.." << max_rank
      << (max_rank < kMaxLoraRank ? " (the engine's max_lora_rank)" : "");
  PAGELLM_CHECK(root.contains("lora_alpha") && root.at("lora_alpha").is_number())
      << source << ": \"lora_alpha\" must be a number";
  c.alpha = root.at("lora_alpha").get<double>();
  PAGELLM_CHECK(std::isfinite(c.alpha))
      << source << ": lora_alpha must be finite, got " << c.alpha;
  if (root.contains("use_rslora") && !root.at("use_rslora").is_null()) {
    PAGELLM_CHECK(root.at("use_rslora").is_boolean())
        << source << ": use_rslora must be true or false";
    c.use_rslora = root.at("use_rslora").get<bool>();
  }

  PAGELLM_CHECK(root.contains("target_modules"))
      << source << ": \"target_modules\" is missing; list modules among " << accepted_modules();
  const json& targets = root.at("target_modules");
  std::set<int> chosen;
  if (targets.is_string()) {
    // PEFT reads a string as a regex over module paths; of those only "all-linear" has a
    // meaning the engine can check (every linear layer but lm_head: the seven).
    PAGELLM_CHECK(targets == "all-linear")
        << source << ": target_modules " << targets.dump()
        << " is a regex, which is not supported; give a list of modules among "
        << accepted_modules() << ", or \"all-linear\"";
    for (LoraModule m : kAllLoraModules) chosen.insert(static_cast<int>(m));
  } else {
    PAGELLM_CHECK(targets.is_array() && !targets.empty())
        << source << ": target_modules must be a non-empty list of modules among "
        << accepted_modules();
    for (const json& t : targets) {
      PAGELLM_CHECK(t.is_string()) << source << ": target_modules holds " << t.dump()
                                   << ", not a module name";
      LoraModule m;
      PAGELLM_CHECK(module_from_name(t.get<std::string>(), &m))
          << source << ": target module " << t.dump()
          << " is not one this engine applies LoRA to; the Qwen3 modules are "
          << accepted_modules();
      chosen.insert(static_cast<int>(m));
    }
  }
  for (int m : chosen) c.target_modules.push_back(static_cast<LoraModule>(m));
  return c;
}

std::string lora_config_to_json(const LoraConfig& config) {
  json root;
  root["peft_type"] = "LORA";
  root["task_type"] = "CAUSAL_LM";
  root["r"] = config.rank;
  root["lora_alpha"] = config.alpha;
  root["use_rslora"] = config.use_rslora;
  root["use_dora"] = false;
  root["bias"] = "none";
  root["lora_dropout"] = 0.0;
  root["fan_in_fan_out"] = false;
  root["target_modules"] = json::array();
  for (LoraModule m : config.target_modules) root["target_modules"].push_back(lora_module_name(m));
  return root.dump(2) + "\n";
}

std::string lora_tensor_name(int64_t layer, LoraModule module, char factor) {
  return "base_model.model.model.layers." + std::to_string(layer) + "." +
         lora_module_parent(module) + "." + lora_module_name(module) + ".lora_" + factor +
         ".weight";
}

LoraAdapter read_lora_adapter(const std::string& dir, const Qwen3Config& model,
                              int64_t max_rank) {
  namespace fs = std::filesystem;
  const std::string config_path = dir + "/adapter_config.json";
  const std::string weights_path = dir + "/adapter_model.safetensors";
  PAGELLM_CHECK(fs::is_directory(dir))
      << "LoRA adapter " << dir << " is not a folder (a PEFT adapter folder holds "
      << "adapter_config.json and adapter_model.safetensors)";
  PAGELLM_CHECK(fs::is_regular_file(config_path))
      << "LoRA adapter " << dir << " has no adapter_config.json";
  PAGELLM_CHECK(fs::is_regular_file(weights_path))
      << "LoRA adapter " << dir << " has no adapter_model.safetensors (adapter_model.bin, "
      << "a pickle, is not read: save with safe_serialization=True)";

  LoraAdapter adapter;
  adapter.path = dir;
  adapter.config = parse_lora_config(read_text(config_path), config_path, max_rank);
  const LoraConfig& c = adapter.config;
  const int64_t r = c.rank;

  std::shared_ptr<const SafetensorsFile> file = SafetensorsFile::open(weights_path);
  std::map<std::string, const HostTensor*> by_name;
  for (const HostTensor& t : file->tensors()) by_name[t.name] = &t;

  std::vector<std::string> problems;
  std::set<std::string> used;
  adapter.layers.resize(static_cast<size_t>(model.num_hidden_layers));
  for (int64_t l = 0; l < model.num_hidden_layers; ++l) {
    for (LoraModule m : c.target_modules) {
      const auto [out, in] = lora_module_shape(model, m);
      LoraFactors& f = adapter.layers[static_cast<size_t>(l)][static_cast<int>(m)];
      for (char factor : {'A', 'B'}) {
        const std::string name = lora_tensor_name(l, m, factor);
        const std::vector<int64_t> want =
            factor == 'A' ? std::vector<int64_t>{r, in} : std::vector<int64_t>{out, r};
        const auto it = by_name.find(name);
        if (it == by_name.end()) {
          problems.push_back("missing tensor " + name + " " + shape_to_string(want));
          continue;
        }
        used.insert(name);
        const HostTensor& t = *it->second;
        if (t.shape != want) {
          problems.push_back(name + " has shape " + t.shape_string() + ", expected " +
                             shape_to_string(want) + " (r = " + std::to_string(r) + ")");
          continue;
        }
        if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16) {
          problems.push_back(name + " has dtype " + dtype_name(t.dtype) +
                             "; F32, BF16 and F16 are accepted");
          continue;
        }
        LoraFactor& view = factor == 'A' ? f.a : f.b;
        view.data = t.data;
        view.dtype = t.dtype;
        view.rows = want[0];
        view.cols = want[1];
      }
    }
  }
  for (const HostTensor& t : file->tensors()) {
    if (used.count(t.name)) continue;
    const bool dora = t.name.find("lora_magnitude_vector") != std::string::npos;
    problems.push_back("unexpected tensor " + t.name +
                       (dora ? " (a DoRA magnitude; DoRA is not supported)"
                             : " (only lora_A / lora_B of the targeted modules of layers 0.." +
                                   std::to_string(model.num_hidden_layers - 1) +
                                   " are accepted)"));
  }
  if (!problems.empty()) {
    std::ostringstream msg;
    msg << "LoRA adapter " << dir << " does not fit this model (" << model.num_hidden_layers
        << " layers, r = " << r << "):";
    const size_t shown = std::min<size_t>(problems.size(), 8);
    for (size_t i = 0; i < shown; ++i) msg << "\n  " << problems[i];
    if (problems.size() > shown) msg << "\n  ... and " << problems.size() - shown << " more";
    PAGELLM_CHECK(false) << msg.str();
  }
  // The image builder reads every factor next; have the kernel fetch the pages meanwhile.
  for (const HostTensor& t : file->tensors()) file->prefetch(t);
  adapter.file = std::move(file);
  return adapter;
}

std::vector<TensorToWrite> random_lora_tensors(const Qwen3Config& model, const LoraConfig& config,
                                               uint64_t seed, DType dtype, float stddev_b) {
  std::vector<TensorToWrite> tensors;
  for (int64_t l = 0; l < model.num_hidden_layers; ++l) {
    for (LoraModule m : config.target_modules) {
      const auto [out, in] = lora_module_shape(model, m);
      for (char factor : {'A', 'B'}) {
        TensorToWrite t;
        t.name = lora_tensor_name(l, m, factor);
        t.dtype = dtype;
        t.shape = factor == 'A' ? std::vector<int64_t>{config.rank, in}
                                : std::vector<int64_t>{out, config.rank};
        const uint64_t key = random_tensor_key(seed, t.name);
        const float stddev =
            factor == 'A' ? 1.0f / std::sqrt(static_cast<float>(in)) : stddev_b;
        t.fill = [key, stddev, dtype](int64_t first, int64_t count, void* dst) {
          fill_random_normal(key, first, count, 0.0f, stddev, dtype, dst);
        };
        tensors.push_back(std::move(t));
      }
    }
  }
  return tensors;
}

void make_lora_adapter(const std::string& dir, const Qwen3Config& model, const LoraConfig& config,
                       uint64_t seed, DType dtype, float stddev_b) {
  std::filesystem::create_directories(dir);
  std::ofstream out(dir + "/adapter_config.json", std::ios::trunc);
  out << lora_config_to_json(config);
  PAGELLM_CHECK(out.good()) << "cannot write " << dir << "/adapter_config.json";
  out.close();
  write_safetensors(dir + "/adapter_model.safetensors",
                    random_lora_tensors(model, config, seed, dtype, stddev_b));
}

}  // namespace pagellm
