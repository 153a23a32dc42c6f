// Programmatic dependent launch (pdl.cuh) for the kernels of the decode step.
//
// Every kernel launched through launch_kernel() may start while the kernel before it is
// still running, and must wait (pdl_wait) before it reads what that kernel wrote or writes
// anything itself. A kernel that does not would read half-written inputs or have its writes
// overwritten, and only sometimes. These tests make that likely to show and sure to fail:
// long chains of dependent launches over shared buffers, each run once eagerly and twice as
// replays of a CUDA graph captured from it (capture turns the launch attribute into
// programmatic edges), every output poisoned with NaN before each run, and compared with the
// same chain computed on the CPU.
//
//  - ElementwiseChain: 256 rounds of fill -> gather_rows -> add_rms_norm -> silu_mul ->
//    rms_norm (in place) -> gather_rows over the same buffers, on the vectorised and the
//    scalar paths. The residual is a chain of bf16 additions, which the CPU reproduces bit
//    for bit, so one late or early read anywhere in 256 rounds shows in the final residual;
//    every round's output is kept and compared as well.
//  - DecodeStepChain: qk_norm_rope_store_kv of a prefill, a long prefill attention (the
//    slow kernel), then 24 decode steps of qk_norm_rope_store_kv -> paged decode attention
//    (8 splits merged by the last split CTA, or 1 split) -> rms_norm of its output (a fast kernel
//    right after the slow merge). The 1-split steps' grid (16 CTAs) fills at most half the
//    SMs of any GPU of 32 SMs or more, so it releases the norm right after its wait
//    (releases_dependents_early); the 8-split steps' 128 CTAs do on GPUs of 256 SMs or more.
//    The decode q buffer overlays the rows of the prefill q, so the first decode step's
//    writes race the prefill attention's reads if it goes early.
//  - SlowFillThenFastGather: a 256 MB fill (many waves) followed by a one-wave gather of
//    rows at its start and end.
//  - GreedySamplingChain: fill -> gather of logits rows -> greedy sample_rows.
//  - EveryLauncherCapturesProgrammaticEdges: capturing each launcher after a fill gives
//    programmatic graph edges exactly when pdl_enabled().
//  - PdlSwitchTest: PAGELLM_DISABLE_PDL is parsed as pdl.cuh says (checked in child
//    processes, since pdl_enabled() reads it once per process), and the chains above pass
//    with PDL switched off too.
//
// Tolerances: copies and the residual exact; bf16 outputs of float math within relative L2
// 1e-2 (one bf16 rounding is ~2e-3; attention is computed in double on the CPU).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "pagellm/common/dtype.h"
#include "pagellm/cuda/attention/attention.h"
#include "pagellm/cuda/support/cuda_check.h"
#include "pagellm/cuda/elementwise/kernels.h"
#include "pagellm/cuda/support/pdl.cuh"
#include "pagellm/cuda/sampling/sampling.h"

extern char** environ;

namespace pagellm::cuda {
namespace {

using test::relative_close;

// ---- host helpers ---------------------------------------------------------------------------

float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}

std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_f32(v[i]);
  return out;
}

/// out = bf16(w * (x * inv)), inv = 1 / sqrt(mean(x^2) + eps): the kernels' order of
/// operations. out may equal x.
void cpu_rms_norm(const float* x, const float* w, float* out, int64_t n, float eps) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  const float inv =
      1.0f / std::sqrt(static_cast<float>(sum_sq) / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = round_bf16(w[i] * (x[i] * inv));
}

float cpu_silu(float g) { return g / (1.0f + std::exp(-g)); }

/// One head vector after RMSNorm (weight w) and rotate-half RoPE at `pos`, rounded to bf16
/// as the kernel stores it.
std::vector<float> cpu_norm_rope(const float* x, const float* w, int D, int pos, float eps,
                                 float theta) {
  double sum_sq = 0.0;
  for (int i = 0; i < D; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(sum_sq) / static_cast<float>(D) + eps);
  std::vector<float> out(static_cast<size_t>(D));
  const int half = D / 2;
  for (int i = 0; i < half; ++i) {
    const float inv_freq =
        1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(D));
    const double angle = static_cast<double>(static_cast<float>(pos) * inv_freq);
    const double c = std::cos(angle), s = std::sin(angle);
    const double x1 = w[i] * (x[i] * inv), x2 = w[half + i] * (x[half + i] * inv);
    out[static_cast<size_t>(i)] = round_bf16(static_cast<float>(x1 * c - x2 * s));
    out[static_cast<size_t>(half + i)] = round_bf16(static_cast<float>(x2 * c + x1 * s));
  }
  return out;
}

/// softmax(q . K[0..n) * scale) . V[0..n) in double for one head; K and V are one sequence's
/// rows [position][Hkv][D].
std::vector<float> cpu_attend(const std::vector<float>& q, const std::vector<float>& k,
                              const std::vector<float>& v, int kv_head, int n, int Hkv, int D,
                              double scale) {
  std::vector<double> score(static_cast<size_t>(n));
  double mx = -INFINITY;
  for (int j = 0; j < n; ++j) {
    const float* kr = &k[(static_cast<size_t>(j) * Hkv + kv_head) * D];
    double dot = 0.0;
    for (int d = 0; d < D; ++d) dot += static_cast<double>(q[static_cast<size_t>(d)]) * kr[d];
    score[static_cast<size_t>(j)] = dot * scale;
    mx = std::max(mx, dot * scale);
  }
  std::vector<double> acc(static_cast<size_t>(D), 0.0);
  double sum = 0.0;
  for (int j = 0; j < n; ++j) {
    const double wt = std::exp(score[static_cast<size_t>(j)] - mx);
    sum += wt;
    const float* vr = &v[(static_cast<size_t>(j) * Hkv + kv_head) * D];
    for (int d = 0; d < D; ++d) acc[static_cast<size_t>(d)] += wt * vr[d];
  }
  std::vector<float> out(static_cast<size_t>(D));
  for (int d = 0; d < D; ++d) out[static_cast<size_t>(d)] = static_cast<float>(acc[d] / sum);
  return out;
}

// ---- device memory, graphs ------------------------------------------------------------------

