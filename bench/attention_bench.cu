// Paged attention benchmark: decode bandwidth and prefill tensor-core rate, each against the
// ceiling this run measures (decode) or the bars of issue 6 (prefill).
//
//   attention_bench [--quick] [--decode-only | --prefill-only | --chunks-only |
//                   --shared-only] [--single] [--prefill-shape HQ:HKV:BATCH:Q:KV]
//                   [--pass-rows 16|32] [--out FILE.csv]
//
// Decode (Qwen3-8B attention: 32 query heads, 8 KV heads, head_dim 128, 16-token pages):
// bytes = K/V rows read + q read + out written; time = median over graph replays of a graph
// holding many launches, which rotate over page tables pointing at disjoint pages so that
// no launch finds its K/V in L2. Printed as GB/s and as a fraction of the copy bandwidth
// measured at the start of the run: the better of cudaMemcpyAsync (device to device, on a
// stream, not in a graph: a graph's memcpy node may run on a copy engine, which is much
// slower than the SM copy a plain D2D memcpy gets) and a 16-byte-vector copy kernel, over
// 2 GiB buffers, bytes read + bytes written.
// --prefill-shape times that one prefill shape (head_dim 128) and nothing else, which is
// what a profiler run of one kernel wants.
// Prefill: causal FLOPs = 4 · head_dim · num_q_heads · Σ (keys each query token sees),
// timed the same way through every prefill kernel (wgmma, whose grid order follows
// prefill_grid_kv_major, wgmma-serial, wgmma-headmajor and wgmma-kvmajor, the Hopper
// kernel where it applies, and v2; attention_prefill_variants.h), one row per shape; the
// kernels' graphs are replayed in turn, round after round, after 300 ms of such replays
// (time_graphs_interleaved), so that no column gets a cooler GPU than another; printed as
// TFLOP/s and
// as a fraction of the 806 TFLOP/s dense bf16 rate measured on the H200, beside
// FlashAttention-2's (~309-342) and cuDNN's (~577-606) rates on this H200 at 4k-32k tokens,
// 32 heads, D = 128. A graph of many prefill launches lets each one's ramp and tail overlap
// the next one's (programmatic dependent launch); --single times graphs of one launch, as
// the engine runs the kernel between two matrix products.
// Short chunks (--chunks-only, also after the prefill table of a full run): 1 to 128 query
// tokens per sequence after a 2k-32k prefix (the tail chunk of a chunked prompt, a
// prefix-cache hit, a few speculative tokens), through the decode kernel (split-KV, the
// query rows of a sequence in turn), the prefill kernel paged_prefill_attention runs for
// them and the Hopper prefill kernel at any query length, rotating over page tables of
// disjoint pages as decode does: the kernels a native route could run.
// Shared prefixes (--shared-only, also in a full run): decode batches of groups of 8
// sequences that share their first `prefix` keys (the same pages, as n-sample fan-out leaves
// a GRPO prompt's samples) and then hold `suffix` keys each, through the TMA decode kernel
// without and with the shared-prefix pass (PagedAttentionParams::prefix_tokens). Bytes are
// the distinct K/V (each shared page once, every suffix) + q + out, as W2's limit counts
// them; rotating over copies on disjoint pages as decode does. Items are packed as the CUDA
// backend packs them (PrefixItemSizes: 16-row items while their pass CTAs fit one wave of
// CTA slots, else 32-row ones; the `rows` column), or all of --pass-rows rows.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "pagellm/cuda/attention/attention.h"
#include "pagellm/cuda/batch_staging.h"
#include "pagellm/cuda/attention/attention_decode_variants.h"
#include "pagellm/cuda/attention/attention_prefill_variants.h"

#include "cuda_bench_util.cuh"

