#include "pagellm/cuda/support/device_info.h"

#include <cuda_runtime.h>

#include <mutex>
#include <set>
#include <utility>

#include "pagellm/cuda/support/cuda_check.h"

namespace pagellm::cuda {

int current_device_info(int* sms) {
  thread_local int cached_device = -1, cached_sms = 0, cached_cc = 0;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it so the next launch check does not see it
    if (sms) *sms = 0;
    return 0;
  }
  if (device != cached_device) {
    int major = 0, minor = 0;
    PAGELLM_CUDA_CHECK(
        cudaDeviceGetAttribute(&cached_sms, cudaDevAttrMultiProcessorCount, device));
    PAGELLM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    PAGELLM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    cached_cc = major * 10 + minor;
    cached_device = device;
  }
  if (sms) *sms = cached_sms;
  return cached_cc;
}

int64_t current_device_l2_bytes() {
  thread_local int cached_device = -1;
  thread_local int64_t cached_bytes = 0;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // as current_device_info
    return 0;
  }
  if (device != cached_device) {
    int bytes = 0;
    PAGELLM_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device));
    cached_bytes = bytes;
    cached_device = device;
  }
  return cached_bytes;
}

void once_per_device(const void* key, void (*set_up)()) {
  int device = 0;
  PAGELLM_CUDA_CHECK(cudaGetDevice(&device));
  const std::pair<int, const void*> entry(device, key);
  thread_local std::set<std::pair<int, const void*>> seen;  // done, as this thread knows
  if (seen.count(entry) != 0) return;
  static std::mutex mutex;
  static std::set<std::pair<int, const void*>> done;  // guarded by mutex
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (done.count(entry) == 0) {
      set_up();
      done.insert(entry);
    }
  }
  seen.insert(entry);
}

}  // namespace pagellm::cuda
