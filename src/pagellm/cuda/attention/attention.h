// Paged attention on the GPU: decode (one query token per sequence, split-KV, K/V tiles
// loaded by TMA where the shape allows; attention_decode_variants.h) and prefill (ragged,
// causal, cached prefixes; FlashAttention-3 style with TMA and wgmma on Hopper where the
// shape allows, FlashAttention-2 style elsewhere; attention_prefill_variants.h).
//
// Both read K/V from the paged pools the KV cache owns and know nothing of requests or
// schedulers: they take raw device pointers and sizes, so they can be tested and
// benchmarked alone. Neither allocates, synchronises or copies between host and device;
// each only enqueues kernels on `stream`, with a grid that depends on host-side fields
// alone, so both may be captured into a CUDA graph and replayed with new device metadata
// (query_start, kv_lens, page_table) as long as the host fields stay the same.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "pagellm/cuda/cuda_settings.h"

namespace pagellm::cuda {

/// Arguments of one paged-attention call. All pointers are device pointers.
///
/// Shapes (bf16 = __nv_bfloat16):
///   q, out           bf16 [num_tokens, num_q_heads, head_dim]
///   k_pool, v_pool   bf16 [num_pages, num_kv_heads, page_size, head_dim]
///   query_start      int32 [num_seqs + 1], query_start[0] == 0, non-decreasing
///   kv_lens          int32 [num_seqs]
///   page_table       int32 [num_seqs, max_pages_per_seq]
///
/// Sequence b owns query tokens [query_start[b], query_start[b+1]); with q = its query
/// length and kv = kv_lens[b] (its new tokens included, already written into the pools),
/// its query token i sits at position kv - q + i and attends keys 0 .. kv - q + i (causal,
/// bottom-right aligned). Logical block j of sequence b is physical page
/// page_table[b * max_pages_per_seq + j]. Only positions < kv are read; kv is clamped to
/// max_pages_per_seq * page_size, so a table row is never read past its end. A row with
/// q == 0 writes nothing; a query token that sees no key (kv == 0, or q > kv) gets zeros.
/// Query head h reads KV head h / (num_q_heads / num_kv_heads) (GQA).
///
/// The kernels read the per-sequence device arrays on the device; the host fields below
/// (counts and upper bounds) size the grids. Within one CUDA graph they must stay fixed.
/// The first call with a given head_dim (and, for prefill, tile height) sets the kernel's
/// shared-memory limit with cudaFuncSetAttribute: make it before capturing a graph.
struct PagedAttentionParams {
  const void* q = nullptr;
  const void* k_pool = nullptr;
  const void* v_pool = nullptr;
  void* out = nullptr;
  const int32_t* query_start = nullptr;
  const int32_t* kv_lens = nullptr;
  const int32_t* page_table = nullptr;
  int32_t num_seqs = 0;
  int32_t num_tokens = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;   // 64 or 128
  int32_t page_size = 0;  // any value in 1..kMaxPageSize; 16, 32 and 64 are the fast ones
  int32_t max_pages_per_seq = 0;
  /// Pages in each pool. 0 = not given; decode then runs its cp.async kernel (the TMA
  /// kernel needs the pools' extent for its tensor maps; attention_decode_variants.h).
  int32_t num_pages = 0;
  int32_t max_query_len = 0;  // upper bound of every q (prefill picks its tile height by it)
  int32_t max_kv_len = 0;     // upper bound of every kv (decode picks its split count by it)
  float scale = 0.0f;         // softmax scale, usually 1/sqrt(head_dim)
  /// Decode's split-KV partial results and split counters; 256-byte aligned. Zero-fill it
  /// (cudaMemset) once before its first use: the counters must start at zero, and every
  /// call leaves them so.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  /// Decode only: the number of KV splits per (sequence, KV head). 0 lets
  /// paged_decode_attention choose (plan_decode_splits). A fixed value must fit the
  /// workspace (paged_attention_workspace_bytes(num_tokens, ..., num_splits)).
  int32_t num_splits = 0;
  /// Decode only, optional: shared-prefix (cascade) attention. When prefix_tokens is not
  /// null, paged_decode_attention first runs a prefix pass over the items at prefix_items
  /// (layout below), each a group of sequences whose first prefix_tokens keys lie in the
  /// same physical pages: one CTA per (item, KV head, chunk of members) reads those pages
  /// once for the query heads of all its members. Then every sequence b attends only its
  /// keys [prefix_tokens[b], kv) as usual and folds the prefix pass's partial result in
  /// (log-sum-exp). prefix_tokens[b] == 0: no prefix pass for b. Device arrays, rewritten
  /// each step like kv_lens; max_prefix_items (host) sizes the prefix grid and must stay
  /// fixed within a CUDA graph. The caller guarantees what the items claim: every member
  /// of an item has one query token, prefix_tokens[b] equals the item's prefix length,
  /// which is at most kv - 1, and the members' page table rows agree on its pages.
  const int32_t* prefix_items = nullptr;
  const int32_t* prefix_tokens = nullptr;
  int32_t max_prefix_items = 0;
  /// With the prefix pass: a member with at most this many keys after its prefix (and a
  /// prefix of whole 16-key tiles) is attended entirely by its item's pass CTAs, which
  /// write its rows; its split CTAs exit at once (0: never).
  int32_t prefix_fold_keys = kDecodePrefixFoldKeys;
};

/// Layout of PagedAttentionParams::prefix_items (int32): word 0 the number of items n, then
/// from word kPrefixItemsHeader item i at kPrefixItemsHeader + i * kPrefixItemInts:
/// {prefix tokens (a multiple of page_size), members m (2 ..
/// decode_prefix_item_members), the members' sequence indices}. A sequence is a member of
/// at most one item, and is one exactly when its prefix_tokens entry is positive.
inline constexpr int32_t kPrefixItemsHeader = 4;
inline constexpr int32_t kPrefixItemMaxMembers = 16;
inline constexpr int32_t kPrefixItemInts = 2 + kPrefixItemMaxMembers;
/// int32 words of a prefix_items array for up to `max_items` items.
inline constexpr int64_t prefix_items_words(int64_t max_items) {
  return kPrefixItemsHeader + max_items * kPrefixItemInts;
}

/// Largest page size the kernels accept.
inline constexpr int32_t kMaxPageSize = 1024;
/// Largest number of KV splits decode uses.
inline constexpr int32_t kMaxDecodeSplits = 64;

/// Bytes of workspace that decode needs to run `max_splits` KV splits over up to
/// `max_tokens` query tokens: 256 KB of split counters (one per sequence and CTA row, up to
/// 65,536) plus f32 partial outputs and (max, sum) pairs per split and query head,
/// (head_dim + 2) * 4 bytes per (token, split, head). Decode never plans more splits
/// than the workspace it is given holds, so a smaller workspace only costs parallelism at
/// small batches (zero bytes means one split). 0 when max_splits <= 1.
size_t paged_attention_workspace_bytes(int32_t max_tokens, int32_t num_q_heads, int32_t head_dim,
                                       int32_t max_splits);

/// A workspace size with which plan_decode_splits is never limited by the workspace, at any
/// decode batch (one token per sequence) on GPUs of up to 256 SMs: room for 1024
/// (token, split) pairs, since the planner keeps num_seqs x num_kv_heads x num_splits within
/// two CTAs per SM. 17 MB for Qwen3-8B.
size_t paged_decode_workspace_bytes(int32_t num_q_heads, int32_t head_dim);

/// The number of KV splits paged_decode_attention uses for `p` when p.num_splits == 0: the
/// most splits whose num_seqs x num_kv_heads x splits CTAs still fit in one wave of two
/// CTAs per SM of the current device, at most one split per 128 keys of max_kv_len, at most
/// kMaxDecodeSplits, and no more than the workspace holds. Depends only on host fields, so
/// it is stable within a CUDA graph.
int32_t plan_decode_splits(const PagedAttentionParams& p);

/// Attention for batches in which every sequence has at most one query token (q == 1;
/// q == 0 rows are skipped). A sequence with q > 1 is computed correctly too, its query
/// tokens one after the other: the cost grows with q, so it pays only for a few tokens
/// (native_attention_takes_decode).
/// One CTA per (sequence, KV head, split) reads each K/V page once for up to 16 query
/// heads of its GQA group, on tensor cores; with more than one split the last split CTA of
/// each sequence to finish merges the partial softmax states (log-sum-exp). Throws
/// pagellm::Error for unsupported shapes or a workspace too small for p.num_splits.
void paged_decode_attention(const PagedAttentionParams& p, cudaStream_t stream);

/// Query rows of a shared-prefix pass CTA: two 16-row mma tiles.
inline constexpr int32_t kDecodePassRows = 32;

/// Members per prefix item for a model of num_q_heads / num_kv_heads query heads per KV head
/// whose query heads fill `rows` rows of a pass CTA (16 or kDecodePassRows): rows / group, at
/// most kPrefixItemMaxMembers; 0 when the group is larger than 16 or the heads do not divide.
int32_t decode_prefix_item_members(int32_t num_q_heads, int32_t num_kv_heads,
                                   int32_t rows = kDecodePassRows);

/// Pass CTAs of 16-row items the decode kernel runs in one wave on the current device (its
/// CTA slots): BatchStaging packs 16-row items while they launch at most this many
/// (PrefixItemSizes).
int64_t decode_prefix_half_item_ctas();

/// Whether paged_decode_attention can run `p` with a shared-prefix pass (p.prefix_tokens
/// set): one query token per sequence (max_query_len 1), at most 16 query heads per KV head,
/// the TMA decode kernel's shape (decode_tma_supported), and a workspace that holds one
/// more split than plan_decode_splits plans (the prefix pass's partials sit in it). Host
/// fields only.
bool decode_cascade_supported(const PagedAttentionParams& p);

/// Query tokens up to which the native route runs a call through paged_decode_attention:
/// at most kDecodeRouteMaxQuery per sequence, or at most kDecodeRouteMaxTokens in all.
inline constexpr int32_t kDecodeRouteMaxQuery = 2;
inline constexpr int32_t kDecodeRouteMaxTokens = 4;

/// Whether the native route runs `p` through paged_decode_attention rather than
/// paged_prefill_attention: decode steps (every q <= 1), and short chunks after a prefix
/// (the tail of a chunked prompt, a few speculative tokens) as kDecodeRouteMaxQuery and
/// kDecodeRouteMaxTokens say. The prefill grid has one CTA per (query tile, head), so one
/// sequence of a few tokens occupies 32 of 132 SMs, each streaming the whole prefix; the
/// split-KV decode kernel spreads the prefix over every SM, but takes a sequence's query
/// tokens in turn. Measured (attention_bench --chunks-only, H200, 2026-12-04): 2 tokens
/// after 8,192 keys 25 µs against 109 µs, 4 tokens 44 against 109 µs; from 4 tokens per
/// sequence at batch 4 (142 against 110 µs) or 8 at batch 1 after 2,048 keys (42 against
/// 30 µs) the prefill kernel wins. Host fields only (max_query_len, num_tokens), so the
/// choice is the same at capture and replay.
bool native_attention_takes_decode(const PagedAttentionParams& p);
/// Smallest leading run of one-token sequences that plan_native_attention splits off a
/// call the prefill kernel runs.
inline constexpr int32_t kMixedDecodeMinSeqs = 4;
/// The kernel calls the native route makes for one attention call: the decode kernel, the
/// prefill kernel, or both on disjoint sequences.
struct NativeAttentionCalls {
  bool run_decode = false;
  bool run_prefill = false;
  PagedAttentionParams decode;   // valid when run_decode
  PagedAttentionParams prefill;  // valid when run_prefill
};
/// A mixed step's leading run of decode rows (one-token sequences; the scheduler puts
/// running sequences first), found once per forward from the host arrays.
struct MixedDecodeRun {
  int32_t seqs = 0;        // 0: no split
  int32_t tokens = 0;      // their query tokens: query_start[seqs] - query_start[0]
  int32_t max_kv_len = 0;  // the longest of their kv_lens
};
/// The leading run of one-token sequences of a batch of `num_seqs` (host copies of its
/// query_start and kv_lens), when it holds at least kMixedDecodeMinSeqs sequences and a
/// sequence follows it; otherwise seqs 0. Only for a call that is not replayed with other
/// contents (a captured graph keeps one route for every replay). Host-only.
MixedDecodeRun find_mixed_decode_run(int32_t num_seqs, const int32_t* query_start,
                                     const int32_t* kv_lens);
/// How the native route runs `p`. native_attention_takes_decode: the decode kernel alone.
/// Otherwise the prefill kernel, except that a mixed step's leading decode rows (`run`,
/// from find_mixed_decode_run) go to the decode kernel, and the prefill kernel gets the
/// sequences after them (its arrays offset past them; query_start stays absolute, so q,
/// out and num_tokens do not change). The prefill grid has a CTA per (128-row tile, query
/// head), so each decode row took 32 CTAs that each streamed its whole context for one
/// query row. Host-only.
NativeAttentionCalls plan_native_attention(const PagedAttentionParams& p,
                                           const MixedDecodeRun& run = {});

/// Attention for ragged batches of any query lengths (prefill, chunked prefill with a
/// cached prefix, or mixed batches). One CTA per (query tile of 64 or 128 rows, query
/// head); tiles are mapped to sequences on the device from query_start. Runs the variant
/// PAGELLM_PREFILL_KERNEL names (attention_prefill_variants.h). Throws pagellm::Error for
/// unsupported shapes.
void paged_prefill_attention(const PagedAttentionParams& p, cudaStream_t stream);

}  // namespace pagellm::cuda