namespace {
using namespace pagellm_bench;

struct Row {
  std::string kind;
  int head_dim, num_q_heads, num_kv_heads, page_size, batch, q_len, kv_len, splits;
  double time_us, gbs, frac_copy, tflops;
};

/// A paged KV cache big enough for every configuration, filled with random bf16 once.
struct Pool {
  int num_kv_heads, head_dim, page_size;
  int64_t num_pages;
  void* k = nullptr;
  void* v = nullptr;
  Pool(int64_t tokens, int hkv, int d, int page) : num_kv_heads(hkv), head_dim(d), page_size(page) {
    num_pages = tokens / page + 1;
    const size_t elems = static_cast<size_t>(num_pages) * hkv * page * d;
    CHECK_CUDA(cudaMalloc(&k, elems * 2));
    CHECK_CUDA(cudaMalloc(&v, elems * 2));
    fill_random(k, elems, 2);
    fill_random(v, elems, 3);
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  ~Pool() {
    cudaFree(k);
    cudaFree(v);
  }
};

/// The arguments of one call over `pool` (device pointers; host sizes).
pagellm::cuda::PagedAttentionParams call_params(const Pool& pool, int num_q_heads, void* q,
                                                void* out, const int32_t* query_start,
                                                const int32_t* kv_lens, const int32_t* table,
                                                int seqs, int tokens, int max_pages, int max_q,
                                                int max_kv, void* workspace, size_t ws_bytes) {
  pagellm::cuda::PagedAttentionParams p;
  p.q = q;
  p.k_pool = pool.k;
  p.v_pool = pool.v;
  p.out = out;
  p.query_start = query_start;
  p.kv_lens = kv_lens;
  p.page_table = table;
  p.num_seqs = seqs;
  p.num_tokens = tokens;
  p.num_q_heads = num_q_heads;
  p.num_kv_heads = pool.num_kv_heads;
  p.head_dim = pool.head_dim;
  p.page_size = pool.page_size;
  p.max_pages_per_seq = max_pages;
  p.num_pages = static_cast<int32_t>(pool.num_pages);
  p.max_query_len = max_q;
  p.max_kv_len = max_kv;
  p.scale = 1.0f / std::sqrt(static_cast<float>(pool.head_dim));
  p.workspace = workspace;
  p.workspace_bytes = ws_bytes;
  return p;
}

/// Device metadata for `copies` batches of `batch` sequences (q_len query tokens each, kv_len
/// keys), each copy on its own pages (shuffled), plus q, out and workspace.
struct Batch {
  int batch, q_len, kv_len, copies, max_pages;
  int32_t *query_start = nullptr, *kv_lens = nullptr, *tables = nullptr;
  void *q = nullptr, *out = nullptr, *workspace = nullptr;
  size_t workspace_bytes = 0;
  Batch(const Pool& pool, int num_q_heads, int b, int ql, int kvl, int n_copies, std::mt19937& rng)
      : batch(b), q_len(ql), kv_len(kvl), copies(n_copies) {
    max_pages = (kv_len + pool.page_size - 1) / pool.page_size;
    const int64_t needed = static_cast<int64_t>(copies) * batch * max_pages;
    if (needed + 1 > pool.num_pages) throw std::runtime_error("pool too small");
    std::vector<int32_t> pages(needed);
    std::iota(pages.begin(), pages.end(), 1);
    std::shuffle(pages.begin(), pages.end(), rng);
    std::vector<int32_t> qs(batch + 1), kvs(batch, kv_len);
    for (int i = 0; i <= batch; ++i) qs[i] = i * q_len;
    CHECK_CUDA(cudaMalloc(&query_start, qs.size() * 4));
    CHECK_CUDA(cudaMalloc(&kv_lens, kvs.size() * 4));
    CHECK_CUDA(cudaMalloc(&tables, pages.size() * 4));
    CHECK_CUDA(cudaMemcpy(query_start, qs.data(), qs.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(kv_lens, kvs.data(), kvs.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(tables, pages.data(), pages.size() * 4, cudaMemcpyHostToDevice));
    const size_t qo = static_cast<size_t>(batch) * q_len * num_q_heads * pool.head_dim;
    CHECK_CUDA(cudaMalloc(&q, qo * 2));
    CHECK_CUDA(cudaMalloc(&out, qo * 2));
    fill_random(q, qo, 4);
    workspace_bytes = pagellm::cuda::paged_decode_workspace_bytes(num_q_heads, pool.head_dim);
    if (workspace_bytes) {
      CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
      CHECK_CUDA(cudaMemset(workspace, 0, workspace_bytes));  // split counters start at zero
    }
    CHECK_CUDA(cudaDeviceSynchronize());  // uploads done before work on other streams
  }
  ~Batch() {
    cudaFree(query_start);
    cudaFree(kv_lens);
    cudaFree(tables);
    cudaFree(q);
    cudaFree(out);
    if (workspace) cudaFree(workspace);
  }
  pagellm::cuda::PagedAttentionParams params(const Pool& pool, int num_q_heads, int copy) const {
    return call_params(pool, num_q_heads, q, out, query_start, kv_lens,
                       tables + static_cast<size_t>(copy) * batch * max_pages, batch,
                       batch * q_len, max_pages, q_len, kv_len, workspace, workspace_bytes);
  }
};

/// Decode metadata for `copies` batches of `groups` x kGroup sequences, each group sharing
/// `prefix` keys (its leader's pages) and each sequence then holding `suffix` keys of its
/// own, every copy on its own pages; the shared-prefix items as the CUDA backend packs them.
struct SharedBatch {
  static constexpr int kGroup = 8;
  int batch, prefix, suffix, copies, max_pages;
  int32_t *query_start = nullptr, *kv_lens = nullptr, *tables = nullptr;
  int32_t *items = nullptr, *tokens = nullptr;
  void *q = nullptr, *out = nullptr, *workspace = nullptr;
  size_t workspace_bytes = 0;
  template <typename T>
  static T* upload(const std::vector<T>& v) {
    T* d = nullptr;
    CHECK_CUDA(cudaMalloc(&d, v.size() * sizeof(T)));
    CHECK_CUDA(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
  }
  int pass_rows = 0;  // rows of the items' pass CTAs (members x group)
  SharedBatch(const Pool& pool, int num_q_heads, int groups, int pre, int suf, int n_copies,
              int force_rows, std::mt19937& rng)
      : batch(groups * kGroup), prefix(pre), suffix(suf), copies(n_copies) {
    const int page = pool.page_size;
    const int pre_pages = prefix / page, suf_pages = (suffix + page - 1) / page;
    max_pages = pre_pages + suf_pages;
    const int64_t per_copy = int64_t{groups} * pre_pages + int64_t{batch} * suf_pages;
    if (copies * per_copy + 1 > pool.num_pages) throw std::runtime_error("pool too small");
    std::vector<int32_t> free_pages(static_cast<size_t>(copies * per_copy));
    std::iota(free_pages.begin(), free_pages.end(), 1);
    std::shuffle(free_pages.begin(), free_pages.end(), rng);
    std::vector<int32_t> table(static_cast<size_t>(copies) * batch * max_pages);
    size_t next = 0;
    for (int c = 0; c < copies; ++c) {
      for (int g = 0; g < groups; ++g) {
        int32_t* lead = table.data() + (static_cast<size_t>(c) * batch + g * kGroup) * max_pages;
        for (int j = 0; j < pre_pages; ++j) lead[j] = free_pages[next++];
        for (int m = 0; m < kGroup; ++m) {
          int32_t* row = lead + static_cast<size_t>(m) * max_pages;
          std::copy(lead, lead + pre_pages, row);
          for (int j = 0; j < suf_pages; ++j) row[pre_pages + j] = free_pages[next++];
        }
      }
    }
    pagellm::ForwardBatch fb;
    fb.page_size = page;
    for (int b = 0; b < batch; ++b) {
      fb.query_start.push_back(b);
      fb.kv_lens.push_back(prefix + suffix);
      fb.token_ids.push_back(0);
      fb.shared_prefix_group.push_back(b / kGroup * kGroup);
      fb.shared_prefix_tokens.push_back(pre_pages * page);
    }
    fb.query_start.push_back(batch);
    std::vector<int32_t> packed(static_cast<size_t>(pagellm::cuda::prefix_items_words(batch)));
    std::vector<int32_t> covered(static_cast<size_t>(batch));
    namespace pc = pagellm::cuda;
    pc::PrefixItemSizes sizes;
    sizes.members = pc::decode_prefix_item_members(num_q_heads, pool.num_kv_heads);
    sizes.half_members = pc::decode_prefix_item_members(num_q_heads, pool.num_kv_heads,
                                                        pc::kDecodePassRows / 2);
    sizes.kv_heads = pool.num_kv_heads;
    sizes.max_half_ctas = pc::decode_prefix_half_item_ctas();
    const int members = force_rows == 16   ? sizes.half_members
                        : force_rows == 32 ? sizes.members
                                           : pc::BatchStaging::prefix_item_members(fb, sizes);
    pass_rows = members * (num_q_heads / pool.num_kv_heads);
    pc::BatchStaging::pack_prefix_items(fb, members, packed.data(), covered.data());
    query_start = upload(fb.query_start);
    kv_lens = upload(fb.kv_lens);
    tables = upload(table);
    items = upload(packed);
    tokens = upload(covered);
    const size_t qo = static_cast<size_t>(batch) * num_q_heads * pool.head_dim;
    CHECK_CUDA(cudaMalloc(&q, qo * 2));
    CHECK_CUDA(cudaMalloc(&out, qo * 2));
    fill_random(q, qo, 5);
    workspace_bytes =
        pagellm::cuda::paged_attention_workspace_bytes(batch, num_q_heads, pool.head_dim, 16);
    CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
    CHECK_CUDA(cudaMemset(workspace, 0, workspace_bytes));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  ~SharedBatch() {
    for (void* p : {static_cast<void*>(query_start), static_cast<void*>(kv_lens),
                    static_cast<void*>(tables), static_cast<void*>(items),
                    static_cast<void*>(tokens), q, out, workspace}) {
      cudaFree(p);
    }
  }
  /// mode 0: no pass; 1: the pass, no member folded into it; 2: the pass with the default
  /// fold (PagedAttentionParams::prefix_fold_keys).
  pagellm::cuda::PagedAttentionParams params(const Pool& pool, int num_q_heads, int copy,
                                             int mode) const {
    pagellm::cuda::PagedAttentionParams p = call_params(
        pool, num_q_heads, q, out, query_start, kv_lens,
        tables + static_cast<size_t>(copy) * batch * max_pages, batch, batch, max_pages, 1,
        prefix + suffix, workspace, workspace_bytes);
    if (mode > 0) {
      p.prefix_items = items;
      p.prefix_tokens = tokens;
      p.max_prefix_items = batch;
      if (mode == 1) p.prefix_fold_keys = 0;
    }
    return p;
  }
};

/// Captures `launches` calls rotating over the batch's copies; returns ms per call.
double time_calls(const Pool& pool, const Batch& batch, int num_q_heads, bool decode, int launches,
                  int reps, cudaStream_t stream, int decode_splits = 0,
                  pagellm::cuda::DecodeKernel decode_kernel = pagellm::cuda::kDefaultDecodeKernel) {
  auto call = [&](int copy) {
    auto p = batch.params(pool, num_q_heads, copy % batch.copies);
    p.num_splits = decode_splits;
    if (decode) {
      pagellm::cuda::paged_decode_attention_with(p, decode_kernel, stream);
    } else {
      pagellm::cuda::paged_prefill_attention_with(p, pagellm::cuda::kDefaultPrefillKernel, stream);
    }
  };
  call(0);  // outside capture: kernel attributes, module load
  CHECK_CUDA(cudaStreamSynchronize(stream));
  return time_launches(call, launches, stream, reps, cudaStreamCaptureModeGlobal);
}

void write_csv(const std::string& path, const std::vector<Row>& rows) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
  std::fprintf(f,
               "kind,head_dim,num_q_heads,num_kv_heads,page_size,batch,q_len,kv_len,splits,"
               "time_us,gb_per_s,frac_copy_bw,tflops\n");
  for (const Row& r : rows) {
    std::fprintf(f, "%s,%d,%d,%d,%d,%d,%d,%d,%d,%.3f,%.1f,%.4f,%.2f\n", r.kind.c_str(), r.head_dim,
                 r.num_q_heads, r.num_kv_heads, r.page_size, r.batch, r.q_len, r.kv_len, r.splits,
                 r.time_us, r.gbs, r.frac_copy, r.tflops);
  }
  std::fclose(f);
}

}  // namespace

int run(int argc, char** argv) {
  std::string out_path;
  bool quick = false, decode_only = false, prefill_only = false, single = false, chunks = false,
       shared = false;
  int pass_rows = 0;  // --pass-rows: 0 packs items as the backend does
  int shape[5] = {0, 0, 0, 0, 0};  // --prefill-shape: hq, hkv, batch, q, kv
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--out") && i + 1 < argc) {
      out_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--prefill-shape") && i + 1 < argc &&
               std::sscanf(argv[i + 1], "%d:%d:%d:%d:%d", &shape[0], &shape[1], &shape[2],
                           &shape[3], &shape[4]) == 5 &&
               shape[0] > 0 && shape[1] > 0 && shape[0] % shape[1] == 0 && shape[2] > 0 &&
               shape[3] > 0 && shape[4] >= shape[3]) {
      prefill_only = true;
      ++i;
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--decode-only")) {
      decode_only = true;
    } else if (!std::strcmp(argv[i], "--prefill-only")) {
      prefill_only = true;
    } else if (!std::strcmp(argv[i], "--pass-rows") && i + 1 < argc &&
               (!std::strcmp(argv[i + 1], "16") || !std::strcmp(argv[i + 1], "32"))) {
      pass_rows = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--single")) {
      single = true;
    } else if (!std::strcmp(argv[i], "--chunks-only")) {
      chunks = true;
    } else if (!std::strcmp(argv[i], "--shared-only")) {
      shared = true;
      decode_only = prefill_only = true;  // neither table
    } else {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--decode-only | --prefill-only | --chunks-only | "
                   "--shared-only] "
                   "[--single] [--prefill-shape HQ:HKV:BATCH:Q:KV (HKV divides HQ, KV >= Q)] "
                   "[--pass-rows 16|32] [--out FILE.csv]\n",
                   argv[0]);
      return 2;
    }
  }
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const CopyBandwidth copy = copy_bandwidth(stream, prop);
  const double copy_gbs = copy.best();
  std::printf(
      "device: %s, %d SMs, L2 %d MB; copy bandwidth (read + write, 2 GiB): cudaMemcpy %.0f "
      "GB/s, copy kernel %.0f GB/s; percentages below are of %.0f GB/s\n",
      prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, copy.memcpy_gbs,
      copy.kernel_gbs, copy_gbs);
  std::vector<Row> rows;
  std::mt19937 rng(12345);
  const size_t l2_rotation_bytes = size_t{512} << 20;  // stay well clear of the 60 MB L2

