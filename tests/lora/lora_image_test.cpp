// write_lora_image: a slot image built straight from the mapped adapter file equals, bit for
// bit, the layout built the plain way (float32 image, zero-filled, A copied, B transposed
// element by element, narrowed once), for every source and image dtype, partial targets,
// ranks that are not a multiple of the transpose blocks, and any thread count; and its errors.
// lora_image_runs: the greedy split of the blocks into runs that fit a staging half, and
// the image written run by run (rebased) equals the image written whole.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/expect_error.h"
#include "common/reference_qwen3.h"
#include "model/model_test_util.h"
#include "pagellm/model/lora.h"
#include "pagellm/model/lora_image.h"

namespace pagellm {
namespace {

using testing::expect_error;
using testing::TempDir;

// Outputs wider than one 64-row transpose tile, with a remainder (gate/up: 150 rows).
Qwen3Config image_config() {
  Qwen3Config c = testing::small_config();
  c.hidden_size = 40;
  c.intermediate_size = 150;
  c.num_hidden_layers = 3;
  return c;
}

const std::vector<std::vector<LoraModule>> kGroups = {
    {LoraModule::kQ, LoraModule::kK, LoraModule::kV},
    {LoraModule::kO},
    {LoraModule::kGate, LoraModule::kUp},
    {LoraModule::kDown}};

int64_t align128(int64_t n) { return (n + 127) / 128 * 128; }

// The blocks Qwen3Model::set_lora lays out: per layer and group with a targeted module,
// A [M·r, in] then Bᵀ [r, Σ width], each padded to 128 elements.
std::vector<LoraImageBlock> layout(const Qwen3Config& mc, const LoraAdapter& a, int64_t* total) {
  const int64_t r = a.config.rank;
  std::vector<LoraImageBlock> blocks;
  *total = 0;
  for (size_t l = 0; l < a.layers.size(); ++l) {
    for (const std::vector<LoraModule>& group : kGroups) {
      bool targeted = false;
      for (LoraModule m : group) targeted = targeted || !a.layers[l][static_cast<int>(m)].empty();
      if (!targeted) continue;
      LoraImageBlock b;
      b.layer = l;
      b.num_modules = static_cast<int>(group.size());
      b.in = lora_module_shape(mc, group[0])[1];
      for (size_t mi = 0; mi < group.size(); ++mi) {
        b.modules[mi] = group[mi];
        b.width[mi] = lora_module_shape(mc, group[mi])[0];
      }
      b.a_offset = *total;
      *total += align128(b.num_modules * r * b.in);
      b.bt_offset = *total;
      *total += align128(r * b.width_total());
      b.end = *total;
      blocks.push_back(b);
    }
  }
  return blocks;
}

// The plain way: a zero-filled float32 image, A copied, B transposed, then narrowed.
std::vector<unsigned char> reference_image(const LoraAdapter& a,
                                           const std::vector<LoraImageBlock>& blocks,
                                           int64_t total, DType dtype) {
  const int64_t r = a.config.rank;
  std::vector<float> image(static_cast<size_t>(total), 0.0f);
  for (const LoraImageBlock& b : blocks) {
    const int64_t W = b.width_total();
    int64_t col = 0;
    for (int mi = 0; mi < b.num_modules; ++mi) {
      const LoraFactors& f = a.layers[b.layer][static_cast<int>(b.modules[mi])];
      if (!f.empty()) {
        const std::vector<float> fa = f.a.to_f32(), fb = f.b.to_f32();
        std::copy(fa.begin(), fa.end(), image.begin() + b.a_offset + mi * r * b.in);
        for (int64_t j = 0; j < b.width[mi]; ++j) {
          for (int64_t i = 0; i < r; ++i) image[b.bt_offset + i * W + col + j] = fb[j * r + i];
        }
      }
      col += b.width[mi];
    }
  }
  std::vector<unsigned char> out(static_cast<size_t>(total) * dtype_size(dtype));
  convert_from_f32(image.data(), out.data(), dtype, image.size());
  return out;
}

// Writes the image into a buffer poisoned with 0xA5 bytes, so that an element the writer
// skips (padding, an untargeted module) shows.
std::vector<unsigned char> written_image(const LoraAdapter& a,
                                         const std::vector<LoraImageBlock>& blocks,
                                         int64_t total, DType dtype, int threads) {
  std::vector<unsigned char> out(static_cast<size_t>(total) * dtype_size(dtype), 0xA5);
  write_lora_image(a, blocks, dtype, out.data(), total, threads);
  return out;
}

LoraConfig config_of(int64_t rank, std::vector<LoraModule> targets, bool rslora = false) {
  LoraConfig c;
  c.rank = rank;
  c.alpha = 7.0;
  c.use_rslora = rslora;
  c.target_modules = std::move(targets);
  return c;
}

// Element e of an image of `dtype` as float32.
float element(const std::vector<unsigned char>& image, DType dtype, int64_t e) {
  float v;
  convert_to_f32(image.data() + e * static_cast<int64_t>(dtype_size(dtype)), dtype, &v, 1);
  return v;
}

TEST(LoraImage, EqualsThePlainLayoutForEverySourceAndImageDtype) {
  const Qwen3Config mc = image_config();
  // q, v and up only: k of qkv and gate of gate_up are zeros, o and down take no room.
  // Rank 13: one 8-row block of the SSE transpose and 5 rows element by element.
  const LoraConfig cfg = config_of(13, {LoraModule::kQ, LoraModule::kV, LoraModule::kUp});
  for (DType source : {DType::F32, DType::BF16, DType::F16}) {
    TempDir dir;
    make_lora_adapter(dir.path(), mc, cfg, /*seed=*/21, source, /*stddev_b=*/0.3f);
    const LoraAdapter a = read_lora_adapter(dir.path(), mc);
    EXPECT_EQ(a.layers[0][static_cast<int>(LoraModule::kQ)].a.dtype, source);
    int64_t total = 0;
    const std::vector<LoraImageBlock> blocks = layout(mc, a, &total);
    ASSERT_EQ(blocks.size(), 2u * static_cast<size_t>(mc.num_hidden_layers));
    for (DType image : {DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(std::string(dtype_name(source)) + " file, " + dtype_name(image) + " image");
      const std::vector<unsigned char> want = reference_image(a, blocks, total, image);
      for (int threads : {1, 3, 0}) {
        const std::vector<unsigned char> got = written_image(a, blocks, total, image, threads);
        ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0) << threads << " threads";
      }
      // Spot checks that do not lean on the reference: k's A rows and gate's Bᵀ columns
      // are zero, q's A and up's Bᵀ hold the file's values.
      const std::vector<unsigned char> got = written_image(a, blocks, total, image, 2);
      const int64_t r = cfg.rank;
      const LoraImageBlock& qkv = blocks[2];  // layer 1
      const LoraImageBlock& gate_up = blocks[3];
      ASSERT_EQ(qkv.layer, 1u);
      ASSERT_EQ(gate_up.modules[1], LoraModule::kUp);
      const LoraFactors& q = a.layers[1][static_cast<int>(LoraModule::kQ)];
      const LoraFactors& up = a.layers[1][static_cast<int>(LoraModule::kUp)];
      for (int64_t e = 0; e < r * qkv.in; ++e) {
        EXPECT_EQ(element(got, image, qkv.a_offset + r * qkv.in + e), 0.0f) << "k A " << e;
      }
      // Exact where nothing narrows, else within the image dtype's rounding.
      const bool exact = image == source || image == DType::F32;
      const auto tol = [&](float v) { return exact ? 0.0f : 1e-2f * std::abs(v) + 1e-4f; };
      EXPECT_NEAR(element(got, image, qkv.a_offset + 3), q.a.at(3), tol(q.a.at(3)));
      const int64_t W = gate_up.width_total(), I = mc.intermediate_size;
      for (int64_t i = 0; i < r; ++i) {
        for (int64_t j = 0; j < I; ++j) {
          ASSERT_EQ(element(got, image, gate_up.bt_offset + i * W + j), 0.0f) << i << " " << j;
          const float b = up.b.at(j * r + i);
          ASSERT_NEAR(element(got, image, gate_up.bt_offset + i * W + I + j), b, tol(b))
              << i << " " << j;
        }
      }
      for (int64_t e = gate_up.bt_offset + r * W; e < gate_up.end; ++e) {
        ASSERT_EQ(element(got, image, e), 0.0f) << "padding " << e;
      }
    }
  }
}

TEST(LoraImage, AllModulesAtTheLargestRankAndRsLora) {
  const Qwen3Config mc = image_config();
  std::vector<LoraModule> all;
  for (int m = 0; m < kNumLoraModules; ++m) all.push_back(static_cast<LoraModule>(m));
  TempDir dir;
  make_lora_adapter(dir.path(), mc, config_of(kMaxLoraRank, all, /*rslora=*/true), 4,
                    DType::BF16);
  const LoraAdapter a = read_lora_adapter(dir.path(), mc);
  EXPECT_FLOAT_EQ(a.config.scale(), 7.0f / 8.0f);  // alpha / sqrt(64)
  int64_t total = 0;
  const std::vector<LoraImageBlock> blocks = layout(mc, a, &total);
  EXPECT_EQ(blocks.size(), 4u * static_cast<size_t>(mc.num_hidden_layers));
  for (DType image : {DType::BF16, DType::F32}) {
    const std::vector<unsigned char> want = reference_image(a, blocks, total, image);
    const std::vector<unsigned char> got = written_image(a, blocks, total, image, 4);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0) << dtype_name(image);
  }
}

TEST(LoraImage, RefusesBlocksThatDoNotFit) {
  const Qwen3Config mc = image_config();
  TempDir dir;
  make_lora_adapter(dir.path(), mc, config_of(4, {LoraModule::kO, LoraModule::kDown}), 9);
  const LoraAdapter a = read_lora_adapter(dir.path(), mc);
  int64_t total = 0;
  const std::vector<LoraImageBlock> blocks = layout(mc, a, &total);
  std::vector<unsigned char> image(static_cast<size_t>(total) * 4);
  expect_error([&] { write_lora_image(a, blocks, DType::F32, image.data(), total + 128); },
               "the blocks end at element");
  expect_error([&] { write_lora_image(a, blocks, DType::I32, image.data(), total); },
               "image dtype int32 is not one of float32, bfloat16, float16");
  std::vector<LoraImageBlock> bad = blocks;
  bad[1].bt_offset = bad[1].a_offset + 1;  // A no longer fits before Bᵀ
  expect_error([&] { write_lora_image(a, bad, DType::F32, image.data(), total); },
               "block 1 (layer 0): offsets");
  bad = blocks;
  bad[0].width[0] += 1;  // o's B has another row count than the block says
  expect_error([&] { write_lora_image(a, bad, DType::F32, image.data(), total); },
               "o_proj: factors [4, 64] and [40, 4] do not match [4, 64] and [41, 4]");
  bad = blocks;
  bad[0].layer = 7;
  expect_error([&] { write_lora_image(a, bad, DType::F32, image.data(), total); },
               "the adapter has 3 layers");
}

// Blocks of the given sizes (elements), back to back from element `start`; block k is
// "layer" k so that an error names it.
std::vector<LoraImageBlock> blocks_of(const std::vector<int64_t>& sizes, int64_t start = 0) {
  std::vector<LoraImageBlock> blocks;
  for (size_t k = 0; k < sizes.size(); ++k) {
    LoraImageBlock b;
    b.layer = k;
    b.a_offset = b.bt_offset = start;
    start += sizes[k];
    b.end = start;
    blocks.push_back(b);
  }
  return blocks;
}

// The properties every split must have, checked without a reference split: each block in
// exactly one run, in order; each run's bounds those of its blocks and within the limit;
// greedy (a run and the next run's first block would not fit together).
void expect_valid_runs(const std::vector<LoraImageBlock>& blocks,
                       const std::vector<LoraImageRun>& runs, int64_t limit) {
  size_t next_block = 0;
  for (size_t k = 0; k < runs.size(); ++k) {
    const LoraImageRun& run = runs[k];
    SCOPED_TRACE("run " + std::to_string(k));
    ASSERT_EQ(run.first_block, next_block);
    ASSERT_LT(run.first_block, run.end_block);
    ASSERT_LE(run.end_block, blocks.size());
    EXPECT_EQ(run.begin, blocks[run.first_block].a_offset);
    EXPECT_EQ(run.end, blocks[run.end_block - 1].end);
    EXPECT_LE(run.elements(), limit);
    if (run.end_block < blocks.size()) {
      const LoraImageBlock& following = blocks[run.end_block];
      EXPECT_GT(following.end - run.begin, limit) << "the next block would have fit";
    }
    next_block = run.end_block;
  }
  EXPECT_EQ(next_block, blocks.size());
}

TEST(LoraImageRuns, GreedyRunsWithinTheLimit) {
  const std::vector<LoraImageBlock> blocks = blocks_of({5, 3, 4, 8, 1, 1, 6, 2}, 256);
  const std::vector<LoraImageRun> runs = lora_image_runs(blocks, 8);
  expect_valid_runs(blocks, runs, 8);
  // 5+3 | 4 (4+8 > 8) | 8 | 1+1+6 | 2
  const std::vector<std::pair<size_t, size_t>> want = {{0, 2}, {2, 3}, {3, 4}, {4, 7}, {7, 8}};
  ASSERT_EQ(runs.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(runs[k].first_block, want[k].first) << "run " << k;
    EXPECT_EQ(runs[k].end_block, want[k].second) << "run " << k;
  }
  EXPECT_EQ(runs[0].begin, 256);
  EXPECT_EQ(runs[0].end, 264);
  EXPECT_EQ(runs[3].begin, 256 + 20);
  EXPECT_EQ(runs[3].elements(), 8);
  // A limit as large as the image: one run; the largest block as the limit: every run fits.
  EXPECT_EQ(lora_image_runs(blocks, 30).size(), 1u);
  EXPECT_EQ(lora_image_runs(blocks, 29).size(), 2u);
  EXPECT_EQ(lora_image_largest_block(blocks), 8);
}

TEST(LoraImageRuns, RandomBlocksAndLimits) {
  std::mt19937 rng(19);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> sizes(std::uniform_int_distribution<size_t>(1, 40)(rng));
    for (int64_t& s : sizes) s = std::uniform_int_distribution<int64_t>(1, 100)(rng);
    const std::vector<LoraImageBlock> blocks = blocks_of(sizes);
    const int64_t largest = lora_image_largest_block(blocks);
    const int64_t limit = std::uniform_int_distribution<int64_t>(largest, 4 * largest)(rng);
    SCOPED_TRACE("trial " + std::to_string(trial) + ", limit " + std::to_string(limit));
    expect_valid_runs(blocks, lora_image_runs(blocks, limit), limit);
  }
}

