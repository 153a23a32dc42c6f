// Paged attention kernels (decode and prefill) against a CPU reference in double precision
// over the same bf16-rounded inputs.
//
// Every case draws fresh random inputs (the seed is printed; set PAGELLM_TEST_SEED to
// replay one), shuffles the physical pages, fills every pool slot that no sequence owns
// (page 0 included) with NaN so that a read past kv_len shows up, and poisons the output
// with NaN so that an unwritten row shows up. A case passes when
//   - every query row of every sequence is finite (NaN never passes),
//   - rows that see no key are exactly zero,
//   - ||out - ref|| / ||ref|| <= 1e-2 over the checked rows, and no single (token, head) row
//     is off by more than 3e-2 relative.
// Long sequences are checked on a sample of rows (first, last and random ones); all rows are
// still checked for finiteness.
#include "pagellm/cuda/attention/attention.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <iterator>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "pagellm/common/check.h"
#include "pagellm/common/dtype.h"
#include "pagellm/cuda/attention/attention_decode_variants.h"
#include "pagellm/cuda/attention/attention_prefill_variants.h"
#include "pagellm/cuda/batch_staging.h"
#include "pagellm/engine/batch_builder.h"
#include "pagellm/cuda/support/cuda_check.h"

namespace pagellm::cuda {
namespace {

constexpr uint16_t kBf16NaN = 0x7fc0;

// ---- device memory ----------------------------------------------------------------------

template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) : n_(n) {
    if (n_ > 0) PAGELLM_CUDA_CHECK(cudaMalloc(&ptr_, n_ * sizeof(T)));
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : ptr_(o.ptr_), n_(o.n_) { o.ptr_ = nullptr; }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~DeviceArray() {
    if (ptr_) cudaFree(ptr_);
  }
  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    PAGELLM_ASSERT(host.size() == n_);
    if (n_ > 0)
      PAGELLM_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_ > 0)
      PAGELLM_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  void fill_bytes(int value) {
    if (n_ > 0) PAGELLM_CUDA_CHECK(cudaMemset(ptr_, value, n_ * sizeof(T)));
  }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

// ---- problem description ----------------------------------------------------------------

/// One attention call: shapes plus per-sequence lengths.
struct Case {
  std::string name;
  int head_dim = 128;
  int num_q_heads = 8;
  int num_kv_heads = 2;
  int page_size = 16;
  std::vector<int> q_lens;   // per sequence
  std::vector<int> kv_lens;  // per sequence
  float q_scale = 1.0f;      // larger values make the softmax peakier
  int num_splits = 0;        // decode only; 0 = automatic
  int max_query_len = -1;    // -1: the true maximum
  int max_kv_len = -1;       // -1: the true maximum
  int extra_tokens = 0;      // rows of q/out past the last sequence (never written)

  std::string describe() const {
    std::ostringstream s;
    s << name << " [D=" << head_dim << " Hq=" << num_q_heads << " Hkv=" << num_kv_heads
      << " page=" << page_size << " seqs=" << q_lens.size() << " splits=" << num_splits << "]";
    return s.str();
  }
};

/// Host copies of one problem's inputs, laid out as the kernels take them.
struct Problem {
  Case c;
  int num_tokens = 0;
  int num_pages = 0;
  int max_pages_per_seq = 0;
  std::vector<int32_t> query_start, kv_lens, page_table;
  std::vector<uint16_t> q, k_pool, v_pool;  // bf16 bits

  int group() const { return c.num_q_heads / c.num_kv_heads; }
  size_t kv_index(int b, int pos, int kv_head, int d) const {
    const int page = page_table[static_cast<size_t>(b) * max_pages_per_seq + pos / c.page_size];
    return ((static_cast<size_t>(page) * c.num_kv_heads + kv_head) * c.page_size +
            pos % c.page_size) *
               c.head_dim +
           d;
  }
};

uint64_t test_seed() {
  static const uint64_t seed = []() -> uint64_t {
    if (const char* env = std::getenv("PAGELLM_TEST_SEED")) return std::strtoull(env, nullptr, 10);
    return (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  }();
  return seed;
}

/// Random bf16 in [-1, 1) times `scale`, never exactly NaN.
uint16_t random_bf16(std::mt19937_64& rng, float scale) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  return f32_to_bf16(u(rng) * scale);
}

Problem make_problem(const Case& c, std::mt19937_64& rng) {
  Problem pr;
  pr.c = c;
  const int B = static_cast<int>(c.q_lens.size());
  PAGELLM_ASSERT(c.kv_lens.size() == c.q_lens.size());
  pr.query_start.assign(B + 1, 0);
  for (int b = 0; b < B; ++b) pr.query_start[b + 1] = pr.query_start[b] + c.q_lens[b];
  pr.num_tokens = pr.query_start[B] + c.extra_tokens;
  pr.kv_lens.assign(c.kv_lens.begin(), c.kv_lens.end());

  int max_blocks = 1, total_blocks = 0;
  for (int b = 0; b < B; ++b) {
    const int blocks = (c.kv_lens[b] + c.page_size - 1) / c.page_size;
    max_blocks = std::max(max_blocks, blocks);
    total_blocks += blocks;
  }
  pr.max_pages_per_seq = max_blocks + 1;  // one spare entry per row, left at page 0
  pr.num_pages = 1 + total_blocks + 3;    // page 0 reserved, a few pages nobody owns
  std::vector<int32_t> free_pages(pr.num_pages - 1);
  std::iota(free_pages.begin(), free_pages.end(), 1);
  std::shuffle(free_pages.begin(), free_pages.end(), rng);
  pr.page_table.assign(static_cast<size_t>(B) * pr.max_pages_per_seq, 0);
  size_t next = 0;
  for (int b = 0; b < B; ++b) {
    const int blocks = (c.kv_lens[b] + c.page_size - 1) / c.page_size;
    for (int j = 0; j < blocks; ++j) {
      pr.page_table[static_cast<size_t>(b) * pr.max_pages_per_seq + j] = free_pages[next++];
    }
  }

  const size_t pool_elems =
      static_cast<size_t>(pr.num_pages) * c.num_kv_heads * c.page_size * c.head_dim;
  pr.k_pool.assign(pool_elems, kBf16NaN);
  pr.v_pool.assign(pool_elems, kBf16NaN);
  for (int b = 0; b < B; ++b) {
    for (int pos = 0; pos < c.kv_lens[b]; ++pos) {
      for (int h = 0; h < c.num_kv_heads; ++h) {
        for (int d = 0; d < c.head_dim; ++d) {
          const size_t i = pr.kv_index(b, pos, h, d);
          pr.k_pool[i] = random_bf16(rng, 1.0f);
          pr.v_pool[i] = random_bf16(rng, 1.0f);
        }
      }
    }
  }
  pr.q.resize(static_cast<size_t>(pr.num_tokens) * c.num_q_heads * c.head_dim);
  for (auto& x : pr.q) x = random_bf16(rng, c.q_scale);
  return pr;
}

/// Device copies of a Problem plus the output and workspace.
struct DeviceProblem {
  DeviceArray<uint16_t> q, k_pool, v_pool, out;
  DeviceArray<int32_t> query_start, kv_lens, page_table;
  DeviceArray<unsigned char> workspace;

  explicit DeviceProblem(const Problem& pr)
      : q(pr.q),
        k_pool(pr.k_pool),
        v_pool(pr.v_pool),
        out(pr.q.size()),
        query_start(pr.query_start),
        kv_lens(pr.kv_lens),
        page_table(pr.page_table),
        workspace(paged_attention_workspace_bytes(pr.num_tokens, pr.c.num_q_heads, pr.c.head_dim,
                                                  kMaxDecodeSplits)) {
    workspace.fill_bytes(0);  // the split counters start at zero
  }

