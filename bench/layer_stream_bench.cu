// What a decode layer's weight stream loses at its kernel boundaries, and what a persistent
// per-layer kernel could win back (docs/PERFORMANCE.md, "Where the W1 decode step goes").
//
// The four Qwen3-4B products of a layer (qkv, o_proj, gate|up, down: 203 MB of bf16
// weights) are streamed through the skinny kernel's pipeline: per stage a 128-row x 64-k
// weight tile in two TMA boxes plus a 32-token x tile, 5 stages per CTA, two CTAs per SM,
// each CTA a contiguous run of (row tile, K chunk) units. There is no arithmetic. The
// benchmark measures the stream and its boundaries only, two ways:
//   separate    one kernel per product, chained with programmatic dependent launch as the
//               engine chains its products: the prologue issues the first stages' weights,
//               waits for the previous kernel, then issues their x tiles;
//   persistent  one kernel per layer. Between products its CTAs pass a grid barrier.
//               Before waiting at the barrier, each CTA has already issued the next
//               product's first stages' weights (the x tiles follow the barrier).
//   dataflow    one kernel per layer without barriers: counters in global memory say which
//               of the previous product's row tiles are done, and each x tile waits only for
//               the tiles that produce it, as a decode megakernel would (issue 20). o_proj's
//               chunk of head h waits for qkv's tiles of q head h and of its KV head (the
//               attention between them is left out), gate|up for all of o_proj (the norm
//               needs whole rows), down's chunk c for gate|up's tile c (64 gate and 64 up
//               columns, the SiLU product's columns 64 c .. 64 c + 63).
// All split every product over the same CTAs in the same way, so their differences are what
// the boundaries cost. Each runs twice: on row-major weights read as the skinny kernel reads
// them (two 64 x 64 boxes per stage: 128 bytes from each of 128 rows), and on weights laid
// out as one contiguous 16 KiB block per (row tile, K chunk), read with one bulk copy per
// stage (what packing the weights at load time would give; the skinny kernel can read such
// a copy, pack_skinny_weights). The eight layers' weights (1.6 GB) exceed the L2 many times
// over, so every byte comes from HBM. Prints µs per layer and the fraction of the copy
// bandwidth it measures itself.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "cuda_bench_util.cuh"
#include "pagellm/cuda/support/pdl.cuh"
#include "pagellm/cuda/support/tma.cuh"
#include "pagellm/cuda/support/tma.h"