  // ---- decode ---------------------------------------------------------------------------
  if (!prefill_only && !chunks) {
    const int hq = 32, hkv = 8, d = 128, page = 16;
    const std::vector<int> contexts =
        quick ? std::vector<int>{4096, 32768}
              : std::vector<int>{128, 512, 1024, 2048, 4096, 8192, 16384, 32768};
    const std::vector<int> batches =
        quick ? std::vector<int>{1, 64} : std::vector<int>{1, 4, 16, 32, 64, 256};
    int64_t max_tokens = 0;
    for (int c : contexts) {
      for (int b : batches) {
        const int64_t bytes = int64_t{c} * b * hkv * d * 4;
        const int64_t copies = std::max<int64_t>(1, (l2_rotation_bytes + bytes - 1) / bytes);
        max_tokens = std::max(max_tokens, copies * b * ((c + page - 1) / page * page));
      }
    }
    Pool pool(max_tokens + page, hkv, d, page);
    std::printf("\ndecode: Hq %d, Hkv %d, D %d, page %d (bytes = K/V + q + out); kernels tma "
                "(the default) and cpasync\n",
                hq, hkv, d, page);
    std::printf("%8s %6s %6s | %10s %9s %8s | %10s %8s\n", "context", "batch", "splits", "tma_us",
                "GB/s", "of_copy", "cpasync_us", "of_copy");
    const pagellm::cuda::DecodeKernel kernels[] = {pagellm::cuda::DecodeKernel::kTma,
                                                   pagellm::cuda::DecodeKernel::kCpAsync};
    for (int c : contexts) {
      for (int b : batches) {
        const double kv_bytes = double(c) * b * hkv * d * 2 * 2;
        const double qo_bytes = double(b) * hq * d * 2 * 2;
        const int copies =
            static_cast<int>(std::max<double>(1, std::ceil(l2_rotation_bytes / kv_bytes)));
        Batch batch(pool, hq, b, 1, c, std::min(copies, 1024), rng);
        const int launches = std::max(batch.copies, 8);
        const int splits = pagellm::cuda::plan_decode_splits(batch.params(pool, hq, 0));
        std::printf("%8d %6d %6d", c, b, splits);
        for (const pagellm::cuda::DecodeKernel kernel : kernels) {
          CHECK_CUDA(cudaMemset(batch.out, 0xff, size_t(b) * hq * d * 2));
          const double ms =
              time_calls(pool, batch, hq, true, launches, quick ? 5 : 9, stream, 0, kernel);
          const size_t bad = nonfinite(batch.out, size_t(b) * hq * d);
          const double gbs = (kv_bytes + qo_bytes) / (ms * 1e-3) / 1e9;
          rows.push_back({std::string("decode-") + pagellm::cuda::decode_kernel_name(kernel), d,
                          hq, hkv, page, b, 1, c, splits, ms * 1e3, gbs, gbs / copy_gbs, 0.0});
          if (kernel == pagellm::cuda::DecodeKernel::kTma) {
            std::printf(" | %10.2f %9.0f %7.1f%%", ms * 1e3, gbs, 100.0 * gbs / copy_gbs);
          } else {
            std::printf(" | %10.2f %7.1f%%", ms * 1e3, 100.0 * gbs / copy_gbs);
          }
          if (bad) std::printf("  NON-FINITE OUTPUT (%s)", pagellm::cuda::decode_kernel_name(kernel));
        }
        std::printf("\n");
      }
    }
    // Forced split counts at the short contexts of a decode batch (the W1 regime): the
    // data behind plan_decode_splits()'s choice there ("*").
    std::printf("\ndecode, forced splits (us per call; * = the plan's choice)\n%8s %6s |", "context",
                "batch");
    for (int sp = 1; sp <= 4; ++sp) std::printf(" %8d", sp);
    std::printf("\n");
    for (int c : {512, 1024, 2048}) {
      for (int b : {32, 64}) {
        const double kv_bytes = double(c) * b * hkv * d * 2 * 2;
        const int copies =
            static_cast<int>(std::max<double>(1, std::ceil(l2_rotation_bytes / kv_bytes)));
        Batch batch(pool, hq, b, 1, c, std::min(copies, 1024), rng);
        const int launches = std::max(batch.copies, 8);
        const int chosen = pagellm::cuda::plan_decode_splits(batch.params(pool, hq, 0));
        std::printf("%8d %6d |", c, b);
        for (int sp = 1; sp <= 4; ++sp) {
          const double ms = time_calls(pool, batch, hq, true, launches, quick ? 5 : 9, stream, sp);
          std::printf(" %7.2f%s", ms * 1e3, sp == chosen ? "*" : " ");
        }
        std::printf("\n");
      }
    }
  }

