// Copy-on-write of KV pages on the device (CudaBackend::copy_kv_pages): every layer's K and
// V pages a step copies, in one launch. Raw pointers and sizes only (page_copy.cu says why
// and how), so the kernel and the waves can be tested alone.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace pagellm::cuda {

/// Where each wave of `src_dst` begins (the first entry is 0; empty for no pairs). A wave
/// is a longest run of consecutive pairs none of which reads or writes a page that an
/// earlier pair of the same wave writes, or writes a page that one reads; its pairs can
/// run at once and give what running them in order gives.
std::vector<size_t> kv_copy_waves(const std::vector<std::pair<int32_t, int32_t>>& src_dst);

/// For each (src, dst) of `src_dst`, with the result of running them in order: bytes
/// [dst * page_bytes, (dst + 1) * page_bytes) of every pool in `pools` (device pointers)
/// become a copy of the src page's. One launch per wave (kv_copy_waves) when it has at most
/// 512 pairs and there are at most 256 pools, more otherwise. The caller has checked the
/// pages (each in its pools, src != dst).
void launch_copy_kv_pages(const std::vector<char*>& pools, size_t page_bytes,
                          const std::vector<std::pair<int32_t, int32_t>>& src_dst,
                          cudaStream_t stream);

}  // namespace pagellm::cuda