namespace {

using namespace pagellm_bench;
using pagellm::cuda::bf16_tensor_map;

constexpr int kThreads = 256;
constexpr int kStages = 5;
constexpr int kTokens = 32;
constexpr int kChunk = 64;                                // K per stage
constexpr int kWeightBytes = 128 * kChunk * 2;            // 16 KiB
constexpr int kStageBytes = kWeightBytes + kTokens * kChunk * 2;
constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + 1024-byte alignment slack
constexpr int kProducts = 4;
constexpr int kLayers = 8;

struct Product {
  CUtensorMap w;  // bf16 [N, K], box 64 k x 64 rows
  CUtensorMap x;  // bf16 [32, K], box 64 k x 32 rows
  const uint8_t* packed;  // the same bytes read as 16 KiB blocks, (tile, chunk) row-major
  int tiles, chunks;
};

constexpr int kMaxTiles = 19456 / 128;  // gate|up's row tiles, the most of any product
constexpr int kQHeads = 32, kKvHeads = 8;  // qkv's row tiles: q heads, then k, then v

struct LayerArgs {
  Product p[kProducts];
  int first, count;        // the products this launch streams
  unsigned* barrier;       // persistent: arrivals, zero at launch
  int packed;              // weights as one contiguous 16 KiB block per stage (bulk copy)
  int dataflow;            // count > 1: counters instead of grid barriers
  // dataflow: units done per (product, row tile) at [q * kMaxTiles + tile], then per product
  // at [kProducts * kMaxTiles + q]; zero at launch
  unsigned* done;
};
constexpr int kDoneCounters = kProducts * kMaxTiles + kProducts;

/// Dataflow: whether every row tile that unit `unit` of product q reads (its x chunk) is
/// done. Product 0's input comes from the previous launch (programmatic dependent launch).
__device__ __forceinline__ bool inputs_done(const LayerArgs& a, int q, int unit) {
  if (q == 0) return true;
  const volatile unsigned* done = a.done;
  const int chunk = unit % a.p[q].chunks;
  if (q == 1) {  // o_proj: chunk c of the attention output is q head c / 2
    const unsigned full = static_cast<unsigned>(a.p[0].chunks);
    const int head = chunk / 2, kv = head / (kQHeads / kKvHeads);
    return done[head] >= full && done[kQHeads + kv] >= full &&
           done[kQHeads + kKvHeads + kv] >= full;
  }
  if (q == 2) {  // gate|up after the norm: all of o_proj
    return done[kProducts * kMaxTiles + 1] >=
           static_cast<unsigned>(a.p[1].tiles) * static_cast<unsigned>(a.p[1].chunks);
  }
  return done[2 * kMaxTiles + chunk] >= static_cast<unsigned>(a.p[2].chunks);  // down
}


/// Streams products [first, first + count) of `a`. Between two of them the CTAs meet at a
/// grid barrier (count > 1) after issuing the next product's first weight boxes.
__global__ void __launch_bounds__(kThreads, 2) stream_kernel(const __grid_constant__ LayerArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using namespace pagellm::cuda;
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t full[kStages];
  const uint32_t raw = tma_smem_addr(smem_raw);
  const uint32_t base = (raw + 1023) & ~1023u;
  const int tid = threadIdx.x;
  const unsigned ctas = gridDim.x;

  // The CTA's units of every product, as one list: item j of product q is unit
  // begin[q] + j, (tile, chunk) = (unit / chunks, unit % chunks).
  int begin[kProducts], items[kProducts];
  int total = 0;
  for (int q = 0; q < a.count; ++q) {
    const Product& p = a.p[a.first + q];
    const int64_t units = int64_t{p.tiles} * p.chunks;
    begin[q] = static_cast<int>(units * blockIdx.x / ctas);
    items[q] = static_cast<int>(units * (blockIdx.x + 1) / ctas) - begin[q];
    total += items[q];
  }
  auto locate = [&](int item, int* q, int* unit) {
    int k = 0;
    while (item >= items[k]) item -= items[k++];
    *q = k;
    *unit = begin[k] + item;
  };
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) mbar_init(tma_smem_addr(&full[s]), 1);
    mbar_init_fence();
  }
  __syncthreads();
  const uint64_t policy = evict_first_policy();
  auto issue_w = [&](int item) {
    int q, unit;
    locate(item, &q, &unit);
    const Product& p = a.p[a.first + q];
    const int stage = item % kStages;
    const uint32_t bar = tma_smem_addr(&full[stage]);
    const int tile = unit / p.chunks, k = (unit % p.chunks) * kChunk;
    mbar_arrive_expect_tx(bar, kStageBytes);
    if (a.packed) {
      bulk_load_hint(base + stage * kStageBytes, p.packed + static_cast<size_t>(unit) * kWeightBytes,
                kWeightBytes, bar, policy);
    } else {
      tma_load_hint(base + stage * kStageBytes, &p.w, k, tile * 128, bar, policy);
      tma_load_hint(base + stage * kStageBytes + kWeightBytes / 2, &p.w, k, tile * 128 + 64, bar,
                    policy);
    }
  };
  auto issue_x = [&](int item) {
    int q, unit;
    locate(item, &q, &unit);
    const Product& p = a.p[a.first + q];
    const int stage = item % kStages;
    tma_load(base + stage * kStageBytes + kWeightBytes, &p.x, (unit % p.chunks) * kChunk, 0,
             tma_smem_addr(&full[stage]));
  };
  auto product_of = [&](int item) {
    int q, unit;
    locate(item, &q, &unit);
    return q;
  };

  // x is the previous product's output: item j's x tile goes out only once every CTA has
  // finished the products before product_of(j) (the grid barrier). Barrier q is met after
  // the CTA's own items of products <= q are consumed; `passed` is the newest product
  // whose input is ready.
  int x_issued = 0, passed = 0, consumed = 0, next_barrier = 0;
  auto issue_ready_x = [&](int upto) {
    if (tid != 0) return;
    for (; x_issued < upto && product_of(x_issued) <= passed; ++x_issued) issue_x(x_issued);
  };
  auto meet_barriers = [&] {
    int finished = 0;  // items of products <= next_barrier
    for (int q = 0; q <= next_barrier && q < a.count; ++q) finished += items[q];
    while (next_barrier + 1 < a.count && consumed >= finished) {
      if (tid == 0) {
        __threadfence();
        atomicAdd(a.barrier, 1u);
        const unsigned target = ctas * static_cast<unsigned>(next_barrier + 1);
        while (*static_cast<volatile unsigned*>(a.barrier) < target) {
        }
        __threadfence();
      }
      __syncthreads();
      passed = ++next_barrier;
      finished += items[next_barrier];
    }
  };

  // Dataflow: thread 0 issues x tiles in order as their inputs are done, waiting only for
  // the one the next stage needs; a run of units of one row tile, once consumed, is added
  // to that tile's counter and its product's.
  auto dataflow_ready = [&](int item) {
    int q, unit;
    locate(item, &q, &unit);
    return inputs_done(a, a.first + q, unit);
  };
  auto issue_dataflow_x = [&](int must, int upto) {  // thread 0: items < must surely
    for (; x_issued < upto; ++x_issued) {
      if (!dataflow_ready(x_issued)) {
        if (x_issued >= must) break;
        while (!dataflow_ready(x_issued)) {
        }
      }
      // What a real kernel needs between seeing a counter and reading by TMA what its
      // producers stored: acquire ordering, then the generic-to-async proxy fence.
      asm volatile("fence.acq_rel.gpu;\n\tfence.proxy.async.global;\n" ::: "memory");
      issue_x(x_issued);
    }
  };
  auto tile_key = [&](int item) {
    int q, unit;
    locate(item, &q, &unit);
    return (a.first + q) * kMaxTiles + unit / a.p[a.first + q].chunks;
  };
  int run = 0;
  auto signal_run = [&](int item) {  // thread 0, after consuming `item`
    ++run;
    if (item + 1 < total && tile_key(item + 1) == tile_key(item)) return;
    const int key = tile_key(item);
    asm volatile("fence.acq_rel.gpu;\n" ::: "memory");  // release what the run stored
    atomicAdd(a.done + key, static_cast<unsigned>(run));
    atomicAdd(a.done + kProducts * kMaxTiles + key / kMaxTiles, static_cast<unsigned>(run));
    run = 0;
  };

  if (tid == 0) {
    for (int i = 0; i < kStages && i < total; ++i) issue_w(i);
  }
  pdl_wait();
  if (!a.dataflow) {
    meet_barriers();  // products this CTA has no share of
    issue_ready_x(kStages < total ? kStages : total);
  }
  for (int it = 0; it < total; ++it) {
    const int stage = it % kStages;
    if (a.dataflow && tid == 0) {
      issue_dataflow_x(it + 1, it + kStages < total ? it + kStages : total);
    }
    mbar_wait(tma_smem_addr(&full[stage]), (it / kStages) & 1);
    __syncthreads();  // every thread is done with the stage (the skinny kernel's barrier)
    if (tid == 0 && it + kStages < total) issue_w(it + kStages);
    ++consumed;
    if (a.dataflow) {
      if (tid == 0) signal_run(it);
    } else {
      meet_barriers();
      issue_ready_x(consumed + kStages < total ? consumed + kStages : total);
    }
  }
  pdl_launch_dependents();
