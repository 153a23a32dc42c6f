// The skinny (decode) matrix product, launch_skinny_gemm, against a float64 CPU reference
// over the same bf16 inputs, and the dispatch in LtMatmul.
//
// Every case draws fresh random inputs (the seed is printed; PAGELLM_TEST_SEED replays it)
// and poisons the output with NaN (all bits set) before the launch. A case passes when every
// output element is finite (so every element was written) and, over all M rows and a random
// sample of output columns (plus the first and last ones, where row masking happens),
// ‖out − ref‖ / ‖ref‖ <= 1e-2 for bf16 output (one rounding) or 1e-3 for float32 output.
// The full reference for lm_head at M = 256 would be 10^11 multiply-adds; sampling columns
// keeps the check to seconds while every output is still checked for being written.
//
// Shapes: Qwen3-0.6B/4B/8B q|k|v, o_proj, gate|up, down and lm_head, odd N, a K tail that is
// not a multiple of the 64-wide chunk, M in {1, 2, 3, 7, 8, 15, 16, 31, 32, 33, 64, 100, 128,
// 256}. Also: every forced split count, two runs are bit-identical (split-K reductions in fixed
// order), a CUDA graph of launches replays correctly more than once, a chain of dependent
// products launched with programmatic dependent launch reads each input only once it is
// written, and LtMatmul's paths.
#include "pagellm/cuda/matmul/skinny_gemm.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "pagellm/common/check.h"
#include "pagellm/common/dtype.h"
#include "pagellm/cuda/support/cuda_check.h"
#include "pagellm/cuda/elementwise/kernels.h"
#include "pagellm/cuda/matmul/matmul.h"