  PagedAttentionParams params(const Problem& pr) const {
    PagedAttentionParams p;
    p.q = q.get();
    p.k_pool = k_pool.get();
    p.v_pool = v_pool.get();
    p.out = out.get();
    p.query_start = query_start.get();
    p.kv_lens = kv_lens.get();
    p.page_table = page_table.get();
    p.num_seqs = static_cast<int32_t>(pr.kv_lens.size());
    p.num_tokens = pr.num_tokens;
    p.num_q_heads = pr.c.num_q_heads;
    p.num_kv_heads = pr.c.num_kv_heads;
    p.head_dim = pr.c.head_dim;
    p.page_size = pr.c.page_size;
    p.max_pages_per_seq = pr.max_pages_per_seq;
    p.num_pages = pr.num_pages;
    int max_q = 0, max_kv = 0;
    for (size_t b = 0; b < pr.kv_lens.size(); ++b) {
      max_q = std::max(max_q, pr.query_start[b + 1] - pr.query_start[b]);
      max_kv = std::max(max_kv, pr.kv_lens[b]);
    }
    p.max_query_len = pr.c.max_query_len >= 0 ? pr.c.max_query_len : max_q;
    p.max_kv_len = pr.c.max_kv_len >= 0 ? pr.c.max_kv_len : max_kv;
    p.scale = 1.0f / std::sqrt(static_cast<float>(pr.c.head_dim));
    p.workspace = workspace.get();
    p.workspace_bytes = workspace.size();
    p.num_splits = pr.c.num_splits;
    return p;
  }
};

// ---- reference and comparison -------------------------------------------------------------

/// out[d] for query token i of sequence b, head h, in double precision.
void reference_row(const Problem& pr, int b, int i, int h, float scale, std::vector<double>& out) {
  const Case& c = pr.c;
  const int D = c.head_dim;
  const int q_len = pr.query_start[b + 1] - pr.query_start[b];
  const int kv = pr.kv_lens[b];
  const int n_keys = std::min(kv, kv - q_len + i + 1);
  out.assign(D, 0.0);
  if (n_keys <= 0) return;
  const int kv_head = h / pr.group();
  const uint16_t* qrow =
      &pr.q[(static_cast<size_t>(pr.query_start[b] + i) * c.num_q_heads + h) * D];
  std::vector<double> qd(D), logits(n_keys);
  for (int d = 0; d < D; ++d) qd[d] = bf16_to_f32(qrow[d]);
  double mx = -INFINITY;
  for (int j = 0; j < n_keys; ++j) {
    const uint16_t* krow = &pr.k_pool[pr.kv_index(b, j, kv_head, 0)];
    double dot = 0.0;
    for (int d = 0; d < D; ++d) dot += qd[d] * bf16_to_f32(krow[d]);
    logits[j] = dot * scale;
    mx = std::max(mx, logits[j]);
  }
  double sum = 0.0;
  for (int j = 0; j < n_keys; ++j) {
    logits[j] = std::exp(logits[j] - mx);
    sum += logits[j];
  }
  for (int j = 0; j < n_keys; ++j) {
    const uint16_t* vrow = &pr.v_pool[pr.kv_index(b, j, kv_head, 0)];
    const double w = logits[j] / sum;
    for (int d = 0; d < D; ++d) out[d] += w * bf16_to_f32(vrow[d]);
  }
}

/// Query rows of sequence b that the reference checks: all of them when short, otherwise
/// the first and last 8 and 48 random ones.
std::vector<int> rows_to_check(int q_len, std::mt19937_64& rng) {
  std::vector<int> rows;
  if (q_len <= 64) {
    rows.resize(q_len);
    std::iota(rows.begin(), rows.end(), 0);
    return rows;
  }
  for (int i = 0; i < 8; ++i) rows.push_back(i);
  for (int i = q_len - 8; i < q_len; ++i) rows.push_back(i);
  std::uniform_int_distribution<int> u(8, q_len - 9);
  for (int k = 0; k < 48; ++k) rows.push_back(u(rng));
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

struct CheckResult {
  bool ok = true;
  std::string report;
};

/// Compares a downloaded output with the reference; the report says what went wrong where.
CheckResult check_output(const Problem& pr, const std::vector<uint16_t>& out, float scale,
                         std::mt19937_64& rng) {
  const Case& c = pr.c;
  const int D = c.head_dim;
  const int B = static_cast<int>(pr.kv_lens.size());
  CheckResult res;
  std::ostringstream msg;
  msg << c.describe() << " seed=" << test_seed() << ": ";

  // Finiteness of every row that belongs to a sequence; exact zeros where no key is seen.
  int64_t nonfinite = 0, nonzero_empty = 0;
  std::string first_bad;
  for (int b = 0; b < B; ++b) {
    const int q_len = pr.query_start[b + 1] - pr.query_start[b];
    for (int i = 0; i < q_len; ++i) {
      const int n_keys = std::min(pr.kv_lens[b], pr.kv_lens[b] - q_len + i + 1);
      for (int h = 0; h < c.num_q_heads; ++h) {
        const size_t row = (static_cast<size_t>(pr.query_start[b] + i) * c.num_q_heads + h) * D;
        for (int d = 0; d < D; ++d) {
          const float v = bf16_to_f32(out[row + d]);
          if (!std::isfinite(v)) {
            if (nonfinite++ == 0) {
              std::ostringstream s;
              s << "seq " << b << " token " << i << " head " << h << " dim " << d << " = " << v
                << " (q_len " << q_len << ", kv_len " << pr.kv_lens[b] << ")";
              first_bad = s.str();
            }
          } else if (n_keys <= 0 && v != 0.0f) {
            ++nonzero_empty;
          }
        }
      }
    }
  }
  if (nonfinite > 0) {
    res.ok = false;
    msg << nonfinite << " non-finite output values (NaN = unwritten or poisoned input read), "
        << "first at " << first_bad << "; ";
  }
  if (nonzero_empty > 0) {
    res.ok = false;
    msg << nonzero_empty << " values of rows that see no key are not zero; ";
  }

  // Accuracy on the checked rows.
  struct Row {
    int b, i;
  };
  std::vector<Row> rows;
  for (int b = 0; b < B; ++b) {
    const int q_len = pr.query_start[b + 1] - pr.query_start[b];
    for (int i : rows_to_check(q_len, rng)) rows.push_back({b, i});
  }
  const int64_t n_items = static_cast<int64_t>(rows.size()) * c.num_q_heads;
  std::vector<double> err2(n_items, 0.0), ref2(n_items, 0.0);
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t item = 0; item < n_items; ++item) {
    const Row r = rows[item / c.num_q_heads];
    const int h = static_cast<int>(item % c.num_q_heads);
    std::vector<double> ref;
    reference_row(pr, r.b, r.i, h, scale, ref);
    const size_t base = (static_cast<size_t>(pr.query_start[r.b] + r.i) * c.num_q_heads + h) * D;
    double e = 0.0, n = 0.0;
    for (int d = 0; d < D; ++d) {
      const double diff = static_cast<double>(bf16_to_f32(out[base + d])) - ref[d];
      e += diff * diff;
      n += ref[d] * ref[d];
    }
    err2[item] = std::isfinite(e) ? e : 1e30;
    ref2[item] = n;
  }
  double e_total = 0.0, n_total = 0.0, worst = 0.0;
  int64_t worst_item = -1;
  for (int64_t k = 0; k < n_items; ++k) {
    e_total += err2[k];
    n_total += ref2[k];
    const double rel = std::sqrt(err2[k]) / std::max(std::sqrt(ref2[k]), 1e-3);
    if (rel > worst) {
      worst = rel;
      worst_item = k;
    }
  }
  const double rel_total = std::sqrt(e_total) / std::max(std::sqrt(n_total), 1e-12);
  msg << "rel_err=" << rel_total << " over " << n_items << " rows, worst row rel_err=" << worst;
  if (worst_item >= 0) {
    const Row r = rows[worst_item / c.num_q_heads];
    const int q_len = pr.query_start[r.b + 1] - pr.query_start[r.b];
    msg << " at seq " << r.b << " token " << r.i << " head " << worst_item % c.num_q_heads
        << " (q_len " << q_len << ", kv_len " << pr.kv_lens[r.b] << ")";
  }
  if (!(rel_total <= 1e-2) || !(worst <= 3e-2)) res.ok = false;
  res.report = msg.str();
  return res;
}

enum class Kernel { kDecode, kPrefill, kNative };

constexpr DecodeKernel kDecodeKernels[] = {DecodeKernel::kTma, DecodeKernel::kCpAsync};
constexpr PrefillKernel kPrefillKernels[] = {
    PrefillKernel::kWgmma, PrefillKernel::kWgmmaSerial, PrefillKernel::kWgmmaHeadMajor,
    PrefillKernel::kWgmmaKvMajor, PrefillKernel::kV2};

/// Runs one case through every variant of one kernel, each on a freshly poisoned output,
/// and checks each. A variant that does not apply runs the fallback (decode's TMA variant
/// runs cp.async for head_dim 64 and page sizes that are not multiples of 16; prefill's
/// wgmma variants run v2 for those and off compute capability 9.0),
/// which the message says.
void run_case(const Case& c, Kernel kernel, std::mt19937_64& rng) {
  SCOPED_TRACE(c.describe());
  const Problem pr = make_problem(c, rng);
  DeviceProblem dev(pr);
  const PagedAttentionParams p = dev.params(pr);
  const int runs = static_cast<int>(kernel == Kernel::kNative   ? 1
                                    : kernel == Kernel::kDecode ? std::size(kDecodeKernels)
                                                                : std::size(kPrefillKernels));
  for (int run = 0; run < runs; ++run) {
    dev.out.fill_bytes(0xff);  // bf16 0xffff is NaN
    std::string what;
    if (kernel == Kernel::kNative) {
      // The native route as an eager forward takes it (the dispatcher's calls).
      const NativeAttentionCalls calls = plan_native_attention(
          p, find_mixed_decode_run(p.num_seqs, pr.query_start.data(), pr.kv_lens.data()));
      if (calls.run_decode) paged_decode_attention(calls.decode, nullptr);
      if (calls.run_prefill) paged_prefill_attention(calls.prefill, nullptr);
      what = std::string("native route (") + (calls.run_decode ? "decode" : "") +
             (calls.run_decode && calls.run_prefill ? " + " : "") +
             (calls.run_prefill ? "prefill" : "") + ") ";
    } else if (kernel == Kernel::kDecode) {
      paged_decode_attention_with(p, kDecodeKernels[run], nullptr);
      what = std::string("decode ") + decode_kernel_name(kDecodeKernels[run]) +
             (kDecodeKernels[run] == DecodeKernel::kTma && !decode_tma_supported(p)
                  ? " (runs cpasync) "
                  : " ");
    } else {
      paged_prefill_attention_with(p, kPrefillKernels[run], nullptr);
      what = std::string("prefill ") + prefill_kernel_name(kPrefillKernels[run]) +
             (kPrefillKernels[run] != PrefillKernel::kV2 && !prefill_wgmma_supported(p)
                  ? " (runs v2) "
                  : " ");
    }
    PAGELLM_CUDA_CHECK(cudaGetLastError());
    PAGELLM_CUDA_CHECK(cudaDeviceSynchronize());
    const CheckResult r = check_output(pr, dev.out.download(), p.scale, rng);
    EXPECT_TRUE(r.ok) << what << r.report;
    if (r.ok && std::getenv("PAGELLM_TEST_VERBOSE")) {
      std::cout << "  ok " << what << r.report << "\n";
    }
  }
}

/// Log-uniform integer in [lo, hi].
int log_uniform(std::mt19937_64& rng, int lo, int hi) {
  std::uniform_real_distribution<double> u(std::log(lo), std::log(hi + 1.0));
  return std::clamp(static_cast<int>(std::exp(u(rng))), lo, hi);
}

/// Compute capability of the current device as major * 10 + minor.
int current_cc() {
  int device = 0, major = 0, minor = 0;
  PAGELLM_CUDA_CHECK(cudaGetDevice(&device));
  PAGELLM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  PAGELLM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

class PagedAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      cudaGetLastError();
      GTEST_SKIP() << "no CUDA device";
    }
    static bool printed = false;
    if (!printed) {
      std::cout << "[ seed     ] PAGELLM_TEST_SEED=" << test_seed() << "\n";
      printed = true;
    }
    rng_.seed(test_seed() ^ std::hash<std::string>{}(
                                ::testing::UnitTest::GetInstance()->current_test_info()->name()));
  }

  /// Runs `launch` once on `stream` (outside capture: kernel attributes), captures it into a
  /// graph, then `replays` times: takes next(replay) (the same problem with new lengths),
  /// uploads its query_start and kv_lens into dev's arrays, poisons the output, replays the
  /// graph and checks the output against the reference.
  void check_graph_replays(DeviceProblem& dev, cudaStream_t stream, float scale,
                           const std::function<void(cudaStream_t)>& launch, int replays,
                           const std::function<Problem(int)>& next) {
    launch(stream);
    PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    PAGELLM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    launch(stream);
    PAGELLM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    PAGELLM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < replays; ++replay) {
      Problem pr = next(replay);
      pr.c.kv_lens.assign(pr.kv_lens.begin(), pr.kv_lens.end());
      dev.kv_lens.upload(pr.kv_lens);
      dev.query_start.upload(pr.query_start);
      dev.out.fill_bytes(0xff);
      PAGELLM_CUDA_CHECK(cudaDeviceSynchronize());
      PAGELLM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream));
      pr.c.name += " " + std::to_string(replay);
      const CheckResult r = check_output(pr, dev.out.download(), scale, rng_);
      EXPECT_TRUE(r.ok) << r.report;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }

  std::mt19937_64 rng_;
};

