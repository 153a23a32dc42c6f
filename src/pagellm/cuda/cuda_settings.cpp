#include "pagellm/cuda/cuda_settings.h"

#include <cstdlib>
#include <string>

#include "pagellm/attention/crossover_table.h"
#include "pagellm/common/check.h"

namespace pagellm::cuda {
namespace {

// A switch that is on unless the variable holds something other than "" or "0".
bool disabled_by(const char* value) {
  return value != nullptr && value[0] != '\0' && std::string(value) != "0";
}

}  // namespace

const char* matmul_path_name(MatmulPath path) {
  switch (path) {
    case MatmulPath::kAuto: return "auto";
    case MatmulPath::kCublasLt: return "cublaslt";
    case MatmulPath::kSkinny: return "skinny";
  }
  return "?";
}

const char* decode_kernel_name(DecodeKernel k) {
  return k == DecodeKernel::kTma ? "tma" : "cpasync";
}

const char* prefill_kernel_name(PrefillKernel k) {
  switch (k) {
    case PrefillKernel::kV2: return "v2";
    case PrefillKernel::kWgmma: return "wgmma";
    case PrefillKernel::kWgmmaSerial: return "wgmma-serial";
    case PrefillKernel::kWgmmaHeadMajor: return "wgmma-headmajor";
    case PrefillKernel::kWgmmaKvMajor: return "wgmma-kvmajor";
  }
  return "?";
}

const char* pack_policy_name(PackPolicy p) {
  switch (p) {
    case PackPolicy::kAuto: return "auto";
    case PackPolicy::kAlways: return "1";
    case PackPolicy::kNever: return "0";
  }
  return "?";
}

MatmulPath parse_matmul_path(const std::string& value) {
  if (value.empty() || value == "auto") return MatmulPath::kAuto;
  if (value == "cublaslt") return MatmulPath::kCublasLt;
  if (value == "skinny") return MatmulPath::kSkinny;
  PAGELLM_FAIL() << "PAGELLM_MATMUL=" << value
                 << " is not a matmul path; use cublaslt, skinny or auto";
}

bool parse_matmul_autotune(const std::string& value) {
  if (value.empty() || value == "1") return true;
  if (value == "0") return false;
  PAGELLM_FAIL() << "PAGELLM_MATMUL_AUTOTUNE=" << value
                 << " is not accepted; use 1 (autotune cuBLASLt algorithms) or 0 (take "
                    "the heuristic's first choice)";
}

CudaSettings CudaSettings::parse(const std::function<const char*(const char*)>& lookup) {
  CudaSettings s;
  if (const char* v = lookup("PAGELLM_MATMUL")) s.matmul_path = parse_matmul_path(v);
  if (const char* v = lookup("PAGELLM_MATMUL_AUTOTUNE")) {
    s.matmul_autotune = parse_matmul_autotune(v);
  }
  if (const char* env = lookup("PAGELLM_PACKED_WEIGHTS")) {
    const std::string v = env;
    PAGELLM_CHECK(v.empty() || v == "auto" || v == "0" || v == "1")
        << "PAGELLM_PACKED_WEIGHTS=" << v
        << " is not accepted; use auto (pack while the copies fit in a quarter of GPU memory), "
           "1 (pack every decode matrix) or 0 (never pack)";
    s.packed_weights = v == "1" ? PackPolicy::kAlways : v == "0" ? PackPolicy::kNever
                                                                 : PackPolicy::kAuto;
  }
  if (const char* env = lookup("PAGELLM_DECODE_KERNEL"); env != nullptr && env[0] != '\0') {
    const std::string v = env;
    if (v == "tma") {
      s.decode_kernel = DecodeKernel::kTma;
    } else if (v == "cpasync") {
      s.decode_kernel = DecodeKernel::kCpAsync;
    } else {
      PAGELLM_FAIL() << "PAGELLM_DECODE_KERNEL=" << v
                     << " is not a decode kernel: use tma or cpasync (or leave it unset for "
                     << decode_kernel_name(kDefaultDecodeKernel) << ")";
    }
  }
  if (const char* env = lookup("PAGELLM_PREFILL_KERNEL"); env != nullptr && env[0] != '\0') {
    const std::string v = env;
    if (v == "wgmma") {
      s.prefill_kernel = PrefillKernel::kWgmma;
    } else if (v == "wgmma-serial") {
      s.prefill_kernel = PrefillKernel::kWgmmaSerial;
    } else if (v == "wgmma-headmajor") {
      s.prefill_kernel = PrefillKernel::kWgmmaHeadMajor;
    } else if (v == "wgmma-kvmajor") {
      s.prefill_kernel = PrefillKernel::kWgmmaKvMajor;
    } else if (v == "v2") {
      s.prefill_kernel = PrefillKernel::kV2;
    } else {
      PAGELLM_FAIL() << "PAGELLM_PREFILL_KERNEL=" << v
                     << " is not a prefill kernel: use wgmma, wgmma-headmajor, wgmma-kvmajor, "
                        "wgmma-serial or v2 (or leave it unset for "
                     << prefill_kernel_name(kDefaultPrefillKernel) << ")";
    }
  }
  s.qkv_fusion = !disabled_by(lookup("PAGELLM_DISABLE_QKV_FUSION"));
  s.decode_cascade = !disabled_by(lookup("PAGELLM_DISABLE_DECODE_CASCADE"));
  s.pdl = !disabled_by(lookup("PAGELLM_DISABLE_PDL"));
  s.lora_dense = !disabled_by(lookup("PAGELLM_DISABLE_LORA_DENSE"));
  if (const char* v = lookup("PAGELLM_CUDNN_LIB")) s.cudnn_library = v;
  if (const char* v = lookup("PAGELLM_NCCL_LIBRARY")) s.nccl_library = v;
  if (const char* v = lookup("PAGELLM_ATTENTION_TABLES")) {
    s.attention_tables = split_crossover_table_paths(v);
  }
  return s;
}

CudaSettings CudaSettings::from_environment() {
  return parse([](const char* name) -> const char* { return std::getenv(name); });
}

const CudaSettings& CudaSettings::process() {
  // A bad variable is reported at every call, not just the first (a static initialiser
  // that throws is retried; the error is kept so that the message stays the same).
  struct Parsed {
    CudaSettings settings;
    std::string error;
  };
  static const Parsed parsed = [] {
    Parsed p;
    try {
      p.settings = from_environment();
    } catch (const Error& e) {
      p.error = e.what();
    }
    return p;
  }();
  PAGELLM_CHECK(parsed.error.empty()) << parsed.error;
  return parsed.settings;
}

}  // namespace pagellm::cuda
