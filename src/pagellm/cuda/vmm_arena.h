// Device memory whose physical backing can be given back and made again at the same
// virtual addresses, through CUDA's virtual memory management API (cuMemAddressReserve,
// cuMemCreate, cuMemMap, cuMemSetAccess; the driver's entry points are looked up through
// the runtime on first use, so nothing touches the driver before a backend is made).
//
// Why: a CUDA graph records the addresses its kernels read and write. Sleep releases the
// physical memory of the KV pools (and of offloaded weights) while the virtual range stays
// reserved; wake maps new physical memory at the same addresses, so every captured decode
// graph, tensor map and cached plan stays valid without re-capture (docs/design.md,
// "Sleep and wake").
//
// CUDA-free header (device_memory.h holds arenas).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

struct CUstream_st;

namespace pagellm::cuda {

/// One reserved virtual range (as large as the device's memory), bump-allocated: each
/// allocation starts 256-byte aligned after the previous one, and physical memory is
/// created and mapped in granularity-sized chunks (2 MiB on the H200) as the allocations
/// grow, so small allocations (norm vectors) share chunks and nothing is wasted but the
/// tail of the last chunk. Freeing the last allocation moves the end back; freeing an
/// inner one leaves a hole until the arena empties (then every chunk is released). Meant
/// for memory made once and kept: weights, their packed copies, KV pools. Not thread-safe.
class VmmArena {
 public:
  /// `name` appears in errors ("weights", "KV cache"); `device_description` in
  /// out-of-memory errors. Reserves nothing until the first allocation.
  VmmArena(std::string name, std::string device_description);
  ~VmmArena();
  VmmArena(const VmmArena&) = delete;
  VmmArena& operator=(const VmmArena&) = delete;

  /// Throws Error naming the size and the free memory when the device is full, or while
  /// released.
  void* allocate(size_t bytes);
  /// Whether `ptr` was returned by allocate() and not freed.
  bool owns(const void* ptr) const;
  /// Bytes of the allocation at `ptr` (0 when not owned).
  size_t size_of(const void* ptr) const;
  /// Frees an owned allocation; reports failures on stderr, never throws. Freeing the last
  /// live allocation gives every chunk back, after waiting for the device (work in flight
  /// may still use the range; cuMemUnmap does not wait for it).
  void deallocate(void* ptr) noexcept;

  /// Bytes of physical memory mapped now (0 while released).
  size_t mapped_bytes() const { return released_ ? 0 : mapped_; }
  /// End of the last live allocation, bytes from the start of the range.
  size_t used_bytes() const { return top_; }
  bool released() const { return released_; }
  /// Bytes of pinned host memory held for the kept contents (0 before the first release
  /// that kept them).
  size_t host_bytes() const { return host_bytes_; }

  /// Waits for `stream`, then (with `keep_contents`) copies the used bytes to pinned host
  /// memory, then unmaps and releases every chunk. The addresses stay reserved. Returns the
  /// physical bytes given back. Throws Error when already released. The pinned buffer is
  /// kept after restore() for the next release (pinning 8 GB costs seconds, the copy a
  /// fraction of one) and freed with the arena or when the arena empties.
  size_t release(bool keep_contents, CUstream_st* stream);
  /// Creates and maps chunks of the same sizes at the same addresses again, then restores
  /// the kept contents or zero-fills the whole mapped range; waits for `stream` before
  /// returning. Throws Error when the device has not enough free memory: the chunks mapped
  /// so far stay mapped and a later restore() continues where this one stopped.
  void restore(CUstream_st* stream);

 private:
  struct Chunk {
    size_t offset = 0;
    size_t bytes = 0;
    unsigned long long handle = 0;  // CUmemGenericAllocationHandle
    bool mapped = false;
  };
  void reserve();
  // Creates and maps `chunk` (allocating its handle); throws Error when memory is short.
  void map_chunk(Chunk& chunk);
  void unmap_chunk(Chunk& chunk) noexcept;
  void release_all_chunks() noexcept;
  [[noreturn]] void fail_out_of_memory(size_t bytes) const;

  std::string name_;
  std::string device_description_;
  int device_ = 0;
  uintptr_t base_ = 0;       // start of the reserved range (0: not reserved yet)
  size_t reserved_ = 0;      // bytes reserved
  size_t granularity_ = 0;   // chunk sizes are multiples of it
  size_t top_ = 0;           // end of the last live allocation
  size_t mapped_ = 0;        // bytes covered by chunks
  std::map<size_t, size_t> allocations_;  // offset -> bytes
  std::vector<Chunk> chunks_;
  bool released_ = false;
  void* host_copy_ = nullptr;  // pinned, host_bytes_ bytes, kept across sleeps
  size_t host_bytes_ = 0;
  bool contents_kept_ = false;  // released with keep_contents: restore() copies back
};

}  // namespace pagellm::cuda