namespace pagellm::cuda {
namespace {

const std::vector<int64_t> kAllM = {1, 2, 3, 7, 8, 15, 16, 31, 32, 33, 64, 100, 128, 256};

struct Shape {
  const char* name;
  int64_t N, K;
  bool f32_out;
};

/// Device memory freed on scope exit.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes) : bytes_(bytes) {
    PAGELLM_CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(bytes, 16)));
  }
  ~DeviceBytes() { cudaFree(ptr_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  template <class T>
  void upload(const std::vector<T>& host) {
    PAGELLM_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T),
                                  cudaMemcpyHostToDevice));
    // The tests launch on a non-blocking stream, which does not wait for the legacy one.
    PAGELLM_CUDA_CHECK(cudaDeviceSynchronize());
  }
  /// All bits set: NaN in bf16 and in float32. Finished before it returns: cudaMemset runs
  /// on the legacy stream, which the tests' non-blocking stream does not wait for.
  void poison() {
    PAGELLM_CUDA_CHECK(cudaMemset(ptr_, 0xff, bytes_));
    PAGELLM_CUDA_CHECK(cudaDeviceSynchronize());
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

/// Output as float32 whatever its storage type.
std::vector<float> download_out(const DeviceBytes& out, size_t count, bool f32) {
  std::vector<float> values(count);
  if (f32) {
    PAGELLM_CUDA_CHECK(
        cudaMemcpy(values.data(), out.get(), count * sizeof(float), cudaMemcpyDeviceToHost));
  } else {
    std::vector<uint16_t> raw(count);
    PAGELLM_CUDA_CHECK(
        cudaMemcpy(raw.data(), out.get(), count * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; ++i) values[i] = bf16_to_f32(raw[i]);
  }
  return values;
}

std::vector<uint8_t> download_raw(const DeviceBytes& out, size_t bytes) {
  std::vector<uint8_t> raw(bytes);
  PAGELLM_CUDA_CHECK(cudaMemcpy(raw.data(), out.get(), bytes, cudaMemcpyDeviceToHost));
  return raw;
}

class SkinnyGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
    seed_ = test::test_seed();
    state_ = seed_ ^ 0x5eed5eed5eed5eedull;
    std::printf("skinny gemm test seed %llu (rerun with PAGELLM_TEST_SEED=%llu)\n",
                static_cast<unsigned long long>(seed_), static_cast<unsigned long long>(seed_));
    PAGELLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }

  std::string seed_note() const {
    return "seed " + std::to_string(seed_) + " (rerun with PAGELLM_TEST_SEED=" +
           std::to_string(seed_) + ")";
  }

  // splitmix64: fast enough for the 389 M weights of a 4B lm_head.
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// n bf16 values uniform in [-scale, scale) (never all zero).
  std::vector<uint16_t> random_bf16(size_t n, float scale) {
    std::vector<uint16_t> v(n);
    for (size_t i = 0; i < n; ++i) {
      const float u = static_cast<float>(next() >> 40) * (2.0f / 16777216.0f) - 1.0f;
      v[i] = f32_to_bf16(u * scale);
    }
    return v;
  }
  int64_t uniform(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
  }

  /// Columns the reference checks: the first and last 8 and `count` random others.
  std::vector<int64_t> sample_columns(int64_t N, int count) {
    std::vector<int64_t> cols;
    for (int64_t n = 0; n < std::min<int64_t>(N, 8); ++n) cols.push_back(n);
    for (int64_t n = std::max<int64_t>(8, N - 8); n < N; ++n) cols.push_back(n);
    for (int i = 0; i < count && N > 16; ++i) cols.push_back(uniform(8, N - 9));
    return cols;
  }

  /// Checks `got` ([M, N] float32 view of the output) against the float64 reference on
  /// the sampled columns, and that every element is finite.
  ::testing::AssertionResult matches(const std::vector<float>& got, const std::vector<uint16_t>& x,
                                     const std::vector<uint16_t>& w, int64_t M, int64_t N,
                                     int64_t K, const std::vector<int64_t>& cols, double tol,
                                     const std::string& what) {
    size_t non_finite = 0, first_bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (!std::isfinite(got[i]) && non_finite++ == 0) first_bad = i;
    }
    if (non_finite > 0) {
      return ::testing::AssertionFailure()
             << what << ": " << non_finite << " non-finite outputs (first at m="
             << first_bad / N << ", n=" << first_bad % N << "); " << seed_note();
    }
    std::vector<double> xd(static_cast<size_t>(M * K));
    for (size_t i = 0; i < xd.size(); ++i) xd[i] = bf16_to_f32(x[i]);
    std::vector<double> wcol(static_cast<size_t>(K));
    double diff2 = 0.0, ref2 = 0.0, worst = -1.0;
    int64_t worst_m = 0, worst_n = 0;
    for (int64_t n : cols) {
      for (int64_t k = 0; k < K; ++k) wcol[k] = bf16_to_f32(w[n * K + k]);
      for (int64_t m = 0; m < M; ++m) {
        const double* xr = &xd[m * K];
        double ref = 0.0;
        for (int64_t k = 0; k < K; ++k) ref += xr[k] * wcol[k];
        const double d = got[m * N + n] - ref;
        diff2 += d * d;
        ref2 += ref * ref;
        if (std::fabs(d) > worst) {
          worst = std::fabs(d);
          worst_m = m;
          worst_n = n;
        }
      }
    }
    const double rel = std::sqrt(diff2) / std::max(std::sqrt(ref2), 1e-30);
    if (rel <= tol) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << what << ": relative L2 error " << rel << " (bound " << tol << "), worst at m="
           << worst_m << " n=" << worst_n << ": " << got[worst_m * N + worst_n] << "; "
           << seed_note();
  }

  /// Runs every M of `ms` for one weight shape (the weights drawn once, x fresh per M).
  void check_shape(const Shape& s, const std::vector<int64_t>& ms, int sampled_columns = 96) {
    const std::vector<uint16_t> w =
        random_bf16(static_cast<size_t>(s.N * s.K), 1.0f / std::sqrt(static_cast<float>(s.K)));
    DeviceBytes dw(w.size() * 2);
    dw.upload(w);
    const int64_t max_m = *std::max_element(ms.begin(), ms.end());
    DeviceBytes dx(static_cast<size_t>(max_m * s.K) * 2);
    DeviceBytes dout(static_cast<size_t>(max_m * s.N) * (s.f32_out ? 4 : 2));
    for (int64_t M : ms) {
      const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(M * s.K), 1.0f);
      dx.upload(x);
      dout.poison();
      launch_skinny_gemm(dx.get(), dw.get(), dout.get(), s.f32_out, M, s.N, s.K, stream_);
      PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
      const std::vector<float> got = download_out(dout, static_cast<size_t>(M * s.N), s.f32_out);
      const SkinnyPlan plan = skinny_gemm_plan(M, s.N, s.K, sms());
      const std::string what = std::string(s.name) + " x[" + std::to_string(M) + ", " +
                               std::to_string(s.K) + "] w[" + std::to_string(s.N) + ", " +
                               std::to_string(s.K) + "]^T -> " + (s.f32_out ? "f32" : "bf16") +
                               " (plan: tokens " + std::to_string(plan.tokens_per_tile) +
                               ", splits " + std::to_string(plan.splits) + ")";
      ASSERT_TRUE(matches(got, x, w, M, s.N, s.K, sample_columns(s.N, sampled_columns),
                          s.f32_out ? 1e-3 : 1e-2, what));
    }
  }

  int sms() const {
    int device = 0, count = 0;
    PAGELLM_CUDA_CHECK(cudaGetDevice(&device));
    PAGELLM_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  }

  uint64_t seed_ = 0, state_ = 0;
  cudaStream_t stream_ = nullptr;
};

