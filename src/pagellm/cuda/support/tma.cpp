#include "pagellm/cuda/support/tma.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <mutex>
#include <tuple>
#include <unordered_map>

#include "pagellm/common/check.h"
#include "pagellm/common/hash.h"
#include "pagellm/cuda/support/cuda_check.h"

namespace pagellm::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    PAGELLM_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000,
                                                        cudaEnableDefault, &status));
    PAGELLM_CHECK(status == cudaDriverEntryPointSuccess && ptr != nullptr)
        << "tensor maps: the CUDA driver has no cuTensorMapEncodeTiled (needs CUDA 12+)";
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

}  // namespace

const CUtensorMap& bf16_tensor_map(const void* data, int64_t rows, int64_t cols, int box_cols,
                                   int box_rows, const char* what) {
  using Key = std::tuple<uintptr_t, int64_t, int64_t, int, int>;
  struct KeyHash {
    size_t operator()(const Key& k) const {
      const auto& [data, rows, cols, box_cols, box_rows] = k;
      return hash_values(data, rows, cols, box_cols, box_rows);
    }
  };
  static std::mutex mutex;
  static std::unordered_map<Key, CUtensorMap, KeyHash> cache;
  const Key key{reinterpret_cast<uintptr_t>(data), rows, cols, box_cols, box_rows};
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(data), dims, strides, box,
      element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  PAGELLM_CHECK(r == CUDA_SUCCESS) << what << ": cuTensorMapEncodeTiled failed (CUresult "
                                   << static_cast<int>(r) << ") for a [" << rows << ", " << cols
                                   << "] bf16 matrix in boxes of " << box_rows << " x "
                                   << box_cols;
  return cache.emplace(key, map).first->second;
}

}  // namespace pagellm::cuda
