// LoRA adapters in PEFT's folder format: reading, checking and (for tests and demos) writing.
//
// A folder holds adapter_config.json ({"r", "lora_alpha", "target_modules", ...}) and
// adapter_model.safetensors with, for each decoder layer N and target module m,
//   base_model.model.model.layers.N.<self_attn|mlp>.m.lora_A.weight   [r, in]
//   base_model.model.model.layers.N.<self_attn|mlp>.m.lora_B.weight   [out, r]
// A module's output becomes x·Wᵀ + scale · (x·Aᵀ)·Bᵀ with scale = lora_alpha / r
// (use_rslora: lora_alpha / sqrt(r)). docs/design.md, "LoRA", lists what is accepted.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pagellm/common/dtype.h"
#include "pagellm/model/config.h"
#include "pagellm/model/safetensors.h"

namespace pagellm {

/// The seven linear modules of a Qwen3 layer an adapter may target, in the engine's order.
enum class LoraModule : int { kQ, kK, kV, kO, kGate, kUp, kDown };
constexpr int kNumLoraModules = 7;
/// Every module, in the engine's order.
constexpr std::array<LoraModule, kNumLoraModules> kAllLoraModules = {
    LoraModule::kQ,    LoraModule::kK,  LoraModule::kV,   LoraModule::kO,
    LoraModule::kGate, LoraModule::kUp, LoraModule::kDown};
/// The largest rank this engine serves (Backend::lora_add's shrink workspace is this wide).
constexpr int64_t kMaxLoraRank = 64;

/// PEFT's name of a module: "q_proj", ..., "down_proj".
const char* lora_module_name(LoraModule module);
/// "self_attn" for q/k/v/o, "mlp" for gate/up/down.
const char* lora_module_parent(LoraModule module);
/// A module's weight shape in a model: {out, in} (q_proj: {Hq·D, H}, down_proj: {H, I}).
std::array<int64_t, 2> lora_module_shape(const Qwen3Config& model, LoraModule module);

/// The parts of adapter_config.json the engine uses.
struct LoraConfig {
  int64_t rank = 0;           // "r"
  double alpha = 0.0;         // "lora_alpha"
  bool use_rslora = false;    // scale alpha / sqrt(r) instead of alpha / r
  /// Targeted modules, each once, in LoraModule order.
  std::vector<LoraModule> target_modules;
  /// The factor applied to B·A.
  float scale() const;
  bool targets(LoraModule module) const;
};

/// Parses adapter_config.json text. Throws Error naming `source` and the field for a
/// missing or mistyped r / lora_alpha / target_modules, r outside 1..max_rank, a target
/// module other than the seven (or a regex string other than "all-linear"), and for
/// what the engine does not implement: use_dora, bias other than "none", peft_type other
/// than "LORA", fan_in_fan_out, modules_to_save, layers_to_transform, rank_pattern or
/// alpha_pattern.
LoraConfig parse_lora_config(const std::string& json_text, const std::string& source,
                             int64_t max_rank = kMaxLoraRank);

/// adapter_config.json text for `config` as PEFT writes it (the fields above, with
/// bias "none", use_dora false and peft_type "LORA").
std::string lora_config_to_json(const LoraConfig& config);

/// One factor of an adapter: a read-only view of `rows` x `cols` elements of `dtype` (F32,
/// BF16 or F16), row-major, inside the adapter's memory-mapped safetensors file. Valid while
/// the LoraAdapter that holds it (its `file`) is alive. Loading converts and lays factors
/// out in bulk (write_lora_image); at() and to_f32() are for tests and references.
struct LoraFactor {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t numel() const { return rows * cols; }
  bool empty() const { return data == nullptr; }
  /// Element `index` (row-major) widened to float32.
  float at(int64_t index) const;
  /// The whole factor widened to float32, row-major.
  std::vector<float> to_f32() const;
};

/// One module's factors: a [rank, in], b [out, rank]; both empty for a module the adapter
/// does not target.
struct LoraFactors {
  LoraFactor a;
  LoraFactor b;
  bool empty() const { return a.empty(); }
};

/// An adapter read from a PEFT folder and checked against a model: views of its factors
/// per layer and module (empty for modules it does not target) into the mapped
/// adapter_model.safetensors, which the adapter keeps open (copies share it).
struct LoraAdapter {
  std::string path;
  LoraConfig config;
  /// [num_hidden_layers][module]
  std::vector<std::array<LoraFactors, kNumLoraModules>> layers;
  /// The mapped file the factors point into (null for an adapter made by hand).
  std::shared_ptr<const SafetensorsFile> file;
};

/// The safetensors name of a factor: "base_model.model.model.layers.3.mlp.up_proj.lora_B.weight".
std::string lora_tensor_name(int64_t layer, LoraModule module, char factor);

/// Reads `dir` (adapter_config.json + adapter_model.safetensors) for `model`. Throws Error
/// naming the folder and each problem: a missing file, a bad config (parse_lora_config), a
/// factor missing for some layer and target, a tensor of another shape than [r, in] /
/// [out, r] (both named), a dtype other than F32/BF16/F16, and any tensor the engine would
/// not use (DoRA magnitudes, biases, embeddings, layers the model lacks, untargeted
/// modules), listed by name. Nothing is converted or copied: the factors are views into
/// the mapped file, whose pages the kernel is asked to start reading (madvise WILLNEED).
LoraAdapter read_lora_adapter(const std::string& dir, const Qwen3Config& model,
                              int64_t max_rank = kMaxLoraRank);

/// The tensors of a random adapter for `model` (A ~ N(0, 1/sqrt(in)), B ~ N(0, stddev_b):
/// unlike PEFT's zero-initialised B, so that the adapter changes outputs), each a pure
/// function of (seed, name, index), in `dtype`. Tests edit this list to make broken folders.
std::vector<TensorToWrite> random_lora_tensors(const Qwen3Config& model, const LoraConfig& config,
                                               uint64_t seed, DType dtype = DType::F32,
                                               float stddev_b = 0.05f);

/// Writes a random adapter folder (adapter_config.json + adapter_model.safetensors).
void make_lora_adapter(const std::string& dir, const Qwen3Config& model, const LoraConfig& config,
                       uint64_t seed, DType dtype = DType::F32, float stddev_b = 0.05f);

}  // namespace pagellm
