// Device helpers shared by the paged-attention kernels (attention_decode.cu,
// attention_prefill.cu, attention_prefill_sm90.cu): PTX wrappers (cp.async, ldmatrix,
// mma.sync, ex2; griddepcontrol comes from pdl.cuh), bf16 packing, the per-sequence metadata
// read that every kernel clamps the same way, the prefill grid's mapping of CTAs to query
// tiles (both prefill kernels), the host-side validation of PagedAttentionParams and the
// host-side choice of a kernel variant by environment variable.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "pagellm/common/check.h"
#include "pagellm/cuda/attention/attention.h"
#include "pagellm/cuda/support/pdl.cuh"

namespace pagellm::cuda::attn {

/// log2(e): scores are kept in the log2 domain so that exp is one ex2 instruction.
inline constexpr float kLog2e = 1.4426950408889634f;

/// Throws pagellm::Error naming the first field of p that the kernels cannot take.
/// `what` names the caller ("paged_decode_attention") for the message.
void validate_params(const PagedAttentionParams& p, const char* what);

// ---- PTX wrappers ---------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// 16-byte global -> shared copy that bypasses L1; when `valid` is false nothing is read
/// and the 16 destination bytes are zero-filled (src-size 0).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/// 2^x with the hardware approximation (rel. error ~2^-22); ex2(-inf) = +0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// One row's step of the online softmax (scores in the log2 domain). `tile_max` is this
/// lane's max of the row's raw scores in the new tile; the row lives in one quad of 4 lanes
/// (the mma.sync and wgmma accumulator layouts), over which it is reduced here. Raises
/// `row_max` to the scaled max, sets `base` (the max to subtract: 0 while the row has seen
/// no key, so that exp2 of its -inf scores is 0), sets `changed` if the max rose, and
/// returns alpha = exp2(old max - base), the factor O and the running sum are scaled by.
__device__ __forceinline__ float online_softmax_step(float tile_max, float& row_max,
                                                     float scale_log2, float& base,
                                                     bool& changed) {
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
  const float new_max = fmaxf(row_max, tile_max * scale_log2);
  base = new_max == -INFINITY ? 0.0f : new_max;
  const float alpha = fast_exp2(row_max - base);
  changed |= new_max != row_max;
  row_max = new_max;
  return alpha;
}

/// Four 8x8 b16 matrices; thread i supplies the address of row (i % 8) of matrix (i / 8)
/// and receives, from matrix j in r[j], row (lane / 4), columns 2 (lane % 4) .. +1.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
/// As ldmatrix_x4, but each matrix transposed: r[j] holds rows 2 (lane % 4) .. +1 of
/// column (lane / 4).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// d += a(16x16, row) * b(16x8, col), bf16 inputs, f32 accumulators (in place).
/// Fragments, with g = lane / 4 and t = lane % 4:
///   a[0] (row g, k 2t..2t+1)   a[1] (row g+8, k 2t..)   a[2] (row g, k 2t+8..)
///   a[3] (row g+8, k 2t+8..)   b[0] (k 2t..2t+1, col g)  b[1] (k 2t+8.., col g)
///   d[0..1] (row g, cols 2t, 2t+1)   d[2..3] (row g+8, cols 2t, 2t+1)
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- bf16 packing -----------------------------------------------------------------------

/// Two floats -> bf16x2 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
/// bf16x2 -> two floats (exact: a bf16 is the top half of an f32).
__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

// ---- per-sequence metadata ----------------------------------------------------------------

/// What one sequence contributes, read from the device arrays and clamped so that no
/// kernel reads past the page-table row or the q/out tensors whatever the arrays hold.
struct SeqInfo {
  int32_t q_begin;  // first query token (row of q/out)
  int32_t q_len;    // number of query tokens (0: nothing to write)
  int32_t kv_len;   // keys 0 .. kv_len - 1 exist
};

__device__ __forceinline__ SeqInfo load_seq_info(const PagedAttentionParams& p, int b) {
  SeqInfo s;
  int32_t begin = p.query_start[b];
  int32_t end = p.query_start[b + 1];
  begin = max(0, min(begin, p.num_tokens));
  end = max(begin, min(end, p.num_tokens));
  s.q_begin = begin;
  s.q_len = end - begin;
  const int64_t capacity = static_cast<int64_t>(p.max_pages_per_seq) * p.page_size;
  const int64_t kv = p.kv_lens[b];
  s.kv_len = static_cast<int32_t>(kv < 0 ? 0 : (kv > capacity ? capacity : kv));
  return s;
}

/// Prefill grids: finds which sequence query tile `tile` belongs to, counting ceil(q_b / bm) tiles per
/// sequence in order. Every lane of the warp gets the same answer. False when `tile` is
/// past the last one (a surplus CTA of the upper-bound grid).
__device__ __forceinline__ bool find_query_tile(const PagedAttentionParams& p, int tile, int bm,
                                                int& seq, int& local, int& count) {
  const int lane = threadIdx.x & 31;
  int base = 0;
  for (int start = 0; start < p.num_seqs; start += 32) {
    const int b = start + lane;
    int cnt = 0;
    if (b < p.num_seqs) cnt = (load_seq_info(p, b).q_len + bm - 1) / bm;
    int incl = cnt;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += y;
    }
    const int total = __shfl_sync(0xffffffffu, incl, 31);
    if (tile < base + total) {
      const unsigned hit = __ballot_sync(0xffffffffu, base + incl > tile);
      const int src = __ffs(hit) - 1;
      const int incl_src = __shfl_sync(0xffffffffu, incl, src);
      const int cnt_src = __shfl_sync(0xffffffffu, cnt, src);
      seq = start + src;
      count = cnt_src;
      local = tile - (base + incl_src - cnt_src);
      return true;
    }
    base += total;
  }
  return false;
}

