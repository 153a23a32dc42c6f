// Backend::copy_kv_pages on the CUDA backend (copy-on-write of KV pages for n-sample
// fan-out, one launch a wave of independent pairs: cuda/kv/page_copy.cu): random pools in
// every layer, destination pages poisoned with NaN, a set of copies (fixed ones with chains
// where a later pair reads or overwrites a page an earlier one wrote or read; random ones,
// more than one launch holds; more layers than one launch holds; pages that are not a
// multiple of 16 bytes), then every layer's K and V compared bit for bit with the same
// copies applied in order on the host. The waves themselves are checked without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "pagellm/cuda/cuda_backend.h"
#include "pagellm/cuda/kv/page_copy.h"

namespace pagellm {
namespace {

using cuda::kv_copy_waves;
using test::CudaOpTest;
using Pairs = std::vector<std::pair<int32_t, int32_t>>;

class CudaCopyKvPages : public CudaOpTest {
 protected:
  /// Random bf16 pools on the GPU and their host copies, [layer][k, v], of `pages` pages of
  /// [heads, page_size, head_dim].
  void make_pools(int layers = 3, int64_t pages = 12, int64_t heads = 2, int64_t page_size = 16,
                  int64_t head_dim = 128) {
    kv_.clear();
    host_.clear();
    layers_ = layers;
    pages_ = pages;
    page_elems_ = heads * page_size * head_dim;
    for (int l = 0; l < layers_; ++l) {
      LayerKv layer;
      std::vector<float> k = randn_bf16(static_cast<size_t>(pages_ * page_elems_));
      std::vector<float> v = randn_bf16(static_cast<size_t>(pages_ * page_elems_));
      layer.k = put(gpu(), gpu().kv_dtype(), {pages_, heads, page_size, head_dim}, k);
      layer.v = put(gpu(), gpu().kv_dtype(), {pages_, heads, page_size, head_dim}, v);
      kv_.push_back(layer);
      host_.push_back({k, v});
    }
  }

  /// NaN in page `page` of every pool, on the GPU and the host copy.
  void poison_page(int32_t page) {
    const std::vector<float> nan(static_cast<size_t>(page_elems_), NAN);
    for (int l = 0; l < layers_; ++l) {
      for (int which = 0; which < 2; ++which) {
        Tensor& pool = which == 0 ? kv_[l].k : kv_[l].v;
        gpu().upload(pool, page * page_elems_, nan.data(), DType::F32, page_elems_);
        std::copy(nan.begin(), nan.end(), host_[l][which].begin() + page * page_elems_);
      }
    }
  }

  void apply_on_host(const Pairs& pairs) {
    for (const auto& [src, dst] : pairs) {
      for (auto& layer : host_) {
        for (auto& pool : layer) {
          std::copy(pool.begin() + src * page_elems_, pool.begin() + (src + 1) * page_elems_,
                    pool.begin() + dst * page_elems_);
        }
      }
    }
  }

  void expect_pools_equal_host() {
    for (int l = 0; l < layers_; ++l) {
      for (int which = 0; which < 2; ++which) {
        const std::vector<float> got = gpu().download_f32(which == 0 ? kv_[l].k : kv_[l].v);
        const std::vector<float>& want = host_[l][which];
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_FALSE(std::isnan(got[i])) << "layer " << l << (which ? " V" : " K")
                                           << " element " << i << " (page " << i / page_elems_
                                           << ") was not written; " << seed_note();
          ASSERT_EQ(got[i], want[i]) << "layer " << l << (which ? " V" : " K") << " element "
                                     << i << " (page " << i / page_elems_ << "); " << seed_note();
        }
      }
    }
  }

  /// Poisons every page whose first use in `pairs` is a write (its old contents must not
  /// survive), then checks the GPU's copies against the host's.
  void run_and_compare(const Pairs& pairs) {
    std::vector<int> first_use(static_cast<size_t>(pages_), 0);  // 1 read, 2 written
    for (const auto& [src, dst] : pairs) {
      if (first_use[src] == 0) first_use[src] = 1;
      if (first_use[dst] == 0) first_use[dst] = 2;
    }
    for (int32_t page = 0; page < pages_; ++page) {
      if (first_use[page] == 2) poison_page(page);
    }
    apply_on_host(pairs);
    gpu().copy_kv_pages(kv_, pairs);
    gpu().synchronize();
    expect_pools_equal_host();
  }