#else
  __trap();
#endif
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    std::printf("layer_stream_bench needs an sm_90 GPU (TMA); found %s\n", prop.name);
    return 0;
  }
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const CopyBandwidth bw = copy_bandwidth(stream, prop);

  struct Shape {
    const char* name;
    int64_t N, K;
  };
  const Shape shapes[kProducts] = {
      {"qkv", 6144, 2560}, {"o_proj", 2560, 4096}, {"gate_up", 19456, 2560}, {"down", 2560, 9728}};
  int64_t layer_bytes = 0;
  for (const Shape& s : shapes) layer_bytes += s.N * s.K * 2;

  std::vector<void*> buffers;
  LayerArgs layers[kLayers];
  void* x = nullptr;
  CHECK_CUDA(cudaMalloc(&x, size_t{kTokens} * 9728 * 2));
  fill_random(x, size_t{kTokens} * 9728, 7);
  for (int l = 0; l < kLayers; ++l) {
    for (int q = 0; q < kProducts; ++q) {
      void* w = nullptr;
      const size_t n = static_cast<size_t>(shapes[q].N * shapes[q].K);
      CHECK_CUDA(cudaMalloc(&w, n * 2));
      fill_random(w, n, static_cast<uint32_t>(l * 16 + q));
      buffers.push_back(w);
      Product& p = layers[l].p[q];
      p.w = bf16_tensor_map(w, shapes[q].N, shapes[q].K, kChunk, 64, "layer_stream_bench");
      p.x = bf16_tensor_map(x, kTokens, shapes[q].K, kChunk, kTokens, "layer_stream_bench");
      p.packed = static_cast<const uint8_t*>(w);
      p.tiles = static_cast<int>(shapes[q].N / 128);
      p.chunks = static_cast<int>(shapes[q].K / kChunk);
    }
  }
  unsigned* barriers = nullptr;
  CHECK_CUDA(cudaMalloc(&barriers, sizeof(unsigned) * kLayers));
  unsigned* done = nullptr;
  CHECK_CUDA(cudaMalloc(&done, sizeof(unsigned) * kDoneCounters * kLayers));
  CHECK_CUDA(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  kSmemBytes));
  int per_sm = 0;
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, stream_kernel, kThreads,
                                                           kSmemBytes));
  const unsigned ctas = static_cast<unsigned>(per_sm * prop.multiProcessorCount);
  std::printf("device: %s, %d SMs; copy bandwidth %.0f GB/s; %d CTAs (%d per SM) of %d KB\n",
              prop.name, prop.multiProcessorCount, bw.best(), ctas, per_sm, kSmemBytes / 1024);
  std::printf("a layer: qkv, o_proj, gate|up, down = %.1f MB of weights (%.1f us at the copy rate)\n",
              layer_bytes / 1e6, layer_bytes / (bw.best() * 1e3));

  int packed = 0;
  auto run_separate = [&] {
    for (int l = 0; l < kLayers; ++l) {
      for (int q = 0; q < kProducts; ++q) {
        LayerArgs a = layers[l];
        a.packed = packed;
        a.first = q;
        a.count = 1;
        a.barrier = barriers;
        a.dataflow = 0;
        a.done = done;
        pagellm::cuda::launch_kernel(stream_kernel, dim3(ctas), dim3(kThreads), kSmemBytes, stream,
                                     1, a);
      }
    }
  };
  int dataflow = 0;
  auto run_persistent = [&] {
    CHECK_CUDA(cudaMemsetAsync(barriers, 0, sizeof(unsigned) * kLayers, stream));
    CHECK_CUDA(cudaMemsetAsync(done, 0, sizeof(unsigned) * kDoneCounters * kLayers, stream));
    for (int l = 0; l < kLayers; ++l) {
      LayerArgs a = layers[l];
      a.packed = packed;
      a.first = 0;
      a.count = kProducts;
      a.barrier = barriers + l;
      a.dataflow = dataflow;
      a.done = done + static_cast<size_t>(kDoneCounters) * l;
      pagellm::cuda::launch_kernel(stream_kernel, dim3(ctas), dim3(kThreads), kSmemBytes, stream,
                                   1, a);
    }
  };
  auto report = [&](const char* what, double ms) {
    const double us = ms * 1e3 / kLayers;
    std::printf("%-11s %8.2f us per layer  %7.0f GB/s  %5.1f %% of copy bandwidth\n", what, us,
                layer_bytes / (us * 1e3), 100.0 * layer_bytes / (us * 1e3) / bw.best());
  };
  for (packed = 0; packed < 2; ++packed) {
    std::printf(packed ? "weights as contiguous 16 KiB blocks per stage (one bulk copy each):\n"
                       : "weights row-major [N, K] (two 64 x 64 TMA boxes per stage, as the "
                         "skinny kernel reads them):\n");
    for (int round = 0; round < 3; ++round) {
      report("separate", time_stream(run_separate, stream, 20));
      dataflow = 0;
      report("persistent", time_stream(run_persistent, stream, 20));
      dataflow = 1;
      report("dataflow", time_stream(run_persistent, stream, 20));
    }
  }
  for (void* p : buffers) CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaFree(x));
  CHECK_CUDA(cudaFree(barriers));
  CHECK_CUDA(cudaFree(done));
  return 0;
}
