// Helpers for the CUDA op tests: a fixture holding a CUDA and a CPU backend (skipping when
// no GPU is present), random bf16-representable inputs, and comparisons that print the op,
// the shape, the error and the seed when they fail.
//
// Every test draws a fresh seed (random_device and the clock) unless PAGELLM_TEST_SEED is
// set, so that repeated runs explore new inputs and a failure can be replayed exactly.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "pagellm/backend/backend.h"
#include "pagellm/common/dtype.h"

namespace pagellm::test {

/// Number of visible CUDA devices (0 when there is no driver or no GPU).
inline int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

/// Sets (or, with a null value, unsets) an environment variable for a scope and restores
/// what was there when the scope ends.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      had_old_ = true;
      old_ = old;
    }
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_old_) {
      ::setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  bool had_old_ = false;
  std::string old_;
};

/// PAGELLM_TEST_SEED if set, else a fresh seed.
inline uint64_t test_seed() {
  if (const char* env = std::getenv("PAGELLM_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  std::random_device rd;
  const uint64_t t = static_cast<uint64_t>(
      std::chrono::high_resolution_clock::now().time_since_epoch().count());
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ t;
}

/// Fixture: gpu (CUDA backend) and cpu (reference) backends, tensors allocated on either
/// and kept alive until the test ends, and a seeded generator.
class CudaOpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
    gpu_ = create_backend("cuda");
    cpu_ = create_backend("cpu");
    seed_ = test_seed();
    rng_.seed(seed_);
  }
  void TearDown() override {
    buffers_.clear();  // before the backends that own the memory
  }

  Backend& gpu() { return *gpu_; }
  Backend& cpu() { return *cpu_; }

  /// "seed N (rerun with PAGELLM_TEST_SEED=N)", for failure messages.
  std::string seed_note() const {
    std::ostringstream os;
    os << "seed " << seed_ << " (rerun with PAGELLM_TEST_SEED=" << seed_ << ")";
    return os.str();
  }

  Tensor alloc(Backend& b, DType dtype, std::initializer_list<int64_t> dims) {
    Tensor probe(nullptr, dtype, dims);
    buffers_.emplace_back(&b, std::max<size_t>(probe.nbytes(), 1));
    return buffers_.back().tensor(dtype, dims);
  }
  Tensor alloc_i32(Backend& b, const std::vector<int32_t>& values) {
    Tensor t = alloc(b, DType::I32, {static_cast<int64_t>(values.size())});
    if (!values.empty()) b.upload(t, 0, values.data(), DType::I32, t.numel());
    return t;
  }
  /// Allocates on b with b's dtype for the role, uploads `values` (float32) and returns it.
  Tensor put(Backend& b, DType dtype, std::initializer_list<int64_t> dims,
             const std::vector<float>& values) {
    Tensor t = alloc(b, dtype, dims);
    EXPECT_EQ(static_cast<size_t>(t.numel()), values.size());
    b.upload(t, 0, values.data(), DType::F32, t.numel());
    return t;
  }
  /// Fills with NaN so that anything an op fails to write is caught.
  void poison(Backend& b, Tensor& t) { b.fill(t, NAN); }

  /// n normal(mean, stddev) values rounded to bf16, so both backends see the same inputs.
  std::vector<float> randn_bf16(size_t n, float stddev = 1.0f, float mean = 0.0f) {
    std::normal_distribution<float> dist(mean, stddev);
    std::vector<float> v(n);
    for (float& x : v) x = bf16_to_f32(f32_to_bf16(dist(rng_)));
    return v;
  }
  int uniform_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<Backend> cpu_;
  std::vector<DeviceBuffer> buffers_;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

/// The spacing of bf16 values at |v| (0 at 0): rounding to bf16 moves v by at most half of it.
inline float bf16_ulp(float v) {
  int e = 0;
  std::frexp(v, &e);  // |v| = m 2^e, m in [0.5, 1): 8 significant bits leave steps of 2^(e-8)
  return v == 0.0f ? 0.0f : std::ldexp(1.0f, e - 8);
}

/// ‖got − ref‖ <= tol ‖ref‖ + ‖rounding‖, and every value finite where the reference is.
/// `rounding` (empty: none) bounds, element by element, what the result's own rounding may
/// move it by whatever the computation: a delta read off bf16 outputs carries up to half a
/// bf16 step of each output it is the difference of, however small the delta is. On failure
/// prints `what`, the error, the worst element and the seed note.
inline ::testing::AssertionResult relative_close(const std::vector<float>& got,
                                                 const std::vector<float>& ref, double tol,
                                                 const std::string& what,
                                                 const std::string& seed_note,
                                                 const std::vector<float>& rounding = {}) {
  if (got.size() != ref.size() || (!rounding.empty() && rounding.size() != ref.size())) {
    return ::testing::AssertionFailure() << what << ": " << got.size() << " values, reference "
                                         << ref.size() << "; " << seed_note;
  }
  double diff2 = 0.0, ref2 = 0.0, worst = -1.0;
  size_t worst_at = 0, non_finite = 0, first_non_finite = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) && std::isfinite(ref[i])) {
      if (non_finite++ == 0) first_non_finite = i;
      continue;
    }
    const double d = static_cast<double>(got[i]) - ref[i];
    diff2 += d * d;
    ref2 += static_cast<double>(ref[i]) * ref[i];
    if (std::fabs(d) > worst) {
      worst = std::fabs(d);
      worst_at = i;
    }
  }
  double rounding2 = 0.0;
  for (const float r : rounding) rounding2 += static_cast<double>(r) * r;
  const double norm = std::max(std::sqrt(ref2), 1e-30);
  const double rel = std::sqrt(diff2) / norm;
  const double bound = tol + std::sqrt(rounding2) / norm;
  if (non_finite == 0 && rel <= bound) return ::testing::AssertionSuccess();
  auto failure = ::testing::AssertionFailure();
  failure << what << ": ";
  if (non_finite > 0) {
    failure << non_finite << " non-finite values (first at " << first_non_finite << ": "
            << got[first_non_finite] << ", reference " << ref[first_non_finite] << "); ";
  }
  failure << "relative L2 error " << rel << " (bound " << bound;
  if (!rounding.empty()) failure << " = " << tol << " + the rounding's " << bound - tol;
  failure << ")";
  if (worst >= 0) {
    failure << ", worst element " << worst_at << ": " << got[worst_at] << " vs reference "
            << ref[worst_at];
  }
  return failure << "; " << seed_note;
}

