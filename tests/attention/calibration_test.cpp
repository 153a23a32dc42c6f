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
#include <set>
#include <sstream>

#include "fixtures.h"
#include "pagellm/attention/attention_call.h"
#include "pagellm/attention/calibration.h"
#include "pagellm/backend/backend.h"
#include "pagellm/engine/attention_calibration.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

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
  // Decode: {8, 64, 256} x {512, 8192} x uniform/ragged.
  EXPECT_EQ(count_if(grid, [](const auto& s) { return !s.decode(); }), 22u);
  EXPECT_EQ(count_if(grid, [](const auto& s) { return s.decode(); }), 12u);
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
    EXPECT_EQ(s.ragged, s.label.find("ragged") != std::string::npos) << s.label;
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
  // Per head configuration: prefill 10 (batch 1) + 20 (4) + 16 (16) + 12 (64) = 58, decode
  // 3 (batch 1) + 4 x 3 x 2 = 27; three head configurations.
  const std::vector<AttentionCallShape> full = calibration_grid(o, rng);
  EXPECT_EQ(full.size(), 3u * 85u);
  EXPECT_EQ(count_if(full, [](const auto& s) { return s.num_q_heads == 64; }), 85u);
  o.quick = true;
  o.page_sizes = {16, 32};
  const std::vector<AttentionCallShape> two = calibration_grid(o, rng);
  EXPECT_EQ(two.size(), 68u);
  EXPECT_EQ(count_if(two, [](const auto& s) { return s.page_size == 32; }), 34u);
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
  EXPECT_EQ(bad([](auto&) {}), "no error");
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
