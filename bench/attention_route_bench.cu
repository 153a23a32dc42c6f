// attention_route_bench: measures where cuDNN's paged attention beats the native kernels
// on this GPU, and what `--attention-backend auto` makes of it.
//
//   attention_route_bench calibrate [--out DIR|FILE] [--quick] [--page-sizes 16,32]
//                                   [--margin 0.05] [--iters 20] [--seed 1]
//     Times native and cuDNN, eager and under graph replay, over a grid of batches (batch,
//     heads, query and KV lengths, uniform and ragged, prefill and decode), derives the
//     crossover per (mode, phase, head_dim) and writes the table `auto` reads
//     (data/attention/crossover-<device>-...-cudnn<version>.json by default; `pagellm
//     calibrate-attention` runs this).
//   attention_route_bench routes [--table FILE|DIR] [--iters 20] [--layers 36] [--quick]
//     Over a fixed grid of routes, times native, cuDNN and auto (auto pays one plan() and,
//     for cuDNN prefill, one upload per forward of --layers calls), prints each route's
//     speedup of auto over native, and the spread of auto/native over the routes auto kept
//     on native (plan() overhead: must stay within the native-vs-native noise, also
//     printed). Prints Markdown for docs/PERFORMANCE.md.
//
// Each call's time is the mean over a loop of back-to-back launches between two CUDA
// events (eager: host submission cost included whenever it exceeds the kernel's time; graph:
// one graph of --layers calls replayed). Roofline columns: prefill against 989 TFLOP/s
// (H100/H200 dense bf16 datasheet), decode against 4.8 TB/s (H200 HBM3e datasheet); the
// work is 4 * head_dim FLOPs per causal query-key pair, decode reads every K/V byte once.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "pagellm/attention/crossover_table.h"
#include "pagellm/attention/planner.h"
#include "pagellm/common/check.h"
#include "pagellm/cuda/attention/attention.h"
#include "pagellm/cuda/support/cuda_check.h"
#include "pagellm/cuda/attention/cudnn_attention.h"

using namespace pagellm;
using namespace pagellm::cuda;

namespace {

constexpr double kPeakTflops = 989.0;  // dense bf16, H100/H200 SXM datasheet
constexpr double kPeakTbps = 4.8;      // H200 HBM3e datasheet

// Deterministic pseudo-random bf16 in [-1, 1): inputs need sane magnitudes, not a good RNG.
__global__ void fill_random_bf16(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32);
    h ^= h >> 16;
    h *= 0x7feb352dU;
    h ^= h >> 15;
    x[i] = __float2bfloat16((h & 0xffff) / 32768.0f - 1.0f);
  }
}

void fill(void* p, size_t n, uint32_t seed) {
  fill_random_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
  PAGELLM_CUDA_CHECK_LAUNCH();
}

struct Args {
  std::string mode;
  std::string out;
  std::vector<std::string> tables;
  std::vector<int32_t> page_sizes = {16};
  double margin = 0.05;
  int iters = 20;
  int layers = 36;
  bool quick = false;
  uint32_t seed = 1;
};

std::vector<int32_t> parse_int_list(const std::string& s) {
  std::vector<int32_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoi(item));
  return v;
}

[[noreturn]] void usage(const char* error) {
  std::fprintf(stderr,
               "%s%s"
               "usage: attention_route_bench calibrate [--out DIR|FILE] [--quick] [--page-sizes 16,32]\n"
               "                                       [--margin 0.05] [--iters 20] [--seed 1]\n"
               "       attention_route_bench routes [--table FILE|DIR]... [--iters 20] [--layers 36]\n"
               "                                    [--quick]\n"
               "  --quick: calibrate a smaller grid; routes with 10 iterations (about a minute each\n"
               "  on an H200). From a bundle, pass --out and --table explicitly (data/attention is\n"
               "  otherwise looked for beside the binary).\n",
               error ? error : "", error ? "\n" : "");
  std::exit(error ? 2 : 0);
}

