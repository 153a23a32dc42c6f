// Copy-on-write of KV pages (n-sample fan-out): after a fan-out each sample copies the
// prompt's last, partly filled page before writing to it, in every layer's K and V pool.
//
// Why a kernel: a group of n = 8 copies one page for 7 samples, 36 layers x 2 pools x 7 =
// 504 copies of 32 KiB for Qwen3-4B. As one cudaMemcpyAsync each they cost ~5.7 us of host
// time apiece while the device waits for the step (0.37 s of W2's 67 s, measured on the
// H200, docs/PERFORMANCE.md); as one launch they cost one launch.
//
// Shape: one CTA per (pair, pool), 256 threads copying 16-byte chunks (bytes when a page or
// a pool is not 16-byte aligned, which only toy shapes are), four loads in flight per thread
// before their stores. The pool pointers and the pairs travel in the kernel's parameters
// (up to 6 KiB; CUDA 12.1+ takes 32 KiB), so nothing is uploaded first.
//
// Order: CudaBackend::copy_kv_pages promises the pairs' in-order result, and a later pair
// may read a page an earlier one wrote. The pairs are cut into waves (kv_copy_waves) of
// pairs independent of one another, one launch each in stream order; a fan-out's pairs read
// one page and write fresh ones, so its copies are one wave.
//
// Roofline: a fan-out of 8 moves 7 x 72 x 32 KiB = 16.5 MB read and written, ~8 us at the
// copy rate, against ~2.9 ms of host time for the same copies one call at a time.
#include "pagellm/cuda/kv/page_copy.h"

#include <algorithm>
#include <unordered_set>

#include "pagellm/cuda/support/cuda_check.h"

namespace pagellm::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxPools = 256;  // 128 layers' K and V pools a launch
constexpr int kMaxPairs = 512;
constexpr int kInFlight = 4;  // 16-byte loads each thread issues before storing them

struct PageCopyArgs {
  char* pools[kMaxPools];
  int32_t src[kMaxPairs];
  int32_t dst[kMaxPairs];
  uint64_t page_bytes;
};
static_assert(sizeof(PageCopyArgs) <= 8 * 1024, "kernel parameters stay well under 32 KiB");

// blockIdx.x: the pair, blockIdx.y: the pool. T is the unit of a copy (uint4 or char).
template <typename T>
__global__ void __launch_bounds__(kThreads) copy_pages_kernel(const __grid_constant__
                                                              PageCopyArgs args) {
  char* pool = args.pools[blockIdx.y];
  const uint64_t n = args.page_bytes / sizeof(T);
  const T* __restrict__ src =
      reinterpret_cast<const T*>(pool + static_cast<uint64_t>(args.src[blockIdx.x]) *
                                            args.page_bytes);
  T* __restrict__ dst =
      reinterpret_cast<T*>(pool + static_cast<uint64_t>(args.dst[blockIdx.x]) * args.page_bytes);
  for (uint64_t base = threadIdx.x; base < n; base += kInFlight * kThreads) {
    T v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const uint64_t i = base + static_cast<uint64_t>(u) * kThreads;
      if (i < n) v[u] = src[i];
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const uint64_t i = base + static_cast<uint64_t>(u) * kThreads;
      if (i < n) dst[i] = v[u];
    }
  }
}

}  // namespace

std::vector<size_t> kv_copy_waves(const std::vector<std::pair<int32_t, int32_t>>& src_dst) {
  std::vector<size_t> starts;
  std::unordered_set<int32_t> read, written;  // the current wave's pages
  for (size_t i = 0; i < src_dst.size(); ++i) {
    const auto [src, dst] = src_dst[i];
    const bool depends = written.count(src) != 0 || written.count(dst) != 0 ||
                         read.count(dst) != 0;
    if (starts.empty() || depends) {
      starts.push_back(i);
      read.clear();
      written.clear();
    }
    read.insert(src);
    written.insert(dst);
  }
  return starts;
}

void launch_copy_kv_pages(const std::vector<char*>& pools, size_t page_bytes,
                          const std::vector<std::pair<int32_t, int32_t>>& src_dst,
                          cudaStream_t stream) {
  if (src_dst.empty() || pools.empty() || page_bytes == 0) return;
  bool vec = page_bytes % sizeof(uint4) == 0;
  for (char* pool : pools) vec = vec && reinterpret_cast<uintptr_t>(pool) % sizeof(uint4) == 0;
  PageCopyArgs args;
  args.page_bytes = page_bytes;
  std::vector<size_t> starts = kv_copy_waves(src_dst);
  starts.push_back(src_dst.size());
  for (size_t w = 0; w + 1 < starts.size(); ++w) {
    for (size_t p0 = starts[w]; p0 < starts[w + 1]; p0 += kMaxPairs) {
      const size_t pairs = std::min<size_t>(kMaxPairs, starts[w + 1] - p0);
      for (size_t i = 0; i < pairs; ++i) {
        args.src[i] = src_dst[p0 + i].first;
        args.dst[i] = src_dst[p0 + i].second;
      }
      for (size_t q0 = 0; q0 < pools.size(); q0 += kMaxPools) {
        const size_t num_pools = std::min<size_t>(kMaxPools, pools.size() - q0);
        std::copy_n(pools.begin() + static_cast<std::ptrdiff_t>(q0), num_pools, args.pools);
        const dim3 grid(static_cast<unsigned>(pairs), static_cast<unsigned>(num_pools));
        if (vec) {
          copy_pages_kernel<uint4><<<grid, kThreads, 0, stream>>>(args);
        } else {
          copy_pages_kernel<char><<<grid, kThreads, 0, stream>>>(args);
        }
        PAGELLM_CUDA_CHECK_LAUNCH();
      }
    }
  }
}

}  // namespace pagellm::cuda
