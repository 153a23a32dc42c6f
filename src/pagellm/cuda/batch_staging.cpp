// Batch metadata staging and the persistent page table (batch_staging.h).
#include "pagellm/cuda/batch_staging.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "pagellm/common/check.h"
#include "pagellm/cuda/attention/attention.h"
#include "pagellm/cuda/attention/page_table.h"
#include "pagellm/cuda/support/cuda_check.h"

namespace pagellm::cuda {
namespace {

// Batch metadata regions start on 64-byte boundaries.
constexpr int64_t kBatchAlign = 16;  // int32 elements

cudaStream_t as_stream(CUstream_st* s) { return s; }
cudaEvent_t as_event(CUevent_st* e) { return e; }
int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

/// Members of each shared-prefix group, indexed by the group's id (a sequence index).
std::vector<int32_t> shared_prefix_group_sizes(const ForwardBatch& batch) {
  const int32_t B = batch.num_seqs();
  std::vector<int32_t> count(static_cast<size_t>(B), 0);
  for (int32_t b = 0; b < B; ++b) {
    if (batch.shared_prefix_tokens[b] > 0) ++count[batch.shared_prefix_group[b]];
  }
  return count;
}

}  // namespace

BatchStaging::BatchStaging(DeviceMemory& memory, CUstream_st* stream)
    : memory_(memory), stream_(stream) {
  try {
    for (PinnedSlot& slot : staging_) {
      PAGELLM_CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
    }
    Capacity initial;
    initial.tokens = 256;
    initial.seqs = 64;
    initial.page_entries = 64 * 64;
    initial.rows = 64;
    grow(initial);
  } catch (...) {
    free_buffers();
    throw;
  }
}

BatchStaging::~BatchStaging() { free_buffers(); }

void BatchStaging::free_buffers() noexcept {
  memory_.deallocate(device_);
  memory_.deallocate(page_table_);
  device_ = page_table_ = nullptr;
  for (PinnedSlot& slot : staging_) {
    if (slot.host) cudaFreeHost(slot.host);
    if (slot.done) cudaEventDestroy(slot.done);
    slot = PinnedSlot{};
  }
}

BatchStaging::Layout BatchStaging::layout() const {
  Layout l{};
  int64_t at = 0;
  auto region = [&at](int64_t elements) {
    const int64_t start = at;
    at += align_up(std::max<int64_t>(elements, 1), kBatchAlign);
    return static_cast<size_t>(start);
  };
  l.token_ids = region(cap_tokens_);
  l.positions = region(cap_tokens_);
  l.slot_mapping = region(cap_tokens_);
  l.query_start = region(cap_seqs_ + 1);
  l.kv_lens = region(cap_seqs_);
  l.logits_indices = region(cap_rows_);
  l.lora_slots = region(cap_tokens_);
  l.prefix_tokens = region(cap_seqs_);
  l.prefix_items = region(prefix_items_words(cap_seqs_));
  // The persistent page table's inputs (sized only once a persistent batch has come, so
  // that the dense path's copy stays as small as before), then the page table last: the
  // dense path copies up to its used part, the persistent path up to the used values.
  l.seq_slots = region(cap_slots_);
  l.page_runs = region(4 * cap_runs_);
  l.page_values = region(cap_values_);
  l.page_table = region(cap_page_entries_);
  l.total = static_cast<size_t>(at);
  return l;
}

void BatchStaging::grow(const Capacity& need) {
  if (need.tokens <= cap_tokens_ && need.seqs <= cap_seqs_ &&
      need.page_entries <= cap_page_entries_ && need.rows <= cap_rows_ &&
      need.slots <= cap_slots_ && need.runs <= cap_runs_ && need.values <= cap_values_ &&
      device_ != nullptr) {
    return;
  }
  PAGELLM_CHECK(!stream_capturing(stream_))
      << "cuda backend: the batch metadata buffers must grow, which cannot happen during "
         "graph capture; call reserve_batch() with the largest batch before capturing";
  // Grow geometrically so that a slowly growing workload reallocates rarely.
  auto grown = [](int64_t need, int64_t have) { return need <= have ? have : std::max(need, 2 * have); };
  const int64_t new_tokens = grown(need.tokens, cap_tokens_);
  const int64_t new_seqs = grown(need.seqs, cap_seqs_);
  const int64_t new_pages = grown(need.page_entries, cap_page_entries_);
  const int64_t new_rows = grown(need.rows, cap_rows_);
  const int64_t new_slots = grown(need.slots, cap_slots_);
  const int64_t new_runs = grown(need.runs, cap_runs_);
  const int64_t new_values = grown(need.values, cap_values_);
  // Everything that reads the old buffers must be done before they are freed.
  memory_.synchronize();
  cap_tokens_ = new_tokens;
  cap_seqs_ = new_seqs;
  cap_page_entries_ = new_pages;
  cap_rows_ = new_rows;
  cap_slots_ = new_slots;
  cap_runs_ = new_runs;
  cap_values_ = new_values;
  const size_t bytes = layout().total * sizeof(int32_t);
  try {
    memory_.deallocate(device_);
    device_ = nullptr;
    device_ = static_cast<int32_t*>(memory_.allocate(bytes));
    for (PinnedSlot& slot : staging_) {
      if (slot.host) cudaFreeHost(slot.host);
      slot.host = nullptr;
      PAGELLM_CUDA_CHECK(cudaHostAlloc(&slot.host, bytes, cudaHostAllocDefault));
    }
  } catch (...) {
    // Leave no half-grown state: the next upload_batch allocates afresh.
    memory_.deallocate(device_);
    device_ = nullptr;
    for (PinnedSlot& slot : staging_) {
      if (slot.host) cudaFreeHost(slot.host);
      slot.host = nullptr;
    }
    cap_tokens_ = cap_seqs_ = cap_page_entries_ = cap_rows_ = 0;
    cap_slots_ = cap_runs_ = cap_values_ = 0;
    throw;
  }
}

void BatchStaging::reserve(int32_t max_tokens, int32_t max_seqs, int32_t max_pages_per_seq,
                           int32_t max_rows) {
  PAGELLM_CHECK(max_tokens >= 0 && max_seqs >= 0 && max_pages_per_seq >= 0 && max_rows >= 0)
      << "cuda backend: reserve_batch needs non-negative sizes";
  reserved_seqs_ = std::max<int64_t>(reserved_seqs_, max_seqs);
  reserved_pages_per_seq_ = std::max<int64_t>(reserved_pages_per_seq_, max_pages_per_seq);
  Capacity need;
  need.tokens = max_tokens;
  need.seqs = max_seqs;
  need.page_entries = int64_t{max_seqs} * max_pages_per_seq;
  need.rows = max_rows;
  if (cap_slots_ > 0) need = with_persistent_reserve(need);
  grow(need);
}

BatchStaging::Capacity BatchStaging::with_persistent_reserve(Capacity need) const {
  // A step of the reserved batch may rewrite every row it holds, in up to four runs per
  // sequence, without growing the buffers (which would invalidate captured graphs).
  need.slots = std::max(need.slots, reserved_seqs_);
  need.runs = std::max(need.runs, 4 * reserved_seqs_ + 16);
  need.values = std::max(need.values, reserved_seqs_ * reserved_pages_per_seq_);
  return need;
}

void BatchStaging::ensure_page_table(int64_t rows, int64_t cols) {
  if (rows <= table_rows_ && cols <= table_cols_ && page_table_ != nullptr) return;
  const int64_t new_rows = std::max(rows, table_rows_), new_cols = std::max(cols, table_cols_);
  const size_t bytes = static_cast<size_t>(new_rows * new_cols) * sizeof(int32_t);
  auto* grown = static_cast<int32_t*>(memory_.allocate(bytes));
  cudaStream_t s = as_stream(stream_);
  // Zero-filled (row 0 and every entry not yet written read as page 0), then the old
  // table's rows copied in, so that a wider or taller table keeps what the engine sent.
  try {
    PAGELLM_CUDA_CHECK(cudaMemsetAsync(grown, 0, bytes, s));
    if (page_table_ != nullptr) {
      PAGELLM_CUDA_CHECK(cudaMemcpy2DAsync(
          grown, static_cast<size_t>(new_cols) * sizeof(int32_t), page_table_,
          static_cast<size_t>(table_cols_) * sizeof(int32_t),
          static_cast<size_t>(table_cols_) * sizeof(int32_t), static_cast<size_t>(table_rows_),
          cudaMemcpyDeviceToDevice, s));
    }
    memory_.synchronize();
  } catch (...) {
    memory_.deallocate(grown);
    throw;
  }
  memory_.deallocate(page_table_);
  page_table_ = grown;
  table_rows_ = new_rows;
  table_cols_ = new_cols;
}

BatchTensors BatchStaging::upload(const ForwardBatch& batch) {
  const int64_t T = batch.num_tokens(), B = batch.num_seqs();
  const int64_t R = static_cast<int64_t>(batch.logits_indices.size());
  const int64_t P = static_cast<int64_t>(batch.page_table.size());
  const bool persistent = !batch.seq_slots.empty();
  PAGELLM_CHECK(static_cast<int64_t>(batch.positions.size()) == T &&
                static_cast<int64_t>(batch.slot_mapping.size()) == T)
      << "cuda backend: upload_batch: token_ids, positions and slot_mapping differ in length ("
      << T << ", " << batch.positions.size() << ", " << batch.slot_mapping.size() << ")";
  PAGELLM_CHECK(static_cast<int64_t>(batch.query_start.size()) == B + 1)
      << "cuda backend: upload_batch: query_start has " << batch.query_start.size()
      << " entries for " << B << " sequences (need " << B + 1 << ")";
  if (persistent) {
    check_persistent(batch);
  } else {
    PAGELLM_CHECK(batch.max_pages_per_seq >= 0 && P == B * batch.max_pages_per_seq)
        << "cuda backend: upload_batch: page table has " << P << " entries, expected " << B
        << " x " << batch.max_pages_per_seq;
  }
  const int64_t U = static_cast<int64_t>(batch.page_table_updates.size());
  const int64_t NV = static_cast<int64_t>(batch.page_table_values.size());
  const int64_t table_entries = B * batch.max_pages_per_seq;
  Capacity need;
  need.tokens = T;
  need.seqs = B;
  need.page_entries = table_entries;
  need.rows = R;
  if (persistent) {
    need.slots = B;
    need.runs = U;
    need.values = NV;
    // The first persistent batch sizes the persistent regions for the reserved batch too.
    if (cap_slots_ == 0) need = with_persistent_reserve(need);
    ensure_page_table(batch.page_table_rows, batch.max_pages_per_seq);
  }
  grow(need);
  const Layout l = layout();

  PinnedSlot& slot = staging_[slot_];
  slot_ ^= 1;
  PAGELLM_CUDA_CHECK(cudaEventSynchronize(as_event(slot.done)));
  auto* staged = static_cast<int32_t*>(slot.host);
  auto put = [staged](size_t offset, const std::vector<int32_t>& v) {
    if (!v.empty()) std::memcpy(staged + offset, v.data(), v.size() * sizeof(int32_t));
  };
  put(l.token_ids, batch.token_ids);
  put(l.positions, batch.positions);
  put(l.slot_mapping, batch.slot_mapping);
  put(l.query_start, batch.query_start);
  put(l.kv_lens, batch.kv_lens);
  put(l.logits_indices, batch.logits_indices);
  const bool lora = !batch.lora_slots.empty();
  if (lora) batch.lora_token_slots(staged + l.lora_slots);
  // The groups' sizes are counted once: they choose the item size and fill the items.
  int32_t prefix_items = 0;
  if (batch.has_shared_prefix()) {
    const std::vector<int32_t> groups = shared_prefix_group_sizes(batch);
    prefix_items = pack_groups(batch, groups, members_for_groups(groups, prefix_sizes_),
                               staged + l.prefix_items, staged + l.prefix_tokens);
  } else {
    prefix_items = pack_groups(batch, {}, prefix_sizes_.members, staged + l.prefix_items,
                               staged + l.prefix_tokens);
  }
  size_t used = 0;
  bool runs_overlap = false;
  if (persistent) {
    put(l.seq_slots, batch.seq_slots);
    // Runs as {row, begin, end, offset into the values}; a row named twice makes the
    // runs order-dependent (applied one after another on the device).
    int32_t* runs = staged + l.page_runs;
    int32_t offset = 0;
    ++run_stamp_;
    if (run_seen_.size() < static_cast<size_t>(batch.page_table_rows)) {
      run_seen_.resize(static_cast<size_t>(batch.page_table_rows), 0);
    }
    for (int64_t u = 0; u < U; ++u) {
      const PageTableUpdate& up = batch.page_table_updates[static_cast<size_t>(u)];
      runs[4 * u + 0] = up.row;
      runs[4 * u + 1] = up.begin;
      runs[4 * u + 2] = up.end;
      runs[4 * u + 3] = offset;
      offset += up.end - up.begin;
      uint64_t& seen = run_seen_[static_cast<size_t>(up.row)];
      runs_overlap = runs_overlap || seen == run_stamp_;
      seen = run_stamp_;
    }
    put(l.page_values, batch.page_table_values);
    used = (l.page_values + static_cast<size_t>(NV)) * sizeof(int32_t);
  } else {
    put(l.page_table, batch.page_table);
    used = (l.page_table + static_cast<size_t>(P)) * sizeof(int32_t);
  }
  cudaStream_t s = as_stream(stream_);
  PAGELLM_CUDA_CHECK(cudaMemcpyAsync(device_, staged, used, cudaMemcpyHostToDevice, s));
  PAGELLM_CUDA_CHECK(cudaEventRecord(as_event(slot.done), s));
  if (persistent) {
    // Outside any graph, before the forward: the table takes this step's changes, then
    // the batch's rows are gathered where the dense path would have copied them.
    launch_apply_page_table_runs(page_table_, table_cols_, device_ + l.page_runs,
                                 static_cast<int32_t>(U), device_ + l.page_values,
                                 runs_overlap, s);
    launch_gather_page_table_rows(page_table_, table_cols_, device_ + l.seq_slots,
                                  static_cast<int32_t>(B), device_ + l.page_table,
                                  batch.max_pages_per_seq, s);
  }

  BatchTensors bt;
  bt.host = &batch;
  bt.token_ids = Tensor(device_ + l.token_ids, DType::I32, {T});
  bt.positions = Tensor(device_ + l.positions, DType::I32, {T});
  bt.slot_mapping = Tensor(device_ + l.slot_mapping, DType::I32, {T});
  bt.query_start = Tensor(device_ + l.query_start, DType::I32, {B + 1});
  bt.kv_lens = Tensor(device_ + l.kv_lens, DType::I32, {B});
  bt.page_table = Tensor(device_ + l.page_table, DType::I32, {B, batch.max_pages_per_seq});
  bt.logits_indices = Tensor(device_ + l.logits_indices, DType::I32, {R});
  if (lora) bt.lora_slots = Tensor(device_ + l.lora_slots, DType::I32, {T});
  bt.prefix_tokens = Tensor(device_ + l.prefix_tokens, DType::I32, {B});
  bt.prefix_items = Tensor(device_ + l.prefix_items, DType::I32, {prefix_items_words(B)});
  bt.prefix_item_count = prefix_items;
  return bt;
}

int32_t BatchStaging::prefix_item_members(const ForwardBatch& batch,
                                          const PrefixItemSizes& sizes) {
  if (!batch.has_shared_prefix()) return sizes.members;
  return members_for_groups(shared_prefix_group_sizes(batch), sizes);
}

int32_t BatchStaging::members_for_groups(const std::vector<int32_t>& group_sizes,
                                         const PrefixItemSizes& sizes) {
  if (sizes.half_members < 2 || sizes.half_members >= sizes.members) return sizes.members;
  int64_t half_items = 0;
  for (const int32_t n : group_sizes) {
    if (n >= 2) half_items += (n + sizes.half_members - 1) / sizes.half_members;
  }
  return half_items * sizes.kv_heads <= sizes.max_half_ctas ? sizes.half_members
                                                             : sizes.members;
}

int32_t BatchStaging::pack_prefix_items(const ForwardBatch& batch, int32_t members,
                                        int32_t* items, int32_t* tokens) {
  if (!batch.has_shared_prefix()) return pack_groups(batch, {}, members, items, tokens);
  return pack_groups(batch, shared_prefix_group_sizes(batch), members, items, tokens);
}

int32_t BatchStaging::pack_groups(const ForwardBatch& batch,
                                  const std::vector<int32_t>& count, int32_t members,
                                  int32_t* items, int32_t* tokens) {
  const int32_t B = batch.num_seqs();
  std::fill(tokens, tokens + B, 0);
  items[0] = 0;
  if (members < 2 || !batch.has_shared_prefix() || batch.num_tokens() != B) return 0;
  members = std::min(members, kPrefixItemMaxMembers);
  // Each group's items filled in batch order (count: members per group).
  std::vector<int32_t> first_item(static_cast<size_t>(B), -1);
  int32_t n_items = 0;
  std::vector<int32_t> seen(static_cast<size_t>(B), 0);
  for (int32_t b = 0; b < B; ++b) {
    const int32_t g = batch.shared_prefix_group[b], n = count[g];
    if (batch.shared_prefix_tokens[b] <= 0 || n < 2) continue;
    const int32_t parts = (n + members - 1) / members;
    const int32_t per = (n + parts - 1) / parts;
    if (first_item[g] < 0) {
      first_item[g] = n_items;
      for (int32_t k = 0; k < parts; ++k) {
        int32_t* it = items + kPrefixItemsHeader + (n_items + k) * kPrefixItemInts;
        it[0] = batch.shared_prefix_tokens[b];
        it[1] = 0;
      }
      n_items += parts;
    }
    int32_t* it = items + kPrefixItemsHeader + (first_item[g] + seen[g] / per) * kPrefixItemInts;
    it[2 + it[1]++] = b;
    ++seen[g];
    tokens[b] = batch.shared_prefix_tokens[b];
  }
  items[0] = n_items;
  return n_items;
}

void BatchStaging::check_persistent(const ForwardBatch& batch) {
  const int64_t B = batch.num_seqs();
  const int64_t rows = batch.page_table_rows, cols = batch.max_pages_per_seq;
  PAGELLM_CHECK(batch.page_table.empty())
      << "cuda backend: upload_batch: a batch with seq_slots (the persistent page table) must "
         "leave page_table empty, got "
      << batch.page_table.size() << " entries";
  PAGELLM_CHECK(static_cast<int64_t>(batch.seq_slots.size()) == B)
      << "cuda backend: upload_batch: " << batch.seq_slots.size() << " seq_slots for " << B
      << " sequences (need one per sequence)";
  PAGELLM_CHECK(rows >= 1 && cols >= 0 && rows * std::max<int64_t>(cols, 1) <= INT32_MAX)
      << "cuda backend: upload_batch: a persistent page table of " << rows << " rows x "
      << cols << " pages is not accepted (need at least 1 row, the reserved row 0, and "
      << "fewer than 2^31 entries)";
  for (int64_t b = 0; b < B; ++b) {
    const int32_t slot = batch.seq_slots[static_cast<size_t>(b)];
    PAGELLM_CHECK(slot >= 0 && slot < rows)
        << "cuda backend: upload_batch: seq_slots[" << b << "] = " << slot
        << " is not a row of the persistent page table [0, " << rows << ")";
  }
  int64_t values = 0;
  for (size_t u = 0; u < batch.page_table_updates.size(); ++u) {
    const PageTableUpdate& up = batch.page_table_updates[u];
    PAGELLM_CHECK(up.row >= 1 && up.row < rows && up.begin >= 0 && up.begin <= up.end &&
                  up.end <= cols)
        << "cuda backend: upload_batch: page_table_updates[" << u << "] (row " << up.row
        << ", entries [" << up.begin << ", " << up.end << ")) is outside the table (rows 1.."
        << rows - 1 << ", row 0 being the reserved all-zero row; entries within [0, " << cols
        << "))";
    values += up.end - up.begin;
  }
  PAGELLM_CHECK(values == static_cast<int64_t>(batch.page_table_values.size()))
      << "cuda backend: upload_batch: page_table_updates cover " << values
      << " entries but page_table_values holds " << batch.page_table_values.size();
}

}  // namespace pagellm::cuda
