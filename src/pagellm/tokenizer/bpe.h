// Byte-level BPE: merges adjacent symbols of one pre-tokenized piece by merge rank.
//
// Works on raw bytes: the initial symbols of a piece are the vocabulary ids of its bytes
// (GPT-2's byte-level alphabet is applied once, when loading, not per call). Merging follows
// Hugging Face tokenizers' BPE::merge_word exactly: a min-heap of (rank, left position);
// the lowest rank merges first, ties go to the leftmost pair; stale heap entries are
// skipped. O(n log n) per piece, so a 1 MB run of letters is no slower per byte than a word.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace pagellm {

/// 64-bit hash of a byte string (used by the BPE caches and the merge table).
uint64_t hash_bytes(std::string_view bytes);

/// Working memory for BpeModel::encode_piece; reuse one per thread to avoid allocation.
struct BpeWorkspace {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    uint32_t length;  // bytes covered; 0 once merged into its left neighbour
  };
  std::vector<Symbol> symbols;
  std::vector<uint64_t> heap;  // (rank << 32) | position, min-heap
};

/// The merge rules and byte alphabet of a BPE model. Immutable after construction.
class BpeModel {
 public:
  struct Merge {
    int32_t left;
    int32_t right;
    int32_t merged;
  };

  /// `byte_ids[b]`: id of the token for byte b, or -1 when the vocabulary lacks it (such
  /// bytes are dropped, as Hugging Face does with no unk token). `merges` in rank order
  /// (a later duplicate of a pair overrides the earlier one, as in Hugging Face).
  /// `whole_pieces`: raw bytes -> id of every vocabulary entry, consulted before merging
  /// when `ignore_merges` is set.
  BpeModel(std::vector<int32_t> byte_ids, const std::vector<Merge>& merges, bool ignore_merges,
           std::unordered_map<std::string, int32_t> whole_pieces);

  /// Appends the ids of one piece (raw bytes) to `out`.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out, BpeWorkspace& ws) const;

  size_t num_merges() const { return merge_count_; }

 private:
  struct Slot {
    uint64_t key;  // (left << 32) | right; kEmpty when unused
    int32_t rank;
    int32_t merged;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  const Slot* find(int32_t left, int32_t right) const;
  void insert(int32_t left, int32_t right, int32_t rank, int32_t merged);

  std::vector<int32_t> byte_ids_;
  std::vector<Slot> table_;  // open addressing, power-of-two size
  uint64_t mask_ = 0;
  size_t merge_count_ = 0;
  bool ignore_merges_ = false;
  std::unordered_map<std::string, int32_t> whole_pieces_;
};

/// A bounded cache from piece bytes to token ids. Not thread-safe by itself: see
/// BpeCachePool. When full, it is emptied (cheap, and keeps memory bounded).
class BpeCache {
 public:
  /// Returns the cached ids of `piece` (valid until the next insert), or nullptr.
  const int32_t* find(std::string_view piece, uint64_t hash, uint32_t& count) const;
  void insert(std::string_view piece, uint64_t hash, const int32_t* ids, uint32_t count);

  static constexpr size_t kMaxPieceBytes = 256;  // longer pieces are not cached

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_offset = 0;
    uint32_t key_length = 0;  // 0: empty slot (empty pieces are never cached)
    uint32_t ids_offset = 0;
    uint32_t ids_count = 0;
  };
  static constexpr size_t kSlots = 1 << 16;      // power of two
  static constexpr size_t kMaxEntries = 1 << 15;  // half full at most

  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t entries_ = 0;
};

/// A few caches behind try-locks, so that concurrent encodes never wait on each other:
/// a thread that finds every cache busy encodes without one.
class BpeCachePool {
 public:
  static constexpr int kCaches = 4;

  /// A cache locked for the caller until destruction; get() is nullptr when all are busy.
  class Lease {
   public:
    explicit Lease(BpeCachePool& pool);
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    BpeCache* get() const { return cache_; }

   private:
    BpeCachePool& pool_;
    int index_ = -1;
    BpeCache* cache_ = nullptr;
  };

 private:
  std::mutex mutexes_[kCaches];
  BpeCache caches_[kCaches];
};

}  // namespace pagellm