// ---- decode -------------------------------------------------------------------------------

TEST_F(PagedAttention, DecodeSweepsHeadDimGroupAndPageSize) {
  const int batches[] = {1, 5, 17, 64};
  int k = 0;
  for (int D : {64, 128}) {
    for (int G : {1, 2, 4, 8}) {
      for (int page : {16, 32, 64}) {
        Case c;
        c.name = "decode sweep";
        c.head_dim = D;
        c.num_kv_heads = 2;
        c.num_q_heads = 2 * G;
        c.page_size = page;
        const int B = batches[k++ % 4];
        for (int b = 0; b < B; ++b) {
          c.q_lens.push_back(1);
          c.kv_lens.push_back(log_uniform(rng_, 1, 4096));
        }
        run_case(c, Kernel::kDecode, rng_);
      }
    }
  }
}

TEST_F(PagedAttention, DecodeForcedSplitCountsAgree) {
  for (int splits : {1, 2, 3, 7, 16, 64}) {
    Case c;
    c.name = "decode forced splits";
    c.num_q_heads = 8;
    c.num_kv_heads = 2;
    c.page_size = 16;
    for (int kv : {1, 31, 32, 33, 100, 1000, 4096}) {
      c.q_lens.push_back(1);
      c.kv_lens.push_back(kv);
    }
    c.num_splits = splits;
    run_case(c, Kernel::kDecode, rng_);
  }
}

TEST_F(PagedAttention, DecodeQwen3Shape) {
  Case c;
  c.name = "decode qwen3-8b shape";
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.page_size = 16;
  for (int b = 0; b < 8; ++b) {
    c.q_lens.push_back(1);
    c.kv_lens.push_back(3000 + 137 * b);
  }
  run_case(c, Kernel::kDecode, rng_);
}

TEST_F(PagedAttention, DecodeGroupsOfAnySize) {
  // Up to 16 heads share a CTA; 20 and 32 take two CTAs per KV head.
  for (int G : {3, 6, 12, 16, 20, 32}) {
    Case c;
    c.name = "decode group " + std::to_string(G);
    c.num_kv_heads = 1;
    c.num_q_heads = G;
    c.head_dim = 64;
    for (int b = 0; b < 3; ++b) {
      c.q_lens.push_back(1);
      c.kv_lens.push_back(log_uniform(rng_, 1, 2000));
    }
    run_case(c, Kernel::kDecode, rng_);
  }
}

TEST_F(PagedAttention, DecodeOddPageSizes) {
  for (int page : {1, 7, 128}) {
    Case c;
    c.name = "decode odd page size";
    c.page_size = page;
    for (int b = 0; b < 4; ++b) {
      c.q_lens.push_back(1);
      c.kv_lens.push_back(log_uniform(rng_, 1, 1500));
    }
    run_case(c, Kernel::kDecode, rng_);
  }
}

TEST_F(PagedAttention, DecodePaddingRowsAndPeakySoftmax) {
  Case c;
  c.name = "decode padding rows, q x 8";
  c.q_scale = 8.0f;  // logits up to ~90: tests the running max
  // Real rows mixed with padding: (q 1, kv 0) must give zeros, (q 0, any kv) writes nothing.
  c.q_lens = {1, 1, 0, 1, 0, 1};
  c.kv_lens = {700, 0, 0, 1, 5, 2500};
  c.extra_tokens = 3;
  run_case(c, Kernel::kDecode, rng_);
}

TEST_F(PagedAttention, DecodeRowsWithSeveralTokensStayCorrect) {
  Case c;
  c.name = "decode multi-token rows";
  c.q_lens = {1, 3, 2, 5};
  c.kv_lens = {40, 300, 2, 1200};
  c.num_splits = 4;
  run_case(c, Kernel::kDecode, rng_);
}

