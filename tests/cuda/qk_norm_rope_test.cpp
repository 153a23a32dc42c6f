// The fused q/k RMSNorm + RoPE + paged KV store against the CPU backend, over ragged
// batches: 1 to 64 sequences, KV lengths up to 4,096, page sizes 16, 32 and 64, GQA
// ratios 1, 2, 4 and 8, head dims 64, 128 and 256, batches of up to about 20,000 tokens,
// and padding tokens whose slots point into the reserved page 0.
//
// Checked: q_out; every slot a real token wrote in the K and V pools (V must be an exact
// copy; q and k within relative L2 1e-2, one bf16 rounding after float32 math); and that
// every other slot outside page 0 still holds the NaN poison (the kernel wrote nowhere
// else). Page 0 is not compared: several padding tokens may write the same slot there.
//
// The same checks cover matmul_qk_norm_rope_store_kv, the qkv product fused with this op
// (the CUDA backend's decode path: one skinny-GEMM kernel whose epilogue normalises,
// rotates and stores), against the CPU backend's product + op in float32; and the fused
// kernel against the plain product + this op on the GPU, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"

namespace pagellm {
namespace {

using test::relative_close;

class QkNormRopeTest : public test::CudaOpTest {
 protected:
  struct Config {
    int32_t num_seqs, max_query_len, max_kv_len, page_size;
    int64_t num_q_heads, num_kv_heads, head_dim;
    int32_t padding_tokens;
  };

  // A ragged batch with every sequence's pages drawn from a shuffled pool (page 0 never
  // used), plus padding tokens at position 0 in page 0.
  ForwardBatch make_batch(const Config& c, int32_t* num_pages) {
    ForwardBatch b;
    b.page_size = c.page_size;
    std::vector<int32_t> q_lens, kv_lens;
    int32_t pages_needed = 0, max_pages = 1;
    for (int32_t s = 0; s < c.num_seqs; ++s) {
      const int32_t kv = uniform_int(1, c.max_kv_len);
      const int32_t q = uniform_int(1, std::min(kv, c.max_query_len));
      q_lens.push_back(q);
      kv_lens.push_back(kv);
      const int32_t pages = (kv + c.page_size - 1) / c.page_size;
      pages_needed += pages;
      max_pages = std::max(max_pages, pages);
    }
    *num_pages = pages_needed + 1;
    std::vector<int32_t> free_pages(static_cast<size_t>(pages_needed));
    std::iota(free_pages.begin(), free_pages.end(), 1);
    std::shuffle(free_pages.begin(), free_pages.end(), rng_);
    b.max_pages_per_seq = max_pages;
    b.page_table.assign(static_cast<size_t>(c.num_seqs) * max_pages, 0);
    b.query_start.push_back(0);
    size_t next_page = 0;
    for (int32_t s = 0; s < c.num_seqs; ++s) {
      const int32_t q = q_lens[static_cast<size_t>(s)], kv = kv_lens[static_cast<size_t>(s)];
      const int32_t pages = (kv + c.page_size - 1) / c.page_size;
      for (int32_t j = 0; j < pages; ++j) {
        b.page_table[static_cast<size_t>(s) * max_pages + j] = free_pages[next_page++];
      }
      for (int32_t i = 0; i < q; ++i) {
        const int32_t pos = kv - q + i;
        b.token_ids.push_back(uniform_int(0, 1000));
        b.positions.push_back(pos);
        b.slot_mapping.push_back(b.page_table[static_cast<size_t>(s) * max_pages + pos / c.page_size] *
                                     c.page_size + pos % c.page_size);
      }
      b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
      b.kv_lens.push_back(kv);
    }
    for (int32_t i = 0; i < c.padding_tokens; ++i) {
      b.token_ids.push_back(0);
      b.positions.push_back(0);
      b.slot_mapping.push_back(uniform_int(0, c.page_size - 1));  // page 0
    }
    return b;
  }

  static AttentionShape shape_of(const Config& c) {
    return AttentionShape{c.num_q_heads, c.num_kv_heads, c.head_dim, c.page_size,
                          1.0f / std::sqrt(static_cast<float>(c.head_dim))};
  }

