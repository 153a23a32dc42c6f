// make_model: writes a random-weight Qwen3 model folder laid out as save_pretrained does.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "pagellm/common/dtype.h"
#include "pagellm/model/config.h"

namespace pagellm {

/// Names accepted by preset_config: "tiny", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b".
std::vector<std::string> model_presets();

/// The architecture of a preset. The qwen3-* presets are the released models' config.json
/// (V=151936, rope_theta 1e6, eps 1e-6, 40960 positions; 0.6B/1.7B/4B tied, 8B untied;
/// bos 151643 <|endoftext|>, eos [151645 <|im_end|>, 151643]). "tiny" is for tests and demos
/// on a laptop CPU: V=1024 H=64 I=192 L=2, 4 query / 2 KV heads of D=32 (so q_size != H),
/// untied (so lm_head is exercised), 2048 positions, and Qwen's three special tokens at the
/// top of its vocabulary: bos 1021 (<|endoftext|>), eos [1023 (<|im_end|>), 1021].
/// Throws Error listing the presets for an unknown name.
Qwen3Config preset_config(const std::string& preset);

/// Called with (bytes written so far, bytes in total) over all files; from the calling thread.
using MakeModelProgress = std::function<void(uint64_t done, uint64_t total)>;

struct MakeModelOptions {
  std::string preset = "tiny";
  std::string out_dir;         // created if missing; existing weight files are replaced
  uint64_t seed = 0;
  DType dtype = DType::BF16;   // F32, BF16 or F16; also written as config.json torch_dtype
  // Largest shard, in bytes; "4GB" as save_pretrained's max_shard_size counts it (10^9).
  uint64_t shard_bytes = 4'000'000'000;
  MakeModelProgress progress;  // optional
};

/// Writes preset_config(options.preset) with random weights; see write_random_model.
void make_model(const MakeModelOptions& options);

/// Writes a model folder for `config` (its torch_dtype is replaced by options.dtype):
///   config.json             qwen3_config_to_json
///   generation_config.json  bos/eos/pad ids and Qwen3's sampling defaults
///   model.safetensors                         when the weights fit in shard_bytes, else
///   model-0000k-of-0000n.safetensors + model.safetensors.index.json
/// with the tensor names, order, sharding and file layout of save_pretrained (tokenizer
/// files are not written here). Weights: linear and embedding N(0, 0.02) (transformers'
/// initializer_range), RMSNorm scales N(1, 0.1) so that no norm is the identity. Every value
/// is a pure function of (seed, tensor name, element index), so the output does not depend
/// on the thread count, and the float32, bfloat16 and float16 folders of one seed hold the
/// same model up to rounding. Generation runs on all OpenMP threads while the previous chunk
/// is written. Files from an earlier run with different sharding are removed.
void write_random_model(const Qwen3Config& config, const MakeModelOptions& options);

/// Fills dst[0, count) with elements [first, first + count) of the normal stream `key`
/// (mean, stddev), converted to dtype (F32, BF16 or F16). Element i is a pure function of
/// (key, i): Box–Muller over a counter-based hash (SplitMix64) with polynomial log and
/// sincos, vectorisable and OpenMP-parallel. Exposed for tests.
void fill_random_normal(uint64_t key, int64_t first, int64_t count, float mean, float stddev,
                        DType dtype, void* dst);
/// The stream key of one tensor: a hash of the seed and the tensor's name.
uint64_t random_tensor_key(uint64_t seed, const std::string& name);

}  // namespace pagellm
