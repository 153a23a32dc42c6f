// Attention calibration's host side (attention/calibration.h): the grid it times, its
// options, the provenance it records and the table writer; and the engine-level entry
// point, which in a build without CUDA fails with a message saying so.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "common/expect_error.h"
#include "fixtures.h"
#include "pagellm/attention/attention_call.h"
#include "pagellm/attention/calibration.h"
#include "pagellm/backend/backend.h"
#include "pagellm/engine/attention_calibration.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;

using testing::error_of;

size_t count_if(const std::vector<AttentionCallShape>& grid,
                const std::function<bool(const AttentionCallShape&)>& pred) {
  return static_cast<size_t>(std::count_if(grid.begin(), grid.end(), pred));
}

TEST(CalibrationGridTest, QuickGridHasEveryCombination) {
  CalibrationOptions o;
  o.quick = true;
  std::mt19937 rng(o.seed);
  const std::vector<AttentionCallShape> grid = calibration_grid(o, rng);
  // Prefill: (batch, query) with batch x query <= 32768 of {1, 16, 64} x {32, 512, 4096}
  // gives 7 pairs, 3 of them batch 1 (not ragged): 3 x 2 prefixes + 4 x 2 prefixes x 2.
  // Chunks: 7 query lengths x 3 prefixes at batch 1, and at batch 4 (at most 4096 tokens:
  // 6 lengths) after 8192 and 32768.
  // Mixed: 4 chunk sets x 3 prefixes with 63 rows, and with 255 rows after 8192.
  // Decode: {8, 64, 256} x {512, 8192} x uniform/ragged.
  const auto kind = [](const char* prefix) {
    return [prefix](const AttentionCallShape& s) { return s.label.rfind(prefix, 0) == 0; };
  };
  EXPECT_EQ(count_if(grid, kind("prefill ")), 22u);
  EXPECT_EQ(count_if(grid, kind("chunk ")), 33u);
  EXPECT_EQ(count_if(grid, kind("mixed ")), 16u);
  EXPECT_EQ(count_if(grid, kind("decode ")), 12u);
  EXPECT_EQ(count_if(grid, [](const auto& s) { return s.decode(); }), 12u);
  EXPECT_EQ(grid.size(), 83u);
  std::set<std::string> labels;
  for (const AttentionCallShape& s : grid) {
    labels.insert(s.label);
    EXPECT_EQ(s.num_q_heads, 32);
    EXPECT_EQ(s.num_kv_heads, 8);
    EXPECT_EQ(s.head_dim, 128);
    EXPECT_EQ(s.page_size, 16);
    ASSERT_EQ(s.q.size(), s.kv.size()) << s.label;
    EXPECT_LE(s.num_tokens(), 32768) << s.label;
    const bool lengths_differ =
        std::adjacent_find(s.kv.begin(), s.kv.end(), std::not_equal_to<>()) != s.kv.end();
    if (!s.ragged) {
      EXPECT_FALSE(lengths_differ) << s.label;
    }
    const bool mixed = s.label.rfind("mixed ", 0) == 0;
    EXPECT_EQ(s.ragged, mixed || s.label.find("ragged") != std::string::npos) << s.label;
    // Ragged in the class's sense (query lengths differ) exactly for ragged prefill points.
    EXPECT_EQ(s.ragged_query(), s.ragged && !s.decode()) << s.label;
    for (size_t i = 0; i < s.q.size(); ++i) {
      EXPECT_GE(s.kv[i], s.q[i]) << s.label;  // a query never exceeds its KV
      EXPECT_GE(s.q[i], 1) << s.label;
    }
  }
  EXPECT_EQ(labels.size(), grid.size());  // each point named once
}

