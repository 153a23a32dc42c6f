// The CUDA backend's packed-weights room: prepare_matrix's second copy of each decode
// matrix in the skinny kernel's stage layout (skinny_gemm.h: pack_skinny_weights), keyed by
// the row-major matrix's address, and freed with the buffer that holds that matrix.
//
// CUDA-free header (cuda_backend.h holds one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>

#include "pagellm/common/tensor.h"
#include "pagellm/cuda/cuda_settings.h"

struct CUstream_st;

namespace pagellm::cuda {

class DeviceMemory;

/// Packed copies of the decode matrices. Not thread-safe (one per backend).
class PackedWeights {
 public:
  /// Copies are allocated from `memory` under `policy` (CudaSettings::packed_weights);
  /// kAuto keeps them within a quarter of `total_memory`.
  PackedWeights(DeviceMemory& memory, PackPolicy policy, size_t total_memory);
  ~PackedWeights();
  PackedWeights(const PackedWeights&) = delete;
  PackedWeights& operator=(const PackedWeights&) = delete;

  /// Backend::prepare_matrix (CudaBackend::prepare_matrix documents the policy): packs w on
  /// `stream`, making the copy on the first call; returns the bytes newly allocated.
  /// `capturing`: whether `stream` is being captured (an Error when a copy must be made).
  size_t prepare(const Tensor& w, int64_t gated_inter, CUstream_st* stream, bool capturing);
  /// The packed copy of w for products of this kind (gated_inter as in prepare), or null
  /// when there is none or packing is turned off.
  const void* find(const Tensor& w, int64_t gated_inter) const;
  /// Frees the copies of matrices inside [begin, begin + bytes) (a buffer being freed).
  void drop_within(const void* begin, size_t bytes);

  /// Packs every copy again from its matrix, at the same addresses (after wake restored
  /// the matrices into memory whose copies were released by sleep).
  void repack_all(CUstream_st* stream);

  size_t bytes() const { return bytes_; }
  size_t count() const { return copies_.size(); }
  /// Whether find() returns the copies (tests turn it off to run the row-major path).
  void set_enabled(bool on) { enabled_ = on; }

 private:
  struct PackedMatrix {
    void* data = nullptr;
    size_t bytes = 0;
    int64_t rows = 0, cols = 0, gated_inter = 0;
  };
  using Map = std::unordered_map<const void*, PackedMatrix>;
  // Frees a copy and forgets it; returns the entry after it.
  Map::iterator drop(Map::iterator it);

  DeviceMemory& memory_;
  PackPolicy policy_;
  size_t total_memory_;
  Map copies_;
  size_t bytes_ = 0;
  bool enabled_ = true;
};

}  // namespace pagellm::cuda
