#include "pagellm/kv/page_table.h"

#include <algorithm>

#include "pagellm/common/check.h"

namespace pagellm {

PageTable::PageTable(int32_t max_slots, int32_t max_pages_per_seq)
    : max_slots_(max_slots), max_pages_per_seq_(max_pages_per_seq) {
  PAGELLM_CHECK(max_slots >= 2) << "the page table needs at least 2 rows (row 0 is reserved "
                                   "for padding), got max_slots = "
                                << max_slots;
  PAGELLM_CHECK(max_pages_per_seq >= 1)
      << "max_pages_per_seq must be at least 1, got " << max_pages_per_seq;
  entries_.assign(static_cast<size_t>(max_slots) * max_pages_per_seq, 0);
  in_use_.assign(static_cast<size_t>(max_slots), 0);
  for (int32_t r = 1; r < max_slots; ++r) free_rows_.push(r);
}

int32_t PageTable::acquire() {
  if (free_rows_.empty()) return -1;
  int32_t row = free_rows_.top();
  free_rows_.pop();
  PAGELLM_ASSERT(!in_use_[row]) << "free row " << row << " is in use";
  in_use_[row] = 1;
  return row;
}

bool PageTable::in_use(int32_t row) const {
  return row >= 1 && row < max_slots_ && in_use_[row];
}

void PageTable::check_row_in_use(int32_t row, const char* what) const {
  PAGELLM_CHECK(row >= 1 && row < max_slots_)
      << what << " of page-table row " << row << ": rows are 1.." << max_slots_ - 1
      << " (row 0 is reserved for padding)";
  PAGELLM_CHECK(in_use_[row]) << what << " of page-table row " << row
                              << ", which is not in use";
}

void PageTable::release(int32_t row) {
  check_row_in_use(row, "release");
  auto begin = entries_.begin() + static_cast<ptrdiff_t>(row) * max_pages_per_seq_;
  std::fill(begin, begin + max_pages_per_seq_, 0);
  in_use_[row] = 0;
  free_rows_.push(row);
}

void PageTable::set(int32_t row, int32_t block, int32_t page) {
  check_row_in_use(row, "set");
  PAGELLM_CHECK(block >= 0 && block < max_pages_per_seq_)
      << "logical block " << block << " is beyond the page table's capacity of "
      << max_pages_per_seq_ << " pages per sequence";
  PAGELLM_CHECK(page >= 0) << "page numbers are non-negative, got " << page;
  entries_[static_cast<size_t>(row) * max_pages_per_seq_ + block] = page;
}

int32_t PageTable::get(int32_t row, int32_t block) const {
  PAGELLM_CHECK(row >= 0 && row < max_slots_ && block >= 0 && block < max_pages_per_seq_)
      << "page-table entry (" << row << ", " << block << ") is outside [" << max_slots_
      << ", " << max_pages_per_seq_ << "]";
  return entries_[static_cast<size_t>(row) * max_pages_per_seq_ + block];
}

const int32_t* PageTable::row(int32_t row) const {
  PAGELLM_CHECK(row >= 0 && row < max_slots_)
      << "page-table row " << row << " is outside 0.." << max_slots_ - 1;
  return entries_.data() + static_cast<size_t>(row) * max_pages_per_seq_;
}

void PageTable::check_invariants() const {
  PAGELLM_ASSERT(!in_use_[0]) << "reserved row 0 is in use";
  // Copy the heap to walk it; check_invariants is for tests and debugging.
  auto heap = free_rows_;
  std::vector<char> is_free(static_cast<size_t>(max_slots_), 0);
  while (!heap.empty()) {
    int32_t r = heap.top();
    heap.pop();
    PAGELLM_ASSERT(r >= 1 && r < max_slots_) << "free list holds invalid row " << r;
    PAGELLM_ASSERT(!is_free[r]) << "row " << r << " is on the free list twice";
    PAGELLM_ASSERT(!in_use_[r]) << "row " << r << " is both free and in use";
    is_free[r] = 1;
  }
  int32_t used = 0;
  for (int32_t r = 0; r < max_slots_; ++r) {
    if (in_use_[r]) {
      ++used;
      continue;
    }
    PAGELLM_ASSERT(r == 0 || is_free[r]) << "row " << r << " is neither used nor free";
    const int32_t* entries = row(r);
    for (int32_t b = 0; b < max_pages_per_seq_; ++b) {
      PAGELLM_ASSERT(entries[b] == 0)
          << "unused row " << r << " maps block " << b << " to page " << entries[b];
    }
  }
  PAGELLM_ASSERT(used + num_free_rows() == max_slots_ - 1)
      << "used rows " << used << " + free rows " << num_free_rows() << " != " << max_slots_ - 1;
}

}  // namespace pagellm
