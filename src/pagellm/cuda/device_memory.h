// The CUDA backend's device room: opening the GPU (with readable reasons when it cannot be
// used), device allocations, and host <-> device transfers on the backend's stream.
//
// CUDA-free header (the stream is a CUstream_st*, which is what cudaStream_t is), so that
// cuda_backend.h can hold one without CUDA include paths.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "pagellm/common/dtype.h"
#include "pagellm/common/tensor.h"
#include "pagellm/cuda/vmm_arena.h"

struct CUstream_st;
struct CUevent_st;

namespace pagellm::cuda {

/// What opening a device found.
struct OpenedDevice {
  std::string description;  // e.g. "NVIDIA H200 (device 0, compute capability 9.0, 139.8 GiB)"
  size_t total_memory = 0;  // bytes
};

/// Makes `device` current after checking that it exists, has compute capability 8.0 or
/// newer and that this build has kernels for it; throws Error with a reason a user can act
/// on otherwise ("no CUDA GPU is visible", "rebuild with -DCMAKE_CUDA_ARCHITECTURES=..").
OpenedDevice open_cuda_device(int device);

/// "1.5 GiB" or "12.0 MiB".
std::string format_bytes(size_t bytes);

/// A pinned host buffer and the event recorded after the copy that last read it.
struct PinnedSlot {
  void* host = nullptr;
  CUevent_st* done = nullptr;
};

/// Where an allocation lives, for sleep and wake. kResident: cudaMalloc, kept through sleep
/// (workspaces, batch metadata). The others come from a VmmArena each, whose physical
/// memory sleep() gives back at fixed addresses: kWeights (copied to host memory first
/// when offloading; kept on the device otherwise), kPrepared (the backend's copies derived
/// from weights, released with them and rebuilt by their owner after wake), kKvCache
/// (always released, zeros after wake).
enum class Residency { kResident, kWeights, kPrepared, kKvCache };

/// What DeviceMemory::sleep gave back, bytes of physical device memory per arena.
struct ReleasedMemory {
  size_t weights = 0;
  size_t prepared = 0;
  size_t kv_cache = 0;
};

/// Device allocations (remembered with their sizes) and the transfers the Backend
/// interface offers. Not thread-safe (one per backend).
class DeviceMemory {
 public:
  /// `stream` (the backend's) carries every transfer; `description` names the device in
  /// out-of-memory errors. Allocates the two 16 MiB pinned upload buffers.
  DeviceMemory(CUstream_st* stream, std::string description);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  /// cudaMalloc (kResident) or an arena's memory; throws Error naming the size and the
  /// free memory when the GPU is full, and for an arena allocation while asleep.
  void* allocate(size_t bytes, Residency residency = Residency::kResident);
  /// cudaFree or the arena's free (reports a failure on stderr, never throws: called from
  /// destructors; allowed while asleep).
  void deallocate(void* ptr) noexcept;
  /// Bytes of the allocation made at `ptr` (0 when allocate did not make it).
  size_t size_of(const void* ptr) const;

  /// Waits for the stream, then releases the physical memory of the kKvCache and, with
  /// `offload_weights`, the kWeights (contents copied to pinned host memory first, a
  /// buffer kept for later sleeps) and kPrepared arenas. Throws Error when already asleep.
  ReleasedMemory sleep(bool offload_weights);
  /// Backs every released arena again at the same addresses: weights restored bit for bit,
  /// kKvCache and kPrepared zero-filled (the prepared copies' owner rebuilds them). Throws
  /// Error when awake, or when the device lacks the memory (a later wake() retries).
  void wake();
  bool asleep() const { return asleep_; }
  /// Whether the kPrepared arena was released by the last sleep (so must be rebuilt).
  bool prepared_released() const;

  void copy_to_device(void* dst, const void* src, size_t bytes);
  void copy_to_host(void* dst, const void* src, size_t bytes);
  void synchronize();
  /// Backend::upload: converts on the host into the pinned buffers, copies asynchronously.
  void upload(Tensor& dst, int64_t dst_offset, const void* src, DType src_dtype, int64_t n);
  std::vector<float> download_f32(const Tensor& src);
  /// cudaMemGetInfo's free bytes.
  size_t free_memory() const;

 private:
  void free_staging() noexcept;

  CUstream_st* stream_;
  std::string description_;
  std::unordered_map<void*, size_t> allocations_;
  // Indexed by Residency (kResident's slot unused); made on first use.
  std::unique_ptr<VmmArena> arenas_[4];
  bool asleep_ = false;
  PinnedSlot upload_staging_[2];
  size_t upload_chunk_bytes_ = 0;
};

/// Whether `stream` is being captured into a graph.
bool stream_capturing(CUstream_st* stream);

}  // namespace pagellm::cuda
