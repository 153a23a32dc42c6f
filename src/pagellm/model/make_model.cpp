// Random-weight model folders.
//
// Speed: qwen3-4b is 4.0e9 values (8 GB of bf16). Each pair of values costs one SplitMix64
// hash, a polynomial log, square root and sincos, then a conversion: about 3 ns per value
// per core with SSE2 vectors (300 M/s), so generation is ~13 core-seconds, spread over all
// cores, and the run is bound by the disk; chunks are generated while the previous one is
// written (write_safetensors).
#include "pagellm/model/make_model.h"
#include "pagellm/model/random_weights.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "pagellm/common/check.h"
#include "pagellm/common/random.h"
#include "pagellm/model/qwen3_weights.h"
#include "pagellm/model/safetensors.h"

namespace pagellm {

namespace fs = std::filesystem;

namespace {

// Elements per parallel work item (32 KiB of floats on each thread's stack).
constexpr int64_t kBlock = 8192;

inline uint32_t as_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Natural log for x in (0, 1], |error| < 1e-6: x = m·2^e with m in [√½, √2), then the
// atanh series of s = (m-1)/(m+1), |s| <= 0.172.
inline float log_unit(float x) {
  // Integer arithmetic only (no selects), so that the caller's loop vectorises.
  const uint32_t bits = as_bits(x);
  const uint32_t mantissa = bits & 0x7fffffu;
  const uint32_t high = static_cast<uint32_t>(mantissa > 0x3504f3u);  // 1.mantissa > √2
  const int32_t e = static_cast<int32_t>(bits >> 23) - 127 + static_cast<int32_t>(high);
  const float m = as_float(mantissa | (0x3f800000u - (high << 23)));  // halved when high
  const float s = (m - 1.0f) / (m + 1.0f);
  const float s2 = s * s;
  const float series =
      s * (2.0f + s2 * (2.0f / 3 + s2 * (2.0f / 5 + s2 * (2.0f / 7 + s2 * (2.0f / 9)))));
  return series + static_cast<float>(e) * 0.69314718f;
}

// sqrt(x) for x in [0, 34] without libm: std::sqrt's errno branch keeps the loop from
// vectorising. Reciprocal square root from the bit pattern, three Newton steps (relative
// error < 1e-7), times x; x = 0 gives 0.
inline float sqrt_nonnegative(float x) {
  float y = as_float(0x5f375a86u - (as_bits(x) >> 1));
  y = y * (1.5f - 0.5f * x * y * y);
  y = y * (1.5f - 0.5f * x * y * y);
  y = y * (1.5f - 0.5f * x * y * y);
  return x * y;
}

// cos(2πu) and sin(2πu) for u in [0, 1), |error| < 1e-6: reduce to a quarter turn q and an
// angle a in [-π/4, π/4], Taylor polynomials there, then rotate by q·π/2.
inline void sincos_turn(float u, float* c, float* s) {
  const int q = static_cast<int>(u * 4.0f + 0.5f);  // 0..4
  const float a = (u - static_cast<float>(q) * 0.25f) * 6.28318531f;
  const float a2 = a * a;
  const float sin_a = a * (1.0f + a2 * (-1.0f / 6 + a2 * (1.0f / 120 + a2 * (-1.0f / 5040))));
  const float cos_a =
      1.0f + a2 * (-0.5f + a2 * (1.0f / 24 + a2 * (-1.0f / 720 + a2 * (1.0f / 40320))));
  // Quadrant 0: (cos a, sin a); 1: (-sin a, cos a); 2: (-cos a, -sin a); 3: (sin a, -cos a).
  // Arithmetic selects rather than branches, so the caller's loop vectorises.
  const float odd = static_cast<float>(q & 1);
  const float cos_sign = static_cast<float>(1 - 2 * (((q + 1) >> 1) & 1));
  const float sin_sign = static_cast<float>(1 - 2 * ((q >> 1) & 1));
  *c = cos_sign * (odd * sin_a + (1.0f - odd) * cos_a);
  *s = sin_sign * (odd * cos_a + (1.0f - odd) * sin_a);
}

// Standard normals of pairs [p0, p0 + n): out[2k] = r·cos θ, out[2k+1] = r·sin θ.
void normal_pairs(uint64_t key, int64_t p0, int64_t n, float* out) {
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) {
    const uint64_t h = splitmix64_mix(key + static_cast<uint64_t>(p0 + k) * kSplitMix64Gamma);
    // 24-bit uniforms: u1 in (0, 1] (so log is finite), u2 in [0, 1). Through int32, which
    // converts to float in vector registers (uint64 does not).
    const float u1 = static_cast<float>(static_cast<int32_t>(h >> 40) + 1) * (1.0f / 16777216.0f);
    const float u2 = static_cast<float>(static_cast<int32_t>(h & 0xffffffu)) * (1.0f / 16777216.0f);
    const float r = sqrt_nonnegative(-2.0f * log_unit(u1));
    float c, s;
    sincos_turn(u2, &c, &s);
    out[2 * k] = r * c;
    out[2 * k + 1] = r * s;
  }
}

// Elements [first, first + count) of the stream into a float buffer (count <= kBlock + 2).
void normal_elements(uint64_t key, int64_t first, int64_t count, float* out) {
  float pairs[kBlock + 4];
  const int64_t p0 = first / 2;
  const int64_t p1 = (first + count + 1) / 2;
  normal_pairs(key, p0, p1 - p0, pairs);
  std::memcpy(out, pairs + (first - 2 * p0), static_cast<size_t>(count) * sizeof(float));
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  PAGELLM_CHECK(out.good()) << path.string() << ": cannot create";
  out << text;
  out.close();
  PAGELLM_CHECK(out.good()) << path.string() << ": write failed";
}

std::string generation_config_json(const Qwen3Config& c) {
  nlohmann::json j;
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() > 1)
    j["eos_token_id"] = c.eos_token_ids;
  else if (c.eos_token_id >= 0)
    j["eos_token_id"] = c.eos_token_id;
  const int64_t pad = c.pad_token_id >= 0 ? c.pad_token_id : c.bos_token_id;
  if (pad >= 0) j["pad_token_id"] = pad;
  // Qwen3's published sampling defaults (its generation_config.json).
  j["do_sample"] = true;
  j["temperature"] = 0.6;
  j["top_k"] = 20;
  j["top_p"] = 0.95;
  j["transformers_version"] = "4.51.0";
  return j.dump(2) + "\n";
}

