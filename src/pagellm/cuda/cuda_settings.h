// The CUDA backend's settings: every PAGELLM_* environment variable the backend and its
// kernels read, parsed once into one typed struct (README's table names them).
//
// CudaBackend holds one (CudaSettings::from_environment() unless it is given another) and
// passes each field to what uses it: the matmul dispatcher, the weight packer, the qkv
// fusion, the attention kernels' variants and the crossover tables. Two settings are
// process-wide by nature and are read from CudaSettings::process() (the environment,
// parsed at first use): programmatic dependent launch, which every kernel launch consults
// (launch_kernel, also outside any backend), and the cuDNN library, which is loaded once
// per process. Nothing else under src/pagellm/cuda calls getenv.
//
// This header includes no CUDA header (cuda_backend.h includes it).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace pagellm::cuda {

/// Which implementation LtMatmul::run uses (PAGELLM_MATMUL).
enum class MatmulPath { kAuto, kCublasLt, kSkinny };

/// The paged decode kernels (attention_decode_variants.h says how they differ).
enum class DecodeKernel { kCpAsync, kTma };

/// The variant paged_decode_attention uses when PAGELLM_DECODE_KERNEL is unset.
inline constexpr DecodeKernel kDefaultDecodeKernel = DecodeKernel::kTma;

/// Fewest sequences of a decode call that runs the shared-prefix pass
/// (AttentionDispatch::add_prefix_pass; CudaSettings::decode_cascade_min_seqs's default).
/// With 16 (H100, 2026-12-06, W2 with the pass against without it), W2's steps of 65+ rows
/// ran 1.6-3.0 % faster and those of 9-64 rows 0.3-0.5 % slower; 65 against 16 in one
/// binary, alternating (H100, 2026-12-06, eighteenth session): W1 (32 sequences that share
/// nothing, whose graphs then hold no pass) 7,197-7,203 against 7,152-7,153 tok/s, W2
/// 78.52-78.55 against 78.63-78.65 s (docs/PERFORMANCE.md).
inline constexpr int32_t kDecodeCascadeMinSeqs = 65;

/// Most keys after its shared prefix for which a sequence's decode attention is done whole
/// by its prefix item's pass CTAs (PagedAttentionParams::prefix_fold_keys's default). W2 on
/// an H100 (2026-12-06, nineteenth session, one binary): 74.56-74.60 s with 256 against
/// 74.91-74.97 with 64, 74.79 with every member folded and 75.13 with none.
inline constexpr int32_t kDecodePrefixFoldKeys = 256;

/// The paged prefill kernels (attention_prefill_variants.h says how they differ).
enum class PrefillKernel { kV2, kWgmma, kWgmmaSerial, kWgmmaHeadMajor, kWgmmaKvMajor };

/// The variant paged_prefill_attention uses when PAGELLM_PREFILL_KERNEL is unset.
inline constexpr PrefillKernel kDefaultPrefillKernel = PrefillKernel::kWgmma;

/// Whether prepare_matrix keeps packed copies of the decode matrices (PAGELLM_PACKED_WEIGHTS):
/// kAuto while they fit in a quarter of GPU memory, kAlways (failing when memory runs out),
/// kNever.
enum class PackPolicy { kAuto, kAlways, kNever };

/// "auto", "cublaslt" or "skinny".
const char* matmul_path_name(MatmulPath path);
/// "cpasync" or "tma".
const char* decode_kernel_name(DecodeKernel k);
/// "v2", "wgmma", "wgmma-serial", "wgmma-headmajor" or "wgmma-kvmajor".
const char* prefill_kernel_name(PrefillKernel k);
/// "auto", "1" or "0".
const char* pack_policy_name(PackPolicy p);

/// Parses a PAGELLM_MATMUL value; throws Error naming the accepted values otherwise.
MatmulPath parse_matmul_path(const std::string& value);
/// Parses a PAGELLM_MATMUL_AUTOTUNE value: "1" or "" (on), "0" (off); throws Error otherwise.
bool parse_matmul_autotune(const std::string& value);

