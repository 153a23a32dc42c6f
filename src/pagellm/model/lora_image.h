// The host image of one LoRA slot: an adapter's factors laid out as Backend::lora_add reads
// them (LoraSlotFactors, docs/design.md "LoRA"), in the backend's weight dtype, built
// straight from the adapter's mapped file by a few threads.
//
// Qwen3Model::set_lora decides where each (layer, group) block goes; write_lora_image fills
// the blocks: per block, A of the group's modules stacked [M·r, in] and their Bᵀ side by
// side [r, Σ width], zeros for a module of the group the adapter does not target and for
// the padding up to the next block. Every element of the image is written exactly once,
// so the destination needs no zero-fill first.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "pagellm/common/dtype.h"
#include "pagellm/model/lora.h"

namespace pagellm {

/// One (layer, group) block of a slot image. Offsets are in elements from the image's
/// start: A [num_modules · r, in] at a_offset, Bᵀ [r, Σ width] at bt_offset, padding (zeros)
/// from the end of each up to bt_offset and `end`.
struct LoraImageBlock {
  static constexpr int kMaxModules = 3;
  size_t layer = 0;
  int num_modules = 0;
  /// The group's modules, in the order their outputs (and Bᵀ columns) sit side by side.
  std::array<LoraModule, kMaxModules> modules{};
  /// The input width every module of the group reads.
  int64_t in = 0;
  /// Each module's output width (rows of its B).
  std::array<int64_t, kMaxModules> width{};
  int64_t a_offset = 0;
  int64_t bt_offset = 0;
  int64_t end = 0;
  int64_t width_total() const;
};

/// Writes the `total` elements of a slot image of `adapter` into `image` in `dtype` (F32,
/// BF16 or F16), converting from each factor's dtype with float32's round-to-nearest-even
/// (bits equal to widening to float32 and narrowing once). `blocks` must cover [0, total)
/// in ascending order, each laid out as LoraImageBlock says; a targeted factor must have
/// the block's shape. Throws Error (before writing anything) naming what does not fit.
/// `threads` workers share the work (0: up to 8, as the machine has cores); bulk copies and
/// cache-blocked transposes, so that the time is close to memory bandwidth.
void write_lora_image(const LoraAdapter& adapter, const std::vector<LoraImageBlock>& blocks,
                      DType dtype, void* image, int64_t total, int threads = 0);

/// A run of consecutive blocks of a slot image, [first_block, end_block) in the block list,
/// covering image elements [begin, end): what set_lora writes into one half of its staging
/// buffer and uploads with one copy.
struct LoraImageRun {
  size_t first_block = 0;
  size_t end_block = 0;
  int64_t begin = 0;  // elements from the image's start
  int64_t end = 0;
  int64_t elements() const { return end - begin; }
};

/// Splits `blocks` (ascending and back to back, as write_lora_image wants them) into runs of
/// at most `max_elements` elements each, greedily: each run takes as many of the next blocks
/// as fit, so every block is in exactly one run, in order, and no two neighbouring runs
/// would fit in one. Empty input: no runs. Throws Error naming the block when one block
/// alone is larger than `max_elements` (the caller sizes its buffer by the largest block,
/// lora_image_largest_block) or when the blocks are not back to back.
std::vector<LoraImageRun> lora_image_runs(const std::vector<LoraImageBlock>& blocks,
                                          int64_t max_elements);

/// The elements of the largest single block of `blocks` (0 for none).
int64_t lora_image_largest_block(const std::vector<LoraImageBlock>& blocks);

/// The blocks of `run`, their offsets taken from the run's start: a block list that
/// write_lora_image fills into a buffer of run.elements() elements.
std::vector<LoraImageBlock> lora_image_run_blocks(const std::vector<LoraImageBlock>& blocks,
                                                  const LoraImageRun& run);

}  // namespace pagellm