Qwen3Config qwen3_preset(int64_t hidden, int64_t intermediate, int64_t layers, int64_t heads,
                         bool tied) {
  Qwen3Config c;
  c.vocab_size = 151936;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.rope_theta = 1000000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = tied;
  c.max_position_embeddings = 40960;
  c.torch_dtype = DType::BF16;
  c.bos_token_id = 151643;  // <|endoftext|>
  c.eos_token_id = 151645;  // <|im_end|>
  c.eos_token_ids = {151645, 151643};
  return c;
}

}  // namespace

std::vector<std::string> model_presets() {
  return {"tiny", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b"};
}

Qwen3Config preset_config(const std::string& preset) {
  if (preset == "qwen3-0.6b") return qwen3_preset(1024, 3072, 28, 16, true);
  if (preset == "qwen3-1.7b") return qwen3_preset(2048, 6144, 28, 16, true);
  if (preset == "qwen3-4b") return qwen3_preset(2560, 9728, 36, 32, true);
  if (preset == "qwen3-8b") return qwen3_preset(4096, 12288, 36, 32, false);
  if (preset == "tiny") {
    Qwen3Config c;
    c.vocab_size = 1024;
    c.hidden_size = 64;
    c.intermediate_size = 192;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 32;
    c.rope_theta = 1000000.0;
    c.rms_norm_eps = 1e-6;
    c.tie_word_embeddings = false;
    c.max_position_embeddings = 2048;
    c.torch_dtype = DType::BF16;
    c.bos_token_id = 1021;  // <|endoftext|>
    c.eos_token_id = 1023;  // <|im_end|>
    c.eos_token_ids = {1023, 1021};
    return c;
  }
  std::string list;
  for (const std::string& p : model_presets()) list += (list.empty() ? "" : ", ") + p;
  PAGELLM_FAIL() << "unknown model preset '" << preset << "'; expected one of: " << list;
}

uint64_t random_tensor_key(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the name, then mixed with the seed
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return splitmix64_mix(splitmix64_mix(seed + kSplitMix64Gamma) ^ h);
}

void fill_random_normal(uint64_t key, int64_t first, int64_t count, float mean, float stddev,
                        DType dtype, void* dst) {
  PAGELLM_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16)
      << "random weights must be float32, bfloat16 or float16, not " << dtype_name(dtype);
  const size_t elem = dtype_size(dtype);
  const int64_t blocks = (count + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    float values[kBlock];
    const int64_t begin = b * kBlock;
    const int64_t n = std::min(kBlock, count - begin);
    normal_elements(key, first + begin, n, values);
    for (int64_t i = 0; i < n; ++i) values[i] = mean + stddev * values[i];
    convert_from_f32(values, static_cast<char*>(dst) + static_cast<size_t>(begin) * elem, dtype,
                     static_cast<size_t>(n));
  }
}