TEST_F(SkinnyGemmTest, Qwen3_4BShapesMatchFloat64) {
  for (const Shape& s : {Shape{"4B qkv", 6144, 2560, false}, Shape{"4B o_proj", 2560, 4096, false},
                         Shape{"4B gate_up", 19456, 2560, false},
                         Shape{"4B down", 2560, 9728, false}}) {
    check_shape(s, kAllM);
  }
}

TEST_F(SkinnyGemmTest, Qwen3_06BAnd8BShapesMatchFloat64) {
  for (const Shape& s :
       {Shape{"0.6B qkv", 4096, 1024, false}, Shape{"0.6B o_proj", 1024, 2048, false},
        Shape{"0.6B gate_up", 6144, 1024, false}, Shape{"0.6B down", 1024, 3072, false},
        Shape{"8B qkv", 6144, 4096, false}, Shape{"8B o_proj", 4096, 4096, false},
        Shape{"8B gate_up", 24576, 4096, false}, Shape{"8B down", 4096, 12288, false}}) {
    check_shape(s, kAllM, 48);
  }
}

TEST_F(SkinnyGemmTest, LmHeadInFloat32MatchesFloat64) {
  check_shape(Shape{"0.6B lm_head", 151936, 1024, true}, kAllM, 48);
  check_shape(Shape{"4B lm_head", 151936, 2560, true}, {1, 7, 32, 33, 64, 256}, 48);
}

TEST_F(SkinnyGemmTest, OddShapesMatchFloat64) {
  check_shape(Shape{"odd N", 1000, 2560, false}, kAllM);
  check_shape(Shape{"odd N f32", 1000, 1024, true}, kAllM);
  check_shape(Shape{"K tail", 777, 1032, false}, {1, 5, 33, 70});  // K = 16·64 + 8
  check_shape(Shape{"tiny", 8, 8, true}, {1, 3, 64, 65});
  check_shape(Shape{"narrow N, long K", 96, 8200, false}, {1, 9, 40});
}

TEST_F(SkinnyGemmTest, RunsAreBitIdentical) {
  // Split-K across CTAs (down, o_proj), rows shared in a CTA (gate_up), f32 logits.
  for (const Shape& s : {Shape{"4B down", 2560, 9728, false}, Shape{"4B o_proj", 2560, 4096, false},
                         Shape{"4B gate_up", 19456, 2560, false},
                         Shape{"0.6B lm_head", 151936, 1024, true}}) {
    for (int64_t M : {1, 32, 64}) {
      const auto w = random_bf16(static_cast<size_t>(s.N * s.K), 0.05f);
      const auto x = random_bf16(static_cast<size_t>(M * s.K), 1.0f);
      DeviceBytes dw(w.size() * 2), dx(x.size() * 2);
      dw.upload(w);
      dx.upload(x);
      const size_t out_bytes = static_cast<size_t>(M * s.N) * (s.f32_out ? 4 : 2);
      DeviceBytes first(out_bytes), second(out_bytes);
      first.poison();
      second.poison();
      launch_skinny_gemm(dx.get(), dw.get(), first.get(), s.f32_out, M, s.N, s.K, stream_);
      // Something else in between, so that timing differs between the two runs.
      launch_skinny_gemm(dx.get(), dw.get(), second.get(), s.f32_out, 1, s.N, s.K, stream_);
      launch_skinny_gemm(dx.get(), dw.get(), second.get(), s.f32_out, M, s.N, s.K, stream_);
      PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
      const auto a = download_raw(first, out_bytes), b = download_raw(second, out_bytes);
      ASSERT_EQ(std::memcmp(a.data(), b.data(), out_bytes), 0)
          << s.name << " M=" << M << ": two runs differ; " << seed_note();
    }
  }
}