TEST(LoraImageRuns, EmptyInputAndRefusals) {
  EXPECT_TRUE(lora_image_runs({}, 8).empty());
  EXPECT_EQ(lora_image_largest_block({}), 0);
  // A block larger than the limit is refused (the caller sizes its halves by the largest
  // block); at that size it is a run of its own.
  const std::vector<LoraImageBlock> blocks = blocks_of({3, 9, 2});
  expect_error([&] { lora_image_runs(blocks, 8); },
               "block 1 (layer 1) has 9 elements, more than a run's 8");
  const std::vector<LoraImageRun> runs = lora_image_runs(blocks, lora_image_largest_block(blocks));
  expect_valid_runs(blocks, runs, 9);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[1].first_block, 1u);
  EXPECT_EQ(runs[1].end_block, 2u);
  expect_error([&] { lora_image_runs(blocks, 0); }, "a run must hold at least 1 element, got 0");
  std::vector<LoraImageBlock> gap = blocks;
  gap[2].a_offset += 1;  // a hole between blocks 1 and 2
  expect_error([&] { lora_image_runs(gap, 16); },
               "block 2 (layer 2) spans elements [13, 14); blocks must follow one another from "
               "element 12");
  expect_error([&] { lora_image_run_blocks(blocks, LoraImageRun{2, 4, 0, 0}); },
               "blocks [2, 4) of 3");
}

