// The CUDA backend's batch-staging room: a step's int32 metadata packed into a pinned
// buffer and copied with one async copy into fixed regions of one device buffer, and the
// persistent page table (ForwardBatch::seq_slots) the engine updates run by run.
//
// CUDA-free header (cuda_backend.h holds one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pagellm/cuda/device_memory.h"
#include "pagellm/kv/forward_batch.h"

struct CUstream_st;

namespace pagellm::cuda {

/// How BatchStaging packs shared-prefix items (PagedAttentionParams::prefix_items): items of
/// up to `members` sequences (a pass CTA of 32 rows), but of up to `half_members` (16 rows)
/// while those would launch at most `max_half_ctas` pass CTAs (items x kv_heads). Within one
/// wave of CTA slots, two 16-row CTAs finish an item sooner than one of 32 rows, whose warps
/// do twice the tile math; past it, one CTA reading the prefix once for 32 rows halves the
/// waves (docs/design.md, "Decode").
struct PrefixItemSizes {
  int32_t members = 0;       // 0: no items
  int32_t half_members = 0;
  int32_t kv_heads = 0;
  int64_t max_half_ctas = 0;
};

/// Batch metadata on the device (CudaBackend::upload_batch documents the contract). Not
/// thread-safe (one per backend).
class BatchStaging {
 public:
  /// Device buffers come from `memory`; every copy and kernel runs on `stream`. Allocates
  /// regions for a first batch of 256 tokens, 64 sequences of 64 pages and 64 rows.
  BatchStaging(DeviceMemory& memory, CUstream_st* stream);
  ~BatchStaging();
  BatchStaging(const BatchStaging&) = delete;
  BatchStaging& operator=(const BatchStaging&) = delete;

  /// Checks `batch`, copies it (growing the regions when it does not fit, which
  /// synchronises) and, for a persistent batch, updates the device table and gathers the
  /// batch's rows. The caller has checked that the stream is not capturing.
  BatchTensors upload(const ForwardBatch& batch);
  /// Sizes the regions for batches up to these sizes (Backend::reserve_batch).
  void reserve(int32_t max_tokens, int32_t max_seqs, int32_t max_pages_per_seq,
               int32_t max_rows);
  /// How shared-prefix items are packed (members 0, the default, packs none). Takes effect
  /// from the next upload.
  void set_prefix_item_sizes(const PrefixItemSizes& sizes) { prefix_sizes_ = sizes; }
  /// The members per item `batch` is packed with under `sizes`: half_members while the
  /// items that makes, times kv_heads, stay within max_half_ctas, else members.
  static int32_t prefix_item_members(const ForwardBatch& batch, const PrefixItemSizes& sizes);
  /// Packs the items of a decode batch's shared prefixes (ForwardBatch::shared_prefix_*)
  /// into `items` (PagedAttentionParams::prefix_items' layout) and each sequence's covered
  /// keys into `tokens` [B]: a group of n >= 2 members splits into ceil(n / members) items
  /// of ceil(n / items) members (the last may hold fewer). Zeros and no items for a batch
  /// without shared prefixes, with a query of more than one token, or when `members` < 2.
  /// Returns the item count (at most B).
  static int32_t pack_prefix_items(const ForwardBatch& batch, int32_t members, int32_t* items,
                                   int32_t* tokens);

 private:
  // prefix_item_members and pack_prefix_items on the members per group (indexed by the
  // group's id; shared_prefix_group_sizes), which upload counts once for both.
  static int32_t members_for_groups(const std::vector<int32_t>& group_sizes,
                                    const PrefixItemSizes& sizes);
  static int32_t pack_groups(const ForwardBatch& batch, const std::vector<int32_t>& count,
                             int32_t members, int32_t* items, int32_t* tokens);

  // Element offsets of the batch regions for the current capacities.
  struct Layout {
    size_t token_ids, positions, slot_mapping, query_start, kv_lens, logits_indices,
        lora_slots, prefix_tokens, prefix_items, seq_slots, page_runs, page_values, page_table,
        total;
  };
  // What the batch regions must hold (elements; runs of the persistent page table).
  struct Capacity {
    int64_t tokens = 0, seqs = 0, page_entries = 0, rows = 0;
    int64_t slots = 0, runs = 0, values = 0;  // persistent page table only
  };
  Layout layout() const;
  void grow(const Capacity& need);
  // `need` raised to what the reserved batch (reserve) needs of the persistent regions.
  Capacity with_persistent_reserve(Capacity need) const;
  // Grows the persistent page table to at least rows x cols (zero-filled, keeping its rows).
  void ensure_page_table(int64_t rows, int64_t cols);
  // Throws Error naming what is wrong with a persistent batch's seq_slots and updates.
  static void check_persistent(const ForwardBatch& batch);
  void free_buffers() noexcept;

  DeviceMemory& memory_;
  CUstream_st* stream_;

  // Device buffer and two pinned staging slots used alternately, with a region per array
  // sized by these capacities.
  int32_t* device_ = nullptr;
  int64_t cap_tokens_ = 0, cap_seqs_ = 0, cap_page_entries_ = 0, cap_rows_ = 0;
  int64_t cap_slots_ = 0, cap_runs_ = 0, cap_values_ = 0;  // 0 until a persistent batch
  int64_t reserved_seqs_ = 0, reserved_pages_per_seq_ = 0;  // reserve's largest
  PinnedSlot staging_[2];
  int slot_ = 0;
  PrefixItemSizes prefix_sizes_;

  // The persistent page table [table_rows_, table_cols_] (device, int32, zero-filled at
  // allocation), and which rows this step's runs named (a stamp per row).
  int32_t* page_table_ = nullptr;
  int64_t table_rows_ = 0, table_cols_ = 0;
  std::vector<uint64_t> run_seen_;
  uint64_t run_stamp_ = 0;
};

}  // namespace pagellm::cuda