/// One prefill CTA's work: query tile `m_tile` (rows m0 .. m0 + rows - 1) of sequence `b`,
/// query head `head` (KV head `kv_head`), and the KV tiles of `bn` keys it must visit.
struct PrefillTile {
  SeqInfo seq;
  int b, head, kv_head;
  int m0;          // first query row of the tile (within the sequence)
  int rows;        // valid query rows, >= 1
  int shift;       // query i sits at position shift + i
  int n_kv_tiles;  // KV tiles 0 .. n_kv_tiles - 1 hold every key a row of the tile sees
  int64_t out_row0;  // row of q/out (in units of head_dim) of (token m0, head)
};

/// Maps CTA `cta` of a prefill grid ((query tiles of bm rows, upper bound) x heads, the
/// head index fastest, so that the first wave holds every head's heaviest tile and the CTAs
/// of one GQA group run together) to its tile; within a sequence the tiles run last-first.
/// False for a surplus CTA. Warp-collective (every warp of the CTA gets the same answer).
__device__ __forceinline__ bool locate_prefill_tile_at(const PagedAttentionParams& p, int bm,
                                                       int bn, unsigned cta, PrefillTile& t) {
  const int tile_idx = static_cast<int>(cta / p.num_q_heads);
  t.head = static_cast<int>(cta % p.num_q_heads);
  int local, count;
  if (!find_query_tile(p, tile_idx, bm, t.b, local, count)) return false;
  t.seq = load_seq_info(p, t.b);
  t.kv_head = t.head / (p.num_q_heads / p.num_kv_heads);
  t.m0 = (count - 1 - local) * bm;  // heavy (late) tiles first
  t.rows = min(bm, t.seq.q_len - t.m0);
  t.shift = t.seq.kv_len - t.seq.q_len;
  const int key_last = min(t.seq.kv_len - 1, t.shift + t.m0 + t.rows - 1);
  t.n_kv_tiles = key_last >= 0 ? key_last / bn + 1 : 0;
  t.out_row0 = static_cast<int64_t>(t.seq.q_begin + t.m0) * p.num_q_heads + t.head;
  return true;
}
/// locate_prefill_tile_at for this CTA.
__device__ __forceinline__ bool locate_prefill_tile(const PagedAttentionParams& p, int bm, int bn,
                                                    PrefillTile& t) {
  return locate_prefill_tile_at(p, bm, bn, blockIdx.x, t);
}

/// Writes zeros to `rows` rows of D bf16 (row r at out + (out_row0 + r * row_stride) * D),
/// with `threads` threads of which this is `tid`: the output of query rows that see no key.
template <int D>
__device__ __forceinline__ void store_zero_rows(__nv_bfloat16* out, int64_t out_row0, int rows,
                                                int row_stride, int tid, int threads) {
  constexpr int kChunks = D / 8;
  for (int idx = tid; idx < rows * kChunks; idx += threads) {
    const int r = idx / kChunks;
    const int c = idx % kChunks;
    *reinterpret_cast<uint4*>(out + (out_row0 + static_cast<int64_t>(r) * row_stride) * D +
                              c * 8) = make_uint4(0, 0, 0, 0);
  }
}

/// Maps a key position to the index of its row in a pool [num_pages, num_kv_heads,
/// page_size, head_dim] seen as rows of head_dim elements. `page_shift` >= 0 when page_size
/// is a power of two (then the division is a shift).
__device__ __forceinline__ int64_t kv_row(const int32_t* page_row, int32_t pos, int32_t page_size,
                                          int32_t page_shift, int32_t num_kv_heads,
                                          int32_t kv_head) {
  int32_t block, slot;
  if (page_shift >= 0) {
    block = pos >> page_shift;
    slot = pos & (page_size - 1);
  } else {
    block = pos / page_size;
    slot = pos - block * page_size;
  }
  const int64_t page = __ldg(page_row + block);
  return (page * num_kv_heads + kv_head) * page_size + slot;
}

/// The element offset of that row.
__device__ __forceinline__ int64_t kv_row_offset(const int32_t* page_row, int32_t pos,
                                                 int32_t page_size, int32_t page_shift,
                                                 int32_t num_kv_heads, int32_t kv_head,
                                                 int32_t head_dim) {
  return kv_row(page_row, pos, page_size, page_shift, num_kv_heads, kv_head) * head_dim;
}

/// Element offset of 16-byte chunk `chunk` of row `row` in a [rows][D] bf16 tile in shared
/// memory whose chunks are XOR-swizzled by row % 8: the 8 rows an ldmatrix (or 8 lanes of a
/// cp.async) touch at one logical chunk land in 8 different 16-byte bank groups.
template <int D>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

/// log2(page_size) if it is a power of two, else -1 (host side).
inline int32_t page_shift_of(int32_t page_size) {
  if (page_size <= 0 || (page_size & (page_size - 1)) != 0) return -1;
  int32_t s = 0;
  while ((1 << s) < page_size) ++s;
  return s;
}

}  // namespace pagellm::cuda::attn