  /// fused_hidden > 0: run matmul_qk_norm_rope_store_kv on x [T, fused_hidden] and random
  /// qkv weights instead of qk_norm_rope_store_kv on a random qkv.
  void check(const Config& c, int64_t fused_hidden = 0) {
    int32_t num_pages = 0;
    const ForwardBatch batch = make_batch(c, &num_pages);
    const int64_t T = batch.num_tokens(), Hq = c.num_q_heads, Hkv = c.num_kv_heads;
    const int64_t D = c.head_dim, P = c.page_size;
    const std::string what = "qk_norm_rope_store_kv: " + std::to_string(c.num_seqs) +
                             " seqs, " + std::to_string(T) + " tokens (" +
                             std::to_string(c.padding_tokens) + " padding), page size " +
                             std::to_string(P) + ", heads " + std::to_string(Hq) + "/" +
                             std::to_string(Hkv) + ", head_dim " + std::to_string(D) +
                             ", " + std::to_string(num_pages) + " pages";
    SCOPED_TRACE(what);

    const AttentionShape shape = shape_of(c);
    RopeParams rope{1000000.0, D};
    const float eps = 1e-6f;

    const int64_t N = (Hq + 2 * Hkv) * D;
    const std::vector<float> qkv = randn_bf16(static_cast<size_t>(T * N), 2.0f);
    const std::vector<float> qn = randn_bf16(static_cast<size_t>(D), 0.3f, 1.0f);
    const std::vector<float> kn = randn_bf16(static_cast<size_t>(D), 0.3f, 1.0f);

    Tensor g_qkv = put(gpu(), DType::BF16, {T, (Hq + 2 * Hkv) * D}, qkv);
    Tensor c_qkv = put(cpu(), DType::F32, {T, (Hq + 2 * Hkv) * D}, qkv);
    Tensor g_qn = put(gpu(), DType::BF16, {D}, qn), c_qn = put(cpu(), DType::F32, {D}, qn);
    Tensor g_kn = put(gpu(), DType::BF16, {D}, kn), c_kn = put(cpu(), DType::F32, {D}, kn);
    Tensor g_q = alloc(gpu(), DType::BF16, {T, Hq, D}), c_q = alloc(cpu(), DType::F32, {T, Hq, D});
    LayerKv g_kv{alloc(gpu(), DType::BF16, {num_pages, Hkv, P, D}),
                 alloc(gpu(), DType::BF16, {num_pages, Hkv, P, D})};
    LayerKv c_kv{alloc(cpu(), DType::F32, {num_pages, Hkv, P, D}),
                 alloc(cpu(), DType::F32, {num_pages, Hkv, P, D})};
    for (Tensor* t : {&g_q, &g_kv.k, &g_kv.v}) poison(gpu(), *t);
    for (Tensor* t : {&c_q, &c_kv.k, &c_kv.v}) poison(cpu(), *t);

    const BatchTensors g_batch = gpu().upload_batch(batch);
    const BatchTensors c_batch = cpu().upload_batch(batch);
    if (fused_hidden == 0) {
      gpu().qk_norm_rope_store_kv(g_qkv, g_qn, g_kn, eps, rope, shape, g_batch, g_q, g_kv);
      cpu().qk_norm_rope_store_kv(c_qkv, c_qn, c_kn, eps, rope, shape, c_batch, c_q, c_kv);
    } else {
      // x · wᵀ with entries of ~N(0, 1/hidden) weights: qkv entries of about unit size.
      const int64_t H = fused_hidden;
      const std::vector<float> x = randn_bf16(static_cast<size_t>(T * H), 1.0f);
      const std::vector<float> w =
          randn_bf16(static_cast<size_t>(N * H), 1.0f / std::sqrt(static_cast<float>(H)));
      Tensor g_x = put(gpu(), DType::BF16, {T, H}, x), c_x = put(cpu(), DType::F32, {T, H}, x);
      Tensor g_w = put(gpu(), DType::BF16, {N, H}, w), c_w = put(cpu(), DType::F32, {N, H}, w);
      poison(gpu(), g_qkv);
      gpu().matmul_qk_norm_rope_store_kv(g_x, g_w, g_qkv, g_qn, g_kn, eps, rope, shape, g_batch,
                                         g_q, g_kv);
      cpu().matmul_qk_norm_rope_store_kv(c_x, c_w, c_qkv, c_qn, c_kn, eps, rope, shape, c_batch,
                                         c_q, c_kv);
    }

    ASSERT_TRUE(relative_close(gpu().download_f32(g_q), cpu().download_f32(c_q), 1e-2,
                               what + ": q", seed_note()));

    // Pools: compare the slots real tokens wrote; everything else outside page 0 stays NaN.
    const std::vector<float> gk = gpu().download_f32(g_kv.k), ck = cpu().download_f32(c_kv.k);
    const std::vector<float> gv = gpu().download_f32(g_kv.v), cv = cpu().download_f32(c_kv.v);
    std::vector<uint8_t> written(static_cast<size_t>(num_pages * P), 0);
    std::vector<float> got_k, ref_k, got_v, ref_v;
    const int64_t real_tokens = batch.query_start.back();
    for (int64_t t = 0; t < real_tokens; ++t) {
      const int64_t slot = batch.slot_mapping[static_cast<size_t>(t)];
      written[static_cast<size_t>(slot)] = 1;
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t base = (((slot / P) * Hkv + h) * P + slot % P) * D;
        got_k.insert(got_k.end(), gk.begin() + base, gk.begin() + base + D);
        ref_k.insert(ref_k.end(), ck.begin() + base, ck.begin() + base + D);
        got_v.insert(got_v.end(), gv.begin() + base, gv.begin() + base + D);
        ref_v.insert(ref_v.end(), cv.begin() + base, cv.begin() + base + D);
      }
    }
    ASSERT_TRUE(relative_close(got_k, ref_k, 1e-2, what + ": K pool", seed_note()));
    // Unfused, V is a copy of the bf16 qkv; fused, it is the product rounded once to bf16
    // against the CPU's float32 product.
    ASSERT_TRUE(relative_close(got_v, ref_v, fused_hidden == 0 ? 0.0 : 1e-2, what + ": V pool",
                               seed_note()));
    size_t stray = 0;
    int64_t first_stray = -1;
    for (int64_t slot = P; slot < num_pages * P; ++slot) {
      if (written[static_cast<size_t>(slot)]) continue;
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t base = (((slot / P) * Hkv + h) * P + slot % P) * D;
        for (int64_t d = 0; d < D; ++d) {
          if (!std::isnan(gk[static_cast<size_t>(base + d)]) ||
              !std::isnan(gv[static_cast<size_t>(base + d)])) {
            if (stray++ == 0) first_stray = slot;
          }
        }
      }
    }
    ASSERT_EQ(stray, 0u) << what << ": " << stray << " values written outside the batch's slots"
                         << " (first in slot " << first_stray << "); " << seed_note();
  }
};

