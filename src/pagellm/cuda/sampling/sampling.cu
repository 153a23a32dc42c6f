// GPU sampler: one cluster of 8 CTAs (512 threads each) per logits row, reproducing
// sampling/sampler.cpp.
//
// Why one CTA per row: a row is V = 151,936 floats (600 KB), every step of the algorithm
// is a reduction over the row followed by a decision that depends on it, and rows are
// independent; a CTA gives block-wide barriers for free and the rows of a batch run on
// different SMs in parallel. Each full-row pass streams 600 KB from L2 (the logits were
// just written by the lm_head matmul), ~3-5 µs per pass. The first pass, which every row
// needs (greedy rows need nothing else), is shared by the 8 CTAs of a cluster: each reduces
// an eighth of the row and they merge through distributed shared memory, so a W1 batch of
// 32 rows runs that pass on 256 CTAs instead of 32 (sample kernel 33 µs per step before,
// H200). Rank 0 then does the rest of the row alone; the other seven exit. A plain row
// (temperature sampling, no penalties, top-k or top-p) is the exception: its kept set needs
// no further pass (min-p's threshold comes from the maximum), so every CTA races its own
// slice and rank 0 merges the eight winners (cluster_plain_race).
//
// Passes, for a typical Qwen3 request (temperature 0.6, top_k 20, top_p 0.95):
//   1.   raw max/argmax and sum of exp (raw log-probabilities), one pass;
//   3.   processed max x_max (x = logit / temperature, computed on the fly);
//   4.   histogram of token counts by distance below x_max (1/8-nat bins);
//   5.   gather the few bins holding the top k into shared memory, bitonic-sort them
//        (value descending, id ascending, like the host), then top-k / top-p / min-p
//        thresholds, the normaliser and the Gumbel race all run on the candidates.
// Top-p without top-k does the same with a probability-mass histogram. When candidates do
// not fit in shared memory (k > 2048, or a flat distribution under top-p), exact
// bisection over the float bit patterns finds the same thresholds in <= 32 passes each.
// With no filter at all the race runs over the whole row, skipping any token whose random
// bits prove it cannot beat the best score its thread has seen, the most likely token's at
// first (the host's pruning table).
//
// Penalties need a modified copy of the row: rows with penalties get a scratch row
// (sanitised logits, penalties applied in place by the CTA, then divided by temperature).
// The penalty of a logit, the penalty lists and the race's pruning are the host sampler's
// own rules (sampling/rules.h), not copies of them.
//
// Roofline: every pass is an L2 read of the row (600 KB, ~3-5 µs at L2 bandwidth per
// SM-limited CTA); the typical request above needs passes 1, 3 and 4 plus the candidates'
// work in shared memory, so a step's sampling is bound by the number of passes and their
// barriers, not by HBM (the logits never leave L2).
//
// Arithmetic that decides a token is done exactly as on the host: exp_nonpositive with
// round-to-nearest intrinsics (no FMA contraction), sums of probabilities in double, in
// the host's order wherever the host's order is sorted order.
//
// PDL (pdl.cuh): a CTA waits (pdl_wait) for the kernel that wrote the logits before it reads
// anything, then lets the next kernel launch at once (it is the last kernel of a step).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include <cooperative_groups.h>

#include "pagellm/common/random.h"
#include "pagellm/cuda/support/cuda_check.h"
#include "pagellm/cuda/support/pdl.cuh"
#include "pagellm/cuda/sampling/sampling.h"

