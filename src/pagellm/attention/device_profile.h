// The identity of a GPU and its cuDNN, as the crossover tables are keyed.
//
// A crossover is a measurement, and a measurement holds for the device and library it was
// taken on: the same name with a different SM count (a cut-down or MIG part) or another
// cuDNN release may cross over elsewhere. So a table applies only where all four agree.
#pragma once

#include <cstdint>
#include <string>

namespace pagellm {

/// cuDNN versions as cudnnGetVersion() reports them from cuDNN 9 on:
/// major * 10000 + minor * 100 + patch (9.14.0 -> 91400). 0 means no cuDNN.
using CudnnVersion = int32_t;

/// "9.14.0" for 91400, "none" for 0.
std::string cudnn_version_string(CudnnVersion v);
/// Parses "9.14.0", "9.14" or "91400"; throws Error naming the accepted forms otherwise.
/// "none" and "0" give 0.
CudnnVersion parse_cudnn_version(const std::string& text);

/// A GPU as the planner sees it: read at run time (cudaGetDeviceProperties and
/// cudnnGetVersion) on a GPU machine, or written by hand to explain a plan elsewhere.
struct DeviceProfile {
  std::string name;              // cudaDeviceProp::name, e.g. "NVIDIA H200"
  int32_t sm_count = 0;          // multiprocessors
  int32_t cc_major = 0;          // compute capability
  int32_t cc_minor = 0;
  CudnnVersion cudnn_version = 0;  // the cuDNN loaded at run time; 0: none

  /// True when name, SM count and compute capability agree (the cuDNN version is compared
  /// separately, so that a message can say which of the two differs).
  bool same_device(const DeviceProfile& other) const {
    return name == other.name && sm_count == other.sm_count && cc_major == other.cc_major &&
           cc_minor == other.cc_minor;
  }
  /// For example "NVIDIA H200 (132 SMs, compute capability 9.0), cuDNN 9.14.0".
  std::string describe() const;
  /// Compute capability as "9.0".
  std::string compute_capability() const;
};

/// Parses "9.0" into major and minor; throws Error otherwise.
void parse_compute_capability(const std::string& text, int32_t& major, int32_t& minor);

/// Reads a profile from JSON: {"name": ..., "sm_count": ..., "compute_capability": "9.0",
/// "cudnn_version": "9.14.0" or 91400}. cudnn_version may be absent (0). Throws Error
/// naming the missing or malformed field; `origin` (a file name) prefixes messages.
DeviceProfile parse_device_profile_json(const std::string& text, const std::string& origin);
/// The JSON form parse_device_profile_json reads.
std::string device_profile_to_json(const DeviceProfile& profile);

}  // namespace pagellm