TEST_F(QkNormRopeTest, DecodeBatchesMatchCpu) {
  for (int32_t page_size : {16, 32, 64}) {
    for (int64_t group : {1, 2, 4, 8}) {
      const int64_t kv_heads = group == 8 ? 4 : 8;
      for (int32_t seqs : {1, 7, 64}) {
        check({seqs, 1, 4096, page_size, kv_heads * group, kv_heads, 128, seqs == 64 ? 5 : 0});
      }
    }
  }
}

TEST_F(QkNormRopeTest, PrefillAndMixedBatchesMatchCpu) {
  for (int32_t page_size : {16, 32, 64}) {
    for (int64_t group : {1, 2, 4, 8}) {
      const int64_t kv_heads = group == 8 ? 2 : 4;
      check({1, 4096, 4096, page_size, kv_heads * group, kv_heads, 128, 0});
      check({8, 512, 2048, page_size, kv_heads * group, kv_heads, 128, 3});
      check({33, 64, 4096, page_size, kv_heads * group, kv_heads, 64, 1});
    }
  }
}

TEST_F(QkNormRopeTest, LargePrefillsMatchCpu) {
  // Tens of thousands of tokens of Qwen3-4B's heads (32 q, 8 kv), a grid of many waves;
  // head_dim 64 and 256 run the other two instantiations (32 and 8 heads a warp) the same
  // way, with head counts that leave the last warp of a token part of a run.
  check({16, 4096, 4096, 16, 32, 8, 128, 2});
  check({12, 4096, 4096, 32, 16, 4, 64, 0});
  check({6, 4096, 4096, 16, 8, 2, 256, 1});
}

TEST_F(QkNormRopeTest, FusedWithTheQkvProductMatchesCpu) {
  // Decode batches (the fused kernel's domain: up to 32 tokens per tile, head_dim 128),
  // padding tokens in page 0, and the shapes it must hand back to the two ops: head_dim 64
  // and a prefill batch (more tokens than the skinny kernel takes under auto).
  for (int32_t page_size : {16, 64}) {
    for (int64_t group : {1, 4, 8}) {
      const int64_t kv_heads = group == 8 ? 4 : 8;
      for (int32_t seqs : {1, 5, 27, 32}) {
        check({seqs, 1, 2048, page_size, kv_heads * group, kv_heads, 128, seqs == 27 ? 5 : 0},
              seqs == 5 ? 1024 : 2560);
      }
    }
  }
  check({3, 1, 300, 16, 8, 2, 64, 1}, 512);
  check({4, 200, 600, 16, 16, 4, 128, 2}, 512);
}