namespace pagellm::cuda {
namespace {

constexpr int kThreads = 512;
// CTAs (one cluster) that share the raw-statistics pass over a row; 8 is the portable
// cluster size.
constexpr int kSampleClusterSize = 8;
constexpr int kWarps = kThreads / 32;
constexpr int kCandidateCap = 2048;  // power of two (bitonic sort)
constexpr int kBins = 256;
constexpr float kBinsPerNat = 8.0f;
constexpr double kThresholdSlack = 1e-6;  // the host's top-p / min-p slack
constexpr unsigned kFullMask = 0xffffffffu;

struct SharedState {
  float cand_value[kCandidateCap];
  int32_t cand_id[kCandidateCap];
  float cand_exp[kCandidateCap];
  int32_t hist_count[kBins];
  float hist_mass[kBins];
  uint64_t prune[kPruneTableSize];
  double reduce_d[kWarps];
  float reduce_f[kWarps];
  int32_t reduce_i[kWarps];
  int32_t num_candidates;
  int32_t selected_bin;
  int32_t found;
  float tau;
  double total;
  // This CTA's slice of the raw statistics (cluster_raw_stats).
  float slice_max;
  int32_t slice_id;
  double slice_sum;
  // This CTA's slice of a plain row's race (cluster_plain_race).
  double race_best;
  int32_t race_id;
  double race_sum;
};

// ---- scalar helpers (bit-identical to the host sampler) ----------------------------------

__device__ __forceinline__ float sanitize(float x) {
  return x != x ? -INFINITY : fminf(x, FLT_MAX);
}

// The host's exp_nonpositive, operation for operation, with explicit round-to-nearest
// intrinsics so that nvcc cannot fuse multiply-adds (the host build has no FMA).
__device__ float exp_nonpositive(float x) {
  const bool underflow = !(x >= -87.0f);
  const float xc = underflow ? -87.0f : x;
  const float t = __fmul_rn(xc, 1.44269504088896341f);
  const int n = static_cast<int>(__fsub_rn(t, 0.5f));
  const float nf = static_cast<float>(n);
  const float r = __fsub_rn(__fsub_rn(xc, __fmul_rn(nf, 0.693359375f)),
                            __fmul_rn(nf, -2.12194440e-4f));
  float p = 1.0f / 5040.0f;
  p = __fadd_rn(__fmul_rn(p, r), 1.0f / 720.0f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f / 120.0f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f / 24.0f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f / 6.0f);
  p = __fadd_rn(__fmul_rn(p, r), 0.5f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f);
  const float scale = __uint_as_float(static_cast<uint32_t>(n + 127) << 23);
  return underflow ? 0.0f : __fmul_rn(p, scale);
}

// Order-preserving map of non-NaN floats to uint32 (-0 and +0 map to the same key, as they
// compare equal).
__device__ __forceinline__ uint32_t float_key(float f) {
  const uint32_t u = f == 0.0f ? 0u : __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_float(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ int histogram_bin(float d) {
  return d < (kBins - 1) / kBinsPerNat ? static_cast<int>(d * kBinsPerNat) : kBins - 1;
}

// a before b: larger value first, then lower id (float logits or double race scores).
template <class T>
__device__ __forceinline__ bool before(T av, int32_t ai, T bv, int32_t bi) {
  return av > bv || (av == bv && ai < bi);
}

// ---- block reductions (every thread gets the same result) ---------------------------------

__device__ double block_sum(double v, SharedState& s) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  if (threadIdx.x % 32 == 0) s.reduce_d[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kWarps; ++w) total += s.reduce_d[w];
  __syncthreads();
  return total;
}

__device__ int32_t block_sum(int32_t v, SharedState& s) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  if (threadIdx.x % 32 == 0) s.reduce_i[threadIdx.x / 32] = v;
  __syncthreads();
  int32_t total = 0;
  for (int w = 0; w < kWarps; ++w) total += s.reduce_i[w];
  __syncthreads();
  return total;
}

// (largest value, lowest id among equals) in float (logits) or double (race scores).
// Threads with nothing pass (-inf, INT32_MAX).
template <class T>
struct Best {
  T value;
  int32_t id;
};
using ArgMax = Best<float>;
using ArgMaxD = Best<double>;

template <class T>
__device__ __forceinline__ T* reduce_values(SharedState& s) {
  if constexpr (sizeof(T) == sizeof(double)) {
    return s.reduce_d;
  } else {
    return s.reduce_f;
  }
}

template <class T>
__device__ Best<T> block_argmax(Best<T> a, SharedState& s) {
  for (int o = 16; o > 0; o >>= 1) {
    const T v = __shfl_xor_sync(kFullMask, a.value, o);
    const int32_t i = __shfl_xor_sync(kFullMask, a.id, o);
    if (before(v, i, a.value, a.id)) a = {v, i};
  }
  T* values = reduce_values<T>(s);
  if (threadIdx.x % 32 == 0) {
    values[threadIdx.x / 32] = a.value;
    s.reduce_i[threadIdx.x / 32] = a.id;
  }
  __syncthreads();
  Best<T> best{values[0], s.reduce_i[0]};
  for (int w = 1; w < kWarps; ++w) {
    if (before(values[w], s.reduce_i[w], best.value, best.id)) best = {values[w], s.reduce_i[w]};
  }
  __syncthreads();
  return best;
}

// ---- raw statistics of a row ----------------------------------------------------------------

// One pass over elements [begin, end) of a row of logits: this thread's (max, lowest
// argmax) of the sanitised values and, in `sum`, the sum of exp(v - max) over its elements
// (online: rescaled when the max rises). The pass is latency-bound, so it loads 16 bytes at
// a time, four loads in flight per thread (when row + begin is 16-byte aligned and the
// range a multiple of 4), and a row is shared by the CTAs of a cluster (sample_rows_kernel).
// The sum only feeds the reported log-probability, never a token decision, so it uses the
// fast exponential; block_argmax is order-independent (value, then id).
__device__ ArgMax thread_raw_stats(const float* __restrict__ row, int32_t begin, int32_t end,
                                   float& sum) {
  ArgMax best{-INFINITY, INT32_MAX};
  sum = 0.0f;
  auto visit = [&](float logit, int32_t i) {
    const float v = sanitize(logit);
    if (v > best.value) {
      sum = (best.value > -INFINITY ? sum * __expf(best.value - v) : 0.0f) + 1.0f;
      best = {v, i};
    } else {
      if (v == best.value && i < best.id) best.id = i;
      if (v > -INFINITY) sum += __expf(v - best.value);
    }
  };
  int32_t scalar_from = begin;
  if ((end - begin) % 4 == 0 && reinterpret_cast<uintptr_t>(row + begin) % 16 == 0) {
    const auto* row4 = reinterpret_cast<const float4*>(row + begin);
    const int32_t n4 = (end - begin) / 4;
    constexpr int kInFlight = 4;  // 16-byte loads per thread per iteration
    int32_t i = threadIdx.x;
    for (; i + (kInFlight - 1) * kThreads < n4; i += kInFlight * kThreads) {
      float4 v[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) v[u] = row4[i + u * kThreads];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int32_t j = begin + 4 * (i + u * kThreads);
        visit(v[u].x, j);
        visit(v[u].y, j + 1);
        visit(v[u].z, j + 2);
        visit(v[u].w, j + 3);
      }
    }
    for (; i < n4; i += kThreads) {
      const float4 a = row4[i];
      const int32_t j = begin + 4 * i;
      visit(a.x, j);
      visit(a.y, j + 1);
      visit(a.z, j + 2);
      visit(a.w, j + 3);
    }
    scalar_from = end;
  }
  for (int32_t i = scalar_from + threadIdx.x; i < end; i += kThreads) visit(row[i], i);
  return best;
}

// This CTA's place in its cluster and its slice [begin, end) of a row: boundaries on
// multiples of 4 elements (16-byte loads), the last slice taking the remainder.
struct ClusterSlice {
  cooperative_groups::cluster_group cluster;
  int ranks, rank;
  int32_t begin, end;
  __device__ __forceinline__ explicit ClusterSlice(int32_t vocab)
      : cluster(cooperative_groups::this_cluster()),
        ranks(static_cast<int>(cluster.num_blocks())),
        rank(static_cast<int>(cluster.block_rank())) {
    const int32_t quads = vocab / 4;
    begin = 4 * static_cast<int32_t>(int64_t{quads} * rank / ranks);
    end = rank == ranks - 1 ? vocab
                            : 4 * static_cast<int32_t>(int64_t{quads} * (rank + 1) / ranks);
  }
};

// The raw statistics of row r, computed by the `ranks` CTAs of this cluster together: each
// reduces a quarter-aligned slice of the row, then every CTA merges the slices' (max,
// argmax, sum relative to the slice max) through distributed shared memory in rank order.
// Returns (max, lowest argmax) and sets log_sum = log(sum exp(v - max)). Every CTA of the
// cluster must call it; afterwards only rank 0 goes on (the others may exit).
__device__ ArgMax cluster_raw_stats(const float* __restrict__ row, int32_t vocab, SharedState& s,
                                    double& log_sum) {
  ClusterSlice cs(vocab);
  cooperative_groups::cluster_group& cluster = cs.cluster;
  const int ranks = cs.ranks;
  const int32_t begin = cs.begin, end = cs.end;
  float thread_sum = 0.0f;
  const ArgMax mine = thread_raw_stats(row, begin, end, thread_sum);
  const ArgMax slice = block_argmax(mine, s);
  const double slice_sum = block_sum(
      mine.value > -INFINITY && slice.value > -INFINITY
          ? double(thread_sum) * exp(double(mine.value) - double(slice.value))
          : 0.0,
      s);
  if (threadIdx.x == 0) {
    s.slice_max = slice.value;
    s.slice_id = slice.id;
    s.slice_sum = slice_sum;
  }
  cluster.sync();  // every slice is published
  ArgMax best{-INFINITY, INT32_MAX};
  float maxes[kSampleClusterSize];
  double sums[kSampleClusterSize];
#pragma unroll
  for (int q = 0; q < kSampleClusterSize; ++q) {
    if (q >= ranks) break;
    SharedState* other = cluster.map_shared_rank(&s, q);
    maxes[q] = other->slice_max;
    sums[q] = other->slice_sum;
    if (before(other->slice_max, other->slice_id, best.value, best.id)) {
      best = {other->slice_max, other->slice_id};
    }
  }
  cluster.sync();  // no CTA leaves while another may still read its slice
  double total = 0.0;
#pragma unroll
  for (int q = 0; q < kSampleClusterSize; ++q) {
    if (q >= ranks) break;
    if (maxes[q] > -INFINITY) total += sums[q] * exp(double(maxes[q]) - double(best.value));
  }
  log_sum = log(total);
  return best;
}

// ---- the processed row x[V] ----------------------------------------------------------------

// x[i]: the penalised, sanitised, tempered logit. Rows with penalties read their scratch
// row (already processed); the others compute x from the logits on the fly.
struct RowView {
  const float* logits;
  const float* scratch;  // null without penalties
  float temperature;
  int32_t vocab;