/// A cudaMalloc'ed array of n T, freed on destruction.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    PAGELLM_CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(n_, 1) * sizeof(T)));
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    if (n_ > 0) {
      PAGELLM_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
    }
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(ptr_); }

  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }
  /// Every byte 0xff: NaN for float and bf16, -1 for integers. Not a kernel, so it never
  /// takes part in programmatic dependencies.
  void poison(cudaStream_t stream) {
    PAGELLM_CUDA_CHECK(cudaMemsetAsync(ptr_, 0xff, bytes(), stream));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_ > 0) {
      PAGELLM_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost));
    }
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

struct GraphDeleter {
  void operator()(cudaGraph_t g) const { cudaGraphDestroy(g); }
};
struct GraphExecDeleter {
  void operator()(cudaGraphExec_t g) const { cudaGraphExecDestroy(g); }
};
using GraphPtr = std::unique_ptr<std::remove_pointer_t<cudaGraph_t>, GraphDeleter>;
using GraphExecPtr = std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>, GraphExecDeleter>;

/// Captures what `enqueue` launches on `stream` into a graph.
GraphPtr capture(cudaStream_t stream, const std::function<void()>& enqueue) {
  PAGELLM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue();
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(stream, &broken);
    if (broken != nullptr) cudaGraphDestroy(broken);
    throw;
  }
  cudaGraph_t graph = nullptr;
  PAGELLM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  return GraphPtr(graph);
}

// ---- fixture ---------------------------------------------------------------------------------

class PdlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
    PAGELLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    seed_ = test::test_seed();
    rng_.seed(seed_);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  std::string seed_note() const {
    return "seed " + std::to_string(seed_) + " (rerun with PAGELLM_TEST_SEED=" +
           std::to_string(seed_) + "), PDL " + (pdl_enabled() ? "on" : "off");
  }
  void sync() { PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  /// n normal(mean, stddev) values rounded to bf16.
  std::vector<float> randn_bf16(size_t n, float stddev = 1.0f, float mean = 0.0f) {
    std::normal_distribution<float> dist(mean, stddev);
    std::vector<float> v(n);
    for (float& x : v) x = round_bf16(dist(rng_));
    return v;
  }
  int uniform_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  /// Runs `chain` three times: once eagerly, then twice as replays of a graph captured from
  /// it. Before each run `reset` restores the inputs and poisons the outputs (copies and
  /// memsets only, never kernels); after each run `check` gets the run's name and compares.
  void run_eager_and_graph(const std::function<void()>& reset, const std::function<void()>& chain,
                           const std::function<void(const std::string&)>& check) {
    // The inputs were uploaded with cudaMemcpy on the legacy stream, which a non-blocking
    // stream does not wait for (and which may return before a pageable copy has landed).
    PAGELLM_CUDA_CHECK(cudaDeviceSynchronize());
    reset();
    chain();
    sync();
    check("eager run");
    if (HasFatalFailure()) return;
    GraphPtr graph = capture(stream_, chain);
    cudaGraphExec_t raw_exec = nullptr;
    PAGELLM_CUDA_CHECK(cudaGraphInstantiate(&raw_exec, graph.get(), 0));
    GraphExecPtr exec(raw_exec);
    for (int replay = 1; replay <= 2; ++replay) {
      reset();
      PAGELLM_CUDA_CHECK(cudaGraphLaunch(exec.get(), stream_));
      sync();
      check("graph replay " + std::to_string(replay));
      if (HasFatalFailure()) return;
    }
  }

  cudaStream_t stream_ = nullptr;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

class PdlChainTest : public PdlTest {
 protected:
  void elementwise_chain(int64_t rows, int64_t hidden, int rounds);
};

class PdlGraphTest : public PdlTest {};

// ---- elementwise chain --------------------------------------------------------------------

// Round k over residual x [R, H], delta d [R, H], normed y [R, H], act [R, I] (I = H / 2):
//   fill(y, NaN); d = table[idx_k]; x = bf16(x + d), y = rms_norm(x) * w;
//   act = silu(y[:, :I]) * y[:, I:]; act = rms_norm(act) * w2; out_k = act[perm_k].
void PdlChainTest::elementwise_chain(int64_t R, int64_t H, int K) {
  const int64_t I = H / 2;
  const int64_t N = 64;  // table rows
  const float eps = 1e-6f;
  const std::string what = "elementwise chain [" + std::to_string(R) + ", " + std::to_string(H) +
                           "] x " + std::to_string(K) + " rounds";
  SCOPED_TRACE(what);

  const std::vector<float> table = randn_bf16(static_cast<size_t>(N * H));
  const std::vector<float> x0 = randn_bf16(static_cast<size_t>(R * H));
  const std::vector<float> w = randn_bf16(static_cast<size_t>(H), 0.1f, 1.0f);
  const std::vector<float> w2 = randn_bf16(static_cast<size_t>(I), 0.1f, 1.0f);
  std::vector<int32_t> idx(static_cast<size_t>(K * R)), perm(static_cast<size_t>(K * R));
  for (int32_t& i : idx) i = uniform_int(0, static_cast<int>(N - 1));
  for (int32_t& i : perm) i = uniform_int(0, static_cast<int>(R - 1));

  // The CPU chain.
  std::vector<float> x = x0, y(static_cast<size_t>(R * H)), act(static_cast<size_t>(R * I));
  std::vector<float> out_ref(static_cast<size_t>(K * R * I));
  for (int k = 0; k < K; ++k) {
    for (int64_t r = 0; r < R; ++r) {
      const float* d = &table[static_cast<size_t>(idx[static_cast<size_t>(k * R + r)] * H)];
      float* xr = &x[static_cast<size_t>(r * H)];
      for (int64_t i = 0; i < H; ++i) xr[i] = round_bf16(xr[i] + d[i]);
      cpu_rms_norm(xr, w.data(), &y[static_cast<size_t>(r * H)], H, eps);
      const float* yr = &y[static_cast<size_t>(r * H)];
      float* ar = &act[static_cast<size_t>(r * I)];
      for (int64_t i = 0; i < I; ++i) ar[i] = round_bf16(cpu_silu(yr[i]) * yr[I + i]);
      cpu_rms_norm(ar, w2.data(), ar, I, eps);
    }
    for (int64_t r = 0; r < R; ++r) {
      const int64_t src = perm[static_cast<size_t>(k * R + r)];
      std::copy_n(&act[static_cast<size_t>(src * I)], I,
                  &out_ref[static_cast<size_t>((k * R + r) * I)]);
    }
  }

  DeviceArray<uint16_t> g_table(to_bf16(table)), g_x0(to_bf16(x0)), g_w(to_bf16(w)),
      g_w2(to_bf16(w2));
  DeviceArray<int32_t> g_idx(idx), g_perm(perm);
  DeviceArray<uint16_t> g_x(static_cast<size_t>(R * H)), g_d(static_cast<size_t>(R * H)),
      g_y(static_cast<size_t>(R * H)), g_act(static_cast<size_t>(R * I)),
      g_out(static_cast<size_t>(K * R * I));

  auto reset = [&] {
    PAGELLM_CUDA_CHECK(
        cudaMemcpyAsync(g_x.get(), g_x0.get(), g_x.bytes(), cudaMemcpyDeviceToDevice, stream_));
    for (DeviceArray<uint16_t>* a : {&g_d, &g_y, &g_act, &g_out}) a->poison(stream_);
  };
  auto chain = [&] {
    for (int k = 0; k < K; ++k) {
      launch_fill(g_y.get(), DType::BF16, R * H, NAN, stream_);
      launch_gather_rows(g_table.get(), N, g_idx.get() + k * R, g_d.get(), R, H * 2, stream_);
      launch_add_rms_norm(g_x.get(), g_d.get(), g_w.get(), g_y.get(), R, H, eps, stream_);
      launch_silu_mul(g_y.get(), g_act.get(), R, I, stream_);
      launch_rms_norm(g_act.get(), g_w2.get(), g_act.get(), R, I, eps, stream_);
      launch_gather_rows(g_act.get(), R, g_perm.get() + k * R, g_out.get() + k * R * I, R, I * 2,
                         stream_);
    }
  };
  auto check = [&](const std::string& run) {
    ASSERT_TRUE(relative_close(from_bf16(g_x.download()), x, 0.0, what + ", " + run +
                               ": residual after the last round (exact)", seed_note()));
    ASSERT_TRUE(relative_close(from_bf16(g_y.download()), y, 1e-2,
                               what + ", " + run + ": normed output of the last round",
                               seed_note()));
    const std::vector<float> out = from_bf16(g_out.download());
    for (int k = 0; k < K; ++k) {
      const auto begin = static_cast<std::ptrdiff_t>(k * R * I);
      const auto end = begin + static_cast<std::ptrdiff_t>(R * I);
      ASSERT_TRUE(relative_close(std::vector<float>(out.begin() + begin, out.begin() + end),
                                 std::vector<float>(out_ref.begin() + begin, out_ref.begin() + end),
                                 1e-2, what + ", " + run + ": output of round " + std::to_string(k),
                                 seed_note()));
    }
  };
  run_eager_and_graph(reset, chain, check);
}

TEST_F(PdlChainTest, ElementwiseChainMatchesCpuEagerAndInGraph) {
  elementwise_chain(48, 2048, 256);  // 16-byte vectors everywhere; norms trigger early
  if (HasFatalFailure()) return;
  elementwise_chain(48, 1002, 64);  // scalar norm and silu, 4- and 1-byte gathers
  if (HasFatalFailure()) return;
  elementwise_chain(24, 2048, 256);  // a 32-token tile's rows: norms trigger early too
  if (HasFatalFailure()) return;
  elementwise_chain(8, 2048, 256);  // under kNormEarlyTriggerMinRows: norms trigger late
}

// ---- decode step chain --------------------------------------------------------------------

TEST_F(PdlChainTest, DecodeStepChainMatchesCpuEagerAndInGraph) {
  const int B = 4, Hq = 16, Hkv = 4, D = 128, P = 16, S = 24;
  const int W = (Hq + 2 * Hkv) * D;  // qkv row
  const int group = Hq / Hkv;
  const std::vector<int> ctx = {37, 300, 1100, 4000};  // prefill length of each sequence
  const float eps = 1e-6f, theta = 1e6f;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const int max_ctx = *std::max_element(ctx.begin(), ctx.end());
  const std::string what = "decode step chain (" + std::to_string(B) + " sequences, " +
                           std::to_string(S) + " steps)";
  SCOPED_TRACE(what);

  // Pages: every sequence's pages drawn from a shuffled pool; page 0 is never used.
  const int max_pages = (max_ctx + S + P - 1) / P;
  int pages_needed = 0;
  for (int c : ctx) pages_needed += (c + S + P - 1) / P;
  const int num_pages = pages_needed + 1;
  std::vector<int32_t> free_pages(static_cast<size_t>(pages_needed));
  std::iota(free_pages.begin(), free_pages.end(), 1);
  std::shuffle(free_pages.begin(), free_pages.end(), rng_);
  std::vector<int32_t> page_table(static_cast<size_t>(B * max_pages), 0);
  size_t next_page = 0;
  for (int b = 0; b < B; ++b) {
    for (int j = 0; j < (ctx[static_cast<size_t>(b)] + S + P - 1) / P; ++j) {
      page_table[static_cast<size_t>(b * max_pages + j)] = free_pages[next_page++];
    }
  }
  auto slot_of = [&](int b, int pos) {
    return page_table[static_cast<size_t>(b * max_pages + pos / P)] * P + pos % P;
  };

  // Prefill: every context token of every sequence. Decode step s: token ctx_b + s of each.
  std::vector<int32_t> qs_pre = {0}, pos_pre, slot_pre;
  for (int b = 0; b < B; ++b) {
    for (int pos = 0; pos < ctx[static_cast<size_t>(b)]; ++pos) {
      pos_pre.push_back(pos);
      slot_pre.push_back(slot_of(b, pos));
    }
    qs_pre.push_back(static_cast<int32_t>(pos_pre.size()));
  }
  const int Tp = static_cast<int>(pos_pre.size());
  std::vector<int32_t> qs_dec(static_cast<size_t>(B + 1)), pos_dec, slot_dec, kv_dec;
  std::iota(qs_dec.begin(), qs_dec.end(), 0);
  for (int s = 0; s < S; ++s) {
    for (int b = 0; b < B; ++b) {
      pos_dec.push_back(ctx[static_cast<size_t>(b)] + s);
      slot_dec.push_back(slot_of(b, ctx[static_cast<size_t>(b)] + s));
      kv_dec.push_back(ctx[static_cast<size_t>(b)] + s + 1);
    }
  }
  const std::vector<int32_t> kv_pre(ctx.begin(), ctx.end());

  const std::vector<float> qkv_pre = randn_bf16(static_cast<size_t>(Tp) * W, 2.0f);
  const std::vector<float> qkv_dec = randn_bf16(static_cast<size_t>(S * B) * W, 2.0f);
  const std::vector<float> q_norm = randn_bf16(static_cast<size_t>(D), 0.3f, 1.0f);
  const std::vector<float> k_norm = randn_bf16(static_cast<size_t>(D), 0.3f, 1.0f);
  const std::vector<float> w_o = randn_bf16(static_cast<size_t>(Hq * D), 0.2f, 1.0f);

  // CPU: K and V of every position of every sequence, [position][Hkv][D].
  auto qkv_row = [&](int b, int pos) -> const float* {
    const int c = ctx[static_cast<size_t>(b)];
    if (pos < c) return &qkv_pre[static_cast<size_t>(qs_pre[static_cast<size_t>(b)] + pos) * W];
    return &qkv_dec[static_cast<size_t>((pos - c) * B + b) * W];
  };
  std::vector<std::vector<float>> k_ref(static_cast<size_t>(B)), v_ref(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) {
    const int n = ctx[static_cast<size_t>(b)] + S;
    k_ref[static_cast<size_t>(b)].resize(static_cast<size_t>(n) * Hkv * D);
    v_ref[static_cast<size_t>(b)].resize(static_cast<size_t>(n) * Hkv * D);
    for (int pos = 0; pos < n; ++pos) {
      const float* row = qkv_row(b, pos);
      for (int h = 0; h < Hkv; ++h) {
        const std::vector<float> k = cpu_norm_rope(row + (Hq + h) * D, k_norm.data(), D, pos, eps,
                                                   theta);
        const size_t off = (static_cast<size_t>(pos) * Hkv + h) * D;
        std::copy(k.begin(), k.end(), k_ref[static_cast<size_t>(b)].begin() + off);
        std::copy_n(row + (Hq + Hkv + h) * D, D, v_ref[static_cast<size_t>(b)].begin() + off);
      }
    }
  }
  // The attention output of the query at `pos` of sequence b, all heads: [Hq][D].
  auto attend_all_heads = [&](int b, int pos) {
    const float* row = qkv_row(b, pos);
    std::vector<float> out;
    for (int h = 0; h < Hq; ++h) {
      const std::vector<float> q = cpu_norm_rope(row + h * D, q_norm.data(), D, pos, eps, theta);
      const std::vector<float> o = cpu_attend(q, k_ref[static_cast<size_t>(b)],
                                              v_ref[static_cast<size_t>(b)], h / group, pos + 1,
                                              Hkv, D, scale);
      out.insert(out.end(), o.begin(), o.end());
    }
    return out;
  };
  // Prefill rows checked: all of sequence 0 (the rows the decode q overlays come first),
  // and six random rows plus the last one of every other sequence.
  std::vector<int> checked_rows;
  for (int pos = 0; pos < ctx[0]; ++pos) checked_rows.push_back(pos);
  for (int b = 1; b < B; ++b) {
    const int c = ctx[static_cast<size_t>(b)], first = qs_pre[static_cast<size_t>(b)];
    for (int i = 0; i < 6; ++i) checked_rows.push_back(first + uniform_int(0, c - 2));
    checked_rows.push_back(first + c - 1);
  }
  std::vector<float> prefill_ref;
  for (int t : checked_rows) {
    const int b =
        static_cast<int>(std::upper_bound(qs_pre.begin(), qs_pre.end(), t) - qs_pre.begin()) - 1;
    const std::vector<float> o = attend_all_heads(b, t - qs_pre[static_cast<size_t>(b)]);
    prefill_ref.insert(prefill_ref.end(), o.begin(), o.end());
  }
  std::vector<std::vector<float>> decode_ref(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) {
    for (int b = 0; b < B; ++b) {
      const std::vector<float> o = attend_all_heads(b, ctx[static_cast<size_t>(b)] + s);
      decode_ref[static_cast<size_t>(s)].insert(decode_ref[static_cast<size_t>(s)].end(), o.begin(),
                                                o.end());
    }
  }

  // Device buffers. The decode q_out is the first B rows of the prefill q.
  DeviceArray<uint16_t> g_qkv_pre(to_bf16(qkv_pre)), g_qkv_dec(to_bf16(qkv_dec)),
      g_q_norm(to_bf16(q_norm)), g_k_norm(to_bf16(k_norm)), g_w_o(to_bf16(w_o));
  DeviceArray<int32_t> g_qs_pre(qs_pre), g_pos_pre(pos_pre), g_slot_pre(slot_pre),
      g_kv_pre(kv_pre), g_qs_dec(qs_dec), g_pos_dec(pos_dec), g_slot_dec(slot_dec),
      g_kv_dec(kv_dec), g_page_table(page_table);
  const size_t pool_elems = static_cast<size_t>(num_pages) * Hkv * P * D;
  DeviceArray<uint16_t> g_k_pool(pool_elems), g_v_pool(pool_elems);
  const size_t pre_elems = static_cast<size_t>(Tp) * Hq * D;
  const size_t dec_elems = static_cast<size_t>(S * B) * Hq * D;
  DeviceArray<uint16_t> g_q(pre_elems), g_out_pre(pre_elems), g_attn(dec_elems),
      g_normed(dec_elems);
  const int max_splits = 8;
  DeviceArray<unsigned char> g_workspace(paged_attention_workspace_bytes(B, Hq, D, max_splits));
  PAGELLM_CUDA_CHECK(cudaMemset(g_workspace.get(), 0, g_workspace.bytes()));  // split counters

  auto rope_args = [&](const uint16_t* qkv, const int32_t* pos, const int32_t* slots, int tokens) {
    QkNormRopeArgs a;
    a.qkv = qkv;
    a.q_norm = g_q_norm.get();
    a.k_norm = g_k_norm.get();
    a.positions = pos;
    a.slot_mapping = slots;
    a.q_out = g_q.get();
    a.k_pool = g_k_pool.get();
    a.v_pool = g_v_pool.get();
    a.num_tokens = tokens;
    a.num_q_heads = Hq;
    a.num_kv_heads = Hkv;
    a.head_dim = D;
    a.page_size = P;
    a.num_pages = num_pages;
    a.eps = eps;
    a.rope_theta = theta;
    return a;
  };
  auto attention_params = [&](void* out, const int32_t* query_start, const int32_t* kv_lens,
                              int tokens, int max_query_len, int max_kv_len) {
    PagedAttentionParams p;
    p.q = g_q.get();
    p.k_pool = g_k_pool.get();
    p.v_pool = g_v_pool.get();
    p.out = out;
    p.query_start = query_start;
    p.kv_lens = kv_lens;
    p.page_table = g_page_table.get();
    p.num_seqs = B;
    p.num_tokens = tokens;
    p.num_q_heads = Hq;
    p.num_kv_heads = Hkv;
    p.head_dim = D;
    p.page_size = P;
    p.max_pages_per_seq = max_pages;
    p.max_query_len = max_query_len;
    p.max_kv_len = max_kv_len;
    p.scale = static_cast<float>(scale);
    return p;
  };

  auto reset = [&] {
    for (DeviceArray<uint16_t>* a : {&g_k_pool, &g_v_pool, &g_q, &g_out_pre, &g_attn, &g_normed}) {
      a->poison(stream_);
    }
  };
  const size_t step_elems = static_cast<size_t>(B) * Hq * D;
  auto chain = [&] {
    launch_qk_norm_rope_store_kv(rope_args(g_qkv_pre.get(), g_pos_pre.get(), g_slot_pre.get(), Tp),
                                 stream_);
    paged_prefill_attention(
        attention_params(g_out_pre.get(), g_qs_pre.get(), g_kv_pre.get(), Tp, max_ctx, max_ctx),
        stream_);
    for (int s = 0; s < S; ++s) {
      launch_qk_norm_rope_store_kv(
          rope_args(g_qkv_dec.get() + static_cast<size_t>(s * B) * W, g_pos_dec.get() + s * B,
                    g_slot_dec.get() + s * B, B),
          stream_);
      uint16_t* attn = g_attn.get() + s * step_elems;
      PagedAttentionParams p =
          attention_params(attn, g_qs_dec.get(), g_kv_dec.get() + s * B, B, 1, max_ctx + s + 1);
      p.workspace = g_workspace.get();
      p.workspace_bytes = g_workspace.bytes();
      p.num_splits = s % 2 == 0 ? max_splits : 1;  // with and without the split merge
      paged_decode_attention(p, stream_);
      launch_rms_norm(attn, g_w_o.get(), g_normed.get() + s * step_elems, B, Hq * D, eps, stream_);
    }
  };
  auto check = [&](const std::string& run) {
    const std::string where = what + ", " + run;
    // Prefill attention: every row finite, the checked rows close to the reference.
    const std::vector<float> out_pre = from_bf16(g_out_pre.download());
    const size_t non_finite = static_cast<size_t>(
        std::count_if(out_pre.begin(), out_pre.end(), [](float v) { return !std::isfinite(v); }));
    ASSERT_EQ(non_finite, 0u) << where << ": non-finite prefill attention outputs; "
                              << seed_note();
    std::vector<float> got;
    for (int t : checked_rows) {
      got.insert(got.end(), out_pre.begin() + static_cast<std::ptrdiff_t>(t) * Hq * D,
                 out_pre.begin() + static_cast<std::ptrdiff_t>(t + 1) * Hq * D);
    }
    ASSERT_TRUE(relative_close(got, prefill_ref, 1e-2, where + ": prefill attention", seed_note()));
    // Decode steps: attention against the reference; the norm against the norm of what
    // the attention wrote, so that a norm that read its input early cannot pass.
    const std::vector<float> attn = from_bf16(g_attn.download());
    const std::vector<float> normed = from_bf16(g_normed.download());
    for (int s = 0; s < S; ++s) {
      const std::string step = where + ", step " + std::to_string(s) + " (" +
                               std::to_string(s % 2 == 0 ? max_splits : 1) + " splits)";
      const auto begin = attn.begin() + static_cast<std::ptrdiff_t>(s * step_elems);
      const std::vector<float> step_attn(begin, begin + static_cast<std::ptrdiff_t>(step_elems));
      ASSERT_TRUE(relative_close(step_attn, decode_ref[static_cast<size_t>(s)], 1e-2,
                                 step + ": decode attention", seed_note()));
      std::vector<float> normed_ref(step_elems);
      for (int b = 0; b < B; ++b) {
        const size_t off = static_cast<size_t>(b) * Hq * D;
        cpu_rms_norm(&step_attn[off], w_o.data(), &normed_ref[off], Hq * D, eps);
      }
      const auto nbegin = normed.begin() + static_cast<std::ptrdiff_t>(s * step_elems);
      const std::vector<float> step_normed(nbegin,
                                           nbegin + static_cast<std::ptrdiff_t>(step_elems));
      ASSERT_TRUE(relative_close(step_normed, normed_ref, 1e-2,
                                 step + ": rms_norm of the attention output", seed_note()));
    }
    // The pools hold every position's K (after norm and RoPE) and V (copied exactly).
    const std::vector<float> k_pool = from_bf16(g_k_pool.download());
    const std::vector<float> v_pool = from_bf16(g_v_pool.download());
    std::vector<float> got_k, ref_k, got_v, ref_v;
    for (int b = 0; b < B; ++b) {
      for (int pos = 0; pos < ctx[static_cast<size_t>(b)] + S; ++pos) {
        const int slot = slot_of(b, pos);
        for (int h = 0; h < Hkv; ++h) {
          const size_t pool_off = ((static_cast<size_t>(slot / P) * Hkv + h) * P + slot % P) * D;
          const size_t ref_off = (static_cast<size_t>(pos) * Hkv + h) * D;
          got_k.insert(got_k.end(), k_pool.begin() + pool_off, k_pool.begin() + pool_off + D);
          got_v.insert(got_v.end(), v_pool.begin() + pool_off, v_pool.begin() + pool_off + D);
          ref_k.insert(ref_k.end(), k_ref[static_cast<size_t>(b)].begin() + ref_off,
                       k_ref[static_cast<size_t>(b)].begin() + ref_off + D);
          ref_v.insert(ref_v.end(), v_ref[static_cast<size_t>(b)].begin() + ref_off,
                       v_ref[static_cast<size_t>(b)].begin() + ref_off + D);
        }
      }
    }
    ASSERT_TRUE(relative_close(got_k, ref_k, 1e-2, where + ": K pool", seed_note()));
    ASSERT_TRUE(relative_close(got_v, ref_v, 0.0, where + ": V pool", seed_note()));
  };
  run_eager_and_graph(reset, chain, check);
}

// ---- a slow kernel, then a fast one --------------------------------------------------------

TEST_F(PdlChainTest, SlowFillThenFastGatherSeesEveryWrite) {
  // A 256 MB fill (hundreds of thousands of CTAs, ~60 µs) with a new value each round, then a
  // gather of 8 rows including the first and the last one the fill writes.
  const int64_t row_floats = 1024, rows = 65536, picked = 8;
  const int K = 12;
  std::vector<int32_t> idx;
  for (int k = 0; k < K; ++k) {
    for (int32_t r : {0, static_cast<int32_t>(rows - 1), static_cast<int32_t>(rows / 2), 1,
                      static_cast<int32_t>(rows - 2)}) {
      idx.push_back(r);
    }
    for (int i = 5; i < picked; ++i) idx.push_back(uniform_int(0, static_cast<int>(rows - 1)));
  }
  auto value_of = [](int k) { return 100.0f + 0.5f * static_cast<float>(k + 1); };
  DeviceArray<float> g_big(static_cast<size_t>(rows * row_floats));
  DeviceArray<float> g_out(static_cast<size_t>(K * picked * row_floats));
  DeviceArray<int32_t> g_idx(idx);
  auto reset = [&] {
    g_big.poison(stream_);
    g_out.poison(stream_);
  };
  auto chain = [&] {
    for (int k = 0; k < K; ++k) {
      launch_fill(g_big.get(), DType::F32, rows * row_floats, value_of(k), stream_);
      launch_gather_rows(g_big.get(), rows, g_idx.get() + k * picked,
                         g_out.get() + k * picked * row_floats, picked, row_floats * 4, stream_);
    }
  };
  auto check = [&](const std::string& run) {
    const std::vector<float> out = g_out.download();
    for (int k = 0; k < K; ++k) {
      size_t wrong = 0, first = 0;
      for (int64_t i = 0; i < picked * row_floats; ++i) {
        if (out[static_cast<size_t>(k * picked * row_floats + i)] != value_of(k)) {
          if (wrong++ == 0) first = static_cast<size_t>(i);
        }
      }
      ASSERT_EQ(wrong, 0u) << run << ", round " << k << ": " << wrong << " gathered values are not "
                           << value_of(k) << " (first: element " << first << ", row "
                           << idx[static_cast<size_t>(k * picked) + first / row_floats] << ", "
                           << out[static_cast<size_t>(k * picked * row_floats) + first] << "); "
                           << seed_note();
    }
  };
  run_eager_and_graph(reset, chain, check);
}

// ---- sampling ------------------------------------------------------------------------------

TEST_F(PdlChainTest, GreedySamplingChainSeesFinishedLogits) {
  // Each round: fill the logits with NaN, gather R rows of a table whose rows each have one
  // spike, sample greedily. A sampler that reads early sees NaN (no finite logit) or the
  // previous round's rows (the wrong token).
  const int32_t V = 151936, R = 4, N = 16, K = 32;
  std::vector<float> table(static_cast<size_t>(N) * V);
  std::vector<int32_t> spike(static_cast<size_t>(N));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int32_t n = 0; n < N; ++n) {
    for (int32_t i = 0; i < V; ++i) {
      table[static_cast<size_t>(n) * V + i] = std::clamp(dist(rng_), -5.0f, 5.0f);
    }
    spike[static_cast<size_t>(n)] = uniform_int(0, V - 1);
    table[static_cast<size_t>(n) * V + spike[static_cast<size_t>(n)]] = 10.0f;
  }
  std::vector<int32_t> idx(static_cast<size_t>(K * R));
  for (int32_t& i : idx) i = uniform_int(0, N - 1);
  std::vector<GpuSamplingRow> params(static_cast<size_t>(R));
  for (GpuSamplingRow& p : params) p.flags = kSampleGreedy;
  std::vector<uint64_t> prune(static_cast<size_t>(kPruneTableSize));
  fill_prune_table(prune.data());

  DeviceArray<float> g_table(table), g_logits(static_cast<size_t>(R) * V);
  DeviceArray<int32_t> g_idx(idx);
  DeviceArray<GpuSamplingRow> g_params(params);
  DeviceArray<uint64_t> g_prune(prune);
  DeviceArray<GpuSampledToken> g_out(static_cast<size_t>(K * R));
  auto reset = [&] {
    g_logits.poison(stream_);
    g_out.poison(stream_);
  };
  auto chain = [&] {
    for (int k = 0; k < K; ++k) {
      launch_fill(g_logits.get(), DType::F32, int64_t{R} * V, NAN, stream_);
      launch_gather_rows(g_table.get(), N, g_idx.get() + k * R, g_logits.get(), R,
                         int64_t{V} * 4, stream_);
      launch_sample_rows(g_logits.get(), R, V, g_params.get(), nullptr, nullptr, g_prune.get(),
                         g_out.get() + k * R, stream_);
    }
  };
  auto check = [&](const std::string& run) {
    const std::vector<GpuSampledToken> out = g_out.download();
    for (int k = 0; k < K; ++k) {
      for (int r = 0; r < R; ++r) {
        const GpuSampledToken& t = out[static_cast<size_t>(k * R + r)];
        const int32_t want = spike[static_cast<size_t>(idx[static_cast<size_t>(k * R + r)])];
        ASSERT_TRUE(t.status == kSampleOk && t.token == want)
            << run << ", round " << k << ", row " << r << ": token " << t.token << " status "
            << t.status << ", want token " << want << " status " << kSampleOk << "; "
            << seed_note();
      }
    }
  };
  run_eager_and_graph(reset, chain, check);
}

