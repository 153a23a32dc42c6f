// CudaSettings: each PAGELLM_* variable of the CUDA backend parsed into its field, defaults
// when unset, and a bad value rejected with a message naming the variable, the value and
// what is accepted. Host code only: runs without a GPU.
#include <gtest/gtest.h>

#include <iterator>
#include <map>
#include <string>

#include "pagellm/common/check.h"
#include "pagellm/cuda/cuda_settings.h"

namespace pagellm::cuda {
namespace {

// Parses a fake environment.
CudaSettings parse_env(const std::map<std::string, std::string>& env) {
  return CudaSettings::parse([&env](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

// The message of the Error parsing `env` throws ("" when it does not throw).
std::string error_of(const std::map<std::string, std::string>& env) {
  try {
    parse_env(env);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CudaSettings, DefaultsWhenNothingIsSet) {
  const CudaSettings s = parse_env({});
  EXPECT_EQ(s.matmul_path, MatmulPath::kAuto);
  EXPECT_TRUE(s.matmul_autotune);
  EXPECT_EQ(s.packed_weights, PackPolicy::kAuto);
  EXPECT_EQ(s.decode_kernel, DecodeKernel::kTma);
  EXPECT_TRUE(s.qkv_fusion);
  EXPECT_TRUE(s.decode_cascade);
  EXPECT_TRUE(s.lora_dense);
  EXPECT_TRUE(s.pdl);
  EXPECT_EQ(s.cudnn_library, "");
  EXPECT_EQ(s.nccl_library, "");
  EXPECT_TRUE(s.attention_tables.empty());
}

TEST(CudaSettings, ParsesMatmulPath) {
  EXPECT_EQ(parse_env({{"PAGELLM_MATMUL", ""}}).matmul_path, MatmulPath::kAuto);
  EXPECT_EQ(parse_env({{"PAGELLM_MATMUL", "auto"}}).matmul_path, MatmulPath::kAuto);
  EXPECT_EQ(parse_env({{"PAGELLM_MATMUL", "cublaslt"}}).matmul_path, MatmulPath::kCublasLt);
  EXPECT_EQ(parse_env({{"PAGELLM_MATMUL", "skinny"}}).matmul_path, MatmulPath::kSkinny);
  const std::string e = error_of({{"PAGELLM_MATMUL", "fast"}});
  EXPECT_NE(e.find("PAGELLM_MATMUL=fast"), std::string::npos) << e;
  EXPECT_NE(e.find("cublaslt, skinny or auto"), std::string::npos) << e;
}

TEST(CudaSettings, ParsesMatmulAutotune) {
  EXPECT_TRUE(parse_env({{"PAGELLM_MATMUL_AUTOTUNE", ""}}).matmul_autotune);
  EXPECT_TRUE(parse_env({{"PAGELLM_MATMUL_AUTOTUNE", "1"}}).matmul_autotune);
  EXPECT_FALSE(parse_env({{"PAGELLM_MATMUL_AUTOTUNE", "0"}}).matmul_autotune);
  const std::string e = error_of({{"PAGELLM_MATMUL_AUTOTUNE", "yes"}});
  EXPECT_NE(e.find("PAGELLM_MATMUL_AUTOTUNE=yes"), std::string::npos) << e;
  EXPECT_NE(e.find("use 1"), std::string::npos) << e;
}

TEST(CudaSettings, ParsesPackedWeights) {
  EXPECT_EQ(parse_env({{"PAGELLM_PACKED_WEIGHTS", ""}}).packed_weights, PackPolicy::kAuto);
  EXPECT_EQ(parse_env({{"PAGELLM_PACKED_WEIGHTS", "auto"}}).packed_weights, PackPolicy::kAuto);
  EXPECT_EQ(parse_env({{"PAGELLM_PACKED_WEIGHTS", "1"}}).packed_weights, PackPolicy::kAlways);
  EXPECT_EQ(parse_env({{"PAGELLM_PACKED_WEIGHTS", "0"}}).packed_weights, PackPolicy::kNever);
  const std::string e = error_of({{"PAGELLM_PACKED_WEIGHTS", "always"}});
  EXPECT_NE(e.find("PAGELLM_PACKED_WEIGHTS=always"), std::string::npos) << e;
  EXPECT_NE(e.find("auto"), std::string::npos) << e;
  EXPECT_NE(e.find("0 (never pack)"), std::string::npos) << e;
}

TEST(CudaSettings, ParsesDecodeKernel) {
  EXPECT_EQ(parse_env({{"PAGELLM_DECODE_KERNEL", ""}}).decode_kernel, kDefaultDecodeKernel);
  for (DecodeKernel k : {DecodeKernel::kTma, DecodeKernel::kCpAsync}) {
    EXPECT_EQ(parse_env({{"PAGELLM_DECODE_KERNEL", decode_kernel_name(k)}}).decode_kernel, k);
  }
  const std::string e = error_of({{"PAGELLM_DECODE_KERNEL", "wgmma"}});
  EXPECT_NE(e.find("PAGELLM_DECODE_KERNEL=wgmma"), std::string::npos) << e;
  EXPECT_NE(e.find("tma or cpasync"), std::string::npos) << e;
}

TEST(CudaSettings, ParsesPrefillKernel) {
  EXPECT_EQ(parse_env({{"PAGELLM_PREFILL_KERNEL", ""}}).prefill_kernel, kDefaultPrefillKernel);
  EXPECT_EQ(kDefaultPrefillKernel, PrefillKernel::kWgmma);
  for (PrefillKernel k : {PrefillKernel::kWgmma, PrefillKernel::kWgmmaSerial,
                          PrefillKernel::kWgmmaHeadMajor, PrefillKernel::kWgmmaKvMajor,
                          PrefillKernel::kV2}) {
    EXPECT_EQ(parse_env({{"PAGELLM_PREFILL_KERNEL", prefill_kernel_name(k)}}).prefill_kernel, k);
  }
  const std::string e = error_of({{"PAGELLM_PREFILL_KERNEL", "fa3"}});
  EXPECT_NE(e.find("PAGELLM_PREFILL_KERNEL=fa3"), std::string::npos) << e;
  EXPECT_NE(e.find("wgmma, wgmma-headmajor, wgmma-kvmajor, wgmma-serial or v2"),
            std::string::npos)
      << e;
}

TEST(CudaSettings, DisableSwitchesAreOnForAnythingButEmptyOrZero) {
  struct Case {
    const char* value;
    bool enabled;
  };
  const char* const vars[] = {"PAGELLM_DISABLE_QKV_FUSION", "PAGELLM_DISABLE_PDL",
                              "PAGELLM_DISABLE_LORA_DENSE", "PAGELLM_DISABLE_DECODE_CASCADE"};
  for (size_t mine = 0; mine < std::size(vars); ++mine) {
    const char* var = vars[mine];
    for (const Case& c : {Case{"", true}, Case{"0", true}, Case{"1", false},
                          Case{"true", false}, Case{"00", false}, Case{"yes", false}}) {
      const CudaSettings s = parse_env({{var, c.value}});
      const bool* const switches[] = {&s.qkv_fusion, &s.pdl, &s.lora_dense, &s.decode_cascade};
      EXPECT_EQ(*switches[mine], c.enabled) << var << "=" << c.value;
      // The other switches are untouched.
      for (size_t i = 0; i < std::size(switches); ++i) {
        if (i != mine) {
          EXPECT_TRUE(*switches[i]) << var << "=" << c.value << " switch " << i;
        }
      }
    }
  }
}

TEST(CudaSettings, ParsesLibrariesAndAttentionTables) {
  const CudaSettings s = parse_env({{"PAGELLM_CUDNN_LIB", "/opt/cudnn/libcudnn.so.9"},
                                    {"PAGELLM_NCCL_LIBRARY", "/opt/nccl/lib/libnccl.so.2"},
                                    {"PAGELLM_ATTENTION_TABLES", "a.json::dir/b:c"}});
  EXPECT_EQ(s.cudnn_library, "/opt/cudnn/libcudnn.so.9");
  EXPECT_EQ(s.nccl_library, "/opt/nccl/lib/libnccl.so.2");
  EXPECT_EQ(s.attention_tables, (std::vector<std::string>{"a.json", "dir/b", "c"}));
}

TEST(CudaSettings, FirstBadVariableIsNamedAmongGoodOnes) {
  const std::string e = error_of({{"PAGELLM_MATMUL", "skinny"},
                                  {"PAGELLM_PACKED_WEIGHTS", "2"},
                                  {"PAGELLM_DISABLE_PDL", "1"}});
  EXPECT_NE(e.find("PAGELLM_PACKED_WEIGHTS=2"), std::string::npos) << e;
}

}  // namespace
}  // namespace pagellm::cuda
