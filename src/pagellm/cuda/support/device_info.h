// The current CUDA device's compute capability and SM count, queried once per device and
// cached: kernel launchers consult them on every call (which kernel applies, how many CTAs
// fill the GPU), so the query must cost nothing after the first.
#pragma once

namespace pagellm::cuda {

/// Compute capability of the current device as major * 10 + minor (90 for an H100/H200),
/// and in *sms (if not null) its SM count; 0 (and 0 SMs) without a device, with the CUDA
/// error cleared so that it does not surface at the next launch.
int current_device_info(int* sms);

}  // namespace pagellm::cuda