TEST_F(PagedAttention, DecodeGraphReplaysWithNewLengths) {
  // Captured once with capacity-sized host fields, replayed with different device lengths.
  constexpr int kBatch = 6, kCapacity = 4096;
  Case c;
  c.name = "decode graph replay";
  c.num_q_heads = 16;
  c.num_kv_heads = 4;
  for (int b = 0; b < kBatch; ++b) {
    c.q_lens.push_back(1);
    c.kv_lens.push_back(kCapacity);
  }
  const Problem full = make_problem(c, rng_);
  DeviceProblem dev(full);
  PagedAttentionParams p = dev.params(full);
  p.max_kv_len = kCapacity;
  cudaStream_t stream;  // blocking: ordered after the uploads on the legacy stream
  PAGELLM_CUDA_CHECK(cudaStreamCreate(&stream));
  for (const DecodeKernel kernel : kDecodeKernels) {
    SCOPED_TRACE(decode_kernel_name(kernel));
    check_graph_replays(
        dev, stream, p.scale, [&](cudaStream_t s) { paged_decode_attention_with(p, kernel, s); }, 3,
      [&](int replay) {
        Problem pr = full;
        for (int b = 0; b < kBatch; ++b) pr.kv_lens[b] = log_uniform(rng_, 1, kCapacity);
        pr.kv_lens[0] = replay == 0 ? 0 : pr.kv_lens[0];  // a padding row in the first replay
        pr.c.name = "decode graph replay";
        return pr;
      });
  }
  cudaStreamDestroy(stream);
}

TEST_F(PagedAttention, DecodeTmaKernelOnQwen3ShapesAndStalePages) {
  // The TMA kernel's own cases: Qwen3 heads (32/8, D 128), pages of 16, 32 and 64 whose
  // unused rows hold NaN (the kernel must zero V past the last key), lengths at and around
  // tile and page edges, split counts that cut inside pages, and rows of several tokens.
  const int cc = current_cc();
  for (int page : {16, 32, 64}) {
    for (int splits : {0, 1, 3}) {
      Case c;
      c.name = "decode tma qwen3";
      c.num_q_heads = 32;
      c.num_kv_heads = 8;
      c.page_size = page;
      c.num_splits = splits;
      for (int kv : {1, 15, 16, 17, 63, 64, 65, 511, 512, 513, 1000}) {
        c.q_lens.push_back(1);
        c.kv_lens.push_back(kv);
      }
      c.q_lens.push_back(3);  // a row of several query tokens
      c.kv_lens.push_back(log_uniform(rng_, 3, 3000));
      const Problem pr = make_problem(c, rng_);
      DeviceProblem dev(pr);
      if (cc >= 90) {
        EXPECT_TRUE(decode_tma_supported(dev.params(pr))) << c.describe();
      }
      run_case(c, Kernel::kDecode, rng_);
    }
  }
}

/// Host fields of a Qwen3-shaped call over a 1000-page pool of 16-token pages: what the
/// TMA kernels' admission checks look at.
PagedAttentionParams qwen3_pool_params() {
  PagedAttentionParams p;
  p.num_q_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim = 128;
  p.page_size = 16;
  p.num_pages = 1000;
  p.max_query_len = 4096;
  return p;
}

TEST_F(PagedAttention, DecodeTmaNeedsHeadDim128PagesOf16AndThePoolExtent) {
  const PagedAttentionParams p = qwen3_pool_params();
  EXPECT_EQ(decode_tma_supported(p), current_cc() >= 90);
  PagedAttentionParams q = p;
  q.head_dim = 64;
  EXPECT_FALSE(decode_tma_supported(q));
  q = p;
  q.page_size = 24;
  EXPECT_FALSE(decode_tma_supported(q));
  q = p;
  q.num_pages = 0;
  EXPECT_FALSE(decode_tma_supported(q)) << "without the pool's extent there is no tensor map";
  q = p;
  q.num_pages = 1 << 24;  // 2^24 pages x 8 heads x 16 rows = 2^31 rows: past int32
  EXPECT_FALSE(decode_tma_supported(q));
}

// ---- prefill ------------------------------------------------------------------------------

TEST_F(PagedAttention, PrefillSweepsHeadDimGroupAndPageSize) {
  for (int D : {64, 128}) {
    for (int G : {1, 2, 4, 8}) {
      for (int page : {16, 32, 64}) {
        Case c;
        c.name = "prefill sweep";
        c.head_dim = D;
        c.num_kv_heads = G == 8 ? 1 : 2;
        c.num_q_heads = c.num_kv_heads * G;
        c.page_size = page;
        const int B = std::uniform_int_distribution<int>(1, 4)(rng_);
        for (int b = 0; b < B; ++b) {
          const int kv = log_uniform(rng_, 1, 1500);
          // A third fresh prefills (q == kv), the rest with a cached prefix.
          const int q = (b % 3 == 0) ? kv : log_uniform(rng_, 1, kv);
          c.q_lens.push_back(q);
          c.kv_lens.push_back(kv);
        }
        run_case(c, Kernel::kPrefill, rng_);
      }
    }
  }
}

TEST_F(PagedAttention, PrefillLongSequences) {
  for (int D : {64, 128}) {
    Case c;
    c.name = "prefill 4096";
    c.head_dim = D;
    c.num_q_heads = 4;
    c.num_kv_heads = 1;
    c.q_lens = {4096};
    c.kv_lens = {4096};
    run_case(c, Kernel::kPrefill, rng_);
  }
  Case c;
  c.name = "prefill chunk after 3000 cached";
  c.q_lens = {100, 1000};
  c.kv_lens = {3100, 4000};
  run_case(c, Kernel::kPrefill, rng_);
}

TEST_F(PagedAttention, PrefillBatch64Ragged) {
  Case c;
  c.name = "prefill 64 ragged";
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  c.page_size = 32;
  for (int b = 0; b < 64; ++b) {
    const int kv = log_uniform(rng_, 1, 600);
    c.q_lens.push_back(log_uniform(rng_, 1, kv));
    c.kv_lens.push_back(kv);
  }
  run_case(c, Kernel::kPrefill, rng_);
}

TEST_F(PagedAttention, PrefillShortQueriesUseEitherTileHeight) {
  // max_query_len <= 64 picks 64-row tiles; a wrong (too small) bound or 0 must not matter.
  for (int max_q : {-1, 0, 1}) {
    Case c;
    c.name = "prefill short queries, max_query_len " + std::to_string(max_q);
    c.max_query_len = max_q;
    for (int b = 0; b < 12; ++b) {
      const int kv = log_uniform(rng_, 1, 2000);
      c.q_lens.push_back(std::min(kv, log_uniform(rng_, 1, 64)));
      c.kv_lens.push_back(kv);
    }
    run_case(c, Kernel::kPrefill, rng_);
  }
}

TEST_F(PagedAttention, PrefillLongQueriesWithTooSmallTileHint) {
  // max_query_len = 1 picks 64-row tiles for sequences of many tiles (and cached prefixes).
  Case c;
  c.name = "prefill long queries, max_query_len 1";
  c.max_query_len = 1;
  c.q_lens = {700, 129, 64, 1000};
  c.kv_lens = {700, 1500, 64, 1003};
  run_case(c, Kernel::kPrefill, rng_);
}

TEST_F(PagedAttention, PrefillGraphReplaysWithNewLengths) {
  // Captured once per variant with capacity-sized host fields, replayed with new device
  // lengths (query_start and kv_lens), as the engine's prefill graphs would be.
  Case c;
  c.name = "prefill graph replay";
  c.num_q_heads = 8;
  c.num_kv_heads = 2;
  c.q_lens = {600, 600, 600};
  c.kv_lens = {900, 900, 900};
  const Problem full = make_problem(c, rng_);
  DeviceProblem dev(full);
  cudaStream_t stream;  // blocking: ordered after the uploads on the legacy stream
  PAGELLM_CUDA_CHECK(cudaStreamCreate(&stream));
  const PagedAttentionParams p = dev.params(full);
  for (const PrefillKernel kernel : kPrefillKernels) {
    SCOPED_TRACE(prefill_kernel_name(kernel));
    check_graph_replays(
        dev, stream, p.scale,
        [&](cudaStream_t s) { paged_prefill_attention_with(p, kernel, s); }, 2, [&](int) {
          Problem pr = full;
          for (int b = 0; b < 3; ++b) {
            pr.kv_lens[b] = log_uniform(rng_, 1, 900);
            const int q = std::min(pr.kv_lens[b], log_uniform(rng_, 1, 600));
            pr.query_start[b + 1] = pr.query_start[b] + q;
          }
          pr.c.name = "prefill graph replay";
          return pr;
        });
  }
  cudaStreamDestroy(stream);
}