  __device__ float operator()(int32_t i) const {
    if (scratch != nullptr) return scratch[i];
    const float v = sanitize(logits[i]);
    return temperature != 1.0f ? fminf(v / temperature, FLT_MAX) : v;
  }
};

// Tokens in the set the filters work on: finite and >= lower.
__device__ __forceinline__ bool in_set(float x, float lower) { return x > -INFINITY && x >= lower; }

// Histogram of the set by distance below m; counts always, probability mass if asked.
// Leaves s.hist_* filled (bins 0 .. kBins-2; the last bin is not tracked).
__device__ void histogram(const RowView& x, float m, float lower, bool with_mass, SharedState& s) {
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    s.hist_count[b] = 0;
    s.hist_mass[b] = 0.0f;
  }
  __syncthreads();
  for (int32_t i = threadIdx.x; i < x.vocab; i += kThreads) {
    const float v = x(i);
    if (!in_set(v, lower)) continue;
    const int b = histogram_bin(m - v);
    if (b == kBins - 1) continue;
    atomicAdd(&s.hist_count[b], 1);
    if (with_mass) atomicAdd(&s.hist_mass[b], exp_nonpositive(v - m));
  }
  __syncthreads();
}

// Gathers the set's tokens of bins <= last_bin into the candidate arrays and sorts them
// (value descending, id ascending). Returns their number (<= kCandidateCap by the
// caller's choice of last_bin).
__device__ int gather_and_sort(const RowView& x, float m, float lower, int last_bin,
                               SharedState& s) {
  if (threadIdx.x == 0) s.num_candidates = 0;
  __syncthreads();
  const int lane = threadIdx.x % 32;
  for (int32_t base = 0; base < x.vocab; base += kThreads) {
    const int32_t i = base + threadIdx.x;
    float v = -INFINITY;
    bool take = false;
    if (i < x.vocab) {
      v = x(i);
      take = in_set(v, lower) && histogram_bin(m - v) <= last_bin;
    }
    const unsigned mask = __ballot_sync(kFullMask, take);
    if (mask == 0) continue;
    const int leader = __ffs(mask) - 1;
    int slot = 0;
    if (lane == leader) slot = atomicAdd(&s.num_candidates, __popc(mask));
    slot = __shfl_sync(kFullMask, slot, leader) + __popc(mask & ((1u << lane) - 1u));
    if (take && slot < kCandidateCap) {
      s.cand_value[slot] = v;
      s.cand_id[slot] = i;
    }
  }
  __syncthreads();
  const int n = min(s.num_candidates, kCandidateCap);
  int padded = 1;
  while (padded < n) padded <<= 1;
  for (int j = n + threadIdx.x; j < padded; j += kThreads) {
    s.cand_value[j] = -INFINITY;
    s.cand_id[j] = INT32_MAX;
  }
  __syncthreads();
  // Bitonic sort into "before" order.
  for (int k = 2; k <= padded; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < padded; i += kThreads) {
        const int partner = i ^ j;
        if (partner <= i) continue;
        const float av = s.cand_value[i], bv = s.cand_value[partner];
        const int32_t ai = s.cand_id[i], bi = s.cand_id[partner];
        const bool ascending = (i & k) == 0;
        const bool swap = ascending ? before(bv, bi, av, ai) : before(av, ai, bv, bi);
        if (swap) {
          s.cand_value[i] = bv;
          s.cand_id[i] = bi;
          s.cand_value[partner] = av;
          s.cand_id[partner] = ai;
        }
      }
      __syncthreads();
    }
  }
  return n;
}