Args parse_args(int argc, char** argv) {
  Args a;
  if (argc < 2) usage("missing mode (calibrate or routes)");
  a.mode = argv[1];
  if (a.mode == "--help" || a.mode == "-h") usage(nullptr);
  if (a.mode != "calibrate" && a.mode != "routes") usage("mode must be calibrate or routes");
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + k).c_str());
      return argv[++i];
    };
    if (k == "--out") a.out = value();
    else if (k == "--table") a.tables.push_back(value());
    else if (k == "--page-sizes") a.page_sizes = parse_int_list(value());
    else if (k == "--margin") a.margin = std::stod(value());
    else if (k == "--iters") a.iters = std::stoi(value());
    else if (k == "--layers") a.layers = std::stoi(value());
    else if (k == "--seed") a.seed = static_cast<uint32_t>(std::stoul(value()));
    else if (k == "--quick") a.quick = true;
    else if (k == "--help" || k == "-h") usage(nullptr);
    else usage(("unknown option " + k).c_str());
  }
  PAGELLM_CHECK(a.iters > 0 && a.layers > 0 && a.margin >= 0)
      << "--iters and --layers must be positive and --margin non-negative";
  if (a.quick && a.mode == "routes") a.iters = std::min(a.iters, 10);
  return a;
}

// One call shape: heads, page size, per-sequence lengths.
struct Point {
  std::string label;
  int32_t hq = 32, hkv = 8, d = 128, page = 16;
  std::vector<int32_t> q, kv;
  bool ragged = false;

  int32_t tokens() const {
    int32_t t = 0;
    for (int32_t x : q) t += x;
    return t;
  }
  bool decode() const {
    return std::all_of(q.begin(), q.end(), [](int32_t x) { return x == 1; });
  }
};

