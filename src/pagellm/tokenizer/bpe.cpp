#include "pagellm/tokenizer/bpe.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "pagellm/common/check.h"

namespace pagellm {

uint64_t hash_bytes(std::string_view bytes) {
  // A multiply-xorshift hash over 8-byte words: fast on short pieces, good enough mixing
  // for power-of-two tables.
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  uint64_t h = 0x243F6A8885A308D3ull ^ (bytes.size() * kMul);
  const char* p = bytes.data();
  size_t n = bytes.size();
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    h = (h ^ word) * kMul;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t word = 0;
    std::memcpy(&word, p, n);
    h = (h ^ word) * kMul;
    h ^= h >> 29;
  }
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}

namespace {
inline uint64_t pair_key(int32_t left, int32_t right) {
  return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}
inline uint64_t mix(uint64_t key) {
  key ^= key >> 33;
  key *= 0xFF51AFD7ED558CCDull;
  key ^= key >> 33;
  return key;
}
}  // namespace

BpeModel::BpeModel(std::vector<int32_t> byte_ids, const std::vector<Merge>& merges,
                   bool ignore_merges, std::unordered_map<std::string, int32_t> whole_pieces)
    : byte_ids_(std::move(byte_ids)),
      ignore_merges_(ignore_merges),
      whole_pieces_(std::move(whole_pieces)) {
  PAGELLM_ASSERT(byte_ids_.size() == 256);
  size_t capacity = 16;
  while (capacity < merges.size() * 2 + 16) capacity *= 2;  // load factor <= 0.5
  table_.assign(capacity, Slot{kEmpty, 0, 0});
  mask_ = capacity - 1;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    insert(merges[rank].left, merges[rank].right, static_cast<int32_t>(rank), merges[rank].merged);
  }
}

void BpeModel::insert(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  const uint64_t key = pair_key(left, right);
  for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
    Slot& slot = table_[i];
    if (slot.key == kEmpty) {
      slot = Slot{key, rank, merged};
      ++merge_count_;
      return;
    }
    if (slot.key == key) {  // duplicate pair: the later rank wins
      slot.rank = rank;
      slot.merged = merged;
      return;
    }
  }
}

const BpeModel::Slot* BpeModel::find(int32_t left, int32_t right) const {
  const uint64_t key = pair_key(left, right);
  for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
    const Slot& slot = table_[i];
    if (slot.key == key) return &slot;
    if (slot.key == kEmpty) return nullptr;
  }
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out,
                            BpeWorkspace& ws) const {
  if (ignore_merges_) {
    auto it = whole_pieces_.find(std::string(piece));
    if (it != whole_pieces_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  auto& symbols = ws.symbols;
  symbols.clear();
  for (unsigned char byte : piece) {
    const int32_t id = byte_ids_[byte];
    if (id < 0) {
      // No token for this byte and no unk token: Hugging Face drops it, but the byte
      // still counts towards the length of its left neighbour's span.
      if (!symbols.empty()) symbols.back().length += 1;
      continue;
    }
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, 1});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;
  if (symbols.size() == 1) {
    out.push_back(symbols[0].id);
    return;
  }

  auto& heap = ws.heap;
  heap.clear();
  const auto later = std::greater<uint64_t>();
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Slot* m = find(symbols[i].id, symbols[i + 1].id)) {
      heap.push_back((uint64_t(uint32_t(m->rank)) << 32) | i);
    }
  }
  std::make_heap(heap.begin(), heap.end(), later);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const uint64_t top = heap.back();
    heap.pop_back();
    const int32_t rank = static_cast<int32_t>(top >> 32);
    const int32_t pos = static_cast<int32_t>(top & 0xFFFFFFFFu);
    BpeWorkspace::Symbol& left = symbols[pos];
    if (left.length == 0 || left.next < 0) continue;
    const BpeWorkspace::Symbol& right = symbols[left.next];
    const Slot* m = find(left.id, right.id);
    // Ranks are unique per pair, so a matching rank means this entry is still current.
    if (m == nullptr || m->rank != rank) continue;
    const int32_t removed = left.next;
    left.id = m->merged;
    left.length += right.length;
    left.next = right.next;
    symbols[removed].length = 0;
    if (left.next >= 0) symbols[left.next].prev = pos;
    if (left.prev >= 0) {
      if (const Slot* p = find(symbols[left.prev].id, left.id)) {
        heap.push_back((uint64_t(uint32_t(p->rank)) << 32) | uint32_t(left.prev));
        std::push_heap(heap.begin(), heap.end(), later);
      }
    }
    if (left.next >= 0) {
      if (const Slot* n = find(left.id, symbols[left.next].id)) {
        heap.push_back((uint64_t(uint32_t(n->rank)) << 32) | uint32_t(pos));
        std::push_heap(heap.begin(), heap.end(), later);
      }
    }
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

const int32_t* BpeCache::find(std::string_view piece, uint64_t hash, uint32_t& count) const {
  if (slots_.empty()) return nullptr;
  for (size_t i = hash & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
    const Slot& slot = slots_[i];
    if (slot.key_length == 0) return nullptr;
    if (slot.hash == hash && slot.key_length == piece.size() &&
        std::memcmp(keys_.data() + slot.key_offset, piece.data(), piece.size()) == 0) {
      count = slot.ids_count;
      return ids_.data() + slot.ids_offset;
    }
  }
}

void BpeCache::insert(std::string_view piece, uint64_t hash, const int32_t* ids, uint32_t count) {
  if (piece.empty() || piece.size() > kMaxPieceBytes) return;
  if (slots_.empty()) slots_.resize(kSlots);
  if (entries_ >= kMaxEntries) {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    keys_.clear();
    ids_.clear();
    entries_ = 0;
  }
  size_t i = hash & (kSlots - 1);
  while (slots_[i].key_length != 0) i = (i + 1) & (kSlots - 1);
  slots_[i] = Slot{hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(piece.size()),
                   static_cast<uint32_t>(ids_.size()), count};
  keys_.append(piece);
  ids_.insert(ids_.end(), ids, ids + count);
  ++entries_;
}

BpeCachePool::Lease::Lease(BpeCachePool& pool) : pool_(pool) {
  for (int i = 0; i < kCaches; ++i) {
    if (pool.mutexes_[i].try_lock()) {
      index_ = i;
      cache_ = &pool.caches_[i];
      return;
    }
  }
}

BpeCachePool::Lease::~Lease() {
  if (index_ >= 0) pool_.mutexes_[index_].unlock();
}

}  // namespace pagellm
