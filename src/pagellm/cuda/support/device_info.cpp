#include "pagellm/cuda/support/device_info.h"

#include <cuda_runtime.h>

#include "pagellm/cuda/support/cuda_check.h"

namespace pagellm::cuda {

int current_device_info(int* sms) {
  static int cached_device = -1, cached_sms = 0, cached_cc = 0;
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

}  // namespace pagellm::cuda