TEST(CalibrationGridTest, FullGridAndPageSizesMultiply) {
  CalibrationOptions o;
  std::mt19937 rng(o.seed);
  // Per head configuration: prefill 10 (batch 1) + 20 (4) + 16 (16) + 12 (64) = 58; chunks
  // 7 query lengths x 5 prefixes at batch 1 (35), batch 4 up to 4096 tokens (6 x 5 = 30),
  // batch 16 up to 4096 tokens (4 x 5, less the 4 after 32768 that pass 2^19 KV tokens =
  // 16): 81; mixed 7 chunk sets x 4 prefixes x 2 row counts = 56; decode 3 (batch 1)
  // + 4 x 3 x 2 = 27; three head configurations.
  const std::vector<AttentionCallShape> full = calibration_grid(o, rng);
  EXPECT_EQ(full.size(), 3u * 222u);
  EXPECT_EQ(count_if(full, [](const auto& s) { return s.num_q_heads == 64; }), 222u);
  o.quick = true;
  o.page_sizes = {16, 32};
  const std::vector<AttentionCallShape> two = calibration_grid(o, rng);
  EXPECT_EQ(two.size(), 166u);
  EXPECT_EQ(count_if(two, [](const auto& s) { return s.page_size == 32; }), 83u);
}

TEST(CalibrationGridTest, PrefillShapesAreWhatTheLabelSays) {
  CalibrationOptions o;
  o.quick = true;
  std::mt19937 rng(o.seed);
  for (const AttentionCallShape& s : calibration_grid(o, rng)) {
    if (s.label != "prefill 32/8 16x512+4096 ragged") continue;
    ASSERT_EQ(s.q.size(), 16u);
    EXPECT_EQ(s.q[0], 512);
    EXPECT_EQ(s.kv[0], 512 + 4096);
    EXPECT_EQ(s.q[1], 32);  // the rest are a sixteenth of the long one
    EXPECT_EQ(s.kv[15], 32 + 4096);
    EXPECT_EQ(s.work(), 32 * (causal_pairs(512, 4608) + 15 * causal_pairs(32, 4128)));
    return;
  }
  FAIL() << "the grid has no 'prefill 32/8 16x512+4096 ragged'";
}

TEST(CalibrationGridTest, ChunkAndMixedShapesAreWhatTheLabelSays) {
  CalibrationOptions o;
  o.quick = true;
  std::mt19937 rng(o.seed);
  bool chunk_seen = false, mixed_seen = false;
  for (const AttentionCallShape& s : calibration_grid(o, rng)) {
    if (s.label == "chunk 32/8 4x512+32768") {
      chunk_seen = true;
      EXPECT_EQ(s.q, std::vector<int32_t>(4, 512));
      EXPECT_EQ(s.kv, std::vector<int32_t>(4, 32768 + 512));
      // Four 512-token chunks: 2,048 query tokens.
      EXPECT_EQ(shape_class_name(s.shape_class()), "q1025-4096 kv16385-65536 uniform");
    }
    if (s.label == "mixed 32/8 1x2048+8192 + 255x1") {
      // The engine's largest mixed step: a 2048-token chunk after a cached prefix and 255
      // one-token decode rows.
      mixed_seen = true;
      ASSERT_EQ(s.q.size(), 256u);
      EXPECT_EQ(s.q[0], 2048);
      EXPECT_EQ(s.kv[0], 2048 + 8192);
      for (size_t i = 1; i < s.q.size(); ++i) {
        EXPECT_EQ(s.q[i], 1);
        EXPECT_GE(s.kv[i], 1);
        EXPECT_LE(s.kv[i], 8192);
      }
      EXPECT_TRUE(s.ragged_query());
      EXPECT_EQ(shape_class_name(s.shape_class()), "q1025-4096 kv4097-16384 ragged");
    }
  }
  EXPECT_TRUE(chunk_seen);
  EXPECT_TRUE(mixed_seen);
}

