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
  changed_begin_.assign(static_cast<size_t>(max_slots), 0);
  changed_end_.assign(static_cast<size_t>(max_slots), 0);
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

void PageTable::mark_changed(int32_t row, int32_t begin, int32_t end) {
  if (changed_begin_[row] == changed_end_[row]) {
    changed_rows_.push_back(row);
    changed_begin_[row] = begin;
    changed_end_[row] = end;
    return;
  }
  changed_begin_[row] = std::min(changed_begin_[row], begin);
  changed_end_[row] = std::max(changed_end_[row], end);
}

void PageTable::release(int32_t row) {
  check_row_in_use(row, "release");
  int32_t* entries = entries_.data() + static_cast<size_t>(row) * max_pages_per_seq_;
  // Only the non-zero span needs zeroing in a persistent copy.
  int32_t first = max_pages_per_seq_, last = -1;
  for (int32_t b = 0; b < max_pages_per_seq_; ++b) {
    if (entries[b] == 0) continue;
    first = std::min(first, b);
    last = b;
    entries[b] = 0;
  }
  if (last >= 0) mark_changed(row, first, last + 1);
  in_use_[row] = 0;
  free_rows_.push(row);
}

void PageTable::set(int32_t row, int32_t block, int32_t page) {
  check_row_in_use(row, "set");
  PAGELLM_CHECK(block >= 0 && block < max_pages_per_seq_)
      << "logical block " << block << " is beyond the page table's capacity of "
      << max_pages_per_seq_ << " pages per sequence";
  PAGELLM_CHECK(page >= 0) << "page numbers are non-negative, got " << page;
  int32_t& entry = entries_[static_cast<size_t>(row) * max_pages_per_seq_ + block];
  if (entry == page) return;
  entry = page;
  mark_changed(row, block, block + 1);
}

void PageTable::take_updates(std::vector<PageTableUpdate>* updates,
                             std::vector<int32_t>* values) {
  std::sort(changed_rows_.begin(), changed_rows_.end());
  for (int32_t row : changed_rows_) {
    PageTableUpdate u;
    u.row = row;
    u.begin = changed_begin_[row];
    u.end = changed_end_[row];
    updates->push_back(u);
    const int32_t* entries = entries_.data() + static_cast<size_t>(row) * max_pages_per_seq_;
    values->insert(values->end(), entries + u.begin, entries + u.end);
    changed_begin_[row] = changed_end_[row] = 0;
  }
  changed_rows_.clear();
}

int32_t PageTable::num_pending_entries() const {
  int32_t n = 0;
  for (int32_t row : changed_rows_) n += changed_end_[row] - changed_begin_[row];
  return n;
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