TEST(LoraImageRuns, TheImageWrittenRunByRunEqualsTheWholeImage) {
  const Qwen3Config mc = image_config();
  std::vector<LoraModule> all;
  for (int m = 0; m < kNumLoraModules; ++m) all.push_back(static_cast<LoraModule>(m));
  TempDir dir;
  make_lora_adapter(dir.path(), mc, config_of(12, all), 5, DType::BF16);
  const LoraAdapter a = read_lora_adapter(dir.path(), mc);
  int64_t total = 0;
  const std::vector<LoraImageBlock> blocks = layout(mc, a, &total);
  const int64_t largest = lora_image_largest_block(blocks);
  for (DType dtype : {DType::BF16, DType::F32}) {
    const std::vector<unsigned char> whole = written_image(a, blocks, total, dtype, 2);
    const size_t esize = dtype_size(dtype);
    for (int64_t limit : {largest, largest + 700, 3 * largest, total}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + ", limit " + std::to_string(limit));
      const std::vector<LoraImageRun> runs = lora_image_runs(blocks, limit);
      expect_valid_runs(blocks, runs, limit);
      if (limit < total) {
        EXPECT_GE(runs.size(), 2u);
      }
      std::vector<unsigned char> pieced;
      for (const LoraImageRun& run : runs) {
        // Each run into its own poisoned buffer, as into a staging half.
        std::vector<unsigned char> half(static_cast<size_t>(limit) * esize, 0xA5);
        write_lora_image(a, lora_image_run_blocks(blocks, run), dtype, half.data(),
                         run.elements(), 2);
        pieced.insert(pieced.end(), half.begin(),
                      half.begin() + static_cast<std::ptrdiff_t>(run.elements() * esize));
      }
      ASSERT_EQ(pieced.size(), whole.size());
      EXPECT_EQ(std::memcmp(pieced.data(), whole.data(), whole.size()), 0);
    }
  }
}

}  // namespace
}  // namespace pagellm
