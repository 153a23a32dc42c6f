// Tensor: a non-owning view of contiguous, row-major memory on some backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "pagellm/common/check.h"
#include "pagellm/common/dtype.h"

namespace pagellm {

/// A typed, shaped view of contiguous row-major memory (host or device, up to 4 dims).
/// Tensors never own memory; the backend or a DeviceBuffer owns it.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  int ndim = 0;
  int64_t shape[4] = {0, 0, 0, 0};

  Tensor() = default;
  Tensor(void* data, DType dtype, std::initializer_list<int64_t> dims) : data(data), dtype(dtype) {
    PAGELLM_ASSERT(dims.size() <= 4) << "at most 4 dims";
    for (int64_t d : dims) shape[ndim++] = d;
  }

  int64_t size(int i) const { return shape[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  /// Elements in one index of dim 0.
  int64_t row_elems() const { return ndim == 0 ? 1 : numel() / shape[0]; }

  /// Rows [begin, begin + count) along dim 0.
  Tensor rows(int64_t begin, int64_t count) const {
    PAGELLM_ASSERT(begin >= 0 && begin + count <= shape[0]);
    Tensor t = *this;
    t.data = static_cast<char*>(data) + static_cast<size_t>(begin * row_elems()) * dtype_size(dtype);
    t.shape[0] = count;
    return t;
  }
  /// Same memory, new shape with the same element count.
  Tensor view(std::initializer_list<int64_t> dims) const {
    Tensor t(data, dtype, dims);
    PAGELLM_ASSERT(t.numel() == numel()) << "view changes element count";
    return t;
  }
  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  std::string shape_string() const;
};

}  // namespace pagellm
