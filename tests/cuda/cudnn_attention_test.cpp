// The cuDNN attention route against the native kernels and a CPU reference (double
// precision over the same bf16 inputs), on every kind of call the planner can admit:
// prefill (uniform, ragged, with cached prefixes), decode, GQA ratios 1 to 16, head dims
// 64 and 128, several page sizes; plus graph capture and replay with new lengths, and the
// auto planner end to end.
//
// Pool slots no sequence owns (page 0 included) hold NaN and outputs are poisoned with NaN
// first, so a read past kv_len or an unwritten row shows up. A case passes when every row
// is finite, ||out - ref|| / ||ref|| <= 1e-2 over the checked rows with no (token, head)
// row above 3e-2, and cuDNN and native agree with each other to the same bounds.
//
// cuDNN must be loadable on the GPU machine (set PAGELLM_CUDNN_LIB to libcudnn.so.9 if the
// loader cannot find it); PAGELLM_ALLOW_NO_CUDNN=1 turns its absence into a skip.
#include "pagellm/cuda/attention/cudnn_attention.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "pagellm/common/dtype.h"
#include "pagellm/cuda/support/cuda_check.h"

namespace pagellm::cuda {
namespace {

constexpr uint16_t kNaNBits = 0x7fc0;

template <class T>
class Buffer {
 public:
  explicit Buffer(size_t n) : n_(n) {
    if (n_) PAGELLM_CUDA_CHECK(cudaMalloc(&ptr_, n_ * sizeof(T)));
  }
  explicit Buffer(const std::vector<T>& host) : Buffer(host.size()) { upload(host); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (ptr_) cudaFree(ptr_);
  }
  T* get() const { return ptr_; }
  // upload() and poison() finish before they return: they run on the legacy stream, which
  // the tests' non-blocking streams do not wait for (a poison still in flight once
  // overwrote part of a finished output on the H200).
  void upload(const std::vector<T>& host) {
    if (n_) PAGELLM_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
    PAGELLM_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_) PAGELLM_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  void poison() {
    if (n_) PAGELLM_CUDA_CHECK(cudaMemset(ptr_, 0xff, n_ * sizeof(T)));
    PAGELLM_CUDA_CHECK(cudaDeviceSynchronize());
  }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

uint64_t seed() {
  static const uint64_t s = []() -> uint64_t {
    if (const char* env = std::getenv("PAGELLM_TEST_SEED")) return std::strtoull(env, nullptr, 10);
    return (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  }();
  return s;
}

struct Route {
  std::string name;
  int hq = 32, hkv = 8, d = 128, page = 16;
  std::vector<int32_t> q, kv;
  /// Page-table row capacity in tokens; 0: the longest KV plus one spare page. The engine's
  /// rows hold max_model_len tokens whatever the batch (e.g. 40960 / 16 = 2560 pages).
  int table_tokens = 0;
  std::string describe() const {
    std::ostringstream s;
    s << name << " [Hq=" << hq << " Hkv=" << hkv << " D=" << d << " page=" << page
      << " seqs=" << q.size();
    if (table_tokens) s << " row=" << table_tokens << " tokens";
    s << "]";
    return s.str();
  }
};

// Host inputs laid out as the kernels take them.
struct Inputs {
  Route r;
  int tokens = 0, pages = 0, table = 0;
  std::vector<int32_t> query_start, page_table;
  std::vector<uint16_t> q, k, v;

  size_t kv_at(int b, int pos, int head, int dim) const {
    const int page = page_table[static_cast<size_t>(b) * table + pos / r.page];
    return ((static_cast<size_t>(page) * r.hkv + head) * r.page + pos % r.page) * r.d + dim;
  }
};

Inputs make_inputs(const Route& r, std::mt19937_64& rng) {
  Inputs in;
  in.r = r;
  in.query_start.push_back(0);
  int longest = 1;
  for (size_t b = 0; b < r.q.size(); ++b) {
    in.query_start.push_back(in.query_start.back() + r.q[b]);
    longest = std::max(longest, r.kv[b]);
  }
  in.tokens = in.query_start.back();
  in.table = r.table_tokens > 0 ? (r.table_tokens + r.page - 1) / r.page
                                 : (longest + r.page - 1) / r.page + 1;  // rows are not exact
  int owned = 0;
  for (int32_t kv : r.kv) owned += (kv + r.page - 1) / r.page;
  in.pages = owned + 3;  // page 0 (reserved) and two pages nobody owns
  std::vector<int32_t> order(in.pages - 1);
  std::iota(order.begin(), order.end(), 1);
  std::shuffle(order.begin(), order.end(), rng);
  in.page_table.assign(r.q.size() * static_cast<size_t>(in.table), 0);
  std::vector<char> used(in.pages, 0);
  size_t next = 0;
  for (size_t b = 0; b < r.q.size(); ++b) {
    for (int j = 0; j < (r.kv[b] + r.page - 1) / r.page; ++j) {
      const int page = order[next++];
      in.page_table[b * in.table + j] = page;
      used[page] = 1;
    }
  }
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  in.q.resize(static_cast<size_t>(in.tokens) * r.hq * r.d);
  for (uint16_t& x : in.q) x = f32_to_bf16(u(rng));
  const size_t pool = static_cast<size_t>(in.pages) * r.hkv * r.page * r.d;
  in.k.assign(pool, kNaNBits);
  in.v.assign(pool, kNaNBits);
  for (size_t b = 0; b < r.q.size(); ++b) {
    for (int pos = 0; pos < r.kv[b]; ++pos) {
      for (int h = 0; h < r.hkv; ++h) {
        for (int dim = 0; dim < r.d; ++dim) {
          in.k[in.kv_at(static_cast<int>(b), pos, h, dim)] = f32_to_bf16(u(rng));
          in.v[in.kv_at(static_cast<int>(b), pos, h, dim)] = f32_to_bf16(u(rng));
        }
      }
    }
  }
  return in;
}

// Reference output row (token i of sequence b, query head h) in double precision.
std::vector<double> reference_row(const Inputs& in, int b, int i, int h, double scale) {
  const Route& r = in.r;
  const int q_len = in.query_start[b + 1] - in.query_start[b];
  const int keys = r.kv[b] - q_len + i + 1;
  const int kvh = h / (r.hq / r.hkv);
  const size_t qrow = (static_cast<size_t>(in.query_start[b] + i) * r.hq + h) * r.d;
  std::vector<double> logits(keys);
  double mx = -1e300;
  for (int j = 0; j < keys; ++j) {
    double s = 0;
    for (int dim = 0; dim < r.d; ++dim) {
      s += static_cast<double>(bf16_to_f32(in.q[qrow + dim])) * bf16_to_f32(in.k[in.kv_at(b, j, kvh, dim)]);
    }
    logits[j] = s * scale;
    mx = std::max(mx, logits[j]);
  }
  double sum = 0;
  for (double& l : logits) sum += (l = std::exp(l - mx));
  std::vector<double> out(r.d, 0.0);
  for (int j = 0; j < keys; ++j) {
    for (int dim = 0; dim < r.d; ++dim) {
      out[dim] += logits[j] / sum * bf16_to_f32(in.v[in.kv_at(b, j, kvh, dim)]);
    }
  }
  return out;
}

struct Errors {
  double total = 0, worst = 0;
  int64_t nonfinite = 0;
};

// Relative error of `out` against `ref_of(b, i, h)` over sampled rows; finiteness over all.
template <class RefFn>
Errors compare(const Inputs& in, const std::vector<uint16_t>& out, RefFn ref_of,
               std::mt19937_64& rng) {
  const Route& r = in.r;
  Errors e;
  for (size_t x = 0; x < out.size(); ++x) e.nonfinite += !std::isfinite(bf16_to_f32(out[x]));
  double err2 = 0, ref2 = 0;
  for (size_t b = 0; b < r.q.size(); ++b) {
    std::vector<int> rows;
    for (int i = 0; i < r.q[b]; ++i) {
      if (i < 4 || i >= r.q[b] - 4 || std::uniform_int_distribution<int>(0, r.q[b])(rng) < 12) {
        rows.push_back(i);
      }
    }
    for (int i : rows) {
      for (int h = 0; h < r.hq; h += (r.hq > 8 ? 3 : 1)) {
        const std::vector<double> ref = ref_of(static_cast<int>(b), i, h);
        const size_t base = (static_cast<size_t>(in.query_start[b] + i) * r.hq + h) * r.d;
        double e2 = 0, n2 = 0;
        for (int dim = 0; dim < r.d; ++dim) {
          const double diff = bf16_to_f32(out[base + dim]) - ref[dim];
          e2 += diff * diff;
          n2 += ref[dim] * ref[dim];
        }
        if (!std::isfinite(e2)) e2 = 1e30;
        err2 += e2;
        ref2 += n2;
        e.worst = std::max(e.worst, std::sqrt(e2) / std::max(std::sqrt(n2), 1e-3));
      }
    }
  }
  e.total = std::sqrt(err2) / std::max(std::sqrt(ref2), 1e-12);
  return e;
}

std::vector<double> as_double(const std::vector<uint16_t>& out, size_t base, int d) {
  std::vector<double> v(d);
  for (int i = 0; i < d; ++i) v[i] = bf16_to_f32(out[base + i]);
  return v;
}

AttentionDomain domain_of(const Route& r) {
  AttentionDomain d;
  d.dtype = DType::BF16;
  d.num_q_heads = r.hq;
  d.num_kv_heads = r.hkv;
  d.head_dim = r.d;
  d.page_size = r.page;
  d.scale = 1.0f / std::sqrt(static_cast<float>(r.d));
  return d;
}

/// The batch the planner sees for these inputs.
ForwardBatch batch_of(const Inputs& in) {
  ForwardBatch batch;
  batch.page_size = in.r.page;
  batch.max_pages_per_seq = in.table;
  batch.query_start = in.query_start;
  batch.kv_lens = in.r.kv;
  batch.page_table = in.page_table;
  batch.token_ids.assign(in.tokens, 0);
  return batch;
}

/// The inputs on the device, and the kernels' parameters over them (out left unset).
struct DeviceInputs {
  explicit DeviceInputs(const Inputs& in)
      : q(in.q), k(in.k), v(in.v), qs(in.query_start), kvl(in.r.kv), pt(in.page_table) {}
  PagedAttentionParams params(const Inputs& in, float scale) const {
    const Route& r = in.r;
    PagedAttentionParams p;
    p.q = q.get();
    p.k_pool = k.get();
    p.v_pool = v.get();
    p.query_start = qs.get();
    p.kv_lens = kvl.get();
    p.page_table = pt.get();
    p.num_seqs = static_cast<int32_t>(r.q.size());
    p.num_tokens = in.tokens;
    p.num_q_heads = r.hq;
    p.num_kv_heads = r.hkv;
    p.head_dim = r.d;
    p.page_size = r.page;
    p.max_pages_per_seq = in.table;
    p.max_query_len = *std::max_element(r.q.begin(), r.q.end());
    p.max_kv_len = *std::max_element(r.kv.begin(), r.kv.end());
    p.scale = scale;
    return p;
  }
  Buffer<uint16_t> q, k, v;
  Buffer<int32_t> qs, kvl, pt;
};

/// A planner with cuDNN forced (`--attention-backend cudnn`) over its own plan cache.
struct ForcedCudnnPlanner {
  ForcedCudnnPlanner() = default;
  ForcedCudnnPlanner(const ForcedCudnnPlanner&) = delete;  // the planner points at cache
  ForcedCudnnPlanner& operator=(const ForcedCudnnPlanner&) = delete;
  static AttentionPlannerConfig config_for(CudnnPlanCache& plans) {
    AttentionPlannerConfig config;
    config.choice = AttentionBackendChoice::kCudnn;
    config.device = cuda_device_profile(0);
    config.registry = &plans;
    return config;
  }
  CudnnPlanCache cache{0};
  AttentionPlanner planner{config_for(cache)};
};

class CudnnAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
    const CudnnLibrary& lib = cudnn_library();
    if (lib.version == 0) {
      if (std::getenv("PAGELLM_ALLOW_NO_CUDNN")) GTEST_SKIP() << lib.error;
      FAIL() << lib.error;
    }
    static bool announced = false;
    if (!announced) {
      announced = true;
      std::cout << "[ cudnn    ] " << lib.path << " " << cudnn_version_string(lib.version)
                << "; PAGELLM_TEST_SEED=" << seed() << "\n";
    }
    rng_.seed(seed());
  }

