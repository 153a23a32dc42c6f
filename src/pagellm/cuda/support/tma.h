// Host side of the tensor memory accelerator: TMA descriptors (tensor maps) of row-major
// bf16 matrices, made with the driver's cuTensorMapEncodeTiled and cached. Device side:
// tma.cuh.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace pagellm::cuda {

/// The TMA map of a row-major bf16 [rows, cols] matrix at `data` (16-byte aligned, cols a
/// multiple of 8) read in boxes of box_cols x box_rows elements (box_cols * 2 <= 128 bytes),
/// 128-byte swizzle, zeros for the parts of a box outside the matrix. Maps are cached by
/// (address, rows, cols, box): weights, activation buffers and KV pools never move, so
/// after the first call every lookup hits. The reference stays valid for the process.
/// Thread-safe; throws pagellm::Error naming `what` if the driver refuses the map.
const CUtensorMap& bf16_tensor_map(const void* data, int64_t rows, int64_t cols, int box_cols,
                                   int box_rows, const char* what);

}  // namespace pagellm::cuda