TEST_F(PagedAttention, PrefillMixedWithDecodeRowsAndPadding) {
  Case c;
  c.name = "prefill mixed, padding, q x 8";
  c.q_scale = 8.0f;
  // Decode rows, a fresh prefill, a chunk, and padding: (q 0, kv 0), (q 2, kv 0) -> zeros,
  // (q 0, kv 9).
  c.q_lens = {1, 1, 300, 0, 2, 77, 0, 1};
  c.kv_lens = {500, 1, 300, 0, 0, 1077, 9, 129};
  c.extra_tokens = 5;
  run_case(c, Kernel::kPrefill, rng_);
}

TEST_F(PagedAttention, PrefillOddPageSizes) {
  for (int page : {1, 7, 128}) {
    Case c;
    c.name = "prefill odd page size";
    c.head_dim = 64;
    c.page_size = page;
    c.q_lens = {200, 33};
    c.kv_lens = {250, 33};
    run_case(c, Kernel::kPrefill, rng_);
  }
}

TEST_F(PagedAttention, PrefillWgmmaTileAndPageEdges) {
  // The Hopper kernel's tiling: 128-row query tiles split over two 64-row consumers, 128-key
  // KV tiles loaded as 16-key TMA chunks. Lengths at and around 64 / 128 and page edges,
  // cached prefixes (q < kv) whose diagonal cuts KV tiles anywhere, a query longer than its
  // keys (rows that see no key), ragged batches, GQA 1 / 4 / 8 and pages of 16 / 32 / 64
  // whose unowned rows hold NaN (V past kv must be zeroed, K past kv masked); 48 and 128
  // too (a page size that is no power of two, and pages as long as a KV tile).
  const int cc = current_cc();
  for (int G : {1, 4, 8}) {
    for (int page : {16, 32, 48, 64, 128}) {
      Case c;
      c.name = "prefill wgmma edges";
      c.num_kv_heads = G == 8 ? 1 : 2;
      c.num_q_heads = c.num_kv_heads * G;
      c.page_size = page;
      // (q, kv): fresh prefills, then chunks after a cached prefix, then q > kv.
      const int lens[][2] = {{65, 65},    {127, 127}, {128, 128}, {129, 129}, {255, 255},
                             {257, 257},  {300, 300}, {65, 66},   {100, 228}, {128, 256},
                             {129, 1000}, {200, 333}, {77, 1077}, {140, 100}};
      for (const auto& qk : lens) {
        c.q_lens.push_back(qk[0]);
        c.kv_lens.push_back(qk[1]);
      }
      const Problem pr = make_problem(c, rng_);
      DeviceProblem dev(pr);
      EXPECT_EQ(prefill_wgmma_supported(dev.params(pr)), cc == 90) << c.describe();
      run_case(c, Kernel::kPrefill, rng_);
    }
  }
  // One sequence per call too (the grid's tile search over a single row), at the
  // consumer boundary: 64 < q <= 128 gives the second consumer 1 .. 64 rows.
  for (int q : {65, 96, 128, 129, 192}) {
    Case c;
    c.name = "prefill wgmma single";
    c.q_lens = {q};
    c.kv_lens = {q + (q % 3) * 50};
    run_case(c, Kernel::kPrefill, rng_);
  }
}

TEST_F(PagedAttention, PrefillWgmmaQwen3Shape) {
  // Qwen3-8B's heads (32 / 8, D 128): a long fresh prefill, a chunk after a cached prefix and
  // a ragged batch, with a peaky softmax in one of them (large q).
  for (float q_scale : {1.0f, 8.0f}) {
    Case c;
    c.name = "prefill wgmma qwen3";
    c.num_q_heads = 32;
    c.num_kv_heads = 8;
    c.q_scale = q_scale;
    c.q_lens = {1500, 300, 1, 700};
    c.kv_lens = {1500, 2300, 40, 701};
    run_case(c, Kernel::kPrefill, rng_);
  }
  // A declared bound whose K/V (256 MiB) outgrows any L2 sends wgmma's grid KV head by KV
  // head (prefill_grid_kv_major), as a long prompt's chunks do.
  Case c;
  c.name = "prefill wgmma qwen3, kv-major grid by the rule";
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  c.max_kv_len = 1 << 16;
  c.q_lens = {900, 1, 333};
  c.kv_lens = {1000, 77, 333};
  run_case(c, Kernel::kPrefill, rng_);
}

TEST_F(PagedAttention, PrefillWgmmaNeedsHeadDim128PagesOf16AndSm90) {
  const PagedAttentionParams p = qwen3_pool_params();
  EXPECT_EQ(prefill_wgmma_supported(p), current_cc() == 90);
  PagedAttentionParams q = p;
  q.max_query_len = 0;  // unknown
  EXPECT_EQ(prefill_wgmma_supported(q), current_cc() == 90);
  q.max_query_len = 64;  // short queries too: v2's 64-row tiles measured 2-2.7x slower
  EXPECT_EQ(prefill_wgmma_supported(q), current_cc() == 90);
  q = p;
  q.head_dim = 64;
  EXPECT_FALSE(prefill_wgmma_supported(q));
  q = p;
  q.page_size = 24;
  EXPECT_FALSE(prefill_wgmma_supported(q));
  q = p;
  q.num_pages = 0;
  EXPECT_FALSE(prefill_wgmma_supported(q)) << "without the pool's extent there is no tensor map";
  q = p;
  q.num_pages = 1 << 24;  // 2^31 pool rows: past int32
  EXPECT_FALSE(prefill_wgmma_supported(q));
}

TEST_F(PagedAttention, ShortChunksAfterLongPrefixesThroughTheDecodeKernel) {
  // What the native route sends to the decode kernel besides decode steps: a sequence or
  // two of up to kDecodeRouteMaxQuery tokens after thousands of keys, and batches of such
  // chunks beside decode rows, on both decode variants, against the reference.
  for (int round = 0; round < 4; ++round) {
    Case c;
    c.name = "short chunks after a prefix, round " + std::to_string(round);
    c.num_q_heads = 32;
    c.num_kv_heads = 8;
    const int seqs = round == 0 ? 1 : log_uniform(rng_, 2, 24);
    for (int b = 0; b < seqs; ++b) {
      const int kv = log_uniform(rng_, kDecodeRouteMaxQuery, 9000);
      c.q_lens.push_back(std::min(kv, log_uniform(rng_, 1, kDecodeRouteMaxQuery)));
      c.kv_lens.push_back(kv);
    }
    run_case(c, Kernel::kDecode, rng_);
  }
}

TEST(NativeAttentionRoute, DecodeKernelForDecodeStepsAndShortChunksOnly) {
  PagedAttentionParams p;
  p.num_seqs = 64;
  p.num_tokens = 64;
  p.max_query_len = 1;
  EXPECT_TRUE(native_attention_takes_decode(p)) << "a decode step";
  p.num_tokens = 128;
  p.max_query_len = kDecodeRouteMaxQuery;
  EXPECT_TRUE(native_attention_takes_decode(p)) << "two tokens per sequence";
  p.num_seqs = 1;
  p.num_tokens = kDecodeRouteMaxTokens;
  p.max_query_len = kDecodeRouteMaxTokens;
  EXPECT_TRUE(native_attention_takes_decode(p)) << "one short chunk";
  p.num_tokens = kDecodeRouteMaxTokens + 1;
  p.max_query_len = kDecodeRouteMaxTokens + 1;
  EXPECT_FALSE(native_attention_takes_decode(p)) << "a longer chunk";
  p.num_seqs = 3;
  p.num_tokens = 2050;
  p.max_query_len = 2048;
  EXPECT_FALSE(native_attention_takes_decode(p)) << "a chunk beside decode rows";
  p.max_query_len = 0;  // unknown
  EXPECT_FALSE(native_attention_takes_decode(p)) << "an unknown query length, many tokens";
  p.num_tokens = 1;
  EXPECT_TRUE(native_attention_takes_decode(p)) << "an unknown query length, one token";
}