TEST_F(SkinnyGemmTest, EverySplitCountMatchesFloat64) {
  // Each cluster size reduces through distributed shared memory with its own share of the
  // tile per CTA; force every one on a narrow shape, an odd one and a K tail.
  for (const Shape& s : {Shape{"4B o_proj", 2560, 4096, false}, Shape{"odd N", 1000, 2560, true},
                         Shape{"K tail", 777, 1032, false}}) {
    const auto w = random_bf16(static_cast<size_t>(s.N * s.K), 1.0f / std::sqrt(float(s.K)));
    DeviceBytes dw(w.size() * 2);
    dw.upload(w);
    for (int64_t M : {1, 33, 64}) {
      const auto x = random_bf16(static_cast<size_t>(M * s.K), 1.0f);
      DeviceBytes dx(x.size() * 2), out(static_cast<size_t>(M * s.N) * (s.f32_out ? 4 : 2));
      dx.upload(x);
      for (int splits = 1; splits <= kSkinnyMaxSplits; ++splits) {
        out.poison();
        launch_skinny_gemm(dx.get(), dw.get(), out.get(), s.f32_out, M, s.N, s.K, stream_,
                           splits);
        PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
        ASSERT_TRUE(matches(download_out(out, static_cast<size_t>(M * s.N), s.f32_out), x, w, M,
                            s.N, s.K, sample_columns(s.N, 64), s.f32_out ? 1e-3 : 1e-2,
                            std::string(s.name) + " M=" + std::to_string(M) + " splits " +
                                std::to_string(splits)));
      }
    }
  }
}