// Where cuDNN may win (uniform chunks over more than 4096 keys), each class the quick grid
// touches has at least two points, so that an entry never rests on one measurement.
TEST(CalibrationGridTest, ChunkClassesPastFourThousandKeysHaveSeveralPoints) {
  CalibrationOptions o;
  o.quick = true;
  std::mt19937 rng(o.seed);
  std::map<int32_t, int> points;
  std::set<int32_t> chunk_classes;
  for (const AttentionCallShape& s : calibration_grid(o, rng)) {
    const ShapeClass c = s.shape_class();
    ++points[c.code()];
    if (s.label.rfind("chunk ", 0) == 0 && c.kv_bucket >= kv_bucket(4097)) {
      chunk_classes.insert(c.code());
    }
  }
  EXPECT_GE(chunk_classes.size(), 8u);  // 4 query buckets x 2 KV buckets
  for (int32_t c : chunk_classes) {
    EXPECT_GE(points[c], 2) << shape_class_name(ShapeClass::from_code(c));
  }
}

// The quick grid stays quick: its compute at 300 TFLOP/s (4 x head_dim FLOPs per causal
// pair), for both providers, three warm-up and 20 timed calls each (graph timings replay
// 36 layers 5 times), stays under 20 seconds; with about a second of overhead per shape
// (upload, a cuDNN plan build) the run stays well under 3 minutes.
TEST(CalibrationGridTest, QuickGridComputeStaysUnderTwentySeconds) {
  CalibrationOptions o;
  o.quick = true;
  std::mt19937 rng(o.seed);
  double seconds = 0;
  for (const AttentionCallShape& s : calibration_grid(o, rng)) {
    const double call_s = 4.0 * s.head_dim * static_cast<double>(s.work()) / 300e12;
    const int calls = (3 + o.iters) + (s.decode() ? 3 + 36 * std::max(2, o.iters / 4) : 0);
    seconds += 2 * calls * call_s;
  }
  EXPECT_LT(seconds, 20.0);
  EXPECT_GT(seconds, 1.0);  // the estimate measures something
  std::printf("quick calibration grid: about %.1f s of attention compute at 300 TFLOP/s\n",
              seconds);
}

TEST(CalibrationGridTest, SameSeedSameGrid) {
  CalibrationOptions o;
  o.quick = true;
  std::mt19937 a(5), b(5), c(6);
  const auto ga = calibration_grid(o, a), gb = calibration_grid(o, b), gc = calibration_grid(o, c);
  ASSERT_EQ(ga.size(), gb.size());
  bool differs_with_other_seed = false;
  for (size_t i = 0; i < ga.size(); ++i) {
    EXPECT_EQ(ga[i].kv, gb[i].kv) << ga[i].label;
    differs_with_other_seed |= ga[i].kv != gc[i].kv;
  }
  EXPECT_TRUE(differs_with_other_seed);  // the ragged decode lengths are drawn
}

TEST(CalibrationOptionsTest, BadOptionsNameTheOptionAndRange) {
  const auto bad = [](const std::function<void(CalibrationOptions&)>& edit) {
    CalibrationOptions o;
    edit(o);
    return error_of([&] { o.validate(); });
  };
  EXPECT_EQ(bad([](auto&) {}), "");
  EXPECT_EQ(bad([](auto& o) { o.iters = 0; }),
            "calibration iterations must be at least 1, got 0");
  EXPECT_EQ(bad([](auto& o) { o.layers = -2; }), "calibration layers must be at least 1, got -2");
  EXPECT_NE(bad([](auto& o) { o.margin = -0.1; }).find("margin must be a finite number >= 0"),
            std::string::npos);
  EXPECT_NE(bad([](auto& o) { o.margin = std::nan(""); }).find("margin must be"),
            std::string::npos);
  EXPECT_EQ(bad([](auto& o) { o.page_sizes.clear(); }),
            "calibration needs at least one page size");
  EXPECT_EQ(bad([](auto& o) { o.page_sizes = {16, 0}; }),
            "calibration page size must be in [1, 1024], got 0");
  EXPECT_EQ(bad([](auto& o) { o.page_sizes = {2048}; }),
            "calibration page size must be in [1, 1024], got 2048");
  EXPECT_EQ(bad([](auto& o) { o.device = -1; }), "CUDA device must be >= 0, got -1");
}