// Mixed steps: the decode rows the scheduler puts first go to the decode kernel, the chunks
// after them to the prefill kernel (plan_native_attention), each writing its own rows of the
// NaN-poisoned output. Leading runs of 3 (not split), 4 and 40 decode rows, one-token rows
// after the chunk (left to the prefill kernel), padding rows, a chunk after a long prefix.
TEST_F(PagedAttention, NativeRouteSplitsDecodeRowsOffMixedSteps) {
  struct Mix {
    std::vector<int> q, kv;
  };
  std::vector<Mix> mixes = {
      {{1, 1, 1, 300}, {700, 90, 2000, 300}},
      {{1, 1, 1, 1, 300, 1, 0}, {700, 1, 2000, 129, 300, 64, 9}},
      {{}, {}},
  };
  for (int i = 0; i < 40; ++i) {
    mixes.back().q.push_back(1);
    mixes.back().kv.push_back(log_uniform(rng_, 1, 3000));
  }
  for (int chunk : {77, 513}) {
    mixes.back().q.push_back(chunk);
    mixes.back().kv.push_back(chunk + log_uniform(rng_, 1, 6000));
  }
  for (const Mix& m : mixes) {
    Case c;
    c.name = "native route, mixed step";
    c.q_lens = m.q;
    c.kv_lens = m.kv;
    run_case(c, Kernel::kNative, rng_);
  }
}

// Which calls plan_native_attention makes, on host data alone.
TEST(NativeAttentionRoute, MixedStepsSplitTheLeadingDecodeRowsOff) {
  const std::vector<int32_t> qs = {0, 1, 2, 3, 4, 5, 305, 306};
  const std::vector<int32_t> kv = {10, 4000, 30, 40, 50, 300, 7};
  static int32_t device_arrays[64];  // stand-ins: only the offsets are checked
  PagedAttentionParams p;
  p.query_start = device_arrays;
  p.kv_lens = device_arrays + 16;
  p.page_table = device_arrays + 32;
  p.max_pages_per_seq = 3;
  p.num_seqs = 7;
  p.num_tokens = 306;
  p.max_query_len = 300;
  p.max_kv_len = 4000;
  const MixedDecodeRun run = find_mixed_decode_run(p.num_seqs, qs.data(), kv.data());
  EXPECT_EQ(run.seqs, 5);
  EXPECT_EQ(run.tokens, 5);
  EXPECT_EQ(run.max_kv_len, 4000);
  NativeAttentionCalls c = plan_native_attention(p, run);
  ASSERT_TRUE(c.run_decode && c.run_prefill);
  EXPECT_EQ(c.decode.num_seqs, 5);
  EXPECT_EQ(c.decode.num_tokens, 5);
  EXPECT_EQ(c.decode.max_query_len, 1);
  EXPECT_EQ(c.decode.max_kv_len, 4000);
  EXPECT_EQ(c.decode.query_start, p.query_start);
  EXPECT_EQ(c.prefill.num_seqs, 2);
  EXPECT_EQ(c.prefill.num_tokens, 306);  // absolute, as query_start's offsets
  EXPECT_EQ(c.prefill.query_start, p.query_start + 5);
  EXPECT_EQ(c.prefill.kv_lens, p.kv_lens + 5);
  EXPECT_EQ(c.prefill.page_table, p.page_table + 15);
  EXPECT_EQ(c.prefill.max_query_len, 300);
  // No run (a replayable forward): one prefill call over everything.
  c = plan_native_attention(p);
  EXPECT_TRUE(c.run_prefill && !c.run_decode);
  EXPECT_EQ(c.prefill.num_seqs, 7);
  // Fewer than kMixedDecodeMinSeqs leading decode rows: not split.
  const std::vector<int32_t> qs3 = {0, 1, 2, 3, 303};
  p.num_seqs = 4;
  p.num_tokens = 303;
  EXPECT_EQ(find_mixed_decode_run(p.num_seqs, qs3.data(), kv.data()).seqs, 0);
  // Nothing after the run (a decode step's arrays): no split either.
  EXPECT_EQ(find_mixed_decode_run(5, qs.data(), kv.data()).seqs, 0);
  // A decode step: the decode kernel alone, whatever the arrays.
  p.max_query_len = 1;
  p.num_tokens = 4;
  c = plan_native_attention(p, run);
  EXPECT_TRUE(c.run_decode && !c.run_prefill);
  EXPECT_EQ(c.decode.num_seqs, 4);
}

TEST_F(PagedAttention, DecodeAndPrefillAgreeOnDecodeBatches) {
  // The same decode-shaped batch through both kernels: both are checked against the reference.
  Case c;
  c.name = "decode batch through prefill";
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  for (int b = 0; b < 16; ++b) {
    c.q_lens.push_back(1);
    c.kv_lens.push_back(log_uniform(rng_, 1, 4096));
  }
  run_case(c, Kernel::kPrefill, rng_);
  run_case(c, Kernel::kDecode, rng_);
}

// ---- argument checks ---------------------------------------------------------------------