// ---- graph edges ---------------------------------------------------------------------------

/// Kernel nodes and the types of all edges of a captured graph.
struct GraphShape {
  int kernels = 0;
  int other_nodes = 0;
  std::vector<cudaGraphEdgeData> edges;
};

GraphShape shape_of(cudaGraph_t graph) {
  GraphShape shape;
  size_t num_nodes = 0;
  PAGELLM_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &num_nodes));
  std::vector<cudaGraphNode_t> nodes(num_nodes);
  PAGELLM_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &num_nodes));
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    PAGELLM_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    (type == cudaGraphNodeTypeKernel ? shape.kernels : shape.other_nodes) += 1;
  }
  size_t num_edges = 0;
  PAGELLM_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &num_edges));
  std::vector<cudaGraphNode_t> from(num_edges), to(num_edges);
  shape.edges.resize(num_edges);
  PAGELLM_CUDA_CHECK(
      cudaGraphGetEdges(graph, from.data(), to.data(), shape.edges.data(), &num_edges));
  shape.edges.resize(num_edges);
  return shape;
}

TEST_F(PdlGraphTest, EveryLauncherCapturesProgrammaticEdges) {
  // A small problem for every launcher; the data only has to be valid, not meaningful.
  const int B = 2, Hq = 4, Hkv = 2, D = 128, P = 16, kv = 40, V = 1000;
  const int max_pages = (kv + P - 1) / P, num_pages = max_pages + 1;
  DeviceArray<uint16_t> buf_a(4096), buf_b(4096), qkv(static_cast<size_t>(B) * (Hq + 2 * Hkv) * D),
      norm_w(static_cast<size_t>(D)), q(static_cast<size_t>(B) * Hq * D),
      out(static_cast<size_t>(B) * Hq * D),
      k_pool(static_cast<size_t>(num_pages) * Hkv * P * D),
      v_pool(static_cast<size_t>(num_pages) * Hkv * P * D);
  DeviceArray<float> logits(static_cast<size_t>(B) * V), marker(256);
  DeviceArray<int32_t> rows01(std::vector<int32_t>{0, 1}),
      query_start(std::vector<int32_t>{0, 1, 2}),
      kv_lens(std::vector<int32_t>(B, kv)), positions(std::vector<int32_t>{kv - 1, kv - 1}),
      slots(std::vector<int32_t>{P * 1 + (kv - 1) % P, P * 2 + (kv - 1) % P}),
      page_table(std::vector<int32_t>(static_cast<size_t>(B * max_pages), 1));
  std::vector<GpuSamplingRow> sample_params(static_cast<size_t>(B));
  for (GpuSamplingRow& p : sample_params) p.flags = kSampleGreedy;
  DeviceArray<GpuSamplingRow> g_sample_params(sample_params);
  std::vector<uint64_t> prune(static_cast<size_t>(kPruneTableSize));
  fill_prune_table(prune.data());
  DeviceArray<uint64_t> g_prune(prune);
  DeviceArray<GpuSampledToken> tokens(static_cast<size_t>(B));
  DeviceArray<unsigned char> workspace(paged_attention_workspace_bytes(B, Hq, D, 4));
  PAGELLM_CUDA_CHECK(cudaMemset(workspace.get(), 0, workspace.bytes()));  // split counters
  for (DeviceArray<uint16_t>* a : {&buf_a, &buf_b, &qkv, &norm_w, &q, &out, &k_pool, &v_pool}) {
    PAGELLM_CUDA_CHECK(cudaMemset(a->get(), 0, a->bytes()));
  }
  PAGELLM_CUDA_CHECK(cudaMemset(logits.get(), 0, logits.bytes()));
  PAGELLM_CUDA_CHECK(cudaDeviceSynchronize());  // the legacy stream's copies and memsets

  QkNormRopeArgs rope;
  rope.qkv = qkv.get();
  rope.q_norm = norm_w.get();
  rope.k_norm = norm_w.get();
  rope.positions = positions.get();
  rope.slot_mapping = slots.get();
  rope.q_out = q.get();
  rope.k_pool = k_pool.get();
  rope.v_pool = v_pool.get();
  rope.num_tokens = B;
  rope.num_q_heads = Hq;
  rope.num_kv_heads = Hkv;
  rope.head_dim = D;
  rope.page_size = P;
  rope.num_pages = num_pages;
  PagedAttentionParams attn;
  attn.q = q.get();
  attn.k_pool = k_pool.get();
  attn.v_pool = v_pool.get();
  attn.out = out.get();
  attn.query_start = query_start.get();
  attn.kv_lens = kv_lens.get();
  attn.page_table = page_table.get();
  attn.num_seqs = B;
  attn.num_tokens = B;
  attn.num_q_heads = Hq;
  attn.num_kv_heads = Hkv;
  attn.head_dim = D;
  attn.page_size = P;
  attn.max_pages_per_seq = max_pages;
  attn.max_query_len = 1;
  attn.max_kv_len = kv;
  attn.scale = 0.1f;
  attn.workspace = workspace.get();
  attn.workspace_bytes = workspace.bytes();

  struct Op {
    const char* name;
    int kernels;  // kernel nodes the launcher adds
    std::function<void()> launch;
  };
  const std::vector<Op> ops = {
      {"fill", 1, [&] { launch_fill(buf_a.get(), DType::BF16, 4096, 1.0f, stream_); }},
      {"gather_rows", 1,
       [&] { launch_gather_rows(buf_a.get(), 2, rows01.get(), buf_b.get(), 2, 4096, stream_); }},
      {"rms_norm", 1,
       [&] { launch_rms_norm(buf_a.get(), buf_b.get(), buf_a.get(), 2, 2048, 1e-6f, stream_); }},
      {"add_rms_norm", 1,
       [&] {
         launch_add_rms_norm(buf_a.get(), buf_b.get(), buf_b.get(), buf_a.get() + 2048, 1, 2048,
                             1e-6f, stream_);
       }},
      {"silu_mul", 1, [&] { launch_silu_mul(buf_a.get(), buf_b.get(), 2, 1024, stream_); }},
      {"qk_norm_rope_store_kv", 1, [&] { launch_qk_norm_rope_store_kv(rope, stream_); }},
      {"paged_decode_attention, 1 split", 1,
       [&] {
         PagedAttentionParams p = attn;
         p.num_splits = 1;
         paged_decode_attention(p, stream_);
       }},
      {"paged_decode_attention, 4 splits", 1,  // the last split CTA merges: no merge kernel
       [&] {
         PagedAttentionParams p = attn;
         p.num_splits = 4;
         paged_decode_attention(p, stream_);
       }},
      {"paged_prefill_attention", 1, [&] { paged_prefill_attention(attn, stream_); }},
      {"sample_rows", 1,
       [&] {
         launch_sample_rows(logits.get(), B, V, g_sample_params.get(), nullptr, nullptr,
                            g_prune.get(), tokens.get(), stream_);
       }},
  };
  const unsigned char want_type =
      pdl_enabled() ? cudaGraphDependencyTypeProgrammatic : cudaGraphDependencyTypeDefault;
  for (const Op& op : ops) {
    SCOPED_TRACE(op.name);
    // Eagerly first: the attention launchers set their shared-memory limits on first use,
    // which must not happen during capture. Then capture it behind a fill.
    op.launch();
    sync();
    GraphPtr graph = capture(stream_, [&] {
      launch_fill(marker.get(), DType::F32, 256, 0.0f, stream_);
      op.launch();
    });
    const GraphShape shape = shape_of(graph.get());
    EXPECT_EQ(shape.kernels, 1 + op.kernels) << op.name;
    EXPECT_EQ(shape.other_nodes, 0) << op.name;
    ASSERT_EQ(shape.edges.size(), static_cast<size_t>(op.kernels)) << op.name << ": not a chain";
    // Stream capture records programmatic stream serialisation as a programmatic edge from
    // the upstream kernel's programmatic port (CUDA programming guide, "Programmatic
    // Dependent Launch", use in CUDA graphs).
    const unsigned char want_port =
        pdl_enabled() ? cudaGraphKernelNodePortProgrammatic : cudaGraphKernelNodePortDefault;
    for (const cudaGraphEdgeData& e : shape.edges) {
      EXPECT_TRUE(e.type == want_type && e.from_port == want_port)
          << op.name << ": edge of type " << int{e.type} << " from port " << int{e.from_port}
          << ", want type " << int{want_type} << " from port " << int{want_port} << " (PDL "
          << (pdl_enabled() ? "on" : "off") << "): a kernel launched without launch_kernel()?";
    }
    // The graph runs.
    cudaGraphExec_t raw_exec = nullptr;
    PAGELLM_CUDA_CHECK(cudaGraphInstantiate(&raw_exec, graph.get(), 0));
    GraphExecPtr exec(raw_exec);
    PAGELLM_CUDA_CHECK(cudaGraphLaunch(exec.get(), stream_));
    sync();
  }
}

