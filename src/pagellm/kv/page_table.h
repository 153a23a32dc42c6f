// The page table: logical block -> physical page, one fixed-size row per running sequence.
//
// It is one dense int32 array [max_slots, max_pages_per_seq] whose address and shape never
// change, so a device copy of it can live in buffers captured by a CUDA graph. Row 0 is
// reserved for padding (all zeros, that is, all pointing at the reserved page 0); rows
// 1..max_slots-1 are handed to running sequences and returned when they stop running.
// Unused entries of every row are 0.
//
// The table records which entries changed since the last take_updates(), so that a backend
// keeping its own persistent copy receives only those (vLLM v1's BlockTable diffs): a
// decode step then sends one entry per sequence that crossed into a new page, and none
// for the others.
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

#include "pagellm/kv/forward_batch.h"

namespace pagellm {

/// Rows of logical-to-physical page mappings with a fixed capacity per sequence.
class PageTable {
 public:
  /// max_slots counts the reserved row 0 (so max_slots - 1 sequences fit, >= 1);
  /// max_pages_per_seq is the capacity of each row (>= 1).
  PageTable(int32_t max_slots, int32_t max_pages_per_seq);

  int32_t max_slots() const { return max_slots_; }
  int32_t max_pages_per_seq() const { return max_pages_per_seq_; }
  int32_t num_free_rows() const { return static_cast<int32_t>(free_rows_.size()); }
  /// Rows handed out (row 0 not counted).
  int32_t num_used_rows() const { return max_slots_ - 1 - num_free_rows(); }

  /// Takes the lowest free row (>= 1, all entries 0). Returns -1 when none is free.
  int32_t acquire();
  /// Returns a row: zeroes it (recorded as a change, so a persistent copy is zeroed too)
  /// and makes it free. Throws Error for row 0, a row out of range or a row not in use.
  void release(int32_t row);
  bool in_use(int32_t row) const;

  /// entry (row, block) = page, recorded as a change when the value differs. Throws Error
  /// when the row is not in use or the block is beyond the row's capacity (the message
  /// names max_pages_per_seq).
  void set(int32_t row, int32_t block, int32_t page);
  int32_t get(int32_t row, int32_t block) const;
  /// The row's max_pages_per_seq entries.
  const int32_t* row(int32_t row) const;
  /// The whole table, [max_slots * max_pages_per_seq], row-major.
  const std::vector<int32_t>& data() const { return entries_; }

  /// Appends to *updates one run per row changed since the previous call, in row order,
  /// covering every changed entry of that row, and the runs' current values to *values;
  /// then counts the table as uploaded. Applying the runs to a copy that equalled the
  /// table at the previous call makes it equal the table now.
  void take_updates(std::vector<PageTableUpdate>* updates, std::vector<int32_t>* values);
  /// Entries take_updates() would hand out now.
  int32_t num_pending_entries() const;

  /// Verifies: row 0 and every free row are all zeros, free rows are unique and in range,
  /// and used + free == max_slots - 1. Throws Error naming the first violation.
  void check_invariants() const;

 private:
  void check_row_in_use(int32_t row, const char* what) const;
  /// Widens row's pending run to cover [begin, end).
  void mark_changed(int32_t row, int32_t begin, int32_t end);

  int32_t max_slots_;
  int32_t max_pages_per_seq_;
  std::vector<int32_t> entries_;  // [max_slots, max_pages_per_seq]
  std::vector<char> in_use_;      // [max_slots]; in_use_[0] stays 0
  std::priority_queue<int32_t, std::vector<int32_t>, std::greater<int32_t>> free_rows_;
  // Changes since the last take_updates(): row r's run is [changed_begin_[r],
  // changed_end_[r]), empty when equal; changed_rows_ lists each row with a run once.
  std::vector<int32_t> changed_begin_;  // [max_slots]
  std::vector<int32_t> changed_end_;    // [max_slots]
  std::vector<int32_t> changed_rows_;
};

}  // namespace pagellm
