// The current CUDA device's compute capability and SM count, queried once per device and
// cached: kernel launchers consult them on every call (which kernel applies, how many CTAs
// fill the GPU), so the query must cost nothing after the first. And the one-time set-up a
// kernel needs on each device (once_per_device).
#pragma once

#include <cstdint>

namespace pagellm::cuda {

/// Compute capability of the current device as major * 10 + minor (90 for an H100/H200),
/// and in *sms (if not null) its SM count; 0 (and 0 SMs) without a device, with the CUDA
/// error cleared so that it does not surface at the next launch. Cached per thread (each
/// thread drives its own device: tensor-parallel ranks as threads).
int current_device_info(int* sms);

/// The current device's L2 cache size in bytes (60 MiB on an H200, 50 on an H100), cached
/// the same way; 0 without a device.
int64_t current_device_l2_bytes();

/// Runs `set_up` the first time it is asked for `key` (the kernel it configures) on the
/// current device in this process, under a lock; later calls for that key and device
/// return at once (a thread-local lookup). For set-up that binds to one device, such as
/// cudaFuncSetAttribute's shared-memory limit, which a process driving several GPUs must
/// make on each. A set_up that throws runs again at the next call.
void once_per_device(const void* key, void (*set_up)());

}  // namespace pagellm::cuda