__device__ void candidate_exps(int n, float m, SharedState& s) {
  for (int j = threadIdx.x; j < n; j += kThreads) s.cand_exp[j] = exp_nonpositive(s.cand_value[j] - m);
  __syncthreads();
}

// The k-th largest value of x over all V tokens (-inf values included), k < V, by
// bisection over float keys: the largest key K with count(key >= K) >= k.
__device__ float bisect_kth(const RowView& x, float m, int32_t k, SharedState& s) {
  uint32_t lo = float_key(-INFINITY), hi = float_key(m);
  while (lo < hi) {
    const uint32_t mid = lo + static_cast<uint32_t>((uint64_t{hi} - lo + 1) / 2);
    int32_t count = 0;
    for (int32_t i = threadIdx.x; i < x.vocab; i += kThreads) count += float_key(x(i)) >= mid;
    if (block_sum(count, s) >= k) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return key_float(lo);
}

// Probability mass (relative to m) of the set's tokens with key >= K.
__device__ double mass_at_least(const RowView& x, float m, float lower, uint32_t key_min,
                                SharedState& s) {
  double sum = 0.0;
  for (int32_t i = threadIdx.x; i < x.vocab; i += kThreads) {
    const float v = x(i);
    if (in_set(v, lower) && float_key(v) >= key_min) sum += exp_nonpositive(v - m);
  }
  return block_sum(sum, s);
}

// Top-p threshold over the set by bisection: the largest key K with mass(key >= K) >=
// target, where target < mass of the whole set.
__device__ float bisect_top_p(const RowView& x, float m, float lower, double target,
                              SharedState& s) {
  uint32_t lo = float_key(-FLT_MAX), hi = float_key(m);
  while (lo < hi) {
    const uint32_t mid = lo + static_cast<uint32_t>((uint64_t{hi} - lo + 1) / 2);
    if (mass_at_least(x, m, lower, mid, s) >= target) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return key_float(lo);
}

__device__ __forceinline__ void consider(double score, int32_t id, ArgMaxD& best) {
  if (score > best.value || (score == best.value && id < best.id)) best = {score, id};
}

// This thread's share of the normaliser over tokens [begin, end): the sum of exp(x - m) over
// the kept ones (finite, x >= threshold).
__device__ double normaliser_part(const RowView& x, int32_t begin, int32_t end, float m,
                                  double threshold) {
  double sum = 0.0;
  for (int32_t i = begin + static_cast<int32_t>(threadIdx.x); i < end; i += kThreads) {
    const float v = x(i);
    if (v > -INFINITY && double(v) >= threshold) sum += exp_nonpositive(v - m);
  }
  return sum;
}

// This thread's share of the Gumbel race over the kept tokens of [begin, end): the best
// (score, lowest id). A token that cannot beat the best score seen (this thread's, or best0,
// a real token's score) is skipped without logarithms, and without its random bits when it
// is out of reach: pruning drops only tokens that cannot win, so the token is the race's.
__device__ ArgMaxD race_part(const RowView& x, int32_t begin, int32_t end, double threshold,
                             double best0, uint64_t key, const uint64_t* prune) {
  ArgMaxD best{-INFINITY, INT32_MAX};
  for (int32_t i = begin + static_cast<int32_t>(threadIdx.x); i < end; i += kThreads) {
    const float v = x(i);
    if (!(v > -INFINITY) || double(v) < threshold) continue;
    const double gap = fmax(best0, best.value) - double(v);
    if (race_out_of_reach(gap)) continue;
    const uint64_t bits = sampling_bits(key, static_cast<uint32_t>(i));
    if (race_pruned(gap, bits, prune)) continue;
    consider(double(v) + gumbel_from_bits(bits), i, best);
  }
  return best;
}

// Whether a row is plain temperature sampling: no penalties, top-k or top-p (min-p only sets
// a threshold from the maximum). Such a row's kept set and race need no decision from a
// pass over the row, so every CTA of its cluster races its own slice (cluster_plain_race).
__device__ __forceinline__ bool plain_race_row(const GpuSamplingRow& p, int32_t vocab) {
  return (p.flags & (kSampleGreedy | kSamplePenalties)) == 0 &&
         !(p.top_k > 0 && p.top_k < vocab) && !(p.top_p < 1.0f);
}

// The Gumbel race of a plain row over the cluster: each CTA races its ClusterSlice (and
// sums its part of the normaliser, when asked), and rank 0 merges the slices' winners
// (score, then lowest id: the order a single CTA uses) and sums, and writes the result. The processed maximum needs no pass: x is non-decreasing in the
// sanitised logit, so x(raw argmax) is the maximum of x. A token is skipped, before its
// random bits where it can, when it cannot beat the best score its thread has seen (the
// raw argmax's at first): the pruning only drops tokens that cannot win, so the token is
// the single-CTA race's. Every CTA of the cluster must call it.
__device__ void cluster_plain_race(const GpuSamplingRow& p, const float* __restrict__ row_logits,
                                   int32_t vocab, const ArgMax& raw, double raw_log_sum,
                                   SharedState& s, const uint64_t* __restrict__ prune_table,
                                   GpuSampledToken* out, int32_t r) {
  ClusterSlice cs(vocab);
  cooperative_groups::cluster_group& cluster = cs.cluster;
  const int ranks = cs.ranks, rank = cs.rank;
  const int32_t begin = cs.begin, end = cs.end;
  for (int j = threadIdx.x; j < kPruneTableSize; j += kThreads) s.prune[j] = prune_table[j];
  const RowView x{row_logits, nullptr, p.temperature, vocab};
  const float m = x(raw.id);
  const double threshold =
      p.min_p > 0.0f ? double(m) + log(double(p.min_p)) - kThresholdSlack : -INFINITY;
  const bool want_normalizer = (p.flags & kSampleProcessedLogprobs) != 0;
  // Its barriers also publish s.prune.
  const double slice_sum =
      block_sum(want_normalizer ? normaliser_part(x, begin, end, m, threshold) : 0.0, s);
  const uint64_t key = p.stream_key;
  const double best0 =
      double(m) + gumbel_from_bits(sampling_bits(key, static_cast<uint32_t>(raw.id)));
  const ArgMaxD best =
      block_argmax(race_part(x, begin, end, threshold, best0, key, s.prune), s);
  if (threadIdx.x == 0) {
    s.race_best = best.value;
    s.race_id = best.id;
    s.race_sum = slice_sum;
  }
  cluster.sync();  // every slice is published
  if (rank == 0 && threadIdx.x == 0) {
    ArgMaxD winner{-INFINITY, INT32_MAX};
    double total = 0.0;
    for (int q = 0; q < ranks; ++q) {
      const SharedState* other = cluster.map_shared_rank(&s, q);
      if (before(other->race_best, other->race_id, winner.value, winner.id)) {
        winner = {other->race_best, other->race_id};
      }
      total += other->race_sum;
    }
    GpuSampledToken result;
    result.token = winner.id;
    result.logprob = static_cast<float>(double(sanitize(row_logits[winner.id])) - raw.value -
                                        raw_log_sum);
    result.processed_logprob =
        want_normalizer ? static_cast<float>(double(x(winner.id)) - m - log(total)) : 0.0f;
    out[r] = result;
  }
  cluster.sync();  // no CTA leaves while rank 0 may still read its slice
}

__global__ void __launch_bounds__(kThreads)
    sample_rows_kernel(const float* __restrict__ logits, int32_t vocab,
                       const GpuSamplingRow* __restrict__ rows,
                       const GpuPenaltyEntry* __restrict__ penalties, float* scratch,
                       const uint64_t* __restrict__ prune_table, GpuSampledToken* out) {
  __shared__ SharedState s;
  pdl_wait();  // the logits come from the kernel before
  pdl_launch_dependents();
  const int32_t r = blockIdx.x;
  const GpuSamplingRow p = rows[r];
  const float* row_logits = logits + static_cast<int64_t>(r) * vocab;
  GpuSampledToken result;

  // ---- raw statistics: max, lowest argmax, log-sum-exp of the unmodified logits --------
  // Shared by the cluster's CTAs; the rest of the row's work is rank 0's alone.
  double raw_log_sum = 0.0;
  const ArgMax raw = cluster_raw_stats(row_logits, vocab, s, raw_log_sum);
  // Every CTA of the cluster sees the same raw statistics and parameters, so all of them
  // agree on whether they race together.
  // (A row whose tempered maximum overflows to -inf takes the single-CTA path's error.)
  const bool plain = raw.value > -INFINITY && plain_race_row(p, vocab) &&
                     RowView{row_logits, nullptr, p.temperature, vocab}(raw.id) > -INFINITY;
  if (plain) {
    cluster_plain_race(p, row_logits, vocab, raw, raw_log_sum, s, prune_table, out, r);
    return;
  }
  if (blockIdx.y != 0) return;
  if (!(raw.value > -INFINITY)) {
    if (threadIdx.x == 0) {
      result.status = kSampleNoFiniteLogit;
      out[r] = result;
    }
    return;
  }
  auto raw_logprob = [&](int32_t token) {
    return static_cast<float>(double(sanitize(row_logits[token])) - raw.value - raw_log_sum);
  };

  // ---- penalties, on a scratch copy ----------------------------------------------------
  const bool penalised = (p.flags & kSamplePenalties) != 0 && p.scratch_row >= 0;
  float* xs = penalised ? scratch + static_cast<int64_t>(p.scratch_row) * vocab : nullptr;
  if (penalised) {
    for (int32_t i = threadIdx.x; i < vocab; i += kThreads) xs[i] = sanitize(row_logits[i]);
    __syncthreads();
    for (int32_t e = threadIdx.x; e < p.penalty_count; e += kThreads) {
      const GpuPenaltyEntry entry = penalties[p.penalty_begin + e];
      // The host sampler's rule (sampling/rules.h).
      const float v = penalised_logit(xs[entry.token], p.repetition_penalty,
                                      p.frequency_penalty, p.presence_penalty,
                                      entry.output_count);
      xs[entry.token] = sanitize(v);
    }
    __syncthreads();
  }

  // ---- greedy -----------------------------------------------------------------------------
  if (p.flags & kSampleGreedy) {
    int32_t token = raw.id;
    if (penalised) {
      ArgMax best{-INFINITY, INT32_MAX};
      for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
        if (before(xs[i], i, best.value, best.id)) best = {xs[i], i};
      }
      best = block_argmax(best, s);
      if (!(best.value > -INFINITY)) {
        if (threadIdx.x == 0) {
          result.status = kSampleNoFiniteAfterPenalties;
          out[r] = result;
        }
        return;
      }
      token = best.id;
    }
    if (threadIdx.x == 0) {
      result.token = token;
      result.logprob = raw_logprob(token);
      result.processed_logprob = 0.0f;
      out[r] = result;
    }
    return;
  }

  // ---- temperature, processed maximum ---------------------------------------------------
  if (penalised && p.temperature != 1.0f) {
    for (int32_t i = threadIdx.x; i < vocab; i += kThreads) xs[i] = fminf(xs[i] / p.temperature, FLT_MAX);
    __syncthreads();
  }
  const RowView x{row_logits, xs, p.temperature, vocab};
  for (int j = threadIdx.x; j < kPruneTableSize; j += kThreads) s.prune[j] = prune_table[j];
  ArgMax top{-INFINITY, INT32_MAX};
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = x(i);
    if (before(v, i, top.value, top.id)) top = {v, i};
  }
  top = block_argmax(top, s);  // its barriers also publish s.prune
  const float m = top.value;
  if (!(m > -INFINITY)) {
    if (threadIdx.x == 0) {
      result.status = penalised ? kSampleNoFiniteAfterPenalties : kSampleNoFiniteLogit;
      out[r] = result;
    }
    return;
  }

  // ---- filters ------------------------------------------------------------------------------
  // Either the candidates (sorted, in shared memory) hold every token of the kept set, or
  // the kept set is described by `threshold` over the whole row.
  double threshold = -INFINITY;
  float lower = -INFINITY;  // the set top-p works on: tokens >= lower (the top-k set)
  int num_candidates = -1;  // -1: no candidates
  bool exps_ready = false;
  const int32_t k = p.top_k > 0 && p.top_k < vocab ? p.top_k : 0;
  if (k > 0) {
    if (k <= kCandidateCap) {
      histogram(x, m, -INFINITY, false, s);
      if (threadIdx.x == 0) {
        int chosen = -1, cumulative = 0;
        for (int b = 0; b < kBins - 1; ++b) {
          cumulative += s.hist_count[b];
          if (cumulative >= k) {
            chosen = cumulative <= kCandidateCap ? b : -1;
            break;
          }
        }
        s.selected_bin = chosen;
      }
      __syncthreads();
      const int bin = s.selected_bin;
      if (bin >= 0) {
        const int n = gather_and_sort(x, m, -INFINITY, bin, s);
        const float kth = s.cand_value[k - 1];
        int32_t kept = 0;
        for (int j = threadIdx.x; j < n; j += kThreads) kept += s.cand_value[j] >= kth;
        num_candidates = block_sum(kept, s);  // the top-k set is a prefix of the sorted list
        lower = kth;
      }
    }
    if (num_candidates < 0) lower = bisect_kth(x, m, k, s);
    threshold = lower;
  }

  if (p.top_p < 1.0f) {
    if (num_candidates >= 0) {
      // Over the top-k candidates, in sorted order, exactly as the host sums them.
      candidate_exps(num_candidates, m, s);
      exps_ready = true;
      if (threadIdx.x == 0) {
        double total = 0.0;
        for (int j = 0; j < num_candidates; ++j) total += s.cand_exp[j];
        const double target = (double(p.top_p) - kThresholdSlack) * total;
        double cumulative = 0.0;
        float tau = s.cand_value[num_candidates - 1];
        for (int j = 0; j < num_candidates; ++j) {
          cumulative += s.cand_exp[j];
          if (cumulative >= target) {
            tau = s.cand_value[j];
            break;
          }
        }
        s.tau = tau;
      }
      __syncthreads();
      threshold = fmax(threshold, double(s.tau));
    } else {
      const double total = mass_at_least(x, m, lower, float_key(-FLT_MAX), s);
      const double target = (double(p.top_p) - kThresholdSlack) * total;
      // Fast path: the bins that reach the target mass (one bin of margin for float
      // rounding of the histogram), if they fit in shared memory.
      histogram(x, m, lower, true, s);
      if (threadIdx.x == 0) {
        int chosen = -1, cumulative = 0;
        double mass = 0.0;
        for (int b = 0; b < kBins - 1; ++b) {
          cumulative += s.hist_count[b];
          mass += s.hist_mass[b];
          if (mass >= target * (1.0 + 1e-4)) {
            chosen = b + 1 < kBins - 1 ? b + 1 : b;
            cumulative += chosen > b ? s.hist_count[chosen] : 0;
            if (cumulative > kCandidateCap) chosen = -1;
            break;
          }
        }
        s.selected_bin = chosen;
      }
      __syncthreads();
      const int bin = s.selected_bin;
      bool found = false;
      if (bin >= 0) {
        const int n = gather_and_sort(x, m, lower, bin, s);
        candidate_exps(n, m, s);
        if (threadIdx.x == 0) {
          double cumulative = 0.0;
          s.found = 0;
          for (int j = 0; j < n; ++j) {
            cumulative += s.cand_exp[j];
            if (cumulative >= target) {
              s.tau = s.cand_value[j];
              s.found = 1;
              break;
            }
          }
        }
        __syncthreads();
        found = s.found != 0;
        if (found) {
          num_candidates = n;
          exps_ready = true;
        }
      }
      const float tau = found ? s.tau : bisect_top_p(x, m, lower, target, s);
      threshold = fmax(threshold, double(tau));
    }
  }

  if (p.min_p > 0.0f) {
    threshold = fmax(threshold, double(m) + log(double(p.min_p)) - kThresholdSlack);
  }

  // ---- normaliser and the Gumbel race over the kept set ---------------------------------
  const bool want_normalizer = (p.flags & kSampleProcessedLogprobs) != 0;
  double log_normalizer = 0.0;
  const uint64_t key = p.stream_key;
  ArgMaxD best{-INFINITY, INT32_MAX};
  if (num_candidates >= 0) {
    int32_t kept = 0;
    for (int j = threadIdx.x; j < num_candidates; j += kThreads) {
      kept += double(s.cand_value[j]) >= threshold;
    }
    const int32_t num_kept = block_sum(kept, s);  // a prefix of the sorted candidates
    if (want_normalizer) {
      if (!exps_ready) candidate_exps(num_kept, m, s);
      if (threadIdx.x == 0) {
        double sum = 0.0;
        for (int j = 0; j < num_kept; ++j) sum += s.cand_exp[j];
        s.total = sum;
      }
      __syncthreads();
      log_normalizer = log(s.total);
    }
    for (int j = threadIdx.x; j < num_kept; j += kThreads) {
      const int32_t id = s.cand_id[j];
      consider(double(s.cand_value[j]) + gumbel_from_bits(sampling_bits(key, static_cast<uint32_t>(id))),
               id, best);
    }
  } else {
    if (want_normalizer) {
      log_normalizer = log(block_sum(normaliser_part(x, 0, vocab, m, threshold), s));
    }
    // The most likely token is always kept: its score starts the pruning.
    const double best0 =
        double(m) + gumbel_from_bits(sampling_bits(key, static_cast<uint32_t>(top.id)));
    best = race_part(x, 0, vocab, threshold, best0, key, s.prune);
  }
  best = block_argmax(best, s);

  if (threadIdx.x == 0) {
    result.token = best.id;
    result.logprob = raw_logprob(best.id);
    result.processed_logprob =
        want_normalizer ? static_cast<float>(double(x(best.id)) - m - log_normalizer) : 0.0f;
    out[r] = result;
  }
}

}  // namespace