// ---- the PAGELLM_DISABLE_PDL switch ------------------------------------------------------

constexpr const char* kExpectVar = "PAGELLM_PDL_TEST_EXPECT";
constexpr int kChildPassed = 42;  // not 0, so that a child that ran no test cannot pass

bool starts_with(const std::string& s, const char* prefix) {
  return s.compare(0, std::strlen(prefix), prefix) == 0;
}

/// Runs this test binary again with only the tests `filter` selects, PAGELLM_DISABLE_PDL
/// set to `disable` (unset for nullptr) and PAGELLM_PDL_TEST_EXPECT to `expect` (unset for
/// nullptr). Returns its exit status, or -1 if it did not exit normally.
int run_child(const std::string& filter, const char* disable, const char* expect) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    if (starts_with(var, "PAGELLM_DISABLE_PDL=") || starts_with(var, "PAGELLM_PDL_TEST_EXPECT=") ||
        starts_with(var, "GTEST_")) {
      continue;  // GTEST_OUTPUT, sharding: the child must run its one test, quietly
    }
    env.push_back(var);
  }
  if (disable != nullptr) env.push_back(std::string("PAGELLM_DISABLE_PDL=") + disable);
  if (expect != nullptr) env.push_back(std::string(kExpectVar) + "=" + expect);
  std::vector<char*> envp;
  for (std::string& var : env) envp.push_back(var.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe", filter_arg = "--gtest_filter=" + filter,
              brief = "--gtest_brief=1";
  char* argv[] = {exe.data(), filter_arg.data(), brief.data(), nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()) != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(PdlSwitchTest, ChildReportsPdlEnabled) {
  const char* expect = std::getenv(kExpectVar);
  if (expect == nullptr) {
    GTEST_SKIP() << "runs in the child processes of PdlSwitchTest.ParsesPagellmDisablePdl";
  }
  const bool want = std::strcmp(expect, "1") == 0;
  const bool first = pdl_enabled();
  // Read once per process: a later change of the environment changes nothing.
  setenv("PAGELLM_DISABLE_PDL", first ? "1" : "0", 1);
  const bool second = pdl_enabled();
  const bool ok = first == want && second == want;
  if (!ok) {
    std::fprintf(stderr, "pdl_enabled() returned %d, then %d after setenv; want %d\n", first,
                 second, want);
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(ok ? kChildPassed : 1);
}

TEST(PdlSwitchTest, ParsesPagellmDisablePdl) {
  if (std::getenv(kExpectVar) != nullptr) GTEST_SKIP() << "in a child process";
  struct Case {
    const char* value;  // nullptr: unset
    bool enabled;
  };
  for (const Case& c : {Case{nullptr, true}, Case{"", true}, Case{"0", true}, Case{"1", false},
                        Case{"true", false}, Case{"00", false}, Case{"yes", false}}) {
    const int status = run_child("PdlSwitchTest.ChildReportsPdlEnabled", c.value,
                                 c.enabled ? "1" : "0");
    EXPECT_EQ(status, kChildPassed)
        << "PAGELLM_DISABLE_PDL=" << (c.value ? std::string("\"") + c.value + "\"" : "(unset)")
        << ": want pdl_enabled() == " << c.enabled
        << " (the child's exit status is " << status << ")";
  }
}

TEST(PdlSwitchTest, ChainsPassWithPdlDisabled) {
  if (std::getenv(kExpectVar) != nullptr) GTEST_SKIP() << "in a child process";
  if (std::getenv("PAGELLM_DISABLE_PDL") != nullptr) {
    GTEST_SKIP() << "PAGELLM_DISABLE_PDL is set: the other tests of this file already ran "
                    "with it";
  }
  if (test::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  // Plain launches (pdl_wait a no-op) must give the same results, and default graph edges.
  const int status = run_child("PdlChainTest.*:PdlGraphTest.*", "1", nullptr);
  EXPECT_EQ(status, 0) << "PdlChainTest / PdlGraphTest failed with PAGELLM_DISABLE_PDL=1 (see "
                          "the child's output above)";
}

}  // namespace
}  // namespace pagellm::cuda
