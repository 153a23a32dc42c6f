// Paged prefill attention, version 1: the first FlashAttention-2-style kernel, kept
// unchanged as a fallback and as the benchmark's baseline (PAGELLM_PREFILL_KERNEL=v1).
// 128 query rows x 32 keys per tile at D = 128 (64 x 64 for short queries, 128 x 64 at
// D = 64), 4 warps, Q re-read from shared memory every tile, 3-stage K/V ring; measured at
// 210 TFLOP/s on an H200 (4k causal, 32 heads). The current kernel and its design notes are
// in attention_prefill.cu; this file differs from that design only in tile shapes, the
// grid order (tile index fastest) and instruction-level details.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "pagellm/common/check.h"
#include "pagellm/cuda/attention.h"
#include "pagellm/cuda/attention_common.cuh"
#include "pagellm/cuda/cuda_check.h"

namespace pagellm::cuda {
namespace attn {
namespace v1 {
namespace {

template <int D, int BM, int BN>
struct PrefillShape {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerWarp = BM / kWarps;
  static constexpr int kMTiles = kRowsPerWarp / 16;  // m16 tiles per warp
  static constexpr int kChunks = D / 8;              // 16-byte chunks per row
  static constexpr int kNTiles = BN / 8;             // n8 tiles of S per m16 tile
  static constexpr int kDTiles = D / 8;              // n8 tiles of O per m16 tile
  static constexpr int kStages = 3;  // K/V ring: one barrier per tile, two tiles ahead
  static constexpr int kQElems = BM * D;
  static constexpr int kKVElems = BN * D;
  static constexpr int kSmemBytes = (kQElems + kStages * 2 * kKVElems) * 2;
  // K/V copies: warp w copies rows (w % kRowBlocks) * 16 + lane % 16, chunks
  // lane / 16 + 2 (w / kRowBlocks) + 2 kWarpsPerRowBlock c: one page-table read per thread
  // and tile, whole 32-byte sectors per load instruction, conflict-free swizzled stores.
  static constexpr int kRowBlocks = BN / 16;
  static constexpr int kWarpsPerRowBlock = kWarps / kRowBlocks;
  static constexpr int kKVChunksPerThread = kChunks / (2 * kWarpsPerRowBlock);
  static constexpr int kQChunksPerThread = BM * kChunks / kThreads;
  static_assert(kRowsPerWarp % 16 == 0, "a warp owns whole m16 tiles");
  static_assert(BN % 16 == 0 && D % 16 == 0, "mma k-steps are 16 wide");
  static_assert(kChunks >= 8, "the swizzle permutes 8 chunks");
  static_assert(kWarps % kRowBlocks == 0 && kChunks % (2 * kWarpsPerRowBlock) == 0,
                "even K/V copies");
  static_assert((BM * kChunks) % kThreads == 0, "even Q copies");
};

struct PrefillArgs {
  PagedAttentionParams p;
  int32_t page_shift;  // log2(page_size) or -1
  float scale_log2;    // scale * log2(e)
};

/// Finds which sequence query tile `tile` belongs to, counting ceil(q_b / bm) tiles per
/// sequence in order. Every lane of the warp gets the same answer. False when `tile` is
/// past the last one (a surplus CTA of the upper-bound grid).
__device__ bool find_query_tile(const PagedAttentionParams& p, int tile, int bm, int& seq,
                                int& local, int& count) {
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

template <int D, int BM, int BN>
__global__ void __launch_bounds__(PrefillShape<D, BM, BN>::kThreads)
    prefill_kernel(const __grid_constant__ PrefillArgs a) {
  using S = PrefillShape<D, BM, BN>;
  extern __shared__ __align__(128) unsigned char smem[];
  auto* q_smem = reinterpret_cast<__nv_bfloat16*>(smem);  // [BM][D], swizzled
  __nv_bfloat16* kv_smem = q_smem + S::kQElems;           // [stage][K|V][BN][D], swizzled

  const PagedAttentionParams& p = a.p;
  int b, local, count;
  if (!find_query_tile(p, blockIdx.x, BM, b, local, count)) return;
  const int m_tile = count - 1 - local;  // heavy (late) tiles first
  const SeqInfo seq = load_seq_info(p, b);
  const int head = blockIdx.y;
  const int kv_head = head / (p.num_q_heads / p.num_kv_heads);
  const int m0 = m_tile * BM;
  const int rows = min(BM, seq.q_len - m0);  // valid query rows of this tile, >= 1
  const int shift = seq.kv_len - seq.q_len;  // query i sits at position shift + i
  const int key_last = min(seq.kv_len - 1, shift + m0 + rows - 1);
  const int n_kv_tiles = key_last >= 0 ? key_last / BN + 1 : 0;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  auto* out = static_cast<__nv_bfloat16*>(p.out);
  const int64_t out_row0 = static_cast<int64_t>(seq.q_begin + m0) * p.num_q_heads + head;

  if (n_kv_tiles == 0) {  // no query row of this tile sees a key: zeros
    for (int idx = tid; idx < rows * S::kChunks; idx += S::kThreads) {
      const int r = idx / S::kChunks;
      const int c = idx % S::kChunks;
      *reinterpret_cast<uint4*>(out + (out_row0 + static_cast<int64_t>(r) * p.num_q_heads) * D +
                                c * 8) = make_uint4(0, 0, 0, 0);
    }
    return;
  }

  // ---- async loads ------------------------------------------------------------------
  const auto* qp = static_cast<const __nv_bfloat16*>(p.q);
#pragma unroll
  for (int c = 0; c < S::kQChunksPerThread; ++c) {
    const int idx = tid + c * S::kThreads;
    const int r = idx / S::kChunks;
    const int ch = idx % S::kChunks;
    const bool valid = r < rows;
    const __nv_bfloat16* src =
        valid ? qp + (out_row0 + static_cast<int64_t>(r) * p.num_q_heads) * D + ch * 8 : qp;
    cp_async_16(smem_addr(q_smem + swizzle<D>(r, ch)), src, valid);
  }
  const int32_t* page_row = p.page_table + static_cast<int64_t>(b) * p.max_pages_per_seq;
  const auto* k_pool = static_cast<const __nv_bfloat16*>(p.k_pool);
  const auto* v_pool = static_cast<const __nv_bfloat16*>(p.v_pool);
  // Gathers K/V tile `t` (keys t*BN ..) into `stage`; keys >= kv_len are zero-filled.
  auto issue_kv = [&](int t, int stage) {
    const int row = (warp % S::kRowBlocks) * 16 + (lane & 15);
    const int chunk0 = (lane >> 4) + 2 * (warp / S::kRowBlocks);
    const int pos = t * BN + row;
    const bool valid = pos < seq.kv_len;
    const int64_t off =
        valid ? kv_row_offset(page_row, pos, p.page_size, a.page_shift, p.num_kv_heads, kv_head, D)
              : 0;
    // off = 0 when invalid: the address stays inside the pool and is never read.
    const __nv_bfloat16* k_src = k_pool + off + chunk0 * 8;
    const __nv_bfloat16* v_src = v_pool + off + chunk0 * 8;
    const uint32_t ks = smem_addr(kv_smem + stage * 2 * S::kKVElems);
    const uint32_t vs = ks + S::kKVElems * 2;
#pragma unroll
    for (int c = 0; c < S::kKVChunksPerThread; ++c) {
      const int step = 2 * S::kWarpsPerRowBlock * c;  // chunks past chunk0
      const uint32_t dst = swizzle<D>(row, chunk0 + step) * 2;
      cp_async_16(ks + dst, k_src + step * 8, valid);
      cp_async_16(vs + dst, v_src + step * 8, valid);
    }
  };
  issue_kv(0, 0);
  cp_async_commit();  // group 0: Q and tile 0
  if (n_kv_tiles > 1) issue_kv(1, 1);
  cp_async_commit();  // group 1: tile 1 (maybe empty)

  // ---- per-thread fragment coordinates -----------------------------------------------
  const int g = lane / 4;   // row within an m16 tile (and +8)
  const int t4 = lane % 4;  // column pair within an n8 tile
  const int r7 = lane & 7;  // row % 8 of every ldmatrix row this lane addresses
  // ldmatrix row addresses (bytes, before the chunk term): Q rows warp*R + mt*16 + lane%16,
  // K rows np*16 + lane%8 + (lane/16)*8, V rows kk*16 + lane%8 + ((lane/8)%2)*8.
  const uint32_t q_base = smem_addr(q_smem) + (warp * S::kRowsPerWarp + (lane & 15)) * D * 2;
  const int q_chunk_hi = lane >> 4;
  const int k_row = (lane & 7) + ((lane >> 4) << 3);
  const int k_chunk_hi = (lane >> 3) & 1;
  const int v_row = (lane & 7) + (((lane >> 3) & 1) << 3);
  const int v_chunk_hi = lane >> 4;

  float o[S::kMTiles][S::kDTiles][4];
  float row_max[S::kMTiles][2];
  float row_sum[S::kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < S::kMTiles; ++mt) {
#pragma unroll
    for (int dt = 0; dt < S::kDTiles; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.0f;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_max[mt][h] = -INFINITY;
      row_sum[mt][h] = 0.0f;
    }
  }
  // Smallest position among this tile's query rows: KV tiles ending at or before it need
  // no causal mask.
  const int pos_first = shift + m0;

  for (int it = 0; it < n_kv_tiles; ++it) {
    cp_async_wait<1>();  // groups 0..it (Q and tile `it`) have landed (this thread's part)
    __syncthreads();     // ... every thread's part, and every warp is done with tile it-1
    // Tile it+2 goes into the stage that held tile it-1 (group it+2, maybe empty).
    if (it + 2 < n_kv_tiles) issue_kv(it + 2, (it + 2) % S::kStages);
    cp_async_commit();

    const uint32_t k_base = smem_addr(kv_smem + (it % S::kStages) * 2 * S::kKVElems);
    const uint32_t v_base = k_base + S::kKVElems * 2;
    const int n0 = it * BN;

    // S = Q Kᵀ
    float s[S::kMTiles][S::kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < S::kMTiles; ++mt) {
#pragma unroll
      for (int j = 0; j < S::kNTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][j][e] = 0.0f;
      }
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[S::kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < S::kMTiles; ++mt) {
        ldmatrix_x4(qa[mt], q_base + mt * 16 * D * 2 + (((kk * 2 + q_chunk_hi) ^ r7) << 4));
      }
#pragma unroll
      for (int np = 0; np < S::kNTiles / 2; ++np) {
        uint32_t kb[4];
        ldmatrix_x4(kb, k_base + (np * 16 + k_row) * D * 2 + (((kk * 2 + k_chunk_hi) ^ r7) << 4));
#pragma unroll
        for (int mt = 0; mt < S::kMTiles; ++mt) {
          mma_bf16_16816(s[mt][2 * np], qa[mt], kb[0], kb[1]);
          mma_bf16_16816(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }

    // Causal mask (and the end of the sequence) on the tiles that straddle it.
    if (n0 + BN - 1 > pos_first || n0 + BN > seq.kv_len) {
#pragma unroll
      for (int mt = 0; mt < S::kMTiles; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = warp * S::kRowsPerWarp + mt * 16 + g + h * 8;
          const int limit = min(pos_first + r, seq.kv_len - 1) - n0;  // last visible key
#pragma unroll
          for (int j = 0; j < S::kNTiles; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              if (j * 8 + t4 * 2 + e > limit) s[mt][j][h * 2 + e] = -INFINITY;
            }
          }
        }
      }
    }

    // Online softmax; each row lives in one quad (4 lanes). O is rescaled only when some
    // row of the warp raised its running max (alpha == 1 exactly otherwise).
    float alpha[S::kMTiles][2];
    bool max_changed = false;
#pragma unroll
    for (int mt = 0; mt < S::kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < S::kNTiles; ++j)
          mx = fmaxf(mx, fmaxf(s[mt][j][h * 2], s[mt][j][h * 2 + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float new_max = fmaxf(row_max[mt][h], mx * a.scale_log2);
        const float base = new_max == -INFINITY ? 0.0f : new_max;
        alpha[mt][h] = fast_exp2(row_max[mt][h] - base);
        max_changed |= new_max != row_max[mt][h];
        row_max[mt][h] = new_max;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < S::kNTiles; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pr = fast_exp2(fmaf(s[mt][j][h * 2 + e], a.scale_log2, -base));
            s[mt][j][h * 2 + e] = pr;
            sum += pr;
          }
        }
        row_sum[mt][h] = row_sum[mt][h] * alpha[mt][h] + sum;
      }
    }
    if (__any_sync(0xffffffffu, max_changed)) {
#pragma unroll
      for (int mt = 0; mt < S::kMTiles; ++mt) {
#pragma unroll
        for (int dt = 0; dt < S::kDTiles; ++dt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[mt][dt][e] *= alpha[mt][e / 2];
        }
      }
    }

    // O += P V; P's accumulator fragments of n-tiles 2kk, 2kk+1 form the A fragment of k-step kk.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t pa[S::kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < S::kMTiles; ++mt) {
        pa[mt][0] = pack_bf16x2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = pack_bf16x2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = pack_bf16x2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = pack_bf16x2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb,
                          v_base + (kk * 16 + v_row) * D * 2 + (((dp * 2 + v_chunk_hi) ^ r7) << 4));
#pragma unroll
        for (int mt = 0; mt < S::kMTiles; ++mt) {
          mma_bf16_16816(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
          mma_bf16_16816(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
  }
  cp_async_wait<0>();

  // ---- normalise and store ----------------------------------------------------------
#pragma unroll
  for (int mt = 0; mt < S::kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = row_sum[mt][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int r = warp * S::kRowsPerWarp + mt * 16 + g + h * 8;
      if (r < rows) {
        __nv_bfloat16* dst =
            out + (out_row0 + static_cast<int64_t>(r) * p.num_q_heads) * D + t4 * 2;
#pragma unroll
        for (int dt = 0; dt < S::kDTiles; ++dt) {
          *reinterpret_cast<uint32_t*>(dst + dt * 8) =
              pack_bf16x2(o[mt][dt][h * 2] * inv, o[mt][dt][h * 2 + 1] * inv);
        }
      }
    }
  }
}

template <int D, int BM, int BN>
void launch_prefill(const PrefillArgs& args, cudaStream_t stream) {
  using S = PrefillShape<D, BM, BN>;
  static const bool smem_set = [] {
    PAGELLM_CUDA_CHECK(cudaFuncSetAttribute(
        prefill_kernel<D, BM, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes));
    return true;
  }();
  (void)smem_set;
  const PagedAttentionParams& p = args.p;
  const int64_t tiles = (static_cast<int64_t>(p.num_tokens) + BM - 1) / BM + p.num_seqs;
  PAGELLM_CHECK(tiles <= 0x7fffffff) << "paged_prefill_attention: too many query tiles";
  const dim3 grid(static_cast<unsigned>(tiles), p.num_q_heads, 1);
  prefill_kernel<D, BM, BN><<<grid, S::kThreads, S::kSmemBytes, stream>>>(args);
  PAGELLM_CUDA_CHECK_LAUNCH();
}

}  // namespace

/// Runs version 1 on validated params with num_seqs, num_tokens > 0.
void launch_prefill_v1(const PagedAttentionParams& p, cudaStream_t stream) {
  PrefillArgs args{};
  args.p = p;
  args.page_shift = page_shift_of(p.page_size);
  args.scale_log2 = p.scale * kLog2e;
  // The tile height only changes speed: the grid covers every tile whatever max_query_len says.
  const bool short_queries = p.max_query_len > 0 && p.max_query_len <= 64;
  if (p.head_dim == 128) {
    if (short_queries) {
      launch_prefill<128, 64, 64>(args, stream);
    } else {
      launch_prefill<128, 128, 32>(args, stream);
    }
  } else {
    if (short_queries) {
      launch_prefill<64, 64, 64>(args, stream);
    } else {
      launch_prefill<64, 128, 64>(args, stream);
    }
  }
}

}  // namespace v1
}  // namespace attn
}  // namespace pagellm::cuda