  int layers_ = 0;
  int64_t pages_ = 0, page_elems_ = 0;
  std::vector<LayerKv> kv_;
  std::vector<std::vector<std::vector<float>>> host_;  // [layer][0: K, 1: V][elements]
};

TEST_F(CudaCopyKvPages, CopiesEveryLayersKAndVInOrder) {
  make_pools();
  // 1..3 -> 5..7 and 4 -> 9: one wave; 9 -> 10 reads what 4 -> 9 wrote, so a second wave
  // (with 11 -> 8).
  const Pairs pairs = {{1, 5}, {2, 6}, {3, 7}, {4, 9}, {9, 10}, {11, 8}};
  for (const auto& [src, dst] : pairs) poison_page(dst);
  apply_on_host(pairs);
  gpu().copy_kv_pages(kv_, pairs);
  gpu().synchronize();
  expect_pools_equal_host();
}

TEST_F(CudaCopyKvPages, APairReadingAPageTheOneBeforeWroteRunsAfterIt) {
  make_pools();
  // 2 -> 3, then 3 -> 4: the second pair reads what the first wrote, so they are two waves;
  // run at once, the second could read the old page 3.
  const Pairs pairs = {{2, 3}, {3, 4}};
  poison_page(4);
  apply_on_host(pairs);
  gpu().copy_kv_pages(kv_, pairs);
  gpu().synchronize();
  expect_pools_equal_host();
}

TEST_F(CudaCopyKvPages, RandomPairsInOrderOverManyLaunches) {
  // 1,500 random pairs over 40 pages: chains, overwrites and reads of written pages cut
  // them into many waves, and a wave of more than 512 pairs is more than one launch.
  make_pools(3, 40);
  Pairs pairs;
  for (int i = 0; i < 1500; ++i) {
    const int32_t src = uniform_int(1, 39);
    int32_t dst = uniform_int(1, 38);
    if (dst >= src) ++dst;
    pairs.emplace_back(src, dst);
  }
  run_and_compare(pairs);
  // A fan-out's shape, larger than one launch: 600 pairs from 3 pages to fresh ones.
  make_pools(2, 700);
  Pairs fan_out;
  for (int32_t i = 0; i < 600; ++i) fan_out.emplace_back(1 + i % 3, 100 + i);
  ASSERT_EQ(kv_copy_waves(fan_out).size(), 1u);
  run_and_compare(fan_out);
}

TEST_F(CudaCopyKvPages, MoreLayersThanOneLaunchHolds) {
  make_pools(130, 6, 1, 16, 64);  // 260 pools
  run_and_compare({{1, 4}, {2, 5}, {4, 3}});
}

TEST_F(CudaCopyKvPages, PagesThatAreNotMultiplesOf16Bytes) {
  make_pools(3, 12, 1, 3, 5);  // 15 bf16 elements a page: 30 bytes
  run_and_compare({{1, 5}, {2, 6}, {5, 7}, {11, 1}});
}

TEST(KvCopyWaves, CutWhereAPairDependsOnTheWave) {
  EXPECT_TRUE(kv_copy_waves({}).empty());
  // Reads of one page into fresh ones: one wave.
  EXPECT_EQ(kv_copy_waves({{1, 5}, {1, 6}, {2, 7}}), (std::vector<size_t>{0}));
  // Reads a page the wave wrote (5): a new wave at 1.
  EXPECT_EQ(kv_copy_waves({{1, 5}, {5, 6}}), (std::vector<size_t>{0, 1}));
  // Writes a page the wave read (1): a new wave at 1.
  EXPECT_EQ(kv_copy_waves({{1, 5}, {2, 1}}), (std::vector<size_t>{0, 1}));
  // Writes a page the wave wrote (5): a new wave at 2; then 3 -> 4 joins it.
  EXPECT_EQ(kv_copy_waves({{1, 5}, {2, 6}, {3, 5}, {3, 4}}), (std::vector<size_t>{0, 2}));
  // A new wave forgets the old one's pages: 3 -> 1 writes page 1, which wave 0 read but
  // wave 1 (from 6 -> 2 on) did not, so it joins wave 1.
  EXPECT_EQ(kv_copy_waves({{1, 6}, {6, 2}, {3, 1}}), (std::vector<size_t>{0, 1}));
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