TEST_F(PagedAttention, RejectsUnsupportedArguments) {
  Case c;
  c.name = "errors";
  c.q_lens = {1, 1};
  c.kv_lens = {10, 20};
  const Problem pr = make_problem(c, rng_);
  DeviceProblem dev(pr);
  const PagedAttentionParams good = dev.params(pr);
  auto expect_error = [&](PagedAttentionParams p, const std::string& fragment) {
    for (int k = 0; k < 2; ++k) {
      try {
        if (k == 0) {
          paged_decode_attention(p, nullptr);
        } else {
          paged_prefill_attention(p, nullptr);
        }
        ADD_FAILURE() << "expected an error mentioning '" << fragment << "'";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
      }
    }
  };
  PagedAttentionParams p = good;
  p.head_dim = 96;
  expect_error(p, "head_dim");
  p = good;
  p.num_q_heads = 6;
  p.num_kv_heads = 4;
  expect_error(p, "num_kv_heads");
  p = good;
  p.page_size = 0;
  expect_error(p, "page_size");
  p = good;
  p.q = static_cast<const char*>(good.q) + 2;
  expect_error(p, "aligned");
  p = good;
  p.kv_lens = nullptr;
  expect_error(p, "null");
  p = good;
  p.scale = 0.0f;
  expect_error(p, "scale");
  p = good;
  p.num_pages = -1;
  expect_error(p, "num_pages");

  p = good;
  p.num_splits = 8;
  p.workspace_bytes = 16;
  EXPECT_THROW(paged_decode_attention(p, nullptr), Error);
  PAGELLM_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST(PagedAttentionPlan, PrefillGridGoesKvMajorOnlyPastTheL2) {
  // Qwen3's 8 KV heads of 128: 4 KiB of K and V per token; an H100's 50 MiB L2.
  PagedAttentionParams p;
  p.num_q_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim = 128;
  const int64_t l2 = int64_t{50} << 20;
  p.max_kv_len = 8192;  // 32 MiB: every head's keys fit, heads fastest balances best
  EXPECT_FALSE(prefill_grid_kv_major(p, l2));
  p.max_kv_len = 12800;  // exactly 50 MiB: still fits
  EXPECT_FALSE(prefill_grid_kv_major(p, l2));
  p.max_kv_len = 12801;
  EXPECT_TRUE(prefill_grid_kv_major(p, l2));
  p.max_kv_len = 32768;
  EXPECT_TRUE(prefill_grid_kv_major(p, l2));
  EXPECT_FALSE(prefill_grid_kv_major(p, 0)) << "an unknown L2 keeps the default order";
  EXPECT_FALSE(prefill_grid_kv_major(p, int64_t{256} << 20)) << "a larger L2 holds 128 MiB";
  p.max_kv_len = 8192;
  p.num_kv_heads = 32;  // no GQA: four times the bytes per token
  EXPECT_TRUE(prefill_grid_kv_major(p, l2));
}

// ---- shared-prefix (cascade) decode ------------------------------------------------------

/// Decode rows in groups that share their first pages, as n-sample fan-out leaves them:
/// group g of sizes[g] sequences shares prompt_g / page full pages (the leader's), then each
/// member holds pages of its own for the rest of its context. Returns the problem and the
/// host batch whose shared prefixes assign_shared_prefixes found, checked against the groups
/// as built.
struct SharedProblem {
  Problem pr;
  ForwardBatch batch;
};

SharedProblem make_shared_problem(Case c, const std::vector<int>& sizes, int max_prompt,
                                  std::mt19937_64& rng) {
  std::vector<int> prompt;
  for (size_t g = 0; g < sizes.size(); ++g) {
    const int len = log_uniform(rng, 1, max_prompt);
    for (int m = 0; m < sizes[g]; ++m) {
      prompt.push_back(len);
      c.q_lens.push_back(1);
      c.kv_lens.push_back(len + log_uniform(rng, 1, 300));
    }
  }
  SharedProblem sp;
  sp.pr = make_problem(c, rng);
  Problem& pr = sp.pr;
  const int B = static_cast<int>(c.kv_lens.size());
  int b = 0;
  std::vector<int> expect(B, 0);
  for (int size : sizes) {
    const int lead = b, shared = prompt[lead] / c.page_size;
    for (int m = 0; m < size; ++m, ++b) {
      for (int j = 0; j < shared; ++j) {
        pr.page_table[static_cast<size_t>(b) * pr.max_pages_per_seq + j] =
            pr.page_table[static_cast<size_t>(lead) * pr.max_pages_per_seq + j];
      }
      expect[b] = size >= 2 ? shared * c.page_size : 0;
    }
  }
  ForwardBatch& fb = sp.batch;
  fb.page_size = c.page_size;
  fb.max_pages_per_seq = pr.max_pages_per_seq;
  fb.query_start = pr.query_start;
  fb.kv_lens = pr.kv_lens;
  fb.token_ids.assign(static_cast<size_t>(pr.num_tokens), 0);
  std::vector<std::vector<int32_t>> rows(B);
  std::vector<const std::vector<int32_t>*> pages;
  for (int r = 0; r < B; ++r) {
    const int n = (pr.kv_lens[r] + c.page_size - 1) / c.page_size;
    const int32_t* row = pr.page_table.data() + static_cast<size_t>(r) * pr.max_pages_per_seq;
    rows[r].assign(row, row + n);
    pages.push_back(&rows[r]);
  }
  assign_shared_prefixes(pages, fb);
  EXPECT_EQ(fb.shared_prefix_tokens, std::vector<int32_t>(expect.begin(), expect.end()));
  return sp;
}

/// One packing of `sp` (run_shared_case).
void run_shared_items(const SharedProblem& sp, int32_t members, std::mt19937_64& rng) {
  const Problem& pr = sp.pr;
  SCOPED_TRACE("members per item " + std::to_string(members));
  DeviceProblem dev(pr);
  const int B = static_cast<int>(pr.kv_lens.size());
  std::vector<int32_t> items(static_cast<size_t>(prefix_items_words(B))), tokens(B);
  const int32_t n_items = BatchStaging::pack_prefix_items(sp.batch, members, items.data(),
                                                          tokens.data());
  DeviceArray<int32_t> d_items(items), d_tokens(tokens);
  PagedAttentionParams p = dev.params(pr);
  p.prefix_items = d_items.get();
  p.prefix_tokens = d_tokens.get();
  p.max_prefix_items = B;
  ASSERT_TRUE(decode_cascade_supported(p));
  int folded_some = 0;
  for (int b = 0; b < B; ++b) {
    folded_some += tokens[b] > 0 && pr.kv_lens[b] - tokens[b] <= kDecodePrefixFoldKeys;
  }
  for (const int fold : {0, kDecodePrefixFoldKeys, 1 << 20}) {
    p.prefix_fold_keys = fold;
    for (int run = 0; run < 2; ++run) {  // twice: the counters must be back at zero
      dev.out.fill_bytes(0xff);
      // The partials after the split counters: NaN, so that a part merged before it was
      // written shows.
      PAGELLM_CUDA_CHECK(cudaMemset(dev.workspace.get() + (256 << 10), 0xff,
                                    dev.workspace.size() - (256 << 10)));
      paged_decode_attention_with(p, DecodeKernel::kTma, nullptr);
      PAGELLM_CUDA_CHECK(cudaGetLastError());
      PAGELLM_CUDA_CHECK(cudaDeviceSynchronize());
      const CheckResult r = check_output(pr, dev.out.download(), p.scale, rng);
      EXPECT_TRUE(r.ok) << "with prefix pass (" << n_items << " items, members of at most "
                        << fold << " own keys folded: " << (fold == 0 ? 0 : folded_some)
                        << " at the default), run " << run << ": " << r.report;
    }
  }
  // The same workspace then serves a call without the pass.
  dev.out.fill_bytes(0xff);
  paged_decode_attention_with(dev.params(pr), DecodeKernel::kTma, nullptr);
  PAGELLM_CUDA_CHECK(cudaDeviceSynchronize());
  const CheckResult r = check_output(pr, dev.out.download(), p.scale, rng);
  EXPECT_TRUE(r.ok) << "after the prefix pass, without it: " << r.report;
}

/// Runs `sp` through the TMA decode kernel with the prefix pass (items packed as the CUDA
/// backend packs them, of both sizes: 16-row and 32-row pass CTAs) on a poisoned output and
/// poisoned split partials, and checks it: with no member folded into the pass, with those
/// of at most kDecodePrefixFoldKeys keys after the prefix folded (some of an item, not
/// all), and with every member folded.
void run_shared_case(const SharedProblem& sp, std::mt19937_64& rng) {
  const Problem& pr = sp.pr;
  SCOPED_TRACE(pr.c.describe());
  int32_t last = 0;
  for (const int32_t rows : {kDecodePassRows / 2, kDecodePassRows}) {
    const int32_t members =
        decode_prefix_item_members(pr.c.num_q_heads, pr.c.num_kv_heads, rows);
    ASSERT_GE(members, 1);
    if (members != last) run_shared_items(sp, members, rng);  // 16 either way at group 1
    last = members;
  }
}

TEST_F(PagedAttention, DecodeSharedPrefixPassMatchesTheReference) {
  if (current_cc() < 90) GTEST_SKIP() << "the prefix pass runs in the TMA kernel (sm_90)";
  // Groups of 8 (n-sample fan-out), 17 and 5 (items split unevenly), 3, and singles; GQA
  // groups of 2, 4, 5 and 8 query heads per KV head and 1 (16 members an item); pages of
  // 16, 32 and 64; split counts automatic, 1 and 3 (cutting inside pages).
  struct Heads {
    int q, kv;
  };
  int k = 0;
  for (const Heads h : {Heads{32, 8}, Heads{16, 8}, Heads{40, 8}, Heads{64, 8}, Heads{8, 8}}) {
    for (int page : {16, 32, 64}) {
      for (int splits : {0, 1, 3}) {
        if (++k % 2 == 0 && !(h.q == 32 && page == 16)) continue;  // a spread, not all
        Case c;
        c.name = "decode shared prefix";
        c.num_q_heads = h.q;
        c.num_kv_heads = h.kv;
        c.page_size = page;
        c.num_splits = splits;
        run_shared_case(make_shared_problem(c, {8, 1, 17, 5, 3, 1, 8}, 1100, rng_), rng_);
      }
    }
  }
}

TEST_F(PagedAttention, DecodeSharedPrefixPassInAGraphWithNewItems) {
  if (current_cc() < 90) GTEST_SKIP() << "the prefix pass runs in the TMA kernel (sm_90)";
  // Captured once with fixed host fields; each replay brings new lengths, groups and items
  // (none in one replay, as a graph of a batch that shares nothing runs).
  Case c;
  c.name = "decode shared prefix graph";
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  const std::vector<int> sizes = {8, 8, 4, 2, 1, 1};
  const int B = 24, capacity = 2048;
  SharedProblem first = make_shared_problem(c, sizes, 1000, rng_);
  ASSERT_EQ(static_cast<int>(first.pr.kv_lens.size()), B);
  // Room for any replay's pages: a problem of capacity-long rows gives the pool and table.
  Case big = first.pr.c;
  big.kv_lens.assign(B, capacity);
  const Problem full = make_problem(big, rng_);
  DeviceProblem dev(full);
  PagedAttentionParams p = dev.params(full);
  p.max_kv_len = capacity;
  DeviceArray<int32_t> d_items(static_cast<size_t>(prefix_items_words(B)));
  DeviceArray<int32_t> d_tokens(static_cast<size_t>(B));
  d_items.fill_bytes(0);
  d_tokens.fill_bytes(0);
  p.prefix_items = d_items.get();
  p.prefix_tokens = d_tokens.get();
  p.max_prefix_items = B;
  cudaStream_t stream;
  PAGELLM_CUDA_CHECK(cudaStreamCreate(&stream));
  const int32_t members = decode_prefix_item_members(32, 8);
  check_graph_replays(
      dev, stream, p.scale,
      [&](cudaStream_t s) { paged_decode_attention_with(p, DecodeKernel::kTma, s); }, 3,
      [&](int replay) {
        // Lengths within the capacity; shared pages as built, on the full problem's pool.
        SharedProblem sp = make_shared_problem(c, sizes, 1000, rng_);
        Problem pr = full;
        pr.kv_lens = sp.pr.kv_lens;
        for (int b = 0; b < B; ++b) {
          for (int j = 0; j < pr.max_pages_per_seq; ++j) {
            pr.page_table[static_cast<size_t>(b) * pr.max_pages_per_seq + j] =
                full.page_table[static_cast<size_t>(b) * full.max_pages_per_seq + j];
          }
        }
        // Share the leaders' first pages again, on this table.
        int b = 0;
        for (int size : sizes) {
          const int lead = b, shared = sp.batch.shared_prefix_tokens[lead] / c.page_size;
          for (int m = 0; m < size; ++m, ++b) {
            for (int j = 0; j < shared; ++j) {
              pr.page_table[static_cast<size_t>(b) * pr.max_pages_per_seq + j] =
                  pr.page_table[static_cast<size_t>(lead) * pr.max_pages_per_seq + j];
            }
          }
        }
        dev.page_table.upload(pr.page_table);
        std::vector<int32_t> items(static_cast<size_t>(prefix_items_words(B))), tokens(B);
        ForwardBatch fb = sp.batch;
        if (replay == 1) {  // nothing shared
          fb.shared_prefix_group.clear();
          fb.shared_prefix_tokens.clear();
        }
        BatchStaging::pack_prefix_items(fb, members, items.data(), tokens.data());
        d_items.upload(items);
        d_tokens.upload(tokens);
        return pr;
      });
  cudaStreamDestroy(stream);
}

/// A decode batch of 12 sequences as assign_shared_prefixes groups them: a group of 9
/// (sequences 0-8, 64 tokens), a group of 2 (9 and 11, 32 tokens) and a single.
ForwardBatch grouped_decode_batch() {
  ForwardBatch fb;
  fb.page_size = 16;
  const int B = 12;
  for (int b = 0; b < B; ++b) {
    fb.query_start.push_back(b);
    fb.kv_lens.push_back(100);
    fb.token_ids.push_back(0);
  }
  fb.query_start.push_back(B);
  fb.shared_prefix_group = {0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 10, 9};
  fb.shared_prefix_tokens = {64, 64, 64, 64, 64, 64, 64, 64, 64, 32, 0, 32};
  return fb;
}

TEST(PrefixItems, PackedAsTheGroupsSay) {
  // Host only: the staging's packing of assign_shared_prefixes' groups.
  ForwardBatch fb = grouped_decode_batch();
  const int B = fb.num_seqs();
  std::vector<int32_t> items(static_cast<size_t>(prefix_items_words(B))), tokens(B);
  // 4 members an item: 9 splits into 3 items of 3; the pair is one item.
  ASSERT_EQ(BatchStaging::pack_prefix_items(fb, 4, items.data(), tokens.data()), 4);
  EXPECT_EQ(items[0], 4);
  auto item = [&](int i) { return items.data() + kPrefixItemsHeader + i * kPrefixItemInts; };
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(item(i)[0], 64);
    ASSERT_EQ(item(i)[1], 3);
    for (int m = 0; m < 3; ++m) EXPECT_EQ(item(i)[2 + m], 3 * i + m);
  }
  EXPECT_EQ(item(3)[0], 32);
  ASSERT_EQ(item(3)[1], 2);
  EXPECT_EQ(item(3)[2], 9);
  EXPECT_EQ(item(3)[3], 11);
  EXPECT_EQ(tokens, fb.shared_prefix_tokens);
  // Members of 1 (a GQA group of 16): nothing packed; nor for a step with a longer query.
  EXPECT_EQ(BatchStaging::pack_prefix_items(fb, 1, items.data(), tokens.data()), 0);
  EXPECT_EQ(tokens, std::vector<int32_t>(B, 0));
  fb.token_ids.push_back(0);
  fb.query_start.back() = B + 1;
  EXPECT_EQ(BatchStaging::pack_prefix_items(fb, 4, items.data(), tokens.data()), 0);
  EXPECT_EQ(items[0], 0);
}