TEST(CalibrationOptionsTest, SourceRecordsEveryOptionThatShapesTheTable) {
  CalibrationOptions o;
  o.quick = true;
  o.page_sizes = {16, 32};
  o.seed = 9;
  EXPECT_EQ(o.source(),
            "pagellm calibrate-attention --quick --iters 20 --margin 0.05 --layers 36 "
            "--page-sizes 16,32 --seed 9");
}

CrossoverTable small_table() {
  CrossoverTable t;
  t.device = test::h200();
  t.measured_on = utc_date_today();
  t.source = CalibrationOptions{}.source();
  t.margin = 0.05;
  CrossoverMeasurement m;
  m.phase = AttentionPhase::kDecode;
  m.head_dim = 128;
  m.page_size = 16;
  m.num_q_heads = 32;
  m.num_kv_heads = 8;
  m.num_seqs = 8;
  m.num_tokens = 8;
  m.max_query_len = 1;
  m.max_kv_len = 512;
  m.work = 32 * 8 * 512;
  m.native_us = 10;
  m.cudnn_us = 5;
  m.label = "decode 32/8 8x512";
  t.measurements = {m};
  t.entries = derive_crossover_entries(t.measurements, t.margin);
  return t;
}

TEST(WriteCrossoverTableTest, FolderGetsTheDeviceFileNameAndTheTableLoadsBack) {
  const fs::path dir = fs::temp_directory_path() / ("pagellm-calib-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const CrossoverTable t = small_table();
  const std::string path = write_crossover_table(t, dir.string());
  EXPECT_EQ(path, (dir / crossover_file_name(t.device)).string());
  // What the planner's loader finds in the folder is the table written.
  const CrossoverTables loaded = CrossoverTables::load({dir.string()}, /*skip_missing=*/false);
  const CrossoverTable* back = loaded.find(t.device);
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(back->source, t.source);
  EXPECT_EQ(back->measured_on.size(), 10u);  // YYYY-MM-DD
  ASSERT_EQ(back->measurements.size(), 1u);
  EXPECT_EQ(back->measurements[0].label, "decode 32/8 8x512");
  EXPECT_EQ(back->entries.size(), t.entries.size());

  // A file path is written as given.
  const std::string file = (dir / "mine.json").string();
  EXPECT_EQ(write_crossover_table(t, file), file);
  std::ifstream f(file);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_EQ(text.str(), crossover_table_to_json(t));
  fs::remove_all(dir);
}

TEST(WriteCrossoverTableTest, AMissingFolderIsAnErrorNamingThePath) {
  const std::string e = error_of([] {
    write_crossover_table(small_table(), "/nonexistent-pagellm-folder/tables/t.json");
  });
  EXPECT_NE(e.find("cannot write the crossover table to "
                   "/nonexistent-pagellm-folder/tables/t.json"),
            std::string::npos)
      << e;
}

TEST(CalibrateAttentionTest, ABuildWithoutCudaSaysSo) {
  const std::vector<std::string> backends = available_backends();
  const bool cuda_built = std::find(backends.begin(), backends.end(), "cuda") != backends.end();
  std::string why;
  const bool available = attention_calibration_available(&why);
  // Invalid options are reported first, whatever the build.
  CalibrationOptions bad;
  bad.iters = 0;
  EXPECT_EQ(error_of([&] { calibrate_attention(bad); }),
            "calibration iterations must be at least 1, got 0");
  if (cuda_built) {
    EXPECT_EQ(available, why.empty());
    return;
  }
  EXPECT_FALSE(available);
  EXPECT_EQ(why, "this build has no CUDA backend (configure with -DPAGELLM_CUDA=ON and a CUDA "
                 "toolkit)");
  EXPECT_EQ(error_of([] { calibrate_attention(CalibrationOptions{}); }),
            "attention calibration needs a GPU build: " + why);
}

}  // namespace
}  // namespace pagellm
