#include "pagellm/cuda/support/device_info.h"

#include <cuda_runtime.h>

#include <mutex>
#include <set>
#include <utility>

#include "pagellm/cuda/support/cuda_check.h"

namespace pagellm::cuda {

namespace {

struct DeviceProps {
  int device = -1;
  int cc = 0;
  int sms = 0;
  int64_t l2_bytes = 0;
};

/// The current device's properties, queried once per device and cached per thread (each
/// thread drives its own device); nullptr without a device, with the CUDA error cleared.
const DeviceProps* current_props() {
  thread_local DeviceProps cached;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it so the next launch check does not see it
    return nullptr;
  }
  if (device != cached.device) {
    DeviceProps p;
    int major = 0, minor = 0, l2 = 0;
    PAGELLM_CUDA_CHECK(cudaDeviceGetAttribute(&p.sms, cudaDevAttrMultiProcessorCount, device));
    PAGELLM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    PAGELLM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    PAGELLM_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    p.device = device;
    p.cc = major * 10 + minor;
    p.l2_bytes = l2;
    cached = p;
  }
  return &cached;
}

}  // namespace

int current_device_info(int* sms) {
  const DeviceProps* p = current_props();
  if (sms) *sms = p ? p->sms : 0;
  return p ? p->cc : 0;
}

int64_t current_device_l2_bytes() {
  const DeviceProps* p = current_props();
  return p ? p->l2_bytes : 0;
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