TEST_F(SkinnyGemmTest, ChainedProductsWaitForTheirInputs) {
  // y[i + 1] = y[i] · w[i]ᵀ, 24 products back to back, each launched with programmatic
  // dependent launch: product i + 1 streams its weights while product i finishes, and must
  // not read y[i + 1]'s input before product i has written it (all outputs start as NaN).
  // Widths alternate as in an MLP (2560 -> 9728 -> 2560), eagerly and as a replayed graph.
  const int64_t M = 32;
  const int kLinks = 24;
  std::vector<int64_t> width(kLinks + 1);
  for (int i = 0; i <= kLinks; ++i) width[i] = i % 2 == 0 ? 2560 : 9728;
  std::vector<std::vector<uint16_t>> w(kLinks);
  std::vector<std::unique_ptr<DeviceBytes>> dw(kLinks), y(kLinks + 1);
  for (int i = 0; i < kLinks; ++i) {
    w[i] = random_bf16(static_cast<size_t>(width[i + 1] * width[i]),
                       1.7f / std::sqrt(static_cast<float>(width[i])));
    dw[i] = std::make_unique<DeviceBytes>(w[i].size() * 2);
    dw[i]->upload(w[i]);
  }
  for (int i = 0; i <= kLinks; ++i) {
    y[i] = std::make_unique<DeviceBytes>(static_cast<size_t>(M * width[i]) * 2);
  }
  auto enqueue = [&] {
    for (int i = 0; i < kLinks; ++i) {
      launch_skinny_gemm(y[i]->get(), dw[i]->get(), y[i + 1]->get(), false, M, width[i + 1],
                         width[i], stream_);
    }
  };
  auto check = [&](const std::string& how) {
    PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int i = 0; i < kLinks; ++i) {
      std::vector<uint16_t> in(static_cast<size_t>(M * width[i]));
      PAGELLM_CUDA_CHECK(
          cudaMemcpy(in.data(), y[i]->get(), in.size() * 2, cudaMemcpyDeviceToHost));
      const auto got = download_out(*y[i + 1], static_cast<size_t>(M * width[i + 1]), false);
      ASSERT_TRUE(matches(got, in, w[i], M, width[i + 1], width[i],
                          sample_columns(width[i + 1], 24), 1e-2,
                          how + " link " + std::to_string(i)));
    }
  };
  auto fresh_input = [&] {
    for (int i = 1; i <= kLinks; ++i) y[i]->poison();
    y[0]->upload(random_bf16(static_cast<size_t>(M * width[0]), 1.0f));
  };
  fresh_input();
  enqueue();
  check("eager");

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  PAGELLM_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  enqueue();
  PAGELLM_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  PAGELLM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    fresh_input();
    PAGELLM_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    check("graph replay " + std::to_string(replay));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST_F(SkinnyGemmTest, GatedProductEqualsProductThenSiluMul) {
  // The fused gate|up product + SiLU-and-multiply against (a) the unfused skinny product
  // followed by launch_silu_mul, bit for bit (same split plan, same roundings), and (b) a
  // float64 reference of silu(x·gateᵀ)·(x·upᵀ).
  struct Gated {
    const char* name;
    int64_t inter, K;
  };
  for (const Gated& s : {Gated{"4B gate_up", 9728, 2560}, Gated{"0.6B gate_up", 3072, 1024},
                         Gated{"odd inter, K tail", 1000, 1032}}) {
    const auto w = random_bf16(static_cast<size_t>(2 * s.inter * s.K),
                               2.0f / std::sqrt(static_cast<float>(s.K)));
    DeviceBytes dw(w.size() * 2);
    dw.upload(w);
    for (int64_t M : {1, 7, 32, 33, 64, 100}) {
      const std::string what = std::string(s.name) + " M=" + std::to_string(M);
      const auto x = random_bf16(static_cast<size_t>(M * s.K), 1.0f);
      DeviceBytes dx(x.size() * 2), both(static_cast<size_t>(M * 2 * s.inter) * 2),
          unfused(static_cast<size_t>(M * s.inter) * 2), fused(unfused.bytes());
      dx.upload(x);
      both.poison();
      unfused.poison();
      fused.poison();
      launch_skinny_gemm(dx.get(), dw.get(), both.get(), false, M, 2 * s.inter, s.K, stream_);
      launch_silu_mul(both.get(), unfused.get(), M, s.inter, stream_);
      launch_skinny_gemm_silu_mul(dx.get(), dw.get(), fused.get(), M, s.inter, s.K, stream_);
      PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
      const auto a = download_raw(unfused, unfused.bytes());
      const auto b = download_raw(fused, fused.bytes());
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0)
          << what << ": fused and unfused differ; " << seed_note();

      // float64 reference on sampled columns.
      const auto got = download_out(fused, static_cast<size_t>(M * s.inter), false);
      for (float v : got) ASSERT_TRUE(std::isfinite(v)) << what << "; " << seed_note();
      double diff2 = 0, ref2 = 0;
      for (int64_t i : sample_columns(s.inter, 32)) {
        for (int64_t m = 0; m < M; ++m) {
          double g = 0, u = 0;
          for (int64_t k = 0; k < s.K; ++k) {
            const double xv = bf16_to_f32(x[m * s.K + k]);
            g += xv * bf16_to_f32(w[i * s.K + k]);
            u += xv * bf16_to_f32(w[(s.inter + i) * s.K + k]);
          }
          const double ref = g / (1.0 + std::exp(-g)) * u;
          const double d = got[m * s.inter + i] - ref;
          diff2 += d * d;
          ref2 += ref * ref;
        }
      }
      EXPECT_LE(std::sqrt(diff2) / std::max(std::sqrt(ref2), 1e-30), 1.5e-2)
          << what << "; " << seed_note();
    }
  }
  // LtMatmul fuses only where the product takes the skinny kernel.
  DeviceBytes lt_workspace(32u << 20);
  LtMatmul matmul(lt_workspace.get(), lt_workspace.bytes());
  const int64_t inter = 3072, K = 1024;
  DeviceBytes dw(static_cast<size_t>(2 * inter * K) * 2), dx(static_cast<size_t>(128 * K) * 2),
      out(static_cast<size_t>(128 * inter) * 2);
  matmul.set_path(MatmulPath::kCublasLt);
  EXPECT_FALSE(matmul.run_silu_mul(dx.get(), dw.get(), out.get(), 32, inter, K, stream_));
  matmul.set_path(MatmulPath::kAuto);
  EXPECT_EQ(matmul.run_silu_mul(dx.get(), dw.get(), out.get(), 32, inter, K, stream_),
            skinny_gemm_preferred(32, 2 * inter, K));
  EXPECT_EQ(matmul.run_silu_mul(dx.get(), dw.get(), out.get(), 128, inter, K, stream_),
            skinny_gemm_preferred(128, 2 * inter, K));
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