void make_model(const MakeModelOptions& options) {
  write_random_model(preset_config(options.preset), options);
}

void write_random_model(const Qwen3Config& base_config, const MakeModelOptions& options) {
  PAGELLM_CHECK(!options.out_dir.empty()) << "make_model: no output folder given";
  PAGELLM_CHECK(options.dtype == DType::F32 || options.dtype == DType::BF16 ||
                options.dtype == DType::F16)
      << "make_model: dtype must be float32, bfloat16 or float16, not "
      << dtype_name(options.dtype);
  PAGELLM_CHECK(options.shard_bytes > 0) << "make_model: shard size must be positive";
  Qwen3Config config = base_config;
  config.torch_dtype = options.dtype;
  validate_qwen3_config(config, "make_model");

  const fs::path dir(options.out_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  PAGELLM_CHECK(fs::is_directory(dir)) << options.out_dir << ": cannot create folder"
                                       << (ec ? ": " + ec.message() : "");
  // Remove weights of an earlier run, which may have been sharded differently.
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const bool shard = name.rfind("model-", 0) == 0 &&
                       name.find("-of-") != std::string::npos &&
                       name.size() > 12 && name.substr(name.size() - 12) == ".safetensors";
    if (shard || name == "model.safetensors" || name == "model.safetensors.index.json")
      fs::remove(entry.path());
  }

  // Tensors in state_dict order, then split as huggingface_hub does: a tensor larger than
  // the limit gets a shard of its own; otherwise a shard closes when the next tensor would
  // push it past the limit.
  const std::vector<ExpectedWeight> weights = expected_qwen3_weights(config);
  const size_t elem = dtype_size(options.dtype);
  std::vector<std::vector<const ExpectedWeight*>> shards;
  std::vector<const ExpectedWeight*> current;
  uint64_t current_bytes = 0, total_bytes = 0;
  for (const ExpectedWeight& w : weights) {
    uint64_t bytes = elem;
    for (int64_t d : w.shape) bytes *= static_cast<uint64_t>(d);
    total_bytes += bytes;
    if (bytes > options.shard_bytes) {
      shards.push_back({&w});
      continue;
    }
    if (current_bytes + bytes > options.shard_bytes && !current.empty()) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(&w);
    current_bytes += bytes;
  }
  if (!current.empty()) shards.push_back(std::move(current));

  auto to_write = [&](const ExpectedWeight& w) {
    TensorToWrite t;
    t.name = w.name;
    t.dtype = options.dtype;
    t.shape = w.shape;
    const uint64_t key = random_tensor_key(options.seed, w.name);
    const RandomInit init = random_init_for(w.kind);
    const float mean = init.mean;
    const float stddev = init.stddev;
    const DType dtype = options.dtype;
    t.fill = [key, mean, stddev, dtype](int64_t first, int64_t count, void* dst) {
      fill_random_normal(key, first, count, mean, stddev, dtype, dst);
    };
    return t;
  };

  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  std::vector<std::vector<TensorToWrite>> files(shards.size());
  uint64_t file_bytes_total = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    for (const ExpectedWeight* w : shards[s]) files[s].push_back(to_write(*w));
    file_bytes_total += safetensors_file_size(files[s], metadata);
  }
  uint64_t done = 0;
  auto on_bytes = [&](uint64_t n) {
    done += n;
    if (options.progress) options.progress(done, file_bytes_total);
  };
  if (options.progress) options.progress(0, file_bytes_total);

  if (shards.size() == 1) {
    write_safetensors((dir / "model.safetensors").string(), files[0], metadata, on_bytes);
  } else {
    nlohmann::json weight_map = nlohmann::json::object();
    char name[64];
    for (size_t s = 0; s < shards.size(); ++s) {
      std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
      write_safetensors((dir / name).string(), files[s], metadata, on_bytes);
      for (const TensorToWrite& t : files[s]) weight_map[t.name] = name;
    }
    nlohmann::json index;
    index["metadata"] = {{"total_parameters", config.num_parameters()},
                         {"total_size", total_bytes}};
    index["weight_map"] = weight_map;
    write_text(dir / "model.safetensors.index.json", index.dump(2) + "\n");
  }

  // config.json carries one eos id, as Qwen3's does; generation_config.json carries them all.
  Qwen3Config file_config = config;
  if (!file_config.eos_token_ids.empty()) file_config.eos_token_ids.resize(1);
  write_text(dir / "config.json", qwen3_config_to_json(file_config));
  write_text(dir / "generation_config.json", generation_config_json(config));
}

}  // namespace pagellm