  // Runs `r` through cuDNN (explicit) and the native kernels; checks both.
  void check_route(const Route& r) {
    SCOPED_TRACE(r.describe());
    const Inputs in = make_inputs(r, rng_);
    const DeviceInputs dev(in);
    Buffer<uint16_t> out_cudnn(in.q.size()), out_native(in.q.size());
    const bool decode = std::all_of(r.q.begin(), r.q.end(), [](int32_t x) { return x == 1; });
    const AttentionDomain dom = domain_of(r);

    ForcedCudnnPlanner forced;
    CudnnPlanCache& cache = forced.cache;
    const ForwardBatch batch = batch_of(in);
    const AttentionPlan& plan = forced.planner.plan(dom, batch_view(batch));
    ASSERT_EQ(plan.provider, AttentionProvider::kCudnn) << plan.summary();
    EXPECT_EQ(plan.phase, decode ? AttentionPhase::kDecode : AttentionPhase::kPrefill);
    // cuDNN's paged loads need ceil(s_kv / page) == the row length: s_kv is the row.
    EXPECT_EQ(plan.cudnn_key.max_kv_len, in.table * r.page);

    PagedAttentionParams p = dev.params(in, dom.scale);
    cache.set_num_pages(in.pages);
    cache.build(plan.cudnn_key);
    out_cudnn.poison();
    p.out = out_cudnn.get();
    cache.upload(plan, nullptr);
    cache.run(p, plan, nullptr);
    PAGELLM_CUDA_CHECK(cudaDeviceSynchronize());

    const size_t ws_bytes = paged_attention_workspace_bytes(in.tokens, r.hq, r.d, 8);
    Buffer<char> ws(std::max<size_t>(ws_bytes, 256));
    PAGELLM_CUDA_CHECK(cudaMemset(ws.get(), 0, std::max<size_t>(ws_bytes, 256)));  // counters
    p.workspace = ws.get();
    p.workspace_bytes = ws_bytes;
    p.out = out_native.get();
    out_native.poison();
    if (decode) {
      paged_decode_attention(p, nullptr);
    } else {
      paged_prefill_attention(p, nullptr);
    }
    PAGELLM_CUDA_CHECK(cudaDeviceSynchronize());

    const std::vector<uint16_t> c = out_cudnn.download(), n = out_native.download();
    const double scale = dom.scale;
    auto ref = [&](int b, int i, int h) { return reference_row(in, b, i, h, scale); };
    const Errors ec = compare(in, c, ref, rng_);
    const Errors en = compare(in, n, ref, rng_);
    auto native_row = [&](int b, int i, int h) {
      return as_double(n, (static_cast<size_t>(in.query_start[b] + i) * r.hq + h) * r.d, r.d);
    };
    const Errors ecn = compare(in, c, native_row, rng_);
    std::ostringstream report;
    report << "seed " << seed() << ": cuDNN vs reference " << ec.total << " (worst row " << ec.worst
           << "), native vs reference " << en.total << " (worst " << en.worst
           << "), cuDNN vs native " << ecn.total << " (worst " << ecn.worst << ")";
    EXPECT_EQ(ec.nonfinite, 0) << "cuDNN left non-finite values; " << report.str();
    EXPECT_LE(ec.total, 1e-2) << report.str();
    EXPECT_LE(ec.worst, 3e-2) << report.str();
    EXPECT_LE(ecn.total, 1e-2) << report.str();
    EXPECT_LE(ecn.worst, 3e-2) << report.str();
    if (std::getenv("PAGELLM_TEST_VERBOSE")) std::cout << "  " << r.describe() << ": " << report.str() << "\n";
  }