// Device state shared by every point: pools large enough for the biggest, q/out buffers,
// the native decode workspace, the cuDNN plan cache.
class Bench {
 public:
  Bench(int64_t pool_tokens, int64_t max_q_elems, int32_t max_hkv, int32_t d) : cache_(0) {
    PAGELLM_CUDA_CHECK(cudaSetDevice(0));
    PAGELLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    PAGELLM_CUDA_CHECK(cudaEventCreate(&start_));
    PAGELLM_CUDA_CHECK(cudaEventCreate(&stop_));
    profile_ = cuda_device_profile(0);
    // Pages of the smallest page size (the most pages): the pool bytes are the same for
    // every page size; pages are shared out by index.
    pool_elems_ = pool_tokens * max_hkv * d;
    PAGELLM_CUDA_CHECK(cudaMalloc(&k_, pool_elems_ * 2));
    PAGELLM_CUDA_CHECK(cudaMalloc(&v_, pool_elems_ * 2));
    PAGELLM_CUDA_CHECK(cudaMalloc(&q_, max_q_elems * 2));
    PAGELLM_CUDA_CHECK(cudaMalloc(&out_, max_q_elems * 2));
    fill(k_, pool_elems_, 11);
    fill(v_, pool_elems_, 12);
    fill(q_, max_q_elems, 13);
    // Native decode's split-KV partials for up to 1024 decode rows of 64 heads.
    ws_bytes_ = paged_attention_workspace_bytes(1024, 64, d, 8);
    PAGELLM_CUDA_CHECK(cudaMalloc(&ws_, std::max<size_t>(ws_bytes_, 256)));
    PAGELLM_CUDA_CHECK(cudaMemset(ws_, 0, std::max<size_t>(ws_bytes_, 256)));  // split counters
    pool_tokens_ = pool_tokens;
    PAGELLM_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~Bench() {
    for (void* p : {k_, v_, q_, out_, ws_, qs_, kvl_, pt_}) cudaFree(p);
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
  }

  const DeviceProfile& profile() const { return profile_; }
  CudnnPlanCache& cache() { return cache_; }

  // Loads a point's metadata: random distinct pages per sequence where the pool allows.
  void load(const Point& pt, std::mt19937& rng) {
    point_ = pt;
    host_.page_size = pt.page;
    host_.query_start.assign(1, 0);
    host_.kv_lens = pt.kv;
    int32_t longest = 1;
    for (size_t b = 0; b < pt.q.size(); ++b) {
      host_.query_start.push_back(host_.query_start.back() + pt.q[b]);
      longest = std::max(longest, pt.kv[b]);
    }
    host_.token_ids.assign(host_.query_start.back(), 0);
    host_.max_pages_per_seq = (longest + pt.page - 1) / pt.page;
    host_.kv_len_capacity = 0;
    const int64_t pages = pool_tokens_ / pt.page;
    std::uniform_int_distribution<int64_t> u(1, pages - 1);
    host_.page_table.assign(pt.q.size() * static_cast<size_t>(host_.max_pages_per_seq), 0);
    for (int32_t& e : host_.page_table) e = static_cast<int32_t>(u(rng));
    upload(qs_, host_.query_start);
    upload(kvl_, host_.kv_lens);
    upload(pt_, host_.page_table);
    num_pages_ = pages;
    // The pools hold pages of this size for up to pool_elems_ elements.
    if (cache_.num_pages() != num_pages_) cache_.set_num_pages(num_pages_);
  }

  AttentionDomain domain() const {
    AttentionDomain dom;
    dom.num_q_heads = point_.hq;
    dom.num_kv_heads = point_.hkv;
    dom.head_dim = point_.d;
    dom.page_size = point_.page;
    dom.scale = 1.0f / std::sqrt(static_cast<float>(point_.d));
    return dom;
  }
  ForwardBatch& batch() { return host_; }

  PagedAttentionParams params() const {
    PagedAttentionParams p;
    p.q = q_;
    p.k_pool = k_;
    p.v_pool = v_;
    p.out = out_;
    p.query_start = static_cast<const int32_t*>(qs_);
    p.kv_lens = static_cast<const int32_t*>(kvl_);
    p.page_table = static_cast<const int32_t*>(pt_);
    p.num_seqs = static_cast<int32_t>(point_.q.size());
    p.num_tokens = point_.tokens();
    p.num_q_heads = point_.hq;
    p.num_kv_heads = point_.hkv;
    p.head_dim = point_.d;
    p.page_size = point_.page;
    p.max_pages_per_seq = host_.max_pages_per_seq;
    p.num_pages = static_cast<int32_t>(num_pages_);  // lets native decode run its TMA kernel
    p.max_query_len = host_.max_query_len();
    p.max_kv_len = std::max(host_.kv_len_capacity, host_.max_kv_len());
    p.scale = 1.0f / std::sqrt(static_cast<float>(point_.d));
    p.workspace = ws_;
    p.workspace_bytes = ws_bytes_;
    return p;
  }

  void native(const PagedAttentionParams& p) {
    if (point_.decode()) {
      paged_decode_attention(p, stream_);
    } else {
      paged_prefill_attention(p, stream_);
    }
  }

  // Mean microseconds per call of `call`, eager (iters back-to-back calls) or graph (one
  // graph of `layers` calls, replayed).
  template <class Call>
  double time(Call&& call, LaunchMode mode, int iters, int layers) {
    for (int i = 0; i < 3; ++i) call();
    PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    float ms = 0;
    if (mode == LaunchMode::kEager) {
      PAGELLM_CUDA_CHECK(cudaEventRecord(start_, stream_));
      for (int i = 0; i < iters; ++i) call();
      PAGELLM_CUDA_CHECK(cudaEventRecord(stop_, stream_));
      PAGELLM_CUDA_CHECK(cudaEventSynchronize(stop_));
      PAGELLM_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
      return ms * 1000.0 / iters;
    }
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    PAGELLM_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      for (int i = 0; i < layers; ++i) call();
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    PAGELLM_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    PAGELLM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    PAGELLM_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    const int replays = std::max(2, iters / 4);
    PAGELLM_CUDA_CHECK(cudaEventRecord(start_, stream_));
    for (int i = 0; i < replays; ++i) PAGELLM_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    PAGELLM_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    PAGELLM_CUDA_CHECK(cudaEventSynchronize(stop_));
    PAGELLM_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return ms * 1000.0 / (static_cast<double>(replays) * layers);
  }

  cudaStream_t stream() const { return stream_; }

 private:
  template <class T>
  void upload(void*& dst, const std::vector<T>& host) {
    if (dst) cudaFree(dst);
    PAGELLM_CUDA_CHECK(cudaMalloc(&dst, std::max<size_t>(host.size(), 1) * sizeof(T)));
    if (!host.empty()) {
      PAGELLM_CUDA_CHECK(cudaMemcpy(dst, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
  }

  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  DeviceProfile profile_;
  CudnnPlanCache cache_;
  void *k_ = nullptr, *v_ = nullptr, *q_ = nullptr, *out_ = nullptr, *ws_ = nullptr;
  void *qs_ = nullptr, *kvl_ = nullptr, *pt_ = nullptr;
  size_t ws_bytes_ = 0;
  int64_t pool_elems_ = 0, pool_tokens_ = 0, num_pages_ = 0;
  Point point_;
  ForwardBatch host_;
};

// Times one point on one provider. Returns microseconds per call, or -1 when the provider
// cannot run it (cuDNN refused the shape; the message goes to stderr).
double time_native(Bench& b, LaunchMode mode, const Args& a) {
  const PagedAttentionParams p = b.params();
  return b.time([&] { b.native(p); }, mode, a.iters, a.layers);
}

double time_cudnn(Bench& b, LaunchMode mode, const Args& a) {
  AttentionPlannerConfig config;
  config.choice = AttentionBackendChoice::kCudnn;
  config.device = b.profile();
  config.registry = &b.cache();
  AttentionPlanner planner(config);
  ForwardBatch& batch = b.batch();
  if (mode == LaunchMode::kGraph) batch.kv_len_capacity = batch.max_kv_len();
  try {
    const AttentionPlan& plan = planner.plan(b.domain(), batch_view(batch), mode);
    b.cache().build(plan.cudnn_key);
    b.cache().upload(plan, b.stream());
    const PagedAttentionParams p = b.params();
    const double us = b.time([&] { b.cache().run(p, plan, b.stream()); }, mode, a.iters, a.layers);
    batch.kv_len_capacity = 0;
    return us;
  } catch (const Error& e) {
    batch.kv_len_capacity = 0;
    std::fprintf(stderr, "  cuDNN: %s\n", e.what());
    return -1.0;
  }
}

int64_t work_of(const Point& pt) {
  int64_t w = 0;
  for (size_t i = 0; i < pt.q.size(); ++i) w += causal_pairs(pt.q[i], pt.kv[i]);
  return w * pt.hq;
}

// Achieved fraction of the roofline: prefill by FLOPs, decode by K/V bytes.
std::string roofline(const Point& pt, double us) {
  if (us <= 0) return "-";
  char buf[64];
  if (pt.decode()) {
    double bytes = 0;
    for (int32_t kv : pt.kv) bytes += 2.0 * kv * pt.hkv * pt.d * 2;
    std::snprintf(buf, sizeof buf, "%.0f GB/s (%.0f%%)", bytes / us / 1e3,
                  100.0 * bytes / us / 1e6 / kPeakTbps);
  } else {
    const double tflops = 4.0 * pt.d * work_of(pt) / us / 1e6;
    std::snprintf(buf, sizeof buf, "%.0f TFLOP/s (%.0f%%)", tflops, 100.0 * tflops / kPeakTflops);
  }
  return buf;
}

std::string format_us(double us) {
  if (us <= 0) return "failed";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", us);
  return buf;
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

// ---- calibrate ----------------------------------------------------------------------------

std::vector<Point> calibration_grid(const Args& a, std::mt19937& rng) {
  std::vector<Point> grid;
  const std::vector<std::pair<int32_t, int32_t>> heads =
      a.quick ? std::vector<std::pair<int32_t, int32_t>>{{32, 8}}
              : std::vector<std::pair<int32_t, int32_t>>{{16, 8}, {32, 8}, {64, 8}};
  const std::vector<int32_t> batches = a.quick ? std::vector<int32_t>{1, 16, 64}
                                               : std::vector<int32_t>{1, 4, 16, 64};
  const std::vector<int32_t> qlens = a.quick ? std::vector<int32_t>{32, 512, 4096}
                                             : std::vector<int32_t>{32, 128, 512, 2048, 8192};
  const std::vector<int32_t> decode_batches = a.quick ? std::vector<int32_t>{8, 64, 256}
                                                      : std::vector<int32_t>{1, 8, 32, 128, 256};
  const std::vector<int32_t> decode_kv = a.quick ? std::vector<int32_t>{512, 8192}
                                                 : std::vector<int32_t>{256, 2048, 16384};
  for (int32_t page : a.page_sizes) {
    for (auto [hq, hkv] : heads) {
      // Prefill: fresh and after a cached prefix; uniform and ragged (one long request and
      // the rest a sixteenth of it).
      for (int32_t b : batches) {
        for (int32_t q : qlens) {
          if (int64_t{b} * q > 32768) continue;
          for (int32_t prefix : {0, 4096}) {
            for (bool ragged : {false, true}) {
              if (ragged && b == 1) continue;
              Point p;
              p.hq = hq;
              p.hkv = hkv;
              p.page = page;
              p.ragged = ragged;
              for (int32_t i = 0; i < b; ++i) {
                const int32_t qi = ragged && i > 0 ? std::max(1, q / 16) : q;
                p.q.push_back(qi);
                p.kv.push_back(qi + prefix);
              }
              std::ostringstream l;
              l << "prefill " << hq << "/" << hkv << " " << b << "x" << q << (prefix ? "+4096" : "")
                << (ragged ? " ragged" : "");
              p.label = l.str();
              grid.push_back(p);
            }
          }
        }
      }
      // Decode: uniform and ragged KV lengths.
      for (int32_t b : decode_batches) {
        for (int32_t kv : decode_kv) {
          for (bool ragged : {false, true}) {
            if (ragged && b == 1) continue;
            Point p;
            p.hq = hq;
            p.hkv = hkv;
            p.page = page;
            p.ragged = ragged;
            std::uniform_int_distribution<int32_t> u(1, kv);
            for (int32_t i = 0; i < b; ++i) {
              p.q.push_back(1);
              p.kv.push_back(ragged && i > 0 ? u(rng) : kv);
            }
            std::ostringstream l;
            l << "decode " << hq << "/" << hkv << " " << b << "x" << kv << (ragged ? " ragged" : "");
            p.label = l.str();
            grid.push_back(p);
          }
        }
      }
    }
  }
  return grid;
}

int run_calibrate(const Args& a) {
  std::mt19937 rng(a.seed);
  const std::vector<Point> grid = calibration_grid(a, rng);
  int64_t pool_tokens = 0, max_q = 0;
  for (const Point& p : grid) {
    int64_t pages = 0;
    for (int32_t kv : p.kv) pages += (kv + p.page - 1) / p.page;
    pool_tokens = std::max(pool_tokens, pages * p.page);
    max_q = std::max<int64_t>(max_q, int64_t{p.tokens()} * p.hq * p.d);
  }
  pool_tokens = std::max<int64_t>(pool_tokens + 1024, 1 << 20);
  Bench bench(pool_tokens, max_q, 8, 128);
  const DeviceProfile& dev = bench.profile();
  PAGELLM_CHECK(dev.cudnn_version > 0) << "calibrate: " << cudnn_library().error;
  std::printf("calibrating on %s over %zu points (%d iterations each)\n", dev.describe().c_str(),
              grid.size(), a.iters);

  CrossoverTable table;
  table.device = dev;
  table.measured_on = today();
  table.margin = a.margin;
  std::ostringstream src;
  src << "attention_route_bench calibrate" << (a.quick ? " --quick" : "") << " --iters " << a.iters
      << " --margin " << a.margin << " --layers " << a.layers;
  table.source = src.str();
  const auto t0 = std::chrono::steady_clock::now();
  for (const Point& pt : grid) {
    bench.load(pt, rng);
    const std::vector<LaunchMode> modes =
        pt.decode() ? std::vector<LaunchMode>{LaunchMode::kEager, LaunchMode::kGraph}
                    : std::vector<LaunchMode>{LaunchMode::kEager};
    for (LaunchMode mode : modes) {
      CrossoverMeasurement m;
      m.mode = mode;
      m.phase = pt.decode() ? AttentionPhase::kDecode : AttentionPhase::kPrefill;
      m.head_dim = pt.d;
      m.page_size = pt.page;
      m.num_q_heads = pt.hq;
      m.num_kv_heads = pt.hkv;
      m.num_seqs = static_cast<int32_t>(pt.q.size());
      m.num_tokens = pt.tokens();
      m.max_query_len = *std::max_element(pt.q.begin(), pt.q.end());
      m.max_kv_len = *std::max_element(pt.kv.begin(), pt.kv.end());
      m.ragged = pt.ragged;
      m.work = work_of(pt);
      m.label = pt.label;
      m.native_us = time_native(bench, mode, a);
      m.cudnn_us = time_cudnn(bench, mode, a);
      std::printf("  %-34s %-5s work %14lld  native %9.2f us  cudnn %9.2f us  %s\n",
                  pt.label.c_str(), mode_name(mode), static_cast<long long>(m.work), m.native_us,
                  m.cudnn_us, m.cudnn_us > 0 ? (m.native_us > m.cudnn_us * (1 + a.margin) ? "cudnn" : "native") : "(cudnn failed)");
      std::fflush(stdout);
      table.measurements.push_back(m);
    }
  }
  table.entries = derive_crossover_entries(table.measurements, a.margin);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%zu measurements in %.0f s; %zu crossover entries:\n", table.measurements.size(),
              seconds, table.entries.size());
  for (const CrossoverEntry& e : table.entries) {
    std::printf("  %s %s head_dim %d: cuDNN from work %lld (of %d points, %d admitted)\n",
                mode_name(e.mode), phase_name(e.phase), e.head_dim,
                static_cast<long long>(e.min_work), e.points, e.admitted_points);
  }
  std::printf("\n| mode | phase | head_dim | cuDNN from work | up to work | page sizes | GQA | "
              "points (admitted) |\n|---|---|---:|---:|---:|---|---|---:|\n");
  for (const CrossoverEntry& e : table.entries) {
    std::string pages, gqa;
    for (int32_t x : e.page_sizes) pages += (pages.empty() ? "" : ",") + std::to_string(x);
    for (int32_t x : e.gqa_ratios) gqa += (gqa.empty() ? "" : ",") + std::to_string(x);
    std::printf("| %s | %s | %d | %lld | %lld | %s | %s | %d (%d) |\n", mode_name(e.mode),
                phase_name(e.phase), e.head_dim, static_cast<long long>(e.min_work),
                static_cast<long long>(e.max_work), pages.c_str(), gqa.c_str(), e.points,
                e.admitted_points);
  }
  if (table.entries.empty()) std::printf("| (none: cuDNN won no group; auto stays native) |\n");
  std::printf("\n");
  std::string path = a.out.empty() ? "data/attention" : a.out;
  if (std::filesystem::is_directory(path)) path += "/" + crossover_file_name(dev);
  std::ofstream(path) << crossover_table_to_json(table);
  PAGELLM_CHECK(std::ifstream(path).good()) << "calibrate: cannot write " << path;
  std::printf("wrote %s\n", path.c_str());
  return 0;
}

// ---- routes -------------------------------------------------------------------------------

std::vector<Point> route_grid(std::mt19937& rng) {
  std::vector<Point> g;
  const auto add = [&](const std::string& label, std::vector<int32_t> q, std::vector<int32_t> kv) {
    Point p;
    p.label = label;
    p.q = std::move(q);
    p.kv = std::move(kv);
    p.ragged = std::adjacent_find(p.kv.begin(), p.kv.end(), std::not_equal_to<>()) != p.kv.end();
    g.push_back(p);
  };
  const auto rep = [](int n, int32_t x) { return std::vector<int32_t>(n, x); };
  // Qwen3-8B attention: 32 query heads, 8 KV heads, head_dim 128, pages of 16.
  add("prefill 1x128", {128}, {128});
  add("prefill 1x2048", {2048}, {2048});
  add("prefill 1x8192", {8192}, {8192});
  add("prefill 1x32768", {32768}, {32768});
  add("prefill 64x128", rep(64, 128), rep(64, 128));
  add("prefill 16x512", rep(16, 512), rep(16, 512));
  add("prefill 4x4096", rep(4, 4096), rep(4, 4096));
  std::vector<int32_t> q(64, 1), kv(64, 1);
  q[0] = kv[0] = 2048;
  add("ragged 1x2048 + 63x1", q, kv);
  add("chunk 512 after 8192", {512}, {8704});
  add("chunks 8x256 after 4096", rep(8, 256), rep(8, 4352));
  add("decode 1x4096", {1}, {4096});
  add("decode 64x1024", rep(64, 1), rep(64, 1024));
  add("decode 64x8192", rep(64, 1), rep(64, 8192));
  std::vector<int32_t> mixed(256);
  std::uniform_int_distribution<int32_t> u(16, 4096);
  for (int32_t& x : mixed) x = u(rng);
  add("decode 256 ragged <=4096", rep(256, 1), mixed);
  return g;
}

// What a decode graph bound to cuDNN reserves, at 16 and 256 sequences with a KV capacity
// of 32768: host bytes of the planner, device bytes of the plan cache (workspace and the
// all-ones seq_len_q), and the time of one bound re-plan (what a replay would add).
void report_graph_reservation(const DeviceProfile& dev) {
  std::printf("\n| decode graph (KV capacity 32768) | host bytes | device bytes | bound plan() ns |\n"
              "|---|---:|---:|---:|\n");
  for (int32_t n : {16, 256}) {
    AttentionPlannerConfig config;
    config.choice = AttentionBackendChoice::kCudnn;
    config.device = dev;
    CudnnPlanCache cache(0);
    config.registry = &cache;
    AttentionPlanner planner(config);
    AttentionDomain dom;
    dom.num_q_heads = 32;
    dom.num_kv_heads = 8;
    dom.head_dim = 128;
    dom.page_size = 16;
    dom.scale = 1.0f / std::sqrt(128.0f);
    ForwardBatch b;
    b.page_size = 16;
    b.max_pages_per_seq = 32768 / 16;
    for (int32_t i = 0; i < n; ++i) {
      b.query_start.push_back(i);
      b.kv_lens.push_back(1 + (i * 977) % 32768);
    }
    b.query_start.push_back(n);
    b.token_ids.assign(n, 0);
    b.page_table.assign(static_cast<size_t>(n) * b.max_pages_per_seq, 1);
    b.kv_len_capacity = 32768;
    GraphCapacity cap;
    cap.num_seqs = n;
    cap.max_num_tokens = n;
    cap.max_query_len = 1;
    cap.max_pages_per_seq = b.max_pages_per_seq;
    cap.kv_len_capacity = 32768;
    try {
      const AttentionPlan& plan = planner.bind_to_graph(dom, cap, batch_view(b));
      cache.set_num_pages(int64_t{n} * b.max_pages_per_seq + 1);
      cache.build(plan.cudnn_key);
      const AttentionBatchView view = batch_view(b);
      const int reps = 100000;
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) planner.plan(dom, view);
      const double ns =
          std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / reps;
      std::printf("| %d sequences | %zu | %zu | %.0f |\n", n, planner.reserved_bytes(),
                  cache.device_bytes(), ns);
    } catch (const Error& e) {
      std::printf("| %d sequences | - | - | - | (cuDNN: %s)\n", n, e.what());
    }
  }
}

int run_routes(const Args& a) {
  std::mt19937 rng(a.seed);
  const std::vector<Point> grid = route_grid(rng);
  int64_t pool_tokens = 0, max_q = 0;
  for (const Point& p : grid) {
    int64_t pages = 0;
    for (int32_t kv : p.kv) pages += (kv + p.page - 1) / p.page;
    pool_tokens = std::max(pool_tokens, pages * p.page);
    max_q = std::max<int64_t>(max_q, int64_t{p.tokens()} * p.hq * p.d);
  }
  Bench bench(pool_tokens + 1024, max_q, 8, 128);
  const DeviceProfile& dev = bench.profile();
  std::vector<std::string> paths = a.tables.empty() ? default_crossover_table_paths() : a.tables;
  const CrossoverTables tables = CrossoverTables::load(paths);
  const CrossoverTable* table = tables.find(dev);

  std::printf("## Attention routes on %s (%s)\n\n", dev.describe().c_str(), today().c_str());
  std::printf("Crossover table: %s. Eager launches; %d calls per timing; auto pays one plan() "
              "(and for cuDNN prefill one upload) per %d calls.\n\n",
              table ? table->origin.c_str() : "none for this device (auto stays native)", a.iters,
              a.layers);
  std::printf("| route | work | auto | native us | cuDNN us | auto us | auto speedup | native "
              "roofline | cuDNN roofline |\n|---|---:|---|---:|---:|---:|---:|---|---|\n");
  std::vector<double> kept_ratio, noise_ratio;
  for (const Point& pt : grid) {
    bench.load(pt, rng);
    const double native_us = time_native(bench, LaunchMode::kEager, a);
    const double native_again = time_native(bench, LaunchMode::kEager, a);
    const double cudnn_us = time_cudnn(bench, LaunchMode::kEager, a);
    // auto: a planner with the tables and the plan cache, warmed like a server would be
    // (requested plans built between steps).
    AttentionPlannerConfig config;
    config.device = dev;
    config.tables = &tables;
    config.registry = &bench.cache();
    AttentionPlanner planner(config);
    const AttentionDomain dom = bench.domain();
    const AttentionBatchView view = batch_view(bench.batch());
    planner.plan(dom, view);
    bench.cache().build_requested();
    const AttentionPlan* plan = &planner.plan(dom, view);
    const AttentionProvider chosen = plan->provider;
    const PagedAttentionParams p = bench.params();
    int call = 0;
    const double auto_us = bench.time(
        [&] {
          if (call++ % a.layers == 0) {
            plan = &planner.plan(dom, view);
            bench.cache().upload(*plan, bench.stream());
          }
          if (plan->provider == AttentionProvider::kCudnn) {
            bench.cache().run(p, *plan, bench.stream());
          } else {
            bench.native(p);
          }
        },
        LaunchMode::kEager, std::max(a.iters, a.layers), a.layers);
    if (chosen == AttentionProvider::kNative) {
      kept_ratio.push_back(auto_us / native_us);
      noise_ratio.push_back(native_again / native_us);
    }
    std::printf("| %s | %lld | %s | %.1f | %s | %.1f | %.2fx | %s | %s |\n", pt.label.c_str(),
                static_cast<long long>(work_of(pt)), provider_name(chosen), native_us,
                format_us(cudnn_us).c_str(),
                auto_us, native_us / auto_us, roofline(pt, native_us).c_str(),
                roofline(pt, cudnn_us).c_str());
    std::fflush(stdout);
  }
  const auto spread = [](const std::vector<double>& v) {
    if (v.empty()) return std::string("none");
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    double mean = 0;
    for (double x : v) mean += x;
    char buf[96];
    std::snprintf(buf, sizeof buf, "%.3f .. %.3f (mean %.3f)", *lo, *hi, mean / v.size());
    return std::string(buf);
  };
  std::printf("\nauto / native over the %zu routes auto kept on native: %s\n", kept_ratio.size(),
              spread(kept_ratio).c_str());
  std::printf("native / native (noise) over the same routes: %s\n", spread(noise_ratio).c_str());
  std::printf("cuDNN plan cache after the routes: %zu plans, %.1f MiB of device memory "
              "(workspace %.1f MiB)\n",
              bench.cache().num_plans(), bench.cache().device_bytes() / 1048576.0,
              bench.cache().workspace_bytes() / 1048576.0);
  report_graph_reservation(dev);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse_args(argc, argv);
    return a.mode == "calibrate" ? run_calibrate(a) : run_routes(a);
  } catch (const Error& e) {
    std::fprintf(stderr, "attention_route_bench: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_route_bench: error: %s (see --help)\n", e.what());
    return 2;
  }
}
