// Releasable device memory at fixed virtual addresses (vmm_arena.h).
#include "pagellm/cuda/vmm_arena.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "pagellm/common/check.h"
#include "pagellm/cuda/device_memory.h"
#include "pagellm/cuda/support/cuda_check.h"

namespace pagellm::cuda {
namespace {

// Allocations start at multiples of this (what cudaMalloc guarantees; TMA, cuBLASLt and
// the vectorised kernels need at most that).
constexpr size_t kAlignment = 256;

size_t round_up(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// The driver API functions the arena calls, looked up once through the runtime (the
// runtime links the driver at run time, so the binaries load where there is no GPU).
struct Driver {
  PFN_cuMemAddressReserve_v10020 address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuGetErrorName_v6000 error_name = nullptr;
};

template <typename Fn>
void look_up(const char* symbol, Fn* fn, unsigned int version) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult status{};
  PAGELLM_CUDA_CHECK(
      cudaGetDriverEntryPointByVersion(symbol, &ptr, version, cudaEnableDefault, &status));
  PAGELLM_CHECK(status == cudaDriverEntryPointSuccess && ptr != nullptr)
      << "sleep and wake need the CUDA driver's " << symbol
      << " (virtual memory management, CUDA 10.2+); the driver does not offer it";
  *fn = reinterpret_cast<Fn>(ptr);
}

const Driver& driver() {
  static const Driver d = [] {
    Driver x;
    look_up("cuMemAddressReserve", &x.address_reserve, 10020);
    look_up("cuMemAddressFree", &x.address_free, 10020);
    look_up("cuMemCreate", &x.create, 10020);
    look_up("cuMemRelease", &x.release, 10020);
    look_up("cuMemMap", &x.map, 10020);
    look_up("cuMemUnmap", &x.unmap, 10020);
    look_up("cuMemSetAccess", &x.set_access, 10020);
    look_up("cuMemGetAllocationGranularity", &x.granularity, 10020);
    look_up("cuGetErrorName", &x.error_name, 6000);
    return x;
  }();
  return d;
}

const char* result_name(CUresult r) {
  const char* name = nullptr;
  if (driver().error_name(r, &name) != CUDA_SUCCESS || name == nullptr) return "unknown";
  return name;
}

#define PAGELLM_CU_CHECK(expr)                                                             \
  do {                                                                                     \
    const CUresult pagellm_cu_res_ = (expr);                                               \
    PAGELLM_CHECK(pagellm_cu_res_ == CUDA_SUCCESS)                                         \
        << "CUDA driver error: " << result_name(pagellm_cu_res_) << " in " #expr " at "    \
        << __FILE__ ":" << __LINE__;                                                       \
  } while (0)

CUmemAllocationProp device_allocation(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

}  // namespace

VmmArena::VmmArena(std::string name, std::string device_description)
    : name_(std::move(name)), device_description_(std::move(device_description)) {}

VmmArena::~VmmArena() {
  release_all_chunks();
  if (base_ != 0) driver().address_free(static_cast<CUdeviceptr>(base_), reserved_);
  if (host_copy_ != nullptr) cudaFreeHost(host_copy_);
}

void VmmArena::reserve() {
  PAGELLM_CUDA_CHECK(cudaGetDevice(&device_));
  const CUmemAllocationProp prop = device_allocation(device_);
  PAGELLM_CU_CHECK(driver().granularity(&granularity_, &prop,
                                        CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  size_t free_bytes = 0, total_bytes = 0;
  PAGELLM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  // Address space is plentiful: room for everything the device could hold.
  reserved_ = round_up(total_bytes, granularity_);
  CUdeviceptr base = 0;
  PAGELLM_CU_CHECK(driver().address_reserve(&base, reserved_, 0, 0, 0));
  base_ = static_cast<uintptr_t>(base);
}

void VmmArena::fail_out_of_memory(size_t bytes) const {
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  cudaGetLastError();
  PAGELLM_FAIL() << "out of GPU memory: cannot allocate " << format_bytes(bytes) << " for the "
                 << name_ << " on " << device_description_ << "; " << format_bytes(free_bytes)
                 << " of " << format_bytes(total_bytes)
                 << " are free (use a smaller model, fewer KV pages or a shorter context)";
  std::abort();  // unreachable: PAGELLM_FAIL throws
}

void VmmArena::map_chunk(Chunk& chunk) {
  const Driver& d = driver();
  const CUmemAllocationProp prop = device_allocation(device_);
  CUmemGenericAllocationHandle handle = 0;
  const CUresult created = d.create(&handle, chunk.bytes, &prop, 0);
  if (created == CUDA_ERROR_OUT_OF_MEMORY) fail_out_of_memory(chunk.bytes);
  PAGELLM_CU_CHECK(created);
  const CUdeviceptr at = static_cast<CUdeviceptr>(base_ + chunk.offset);
  CUresult mapped = d.map(at, chunk.bytes, 0, handle, 0);
  if (mapped == CUDA_SUCCESS) {
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    mapped = d.set_access(at, chunk.bytes, &access, 1);
    if (mapped != CUDA_SUCCESS) d.unmap(at, chunk.bytes);
  }
  if (mapped != CUDA_SUCCESS) {
    d.release(handle);
    PAGELLM_CU_CHECK(mapped);
  }
  chunk.handle = handle;
  chunk.mapped = true;
}

void VmmArena::unmap_chunk(Chunk& chunk) noexcept {
  if (!chunk.mapped) return;
  const Driver& d = driver();
  const CUresult unmapped = d.unmap(static_cast<CUdeviceptr>(base_ + chunk.offset), chunk.bytes);
  const CUresult released = d.release(chunk.handle);
  if (unmapped != CUDA_SUCCESS || released != CUDA_SUCCESS) {
    std::fprintf(stderr, "pagellm: releasing %zu bytes of the %s failed: %s\n", chunk.bytes,
                 name_.c_str(), result_name(unmapped != CUDA_SUCCESS ? unmapped : released));
  }
  chunk.mapped = false;
  chunk.handle = 0;
}

void VmmArena::release_all_chunks() noexcept {
  if (chunks_.empty()) return;
  // cuMemUnmap does not wait for work in flight (cudaFree does, implicitly): a kernel still
  // reading or writing the range would fault with an illegal address, and the fault is
  // sticky. The arena serves several streams (the backend's, cuBLASLt's, cuDNN's), so wait
  // for the device, as cudaFree would. Only the last free of an arena and its destruction
  // come here, never a step.
  const cudaError_t waited = cudaDeviceSynchronize();
  if (waited != cudaSuccess) {
    std::fprintf(stderr, "pagellm: waiting for the device before releasing the %s failed: %s\n",
                 name_.c_str(), cudaGetErrorString(waited));
  }
  for (Chunk& c : chunks_) unmap_chunk(c);
  chunks_.clear();
  mapped_ = 0;
  top_ = 0;
}

void* VmmArena::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  PAGELLM_CHECK(!released_) << "cuda backend: cannot allocate " << format_bytes(bytes)
                            << " for the " << name_ << " while asleep (wake first)";
  if (base_ == 0) reserve();
  const size_t offset = round_up(top_, kAlignment);
  const size_t end = offset + bytes;
  if (end > reserved_) fail_out_of_memory(bytes);
  if (end > mapped_) {
    Chunk chunk;
    chunk.offset = mapped_;
    chunk.bytes = round_up(end - mapped_, granularity_);
    map_chunk(chunk);  // throws, leaving the arena as it was
    chunks_.push_back(chunk);
    mapped_ += chunk.bytes;
  }
  allocations_[offset] = bytes;
  top_ = end;
  return reinterpret_cast<void*>(base_ + offset);
}

bool VmmArena::owns(const void* ptr) const { return size_of(ptr) > 0; }

size_t VmmArena::size_of(const void* ptr) const {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  if (base_ == 0 || p < base_ || p >= base_ + reserved_) return 0;
  const auto it = allocations_.find(p - base_);
  return it == allocations_.end() ? 0 : it->second;
}

void VmmArena::deallocate(void* ptr) noexcept {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  if (base_ == 0 || p < base_) return;
  allocations_.erase(p - base_);
  if (allocations_.empty()) {
    // Everything is gone: give every chunk back (asleep or not) and start over.
    release_all_chunks();
    released_ = false;
    contents_kept_ = false;
    if (host_copy_ != nullptr) cudaFreeHost(host_copy_);
    host_copy_ = nullptr;
    host_bytes_ = 0;
    return;
  }
  const auto last = std::prev(allocations_.end());
  top_ = last->first + last->second;
}

size_t VmmArena::release(bool keep_contents, CUstream_st* stream) {
  PAGELLM_CHECK(!released_) << "cuda backend: the " << name_ << " is already released";
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (keep_contents && top_ > 0) {
    if (host_bytes_ < top_) {
      if (host_copy_ != nullptr) PAGELLM_CUDA_CHECK(cudaFreeHost(host_copy_));
      host_copy_ = nullptr;
      host_bytes_ = 0;
      PAGELLM_CUDA_CHECK(cudaHostAlloc(&host_copy_, top_, cudaHostAllocDefault));
      host_bytes_ = top_;
    }
    PAGELLM_CUDA_CHECK(cudaMemcpyAsync(host_copy_, reinterpret_cast<void*>(base_), top_,
                                       cudaMemcpyDeviceToHost, stream));
    PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  for (Chunk& c : chunks_) unmap_chunk(c);
  contents_kept_ = keep_contents && top_ > 0;
  released_ = true;
  return mapped_;
}

void VmmArena::restore(CUstream_st* stream) {
  PAGELLM_CHECK(released_) << "cuda backend: the " << name_ << " is not released";
  for (Chunk& c : chunks_) {
    if (!c.mapped) map_chunk(c);  // an out-of-memory error leaves a retry possible
  }
  void* base = reinterpret_cast<void*>(base_);
  if (contents_kept_) {
    PAGELLM_CUDA_CHECK(cudaMemcpyAsync(base, host_copy_, top_, cudaMemcpyHostToDevice, stream));
  } else if (mapped_ > 0) {
    PAGELLM_CUDA_CHECK(cudaMemsetAsync(base, 0, mapped_, stream));
  }
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream));
  contents_kept_ = false;
  released_ = false;
}

}  // namespace pagellm::cuda
