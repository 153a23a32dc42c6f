// Backend::copy_kv_pages on the CUDA backend (copy-on-write of KV pages for n-sample
// fan-out): random pools in every layer, destination pages poisoned with NaN, a set of
// copies (a run of consecutive pages, which the backend merges into one copy, and a chain
// where a later pair reads a page an earlier one wrote), then every layer's K and V compared
// bit for bit with the same copies applied in order on the host.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "pagellm/cuda/cuda_backend.h"

namespace pagellm {
namespace {

using test::CudaOpTest;
using Pairs = std::vector<std::pair<int32_t, int32_t>>;

class CudaCopyKvPages : public CudaOpTest {
 protected:
  static constexpr int64_t kPages = 12, kHeads = 2, kPageSize = 16, kHeadDim = 128;
  static constexpr int64_t kPageElems = kHeads * kPageSize * kHeadDim;
  static constexpr int kLayers = 3;

  /// Random bf16 pools on the GPU and their host copies, [layer][k, v].
  void make_pools() {
    for (int l = 0; l < kLayers; ++l) {
      LayerKv layer;
      std::vector<float> k = randn_bf16(static_cast<size_t>(kPages * kPageElems));
      std::vector<float> v = randn_bf16(static_cast<size_t>(kPages * kPageElems));
      layer.k = put(gpu(), gpu().kv_dtype(), {kPages, kHeads, kPageSize, kHeadDim}, k);
      layer.v = put(gpu(), gpu().kv_dtype(), {kPages, kHeads, kPageSize, kHeadDim}, v);
      kv_.push_back(layer);
      host_.push_back({k, v});
    }
  }

  /// NaN in page `page` of every pool, on the GPU and the host copy.
  void poison_page(int32_t page) {
    const std::vector<float> nan(static_cast<size_t>(kPageElems), NAN);
    for (int l = 0; l < kLayers; ++l) {
      for (int which = 0; which < 2; ++which) {
        Tensor& pool = which == 0 ? kv_[l].k : kv_[l].v;
        gpu().upload(pool, page * kPageElems, nan.data(), DType::F32, kPageElems);
        std::copy(nan.begin(), nan.end(), host_[l][which].begin() + page * kPageElems);
      }
    }
  }

  void apply_on_host(const Pairs& pairs) {
    for (const auto& [src, dst] : pairs) {
      for (auto& layer : host_) {
        for (auto& pool : layer) {
          std::copy(pool.begin() + src * kPageElems, pool.begin() + (src + 1) * kPageElems,
                    pool.begin() + dst * kPageElems);
        }
      }
    }
  }

  void expect_pools_equal_host() {
    for (int l = 0; l < kLayers; ++l) {
      for (int which = 0; which < 2; ++which) {
        const std::vector<float> got = gpu().download_f32(which == 0 ? kv_[l].k : kv_[l].v);
        const std::vector<float>& want = host_[l][which];
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_FALSE(std::isnan(got[i])) << "layer " << l << (which ? " V" : " K")
                                           << " element " << i << " (page " << i / kPageElems
                                           << ") was not written; " << seed_note();
          ASSERT_EQ(got[i], want[i]) << "layer " << l << (which ? " V" : " K") << " element "
                                     << i << " (page " << i / kPageElems << "); " << seed_note();
        }
      }
    }
  }

  std::vector<LayerKv> kv_;
  std::vector<std::vector<std::vector<float>>> host_;  // [layer][0: K, 1: V][elements]
};

TEST_F(CudaCopyKvPages, CopiesEveryLayersKAndVInOrder) {
  make_pools();
  // 1..3 -> 5..7: one run; 4 -> 9 then 9 -> 10: the second reads what the first wrote;
  // 11 -> 8 alone.
  const Pairs pairs = {{1, 5}, {2, 6}, {3, 7}, {4, 9}, {9, 10}, {11, 8}};
  for (const auto& [src, dst] : pairs) poison_page(dst);
  apply_on_host(pairs);
  gpu().copy_kv_pages(kv_, pairs);
  gpu().synchronize();
  expect_pools_equal_host();
}

TEST_F(CudaCopyKvPages, OverlappingConsecutiveRunsAreNotMerged) {
  make_pools();
  // Each pair is consecutive with the one before, but page 3 is written (from 2) before it
  // is read (into 4): one merged copy of 2..3 -> 3..4 would read the old page 3.
  const Pairs pairs = {{2, 3}, {3, 4}};
  poison_page(4);
  apply_on_host(pairs);
  gpu().copy_kv_pages(kv_, pairs);
  gpu().synchronize();
  expect_pools_equal_host();
}

TEST_F(CudaCopyKvPages, RejectsBadPagesAndCapture) {
  make_pools();
  auto message = [&](const Pairs& pairs) {
    try {
      gpu().copy_kv_pages(kv_, pairs);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({{1, 12}}).find("pages must differ and lie in 1..11"), std::string::npos);
  EXPECT_NE(message({{0, 3}}).find("copies page 0 to page 3"), std::string::npos);
  EXPECT_NE(message({{4, 4}}).find("pages must differ"), std::string::npos);
  gpu().copy_kv_pages(kv_, {});  // nothing to do
  gpu().begin_capture();
  const std::string captured = message({{1, 2}});
  gpu().end_capture();
  EXPECT_NE(captured.find("cannot be captured"), std::string::npos) << captured;
}

}  // namespace
}  // namespace pagellm