/// Every PAGELLM_* setting of the CUDA backend, with its default.
struct CudaSettings {
  /// PAGELLM_MATMUL: auto (skinny kernel for M <= 64 where it applies, else cuBLASLt),
  /// cublaslt or skinny.
  MatmulPath matmul_path = MatmulPath::kAuto;
  /// PAGELLM_MATMUL_AUTOTUNE: 1 or empty (time cuBLASLt's candidates per shape), 0 (the
  /// heuristic's first choice, bit-identical across processes).
  bool matmul_autotune = true;
  /// PAGELLM_PACKED_WEIGHTS: auto, 1 or 0.
  PackPolicy packed_weights = PackPolicy::kAuto;
  /// PAGELLM_DECODE_KERNEL: tma (default) or cpasync.
  DecodeKernel decode_kernel = kDefaultDecodeKernel;
  /// PAGELLM_PREFILL_KERNEL: wgmma (default; where it applies), wgmma-headmajor,
  /// wgmma-kvmajor, wgmma-serial or v2.
  PrefillKernel prefill_kernel = kDefaultPrefillKernel;
  /// False when PAGELLM_DISABLE_QKV_FUSION is anything but empty or "0" (an ablation: the
  /// qkv product and q/k-norm + RoPE + KV store run as two kernels at decode).
  bool qkv_fusion = true;
  /// False when PAGELLM_DISABLE_DECODE_CASCADE is anything but empty or "0" (an ablation:
  /// decode attention reads every sequence's shared prefix pages itself instead of once per
  /// group; docs/design.md, "Shared-prefix decode attention").
  bool decode_cascade = true;
  /// The fewest sequences of a decode call that runs the shared-prefix pass (tests lower it
  /// to reach the pass with small batches).
  int32_t decode_cascade_min_seqs = kDecodeCascadeMinSeqs;
  /// PagedAttentionParams::prefix_fold_keys of the decode calls that run the pass (0: no
  /// member is folded into it).
  int32_t decode_prefix_fold_keys = kDecodePrefixFoldKeys;
  /// False when PAGELLM_DISABLE_LORA_DENSE is anything but empty or "0" (an ablation:
  /// prefill chunks' LoRA runs the shrink and expand kernels instead of cuBLASLt products;
  /// docs/design.md, "The CUDA kernels" of "LoRA").
  bool lora_dense = true;
  /// False when PAGELLM_DISABLE_PDL is anything but empty or "0": kernels launch without
  /// programmatic dependent launch. Process-wide (CudaSettings::process()).
  bool pdl = true;
  /// PAGELLM_CUDNN_LIB: a libcudnn.so.9 to try before the loader's search (empty: none).
  /// Process-wide (cuDNN is loaded once).
  std::string cudnn_library;
  /// PAGELLM_NCCL_LIBRARY: the libnccl.so.2 that tensor parallelism loads (full path;
  /// empty: "libnccl.so.2" through the loader's search). Read by join_communicator and
  /// new_communicator_id (nccl_communicator.h), which never fall back to another library.
  std::string nccl_library;
  /// PAGELLM_ATTENTION_TABLES: extra crossover tables (files or folders), after the
  /// shipped ones, in the order given (':'-separated in the variable).
  std::vector<std::string> attention_tables;

  /// Parses the variables through `lookup` (name -> value, or null when unset). Throws
  /// Error for a value a variable does not accept, naming the variable, the value and the
  /// accepted values.
  static CudaSettings parse(const std::function<const char*(const char*)>& lookup);
  /// parse(getenv).
  static CudaSettings from_environment();
  /// from_environment(), parsed at the first call and kept for the process (the settings
  /// that cannot differ between backends: pdl and cudnn_library). Throws like parse at the
  /// first call (and again at later ones) when a variable is bad.
  static const CudaSettings& process();
};

}  // namespace pagellm::cuda