TEST_F(QkNormRopeTest, FusedEpilogueAndTheOpWriteTheSameBits) {
  // A token's q and K/V must not depend on whether a decode step (the skinny product's
  // fused epilogue) or a prefill chunk (product, then qk_norm_rope_store_kv) wrote them:
  // the two share their layout and arithmetic (qk_norm_rope.cuh), and the plain skinny
  // product rounds the same sums the fused one normalises.
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  if (major != 9) GTEST_SKIP() << "the fused epilogue runs on sm_90 only";
  for (int32_t seqs : {1, 9, 32}) {
    const Config c{seqs, 1, 2048, 16, 32, 8, 128, 0};
    int32_t num_pages = 0;
    const ForwardBatch batch = make_batch(c, &num_pages);
    const int64_t T = batch.num_tokens(), Hq = c.num_q_heads, Hkv = c.num_kv_heads;
    const int64_t D = c.head_dim, P = c.page_size, H = 2560, N = (Hq + 2 * Hkv) * D;
    SCOPED_TRACE(std::to_string(T) + " decode tokens; " + seed_note());
    const AttentionShape shape = shape_of(c);
    const RopeParams rope{1000000.0, D};
    Tensor x = put(gpu(), DType::BF16, {T, H}, randn_bf16(static_cast<size_t>(T * H), 1.0f));
    Tensor w = put(gpu(), DType::BF16, {N, H},
                   randn_bf16(static_cast<size_t>(N * H), 1.0f / std::sqrt(static_cast<float>(H))));
    Tensor qn = put(gpu(), DType::BF16, {D}, randn_bf16(static_cast<size_t>(D), 0.3f, 1.0f));
    Tensor kn = put(gpu(), DType::BF16, {D}, randn_bf16(static_cast<size_t>(D), 0.3f, 1.0f));
    const BatchTensors b = gpu().upload_batch(batch);
    Tensor qkv_fused = alloc(gpu(), DType::BF16, {T, N}), qkv = alloc(gpu(), DType::BF16, {T, N});
    Tensor q_fused = alloc(gpu(), DType::BF16, {T, Hq, D});
    Tensor q = alloc(gpu(), DType::BF16, {T, Hq, D});
    LayerKv kv_fused{alloc(gpu(), DType::BF16, {num_pages, Hkv, P, D}),
                     alloc(gpu(), DType::BF16, {num_pages, Hkv, P, D})};
    LayerKv kv{alloc(gpu(), DType::BF16, {num_pages, Hkv, P, D}),
               alloc(gpu(), DType::BF16, {num_pages, Hkv, P, D})};
    for (Tensor* t : {&qkv_fused, &qkv, &q_fused, &q, &kv_fused.k, &kv_fused.v, &kv.k, &kv.v}) {
      poison(gpu(), *t);
    }
    gpu().matmul_qk_norm_rope_store_kv(x, w, qkv_fused, qn, kn, 1e-6f, rope, shape, b, q_fused,
                                       kv_fused);
    gpu().matmul(x, w, qkv);
    gpu().qk_norm_rope_store_kv(qkv, qn, kn, 1e-6f, rope, shape, b, q, kv);
    const auto same_bits = [&](const Tensor& a, const Tensor& bt, const char* what) {
      const std::vector<float> va = gpu().download_f32(a), vb = gpu().download_f32(bt);
      size_t diff = 0, first = 0;
      for (size_t i = 0; i < va.size(); ++i) {
        uint32_t ba, bb;
        std::memcpy(&ba, &va[i], 4);
        std::memcpy(&bb, &vb[i], 4);
        if (ba != bb && diff++ == 0) first = i;
      }
      EXPECT_EQ(diff, 0u) << what << ": " << diff << " of " << va.size()
                          << " values differ, the first at " << first << " (" << va[first]
                          << " fused, " << vb[first] << " unfused)";
    };
    same_bits(q_fused, q, "q");
    same_bits(kv_fused.k, kv.k, "K pool");  // untouched slots hold the same poison
    same_bits(kv_fused.v, kv.v, "V pool");
  }
}

TEST_F(QkNormRopeTest, FusedDecodeProductRunsAsOneKernel) {
  // On a GPU where the skinny kernel runs (sm_90), a decode batch's qkv product and the
  // norm/RoPE/store are one kernel: no qk_norm_rope_store_kv_kernel is launched.
  const std::string why = gpu().begin_kernel_trace();
  if (why.find("cannot load CUPTI") != std::string::npos) GTEST_SKIP() << why;
  ASSERT_EQ(why, "");
  check({8, 1, 512, 16, 32, 8, 128, 0}, 2560);
  std::vector<std::string> names;
  for (const KernelSpan& span : gpu().end_kernel_trace()) {
    if (span.kind == KernelSpan::Kind::kKernel) names.push_back(span.name);
  }
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  const auto count = [&](const char* what) {
    return std::count_if(names.begin(), names.end(), [&](const std::string& n) {
      return n.find(what) != std::string::npos;
    });
  };
  if (major != 9) GTEST_SKIP() << "the skinny kernel runs on sm_90 only";
  EXPECT_EQ(count("qk_norm_rope_store_kv_kernel"), 0) << "the op ran unfused";
  EXPECT_GE(count("skinny_gemm_kernel"), 1) << "no skinny product ran";
}

TEST_F(QkNormRopeTest, RejectsUnsupportedHeadDimClearly) {
  Config c{1, 1, 4, 16, 2, 1, 96, 0};
  try {
    check(c);
    FAIL() << "head_dim 96 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pagellm