namespace {

constexpr int32_t kFeedRowsPerLaunch = 1024;

/// The source rows of one feed launch, in the kernel's parameters (4 KB).
struct FeedRows {
  int32_t rows[kFeedRowsPerLaunch];
};

__global__ void feed_sampled_tokens_kernel(const GpuSampledToken* __restrict__ results,
                                           const __grid_constant__ FeedRows f, int32_t n,
                                           int32_t* __restrict__ token_ids) {
  pdl_wait();  // the results come from an earlier kernel (the sampler of the step before)
  const int32_t stride = static_cast<int32_t>(blockDim.x);
  for (int32_t i = static_cast<int32_t>(threadIdx.x); i < n; i += stride) {
    token_ids[i] = results[f.rows[i]].token;
  }
  pdl_launch_dependents();
}

}  // namespace

void launch_feed_sampled_tokens(const GpuSampledToken* results, const int32_t* src_rows,
                                int32_t n, int32_t* token_ids, cudaStream_t stream) {
  for (int32_t begin = 0; begin < n; begin += kFeedRowsPerLaunch) {
    const int32_t count = std::min(n - begin, kFeedRowsPerLaunch);
    FeedRows f;
    for (int32_t i = 0; i < count; ++i) f.rows[i] = src_rows[begin + i];
    launch_kernel(feed_sampled_tokens_kernel, dim3(1), dim3(256), 0, stream, 1, results, f,
                  count, token_ids + begin);
  }
}

void fill_prune_table(uint64_t* table) {
  for (int j = 0; j < kPruneTableSize; ++j) table[j] = prune_table_entry(j);
}

void launch_sample_rows(const float* logits, int32_t num_rows, int32_t vocab,
                        const GpuSamplingRow* rows, const GpuPenaltyEntry* penalties,
                        float* scratch, const uint64_t* prune_table, GpuSampledToken* out,
                        cudaStream_t stream) {
  if (num_rows == 0) return;
  launch_kernel(sample_rows_kernel, dim3(static_cast<unsigned>(num_rows), kSampleClusterSize),
                dim3(kThreads), 0, stream, kSampleClusterSize, logits, vocab, rows, penalties,
                scratch, prune_table, out);
}

}  // namespace pagellm::cuda