TEST_F(SkinnyGemmTest, PackedWeightsGiveTheSameBits) {
  // pack_skinny_weights writes each stage's weight tile as TMA leaves it in shared memory,
  // so streaming the packed copy (one bulk copy per stage) must give the same output bits
  // as the two swizzled boxes per stage: plain products with ragged N and a K tail, a split
  // K, f32 logits, and gated products with an odd I.
  struct Case {
    const char* name;
    int64_t N, K, inter;
    bool f32;
  };
  for (const Case& c :
       {Case{"4B o_proj", 2560, 4096, 0, false}, Case{"4B qkv", 6144, 2560, 0, false},
        Case{"odd N, K tail", 1000, 1032, 0, false}, Case{"tiny", 8, 8, 0, true},
        Case{"lm_head-like f32", 3000, 1024, 0, true}, Case{"4B gate_up", 19456, 2560, 9728, false},
        Case{"odd inter, K tail", 200, 264, 100, false}}) {
    const auto w = random_bf16(static_cast<size_t>(c.N * c.K),
                               2.0f / std::sqrt(static_cast<float>(c.K)));
    const size_t packed_bytes = skinny_packed_bytes(c.N, c.K);
    DeviceBytes dw(w.size() * 2), packed(packed_bytes);
    dw.upload(w);
    packed.poison();  // padding the packer failed to zero would show as NaN below
    pack_skinny_weights(dw.get(), c.N, c.K, c.inter, packed.get(), stream_);
    PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int64_t M : {1, 7, 32, 64}) {
      const std::string what = std::string(c.name) + " M=" + std::to_string(M);
      const auto x = random_bf16(static_cast<size_t>(M * c.K), 1.0f);
      const int64_t cols = c.inter > 0 ? c.inter : c.N;
      const size_t out_bytes = static_cast<size_t>(M * cols) * (c.f32 ? 4 : 2);
      DeviceBytes dx(x.size() * 2), ref(out_bytes), got(out_bytes);
      dx.upload(x);
      ref.poison();
      got.poison();
      if (c.inter > 0) {
        launch_skinny_gemm_silu_mul(dx.get(), dw.get(), ref.get(), M, c.inter, c.K, stream_);
        launch_skinny_gemm_silu_mul(dx.get(), dw.get(), got.get(), M, c.inter, c.K, stream_, 0,
                                    packed.get());
      } else {
        launch_skinny_gemm(dx.get(), dw.get(), ref.get(), c.f32, M, c.N, c.K, stream_);
        launch_skinny_gemm(dx.get(), dw.get(), got.get(), c.f32, M, c.N, c.K, stream_, 0,
                           packed.get());
      }
      PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
      const auto a = download_raw(ref, out_bytes), b = download_raw(got, out_bytes);
      ASSERT_EQ(std::memcmp(a.data(), b.data(), out_bytes), 0)
          << what << ": packed and row-major weights give different outputs; " << seed_note();
      const auto values = download_out(got, static_cast<size_t>(M * cols), c.f32);
      for (float v : values) ASSERT_TRUE(std::isfinite(v)) << what << "; " << seed_note();
    }
  }
}