  std::mt19937_64 rng_;
};

TEST_F(CudnnAttention, PrefillUniform) {
  check_route({"uniform prefill", 32, 8, 128, 16, {128, 128, 128, 128}, {128, 128, 128, 128}});
}

TEST_F(CudnnAttention, PrefillRaggedWithCachedPrefixes) {
  check_route({"ragged + prefixes", 32, 8, 128, 16, {1, 17, 300, 64, 5}, {1, 500, 300, 1000, 77}});
}

TEST_F(CudnnAttention, PrefillOneLongManyShort) {
  std::vector<int32_t> q(24, 1), kv(24, 3);
  q[3] = kv[3] = 700;
  kv[10] = 1500;
  check_route({"one long, many short", 32, 8, 128, 16, q, kv});
}

TEST_F(CudnnAttention, PrefillChunkAfterALongPrefix) {
  check_route({"chunk after prefix", 32, 8, 128, 32, {256}, {3000}});
}

TEST_F(CudnnAttention, PrefillGqaRatiosAndHeadDims) {
  check_route({"MHA", 8, 8, 128, 16, {40, 90}, {40, 200}});
  check_route({"MQA", 16, 1, 128, 16, {33, 7}, {100, 7}});
  check_route({"GQA 2, head_dim 64", 16, 8, 64, 16, {65, 130}, {65, 400}});
}

TEST_F(CudnnAttention, PrefillPageSizes) {
  for (int page : {1, 8, 64, 128}) {
    check_route({"page size " + std::to_string(page), 32, 8, 128, page, {50, 3}, {200, 60}});
  }
}

TEST_F(CudnnAttention, DecodeUniformAndRagged) {
  check_route({"decode uniform", 32, 8, 128, 16, std::vector<int32_t>(16, 1),
               std::vector<int32_t>(16, 1000)});
  std::vector<int32_t> kv(64);
  std::uniform_int_distribution<int> u(1, 4000);
  for (int32_t& x : kv) x = u(rng_);
  kv[0] = 1;  // a padding-like row
  check_route({"decode ragged", 32, 8, 128, 16, std::vector<int32_t>(64, 1), kv});
  check_route({"decode head_dim 64, MQA", 16, 1, 64, 16, std::vector<int32_t>(8, 1),
               {5, 70, 300, 1, 2, 900, 16, 17}});
}

// A decode plan captured into a CUDA graph replays correctly with new KV lengths (written
// into the same device arrays), as the engine's decode graphs do. `table_tokens` is the
// page-table row (the engine's is max_model_len rounded up to pages), `capacity` the KV
// bound every replay stays within; cuDNN's s_kv is the whole row either way.
void check_decode_graph(std::mt19937_64& rng, int table_tokens, int capacity,
                        const std::vector<std::vector<int32_t>>& replays) {
  Route r{"decode graph", 32, 8, 128, 16, std::vector<int32_t>(8, 1), std::vector<int32_t>(8, capacity),
          table_tokens};
  SCOPED_TRACE(r.describe());
  const Inputs in = make_inputs(r, rng);
  DeviceInputs dev(in);
  Buffer<uint16_t> out(in.q.size()), eager(in.q.size());
  const AttentionDomain dom = domain_of(r);
  ForcedCudnnPlanner forced;
  CudnnPlanCache& cache = forced.cache;
  AttentionPlanner& planner = forced.planner;
  ForwardBatch batch = batch_of(in);
  batch.kv_len_capacity = capacity;
  GraphCapacity cap;
  cap.num_seqs = 8;
  cap.max_num_tokens = 8;
  cap.max_query_len = 1;
  cap.max_pages_per_seq = in.table;
  cap.kv_len_capacity = capacity;
  const AttentionPlan& plan = planner.bind_to_graph(dom, cap, batch_view(batch));
  ASSERT_EQ(plan.provider, AttentionProvider::kCudnn);
  EXPECT_EQ(plan.cudnn_key.max_kv_len, in.table * r.page);  // the row, not the capacity
  PagedAttentionParams p = dev.params(in, dom.scale);  // max_kv_len: capacity, every row's
  p.out = out.get();
  cache.set_num_pages(in.pages);
  cache.build(plan.cudnn_key);

  cudaStream_t stream;
  PAGELLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cache.run(p, plan, stream);  // warm-up outside capture
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  PAGELLM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cache.run(p, plan, stream);
  PAGELLM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  PAGELLM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  for (const std::vector<int32_t>& lens : replays) {
    dev.kvl.upload(lens);
    // The planner, still bound, accepts the new lengths with the same plan.
    ForwardBatch next = batch;
    next.kv_lens = lens;
    EXPECT_EQ(planner.plan(dom, batch_view(next)).cudnn_key, plan.cudnn_key);
    out.poison();
    PAGELLM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<uint16_t> replayed = out.download();
    p.out = eager.get();
    eager.poison();
    cache.run(p, plan, stream);
    PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream));
    p.out = out.get();
    const std::vector<uint16_t> eager_out = eager.download();
    // cuDNN's decode kernel is not bitwise deterministic from run to run: on the H200
    // (cuDNN 9.14, 2026-11-29) a replay and an eager run of the same plan differed in two
    // of about 20 runs of this test, the second time in 1 of 32,768 values by one bf16 ulp. So the replay must
    // equal the eager run to within one ulp in every value, with none left unwritten; a
    // replay that read stale lengths or buffers differs by far more.
    auto ulps = [](uint16_t a, uint16_t b) {
      if ((a ^ b) & 0x8000u) return static_cast<int>(a & 0x7fffu) + static_cast<int>(b & 0x7fffu);
      return std::abs(static_cast<int>(a) - static_cast<int>(b));
    };
    size_t differ = 0, beyond_ulp = 0, unwritten = 0, first = replayed.size();
    for (size_t i = 0; i < replayed.size(); ++i) {
      unwritten += replayed[i] == 0xffff || eager_out[i] == 0xffff;
      if (replayed[i] == eager_out[i]) continue;
      ++differ;
      if (ulps(replayed[i], eager_out[i]) > 1) {
        if (beyond_ulp++ == 0) first = i;
      }
    }
    EXPECT_EQ(unwritten, 0u) << "values left unwritten (0xffff) by the replay or the eager run";
    EXPECT_EQ(beyond_ulp, 0u) << "graph replay differs from an eager run by more than one ulp in "
                              << beyond_ulp << " of " << replayed.size() << " values (first at "
                              << first << "; " << differ << " differ at all)";
    Inputs shrunk = in;
    shrunk.r.kv = lens;
    const Errors e = compare(
        shrunk, replayed, [&](int b, int i, int h) { return reference_row(shrunk, b, i, h, dom.scale); },
        rng);
    EXPECT_EQ(e.nonfinite, 0);
    EXPECT_LE(e.total, 1e-2);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_F(CudnnAttention, DecodeGraphReplaysWithNewLengths) {
  // Capacity 1000 in a row of 64 pages (1024 tokens): s_kv 1024, KV lengths up to 1000.
  check_decode_graph(rng_, 0, 1000,
                     {{1, 2, 3, 999, 1000, 17, 64, 500}, std::vector<int32_t>(8, 1000)});
}

TEST_F(CudnnAttention, DecodeGraphWithTheEnginesPageTableStride) {
  // The engine's decode graphs: rows of max_model_len / page_size pages (4000 / 16 -> 250
  // pages, s_kv 4000) with KV capacity max_model_len, replayed with short and full lengths.
  check_decode_graph(rng_, 4000, 4000,
                     {{1, 1, 1, 1, 1, 1, 1, 1}, {1, 17, 300, 4000, 2, 999, 64, 3333}});
}

TEST_F(CudnnAttention, EngineWidePageTables) {
  // Eager calls whose rows are far longer than their KV (the engine's rows hold
  // max_model_len tokens): s_kv is the row (40960), the real lengths come from seq_len_kv.
  check_route({"wide rows, ragged prefill", 32, 8, 128, 16, {17, 300, 1}, {500, 300, 40}, 40960});
  check_route({"wide rows, decode", 32, 8, 128, 16, std::vector<int32_t>(16, 1),
               {1, 2, 3, 1000, 4096, 17, 16, 15, 33, 64, 65, 100, 999, 1, 7, 2048}, 40960});
  check_route({"wide rows, page 64", 32, 8, 128, 64, {50, 3}, {200, 60}, 8000});
}

// Auto with a table that admits everything routes to cuDNN only after the plan is built
// off the hot path, and a run during capture without a plan is refused, not built.
TEST_F(CudnnAttention, AutoRequestsPlansAndNeverBuildsDuringCapture) {
  Route r{"auto", 32, 8, 128, 16, {64, 64}, {64, 200}};
  const Inputs in = make_inputs(r, rng_);
  const DeviceProfile device = cuda_device_profile(0);
  CrossoverTables tables;
  CrossoverTable t;
  t.device = device;
  t.measured_on = "test";
  CrossoverEntry e;
  e.mode = LaunchMode::kEager;
  e.phase = AttentionPhase::kPrefill;
  e.head_dim = 128;
  e.shape_class = classify_shape(64, 128, 200, /*ragged_query=*/false);  // q {64, 64}, kv {64, 200}
  e.min_work = 0;
  e.max_work = int64_t{1} << 50;
  e.page_sizes = {16};
  e.gqa_ratios = {4};
  e.max_num_seqs = 8;
  e.max_query_len = 1024;
  e.max_kv_len = 1024;
  t.entries.push_back(e);
  tables.add(t);
  CudnnPlanCache cache(0);
  cache.set_num_pages(in.pages);
  AttentionPlannerConfig config;
  config.device = device;
  config.tables = &tables;
  config.registry = &cache;
  AttentionPlanner planner(config);
  const ForwardBatch batch = batch_of(in);
  const AttentionDomain dom = domain_of(r);
  EXPECT_EQ(planner.plan(dom, batch_view(batch)).provider, AttentionProvider::kNative);
  EXPECT_EQ(cache.num_requested(), 1u);
  EXPECT_TRUE(cache.build_requested().empty());
  EXPECT_EQ(cache.num_plans(), 1u);
  EXPECT_EQ(planner.plan(dom, batch_view(batch)).provider, AttentionProvider::kCudnn);

  // A plan never built is refused inside capture.
  AttentionPlannerConfig forced = config;
  forced.choice = AttentionBackendChoice::kCudnn;
  AttentionPlanner strict(forced);
  ForwardBatch other = batch;
  other.kv_lens = {64, 3000};
  other.max_pages_per_seq = 200;
  other.page_table.assign(2 * 200, 1);
  const AttentionPlan& plan = strict.plan(dom, batch_view(other));
  ASSERT_TRUE(plan.cudnn_plan_missing);
  Buffer<uint16_t> q(in.q), k(in.k), v(in.v), out(in.q.size());
  Buffer<int32_t> kvl(other.kv_lens), pt(other.page_table);
  PagedAttentionParams p;
  p.q = q.get();
  p.k_pool = k.get();
  p.v_pool = v.get();
  p.out = out.get();
  p.kv_lens = kvl.get();
  p.page_table = pt.get();
  p.num_seqs = 2;
  p.num_tokens = in.tokens;
  p.num_q_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim = 128;
  p.page_size = 16;
  p.max_pages_per_seq = 200;
  p.scale = dom.scale;
  cudaStream_t stream;
  PAGELLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cache.upload(plan, stream);
  PAGELLM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  EXPECT_THROW(cache.run(p, plan, stream), Error);
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream, &graph);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();
  cudaStreamDestroy(stream);
  EXPECT_EQ(cache.num_plans(), 1u);
}

TEST_F(CudnnAttention, StaticSupportMatchesTheLoadedVersion) {
  AttentionDomain d = domain_of({"", 32, 8, 128, 16, {1}, {1}});
  std::string why;
  EXPECT_TRUE(cudnn_attention_supported(d, AttentionPhase::kPrefill, 0, &why)) << why;
  d.head_dim = 100;
  EXPECT_FALSE(cudnn_attention_supported(d, AttentionPhase::kPrefill, 0, &why));
  EXPECT_NE(why.find("head_dim 100"), std::string::npos) << why;
}

}  // namespace
}  // namespace pagellm::cuda