  // ---- prefill --------------------------------------------------------------------------
  if (!decode_only && !chunks) {
    struct Config {
      int hq, hkv, d, batch, q_len, kv_len;
    };
    std::vector<Config> configs;
    const std::vector<int> lengths =
        quick ? std::vector<int>{4096} : std::vector<int>{1024, 4096, 8192, 16384, 32768};
    for (int hkv : {32, 8}) {
      for (int len : lengths) configs.push_back({32, hkv, 128, 1, len, len});
    }
    if (shape[0] > 0) {
      configs = {{shape[0], shape[1], 128, shape[2], shape[3], shape[4]}};
    } else if (!quick) {
      configs.push_back({32, 8, 128, 8, 2048, 2048});
      configs.push_back({32, 8, 128, 4, 2048, 2048});   // an 8,192-token engine chunk
      configs.push_back({32, 8, 128, 32, 512, 512});
      configs.push_back({32, 8, 128, 4, 512, 8192});    // chunked prefill after 7.5k cached
      configs.push_back({32, 8, 128, 1, 2048, 32768});  // last chunk of a 32k prompt
      configs.push_back({32, 8, 128, 64, 32, 2048});    // short queries: 64-row tiles
      configs.push_back({16, 8, 64, 1, 8192, 8192});    // head_dim 64
    }
    // Dense bf16 tensor-core rate measured on the H200 (the prefill roofline).
    constexpr double kPeakTflops = 806.0;
    std::printf(
        "\nprefill: causal FLOPs = 4 * D * Hq * pairs; %% of %.0f TFLOP/s (H200 dense bf16); "
        "bars: FA2 ~309-342, cuDNN ~577-606 TFLOP/s\n",
        kPeakTflops);
    std::printf("%4s %4s %4s %6s %6s %6s", "Hq", "Hkv", "D", "batch", "q", "kv");
    for (const char* name : {"wgmma", "serial", "headmaj", "kvmajor", "v2"}) {
      std::printf(" | %7s_us %8s %6s", name, "TFLOP/s", "peak");
    }
    std::printf("\n");
    const pagellm::cuda::PrefillKernel kernels[] = {
        pagellm::cuda::PrefillKernel::kWgmma, pagellm::cuda::PrefillKernel::kWgmmaSerial,
        pagellm::cuda::PrefillKernel::kWgmmaHeadMajor,
        pagellm::cuda::PrefillKernel::kWgmmaKvMajor, pagellm::cuda::PrefillKernel::kV2};
    for (const Config& cf : configs) {
      const int page = 16;
      const int64_t tokens = int64_t{cf.batch} * ((cf.kv_len + page - 1) / page * page) * 2;
      Pool pool(tokens + page, cf.hkv, cf.d, page);
      Batch batch(pool, cf.hq, cf.batch, cf.q_len, cf.kv_len, 1, rng);
      double pairs = 0;
      for (int i = 0; i < cf.q_len; ++i) pairs += cf.kv_len - cf.q_len + i + 1;
      pairs *= cf.batch;
      const double flops = 4.0 * cf.d * cf.hq * pairs;
      // Back to back, each launch's ramp and tail overlap its neighbours' (programmatic
      // dependent launch); --single times one launch at a time, as the engine runs it
      // between two matrix products.
      const int launches = single ? 1 : std::clamp(static_cast<int>(2e12 / flops), 1, 20);
      const bool wgmma_runs =
          pagellm::cuda::prefill_wgmma_supported(batch.params(pool, cf.hq, 0));
      std::printf("%4d %4d %4d %6d %6d %6d", cf.hq, cf.hkv, cf.d, cf.batch, cf.q_len, cf.kv_len);
      // Each kernel's output checked on a poisoned buffer, its launches captured; then all
      // of them timed in interleaved rounds (time_graphs_interleaved).
      const size_t out_elems = size_t(cf.batch) * cf.q_len * cf.hq * cf.d;
      std::vector<cudaGraphExec_t> execs;
      std::vector<size_t> bad;
      for (const pagellm::cuda::PrefillKernel kernel : kernels) {
        auto call = [&](int copy) {
          pagellm::cuda::paged_prefill_attention_with(
              batch.params(pool, cf.hq, copy % batch.copies), kernel, stream);
        };
        CHECK_CUDA(cudaMemset(batch.out, 0xff, out_elems * 2));
        call(0);  // outside capture: kernel attributes, module load
        CHECK_CUDA(cudaStreamSynchronize(stream));
        bad.push_back(nonfinite(batch.out, out_elems));
        execs.push_back(capture_launches(call, launches, stream, cudaStreamCaptureModeGlobal));
      }
      const std::vector<double> graph_ms =
          time_graphs_interleaved(execs, stream, quick ? 3 : 7, quick ? 100.0 : 300.0);
      for (cudaGraphExec_t exec : execs) CHECK_CUDA(cudaGraphExecDestroy(exec));
      for (size_t k = 0; k < std::size(kernels); ++k) {
        const pagellm::cuda::PrefillKernel kernel = kernels[k];
        const double ms = graph_ms[k] / launches;
        const double tflops = flops / (ms * 1e-3) / 1e12;
        const bool runs_v2 = kernel != pagellm::cuda::PrefillKernel::kV2 && !wgmma_runs;
        rows.push_back({std::string("prefill-") + pagellm::cuda::prefill_kernel_name(kernel) +
                            (runs_v2 ? "(v2)" : ""),
                        cf.d, cf.hq, cf.hkv, page, cf.batch, cf.q_len, cf.kv_len, 0, ms * 1e3, 0.0,
                        0.0, tflops});
        std::printf(" | %10.1f %8.1f %5.1f%%%s", ms * 1e3, tflops, 100.0 * tflops / kPeakTflops,
                    runs_v2 ? " (runs v2)" : "");
        if (bad[k]) {
          std::printf("  NON-FINITE OUTPUT (%s)", pagellm::cuda::prefill_kernel_name(kernel));
        }
      }
      std::printf("\n");
    }
  }
  // ---- decode with shared prefixes ---------------------------------------------------------
  if (shared || (!quick && !decode_only && !prefill_only && !chunks && shape[0] == 0)) {
    const int hq = 32, hkv = 8, d = 128, page = 16;
    const double token_bytes = double(hkv) * d * 2 * 2;
    const int64_t rotation_tokens = int64_t{l2_rotation_bytes} / int64_t(token_bytes);
    Pool pool(2 * rotation_tokens + 64 * 2048 + page, hkv, d, page);
    std::printf("\ndecode with shared prefixes: Hq %d, Hkv %d, D %d, page %d, groups of %d "
                "sequences sharing `prefix` keys, then `suffix` keys each; TMA kernel without "
                "the shared-prefix pass, with it, and with members of at most %d own keys "
                "folded into it; %% of copy over the distinct bytes\n",
                hq, hkv, d, page, SharedBatch::kGroup, pagellm::cuda::kDecodePrefixFoldKeys);
    std::printf("%6s %7s %7s %4s | %9s %7s | %9s %7s | %9s %7s | %6s %6s\n", "batch",
                "prefix", "suffix", "rows", "plain_us", "of_copy", "pass_us", "of_copy",
                "fold_us", "of_copy", "pass", "fold");
    const std::vector<int> batches = quick ? std::vector<int>{64, 256}
                                           : std::vector<int>{16, 32, 64, 128, 256, 512};
    for (int prefix : {512, 1024}) {
      for (int suffix : {8, 32, 256, 768}) {
        for (int b : batches) {
          const int groups = b / SharedBatch::kGroup;
          const double distinct = (double(groups) * prefix + double(b) * suffix) * token_bytes +
                                  double(b) * hq * d * 2 * 2;
          const int copies = static_cast<int>(std::clamp<double>(
              std::ceil(l2_rotation_bytes / (distinct)), 1, 256));
          SharedBatch batch(pool, hq, groups, prefix, suffix, copies, pass_rows, rng);
          const int launches = std::max(batch.copies, 8);
          double us[3];
          size_t bad = 0;
          for (int mode = 0; mode < 3; ++mode) {
            auto call = [&](int copy) {
              pagellm::cuda::paged_decode_attention_with(
                  batch.params(pool, hq, copy % batch.copies, mode),
                  pagellm::cuda::DecodeKernel::kTma, stream);
            };
            CHECK_CUDA(cudaMemset(batch.out, 0xff, size_t(b) * hq * d * 2));
            call(0);
            CHECK_CUDA(cudaStreamSynchronize(stream));
            bad += nonfinite(batch.out, size_t(b) * hq * d);
            us[mode] = 1e3 * time_launches(call, launches, stream, quick ? 5 : 9,
                                           cudaStreamCaptureModeGlobal);
            const double gbs = distinct / (us[mode] * 1e-6) / 1e9;
            static const char* const kKinds[] = {"shared-plain", "shared-pass", "shared-fold"};
            rows.push_back({kKinds[mode], d, hq, hkv, page, b, prefix, prefix + suffix, 0,
                            us[mode], gbs, gbs / copy_gbs, 0.0});
          }
          auto frac = [&](double t) { return 100.0 * distinct / (t * 1e-6) / 1e9 / copy_gbs; };
          std::printf("%6d %7d %7d %4d | %9.1f %6.1f%% | %9.1f %6.1f%% | %9.1f %6.1f%% | "
                      "%5.2fx %5.2fx%s\n",
                      b, prefix, suffix, batch.pass_rows, us[0], frac(us[0]), us[1],
                      frac(us[1]), us[2], frac(us[2]), us[0] / us[1], us[0] / us[2],
                      bad ? "  NON-FINITE OUTPUT" : "");
        }
      }
    }
  }
  // ---- short chunks over long prefixes -----------------------------------------------------
  if (chunks || (!quick && !decode_only && shape[0] == 0)) {
    const int hq = 32, hkv = 8, d = 128, page = 16;
    const int64_t rotation_tokens = int64_t{l2_rotation_bytes} / (int64_t{hkv} * d * 2 * 2);
    Pool pool(2 * rotation_tokens + 32 * 8192 + page, hkv, d, page);
    std::printf("\nshort chunks after a prefix: Hq %d, Hkv %d, D %d, page %d; us per call of the "
                "decode kernel (split-KV) and of the prefill kernel (%s for q > 64, v2 below)\n",
                hq, hkv, d, page,
                pagellm::cuda::prefill_kernel_name(pagellm::cuda::kDefaultPrefillKernel));
    std::printf("%6s %6s %6s | %10s %10s %10s\n", "batch", "q", "kv", "decode_us", "prefill_us",
                "wgmma_us");
    for (int kv : {2048, 8192, 32768}) {
      for (int b : {1, 4, 32}) {
        if (b == 32 && kv > 8192) continue;
        for (int q : {1, 2, 4, 8, 16, 32, 64, 128}) {
          const int64_t copies =
              std::max<int64_t>(1, (rotation_tokens + int64_t{b} * kv - 1) / (int64_t{b} * kv));
          Batch batch(pool, hq, b, q, kv, static_cast<int>(copies), rng);
          const int launches = single ? 1 : static_cast<int>(std::clamp<int64_t>(copies, 4, 64));
          const size_t out_elems = size_t(b) * q * hq * d;
          double us[3] = {0, 0, 0};
          size_t bad = 0;
          const bool wgmma = pagellm::cuda::prefill_wgmma_supported(batch.params(pool, hq, 0));
          for (int side = 0; side < (wgmma ? 3 : 2); ++side) {
            CHECK_CUDA(cudaMemset(batch.out, 0xff, out_elems * 2));
            if (side < 2) {
              us[side] =
                  1e3 * time_calls(pool, batch, hq, side == 0, launches, quick ? 3 : 5, stream);
            } else {  // the Hopper kernel whatever the query length
              auto call = [&](int copy) {
                pagellm::cuda::attn::launch_prefill_wgmma(
                    batch.params(pool, hq, copy % batch.copies),
                    pagellm::cuda::kDefaultPrefillKernel, stream);
              };
              call(0);
              CHECK_CUDA(cudaStreamSynchronize(stream));
              us[side] = 1e3 * time_launches(call, launches, stream, quick ? 3 : 5,
                                             cudaStreamCaptureModeGlobal);
            }
            bad += nonfinite(batch.out, out_elems);
          }
          rows.push_back({"chunk-decode", d, hq, hkv, page, b, q, kv, 0, us[0], 0.0, 0.0, 0.0});
          rows.push_back({"chunk-prefill", d, hq, hkv, page, b, q, kv, 0, us[1], 0.0, 0.0, 0.0});
          rows.push_back({"chunk-wgmma", d, hq, hkv, page, b, q, kv, 0, us[2], 0.0, 0.0, 0.0});
          std::printf("%6d %6d %6d | %10.1f %10.1f %10.1f%s\n", b, q, kv, us[0], us[1], us[2],
                      bad ? "  NON-FINITE OUTPUT" : "");
        }
      }
    }
  }
  if (!out_path.empty()) write_csv(out_path, rows);
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_bench: %s\n", e.what());
    return 1;
  }
}