TEST(PrefixItems, SixteenRowItemsWhileTheirPassFitsAWave) {
  // Host only. The group of 9 and the pair make 3 + 1 items of up to 4 members (16 rows at
  // 4 query heads per KV head) or 2 + 1 of up to 8 (32 rows); 8 KV heads.
  ForwardBatch fb = grouped_decode_batch();
  const int B = fb.num_seqs();
  EXPECT_EQ(decode_prefix_item_members(32, 8, kDecodePassRows / 2), 4);
  EXPECT_EQ(decode_prefix_item_members(32, 8), 8);
  PrefixItemSizes sizes;
  sizes.members = 8;
  sizes.half_members = 4;
  sizes.kv_heads = 8;
  sizes.max_half_ctas = 32;  // 4 half items x 8 KV heads: exactly one wave
  EXPECT_EQ(BatchStaging::prefix_item_members(fb, sizes), 4);
  sizes.max_half_ctas = 31;
  EXPECT_EQ(BatchStaging::prefix_item_members(fb, sizes), 8);
  std::vector<int32_t> items(static_cast<size_t>(prefix_items_words(B))), tokens(B);
  ASSERT_EQ(BatchStaging::pack_prefix_items(fb, 8, items.data(), tokens.data()), 3);
  EXPECT_EQ(items[kPrefixItemsHeader + 1], 5);  // 9 members: 5 and 4
  EXPECT_EQ(items[kPrefixItemsHeader + kPrefixItemInts + 1], 4);
  // A model whose groups fill 16 rows either way, and a batch that shares nothing, keep
  // `members`.
  sizes.half_members = 8;
  EXPECT_EQ(BatchStaging::prefix_item_members(fb, sizes), 8);
  sizes.half_members = 4;
  fb.shared_prefix_tokens.assign(B, 0);
  EXPECT_EQ(BatchStaging::prefix_item_members(fb, sizes), 8);
}

TEST(PagedAttentionPlan, SplitsFitTheWorkspaceAndFillTheDevice) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    GTEST_SKIP() << "no CUDA device";
  }
  PagedAttentionParams p;
  p.num_seqs = 1;
  p.num_tokens = 1;
  p.num_q_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim = 128;
  p.max_kv_len = 32768;
  p.workspace = reinterpret_cast<void*>(256);  // only its size matters for planning
  p.workspace_bytes = paged_attention_workspace_bytes(1, 32, 128, kMaxDecodeSplits);
  const int32_t many = plan_decode_splits(p);
  EXPECT_GE(many, 8) << "one sequence with 8 KV heads should be split to fill the device";
  EXPECT_LE(many, kMaxDecodeSplits);
  p.workspace_bytes = paged_attention_workspace_bytes(1, 32, 128, 3);
  EXPECT_LE(plan_decode_splits(p), 3) << "splits must fit the workspace";
  p.workspace_bytes = 0;
  EXPECT_EQ(plan_decode_splits(p), 1);
  p.workspace_bytes = paged_attention_workspace_bytes(1, 32, 128, kMaxDecodeSplits);
  p.max_kv_len = 100;
  EXPECT_EQ(plan_decode_splits(p), 1) << "short contexts need no split";
  p.max_kv_len = 32768;
  p.num_seqs = p.num_tokens = 256;
  p.workspace_bytes = paged_attention_workspace_bytes(256, 32, 128, kMaxDecodeSplits);
  EXPECT_EQ(plan_decode_splits(p), 1) << "256 x 8 CTAs fill the device without splits";

  // paged_decode_workspace_bytes never limits the plan.
  for (int batch : {1, 2, 3, 4, 8, 16, 33, 64}) {
    p.num_seqs = p.num_tokens = batch;
    p.workspace_bytes = paged_attention_workspace_bytes(batch, 32, 128, kMaxDecodeSplits);
    const int32_t unlimited = plan_decode_splits(p);
    p.workspace_bytes = paged_decode_workspace_bytes(32, 128);
    EXPECT_EQ(plan_decode_splits(p), unlimited) << "batch " << batch;
  }
}

}  // namespace
}  // namespace pagellm::cuda