TEST_F(SkinnyGemmTest, GraphReplayIsCorrectEveryTime) {
  // o_proj and down split K across a cluster; replays must reduce fresh inputs every time.
  const int64_t M = 32;
  const std::vector<Shape> shapes = {Shape{"4B o_proj", 2560, 4096, false},
                                     Shape{"4B down", 2560, 9728, false},
                                     Shape{"0.6B lm_head", 151936, 1024, true}};
  struct Buffers {
    std::vector<uint16_t> w;
    std::unique_ptr<DeviceBytes> dw, dx, out;
  };
  std::vector<Buffers> bufs(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    bufs[i].w = random_bf16(static_cast<size_t>(s.N * s.K), 1.0f / std::sqrt(float(s.K)));
    bufs[i].dw = std::make_unique<DeviceBytes>(bufs[i].w.size() * 2);
    bufs[i].dw->upload(bufs[i].w);
    bufs[i].dx = std::make_unique<DeviceBytes>(static_cast<size_t>(M * s.K) * 2);
    bufs[i].out = std::make_unique<DeviceBytes>(static_cast<size_t>(M * s.N) * (s.f32_out ? 4 : 2));
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  PAGELLM_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    launch_skinny_gemm(bufs[i].dx->get(), bufs[i].dw->get(), bufs[i].out->get(), s.f32_out, M,
                       s.N, s.K, stream_);
  }
  PAGELLM_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  PAGELLM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    std::vector<std::vector<uint16_t>> xs;
    for (size_t i = 0; i < shapes.size(); ++i) {
      xs.push_back(random_bf16(static_cast<size_t>(M * shapes[i].K), 1.0f));
      bufs[i].dx->upload(xs.back());
      bufs[i].out->poison();
    }
    PAGELLM_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Shape& s = shapes[i];
      const auto got = download_out(*bufs[i].out, static_cast<size_t>(M * s.N), s.f32_out);
      ASSERT_TRUE(matches(got, xs[i], bufs[i].w, M, s.N, s.K, sample_columns(s.N, 64),
                          s.f32_out ? 1e-3 : 1e-2,
                          std::string(s.name) + " replay " + std::to_string(replay)));
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST_F(SkinnyGemmTest, LtMatmulPathsAgree) {
  const int64_t N = 2560, K = 4096;
  const auto w = random_bf16(static_cast<size_t>(N * K), 1.0f / 64);
  DeviceBytes dw(w.size() * 2);
  dw.upload(w);
  DeviceBytes lt_workspace(32u << 20);
  LtMatmul matmul(lt_workspace.get(), lt_workspace.bytes());
  for (int64_t M : {1, 32, 64, 100}) {
    const auto x = random_bf16(static_cast<size_t>(M * K), 1.0f);
    DeviceBytes dx(x.size() * 2), out(static_cast<size_t>(M * N) * 2);
    dx.upload(x);
    for (MatmulPath path : {MatmulPath::kCublasLt, MatmulPath::kSkinny, MatmulPath::kAuto}) {
      matmul.set_path(path);
      const MatmulPath taken = matmul.path_for(dx.get(), dw.get(), out.get(), CUDA_R_16BF, M, N, K);
      // auto takes the skinny kernel for decode shapes (M <= 64) and cuBLASLt above.
      const MatmulPath expected =
          path != MatmulPath::kAuto ? path
          : skinny_gemm_preferred(M, N, K) ? MatmulPath::kSkinny
                                           : MatmulPath::kCublasLt;
      EXPECT_EQ(taken, expected) << "M=" << M << " path " << matmul_path_name(path);
      out.poison();
      matmul.run(dx.get(), dw.get(), out.get(), CUDA_R_16BF, M, N, K, stream_);
      PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
      ASSERT_TRUE(matches(download_out(out, static_cast<size_t>(M * N), false), x, w, M, N, K,
                          sample_columns(N, 64), 1e-2,
                          std::string("LtMatmul ") + matmul_path_name(path) + " M=" +
                              std::to_string(M)));
    }
  }
  // K not a multiple of 8: the skinny kernel refuses, LtMatmul falls back to cuBLASLt.
  const int64_t M = 5, N2 = 300, K2 = 36;
  const auto w2 = random_bf16(static_cast<size_t>(N2 * K2), 0.2f);
  const auto x2 = random_bf16(static_cast<size_t>(M * K2), 1.0f);
  DeviceBytes dw2(w2.size() * 2), dx2(x2.size() * 2), out2(static_cast<size_t>(M * N2) * 4);
  dw2.upload(w2);
  dx2.upload(x2);
  EXPECT_FALSE(skinny_gemm_supported(dx2.get(), dw2.get(), out2.get(), M, N2, K2));
  EXPECT_THROW(launch_skinny_gemm(dx2.get(), dw2.get(), out2.get(), true, M, N2, K2, stream_),
               Error);
  matmul.set_path(MatmulPath::kSkinny);
  EXPECT_EQ(matmul.path_for(dx2.get(), dw2.get(), out2.get(), CUDA_R_32F, M, N2, K2),
            MatmulPath::kCublasLt);
  out2.poison();
  matmul.run(dx2.get(), dw2.get(), out2.get(), CUDA_R_32F, M, N2, K2, stream_);
  PAGELLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  ASSERT_TRUE(matches(download_out(out2, static_cast<size_t>(M * N2), true), x2, w2, M, N2, K2,
                      sample_columns(N2, 64), 1e-3, "LtMatmul fallback K=36"));
}

// ---- host-only: no GPU needed ------------------------------------------------------------

TEST(SkinnyGemmPlan, CoversEveryOutputWithValidClusters) {
  for (int64_t N : {8, 96, 1000, 1024, 2560, 4096, 6144, 19456, 24576, 151936}) {
    for (int64_t K : {8, 1024, 1032, 2560, 4096, 9728, 12288}) {
      for (int64_t M : {1, 7, 32, 33, 64, 65, 256}) {
        for (int forced : {0, 1, 3, 8, 20}) {
          const SkinnyPlan p = skinny_gemm_plan(M, N, K, 132, forced);
          SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" +
                       std::to_string(K) + " forced splits " + std::to_string(forced));
          EXPECT_GE(static_cast<int64_t>(p.grid_x) * kSkinnyRowsPerCta, N);
          EXPECT_LT(static_cast<int64_t>(p.grid_x - 1) * kSkinnyRowsPerCta, N);
          EXPECT_GE(static_cast<int64_t>(p.grid_z) * p.tokens_per_tile, M);
          EXPECT_TRUE(p.tokens_per_tile == 8 || p.tokens_per_tile == 16 ||
                      p.tokens_per_tile == 32 || p.tokens_per_tile == 64);
          EXPECT_GE(p.splits, 1);
          EXPECT_LE(p.splits, kSkinnyMaxSplits);  // a portable cluster
          EXPECT_LE(p.splits, (K + 63) / 64);     // no split without a chunk
          EXPECT_EQ(p.grid_y, p.splits);
          const int64_t ctas = static_cast<int64_t>(p.grid_x) * p.grid_y * p.grid_z;
          if (forced == 0 && p.splits > 1) {
            // A power of two, only to fill the GPU, never past two CTAs per SM.
            EXPECT_EQ(p.splits & (p.splits - 1), 0);
            EXPECT_LE(p.splits, kSkinnyAutoMaxSplits);
            EXPECT_LE(ctas, 2 * 132);
            EXPECT_GE((K + 63) / 64 / p.splits, 2);
          }
        }
      }
    }
  }
  // The Qwen3-4B decode shapes at M = 32 on 132 SMs: narrow N is split, wide N is not.
  EXPECT_EQ(skinny_gemm_plan(32, 6144, 2560, 132).splits, 4);   // qkv: 48 tiles
  EXPECT_EQ(skinny_gemm_plan(32, 2560, 4096, 132).splits, 4);   // o_proj: 20 tiles
  EXPECT_EQ(skinny_gemm_plan(32, 2560, 9728, 132).splits, 4);   // down
  EXPECT_EQ(skinny_gemm_plan(32, 19456, 2560, 132).splits, 1);  // gate_up: 152 tiles
}

TEST(SkinnyGemmPlan, MatmulPathNamesParse) {
  EXPECT_EQ(parse_matmul_path("auto"), MatmulPath::kAuto);
  EXPECT_EQ(parse_matmul_path("cublaslt"), MatmulPath::kCublasLt);
  EXPECT_EQ(parse_matmul_path("skinny"), MatmulPath::kSkinny);
  try {
    parse_matmul_path("fast");
    FAIL() << "PAGELLM_MATMUL=fast accepted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("cublaslt, skinny or auto"), std::string::npos) << message;
  }
  EXPECT_TRUE(parse_matmul_autotune("1"));
  EXPECT_TRUE(parse_matmul_autotune(""));
  EXPECT_FALSE(parse_matmul_autotune("0"));
  try {
    parse_matmul_autotune("yes");
    FAIL() << "PAGELLM_MATMUL_AUTOTUNE=yes accepted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("use 1"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace pagellm::cuda