/// Greedy outputs of one engine run and the logits of every sampled token, by (request id,
/// output index).
struct GreedyRun {
  std::vector<std::vector<int32_t>> outputs;  // per request, in `ids` order
  std::map<std::pair<int64_t, int64_t>, std::vector<float>> logits;
  std::vector<int64_t> ids;
};

/// Compares two greedy runs of the same requests token by token: each token's logits within
/// `tol` (relative L2), and where the tokens differ, a top-two gap under `tie_gap` in `a`'s
/// logits (a tie that rounding may flip; the rest of that request depends on it and is not
/// compared). Expects at least three quarters of the tokens compared. `what` names b's side
/// in the messages.
inline void expect_same_greedy_run(const GreedyRun& a, const GreedyRun& b, const std::string& what,
                                   double tol = 2e-2, double tie_gap = 0.05) {
  ASSERT_EQ(a.outputs.size(), b.outputs.size());
  int64_t compared = 0, total = 0;
  for (size_t r = 0; r < a.outputs.size(); ++r) {
    const auto& ta = a.outputs[r];
    const auto& tb = b.outputs[r];
    ASSERT_EQ(ta.size(), tb.size());
    total += static_cast<int64_t>(ta.size());
    for (size_t i = 0; i < ta.size(); ++i) {
      const std::vector<float>& la = a.logits.at({a.ids[r], static_cast<int64_t>(i)});
      const std::vector<float>& lb = b.logits.at({b.ids[r], static_cast<int64_t>(i)});
      double err = 0, norm = 0;
      for (size_t v = 0; v < la.size(); ++v) {
        err += (la[v] - lb[v]) * double(la[v] - lb[v]);
        norm += double(la[v]) * la[v];
      }
      EXPECT_LT(std::sqrt(err / std::max(norm, 1e-30)), tol)
          << "request " << r << " token " << i << ": logits differ " << what;
      if (ta[i] != tb[i]) {
        std::vector<float> sorted = la;
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
        EXPECT_LT(sorted[0] - sorted[1], tie_gap)
            << "request " << r << " token " << i << ": " << ta[i] << " against " << tb[i] << " "
            << what << " at a top-two gap of " << sorted[0] - sorted[1];
        break;  // later tokens depend on the tie
      }
      ++compared;
    }
  }
  // Ties are rare; a test that compared almost nothing would prove nothing.
  EXPECT_GE(compared, total * 3 / 4) << compared << " of " << total << " tokens compared";
}

}  // namespace pagellm::test
