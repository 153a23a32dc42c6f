// LoRA adapters as the public API names them (vLLM's LoRARequest).
#pragma once

#include <cstdint>
#include <string>

namespace pagellm {

/// Selects a LoRA adapter for a request, or names one to load (vLLM's
/// LoRARequest(lora_name, lora_int_id, lora_path)). The name is the key: a request whose
/// adapter name is not loaded yet loads it from `path` first; one whose name is loaded
/// uses that adapter (its path must then be empty or the loaded path). An empty name means
/// no adapter. docs/design.md, "LoRA", gives the accepted PEFT folders.
struct LoraRequest {
  std::string name;
  /// The caller's own number for the adapter (vLLM's lora_int_id), reported back in
  /// LoraAdapterInfo; the engine does not use it.
  int64_t id = 0;
  /// A PEFT adapter folder: adapter_config.json and adapter_model.safetensors.
  std::string path;
};

/// A loaded adapter.
struct LoraAdapterInfo {
  std::string name;
  int64_t id = 0;
  std::string path;
  int64_t rank = 0;
  /// The factor B·A is scaled by (lora_alpha / r, or lora_alpha / sqrt(r) with rsLoRA).
  float scale = 0.0f;
  /// The adapter slot it occupies (1 .. max_loras).
  int32_t slot = 0;
  /// 1 when first loaded, increased by each replace in place (a load under its name).
  uint64_t version = 0;
};

}  // namespace pagellm
