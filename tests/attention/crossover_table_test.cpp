// Crossover tables: the file format (round trip, every malformed field named), the
// conservative derivation of thresholds from measurements, lookup by device and cuDNN
// version, loading from directories, and the tables shipped in data/attention.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fixtures.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;
using test::h200;

CrossoverMeasurement point(int64_t work, double native_us, double cudnn_us, int32_t page = 16,
                           int32_t hq = 32, int32_t hkv = 8,
                           AttentionPhase phase = AttentionPhase::kPrefill,
                           LaunchMode mode = LaunchMode::kEager, int32_t seqs = 4) {
  CrossoverMeasurement m;
  m.mode = mode;
  m.phase = phase;
  m.head_dim = 128;
  m.page_size = page;
  m.num_q_heads = hq;
  m.num_kv_heads = hkv;
  m.num_seqs = seqs;
  m.num_tokens = seqs * 64;
  // One class per phase (q2-64 kv1025-4096 uniform, or decode) whatever the work.
  m.max_query_len = phase == AttentionPhase::kDecode ? 1 : 64;
  m.max_kv_len = 4096;
  m.shape_class = classify_shape(m.max_query_len, m.num_tokens, m.max_kv_len, false);
  m.work = work;
  m.native_us = native_us;
  m.cudnn_us = cudnn_us;
  return m;
}

std::string with_field(const std::string& json, const std::string& from, const std::string& to) {
  const size_t at = json.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  std::string out = json;
  out.replace(at, from.size(), to);
  return out;
}

void expect_parse_error(const std::string& text, const std::string& needle) {
  try {
    parse_crossover_table(text, "table.json");
    ADD_FAILURE() << "parsed without error; expected one mentioning " << needle;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("table.json"), std::string::npos) << m;
    EXPECT_NE(m.find(needle), std::string::npos) << m;
  }
}

TEST(CrossoverTable, RoundTrip) {
  CrossoverTable t = test::standard_table();
  t.measurements.push_back(point(5000, 10.0, 20.0));
  t.measurements.back().label = "uniform 4x64";
  const CrossoverTable u = parse_crossover_table(crossover_table_to_json(t), "mem");
  EXPECT_EQ(u.device.name, "NVIDIA H200");
  EXPECT_EQ(u.device.sm_count, 132);
  EXPECT_EQ(u.device.cc_major, 9);
  EXPECT_EQ(u.device.cc_minor, 0);
  EXPECT_EQ(u.device.cudnn_version, 91400);
  EXPECT_EQ(u.measured_on, "2026-11-29");
  EXPECT_DOUBLE_EQ(u.margin, 0.05);
  ASSERT_EQ(u.entries.size(), 2u);
  const CrossoverEntry* e =
      u.find(LaunchMode::kEager, AttentionPhase::kPrefill, 128, test::chunk_class());
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->shape_class, test::chunk_class());
  // Another class of the same mode, phase and head_dim has no entry.
  EXPECT_EQ(u.find(LaunchMode::kEager, AttentionPhase::kPrefill, 128,
                   classify_shape(2048, 2048, 2048, false)),
            nullptr);
  EXPECT_EQ(e->min_work, 1000000);
  EXPECT_EQ(e->max_work, int64_t{1} << 40);
  EXPECT_EQ(e->page_sizes, (std::vector<int32_t>{16, 32}));
  EXPECT_EQ(e->gqa_ratios, (std::vector<int32_t>{1, 4, 8}));
  EXPECT_EQ(e->max_kv_len, 32768);
  EXPECT_EQ(u.find(LaunchMode::kEager, AttentionPhase::kDecode, 128, ShapeClass{}), nullptr);
  EXPECT_NE(u.find(LaunchMode::kGraph, AttentionPhase::kDecode, 128, ShapeClass{}), nullptr);
  ASSERT_EQ(u.measurements.size(), 1u);
  EXPECT_EQ(u.measurements[0].shape_class, t.measurements[0].shape_class);
  EXPECT_EQ(u.measurements[0].work, 5000);
  EXPECT_DOUBLE_EQ(u.measurements[0].cudnn_us, 20.0);
  EXPECT_EQ(u.measurements[0].label, "uniform 4x64");
}

TEST(CrossoverTable, EveryMalformedFieldIsNamed) {
  const std::string good = crossover_table_to_json(test::standard_table());
  ASSERT_NO_THROW(parse_crossover_table(good, "table.json"));
  expect_parse_error("{", "not valid JSON");
  expect_parse_error("[]", "must be a JSON object");
  expect_parse_error(with_field(good, kCrossoverFormat, "v0"), "format");
  expect_parse_error(with_field(good, "\"class\": \"q257-1024 kv4097-16384 uniform\"",
                                "\"class\": \"q9 kv1-256 uniform\""),
                     "shape class \"q9 kv1-256 uniform\"");
  // A prefill entry cannot hold the decode class (nor the reverse).
  expect_parse_error(with_field(good, "\"class\": \"q257-1024 kv4097-16384 uniform\"",
                                "\"class\": \"decode\""),
                     "\"class\" is \"decode\" but \"phase\" is prefill");
  expect_parse_error(with_field(good, "\"class\": \"decode\"",
                                "\"class\": \"q2-64 kv1-256 uniform\""),
                     "entries[1]");
  expect_parse_error(with_field(good, "\"name\": \"NVIDIA H200\"", "\"name\": \"\""), "name");
  expect_parse_error(with_field(good, "\"sm_count\": 132", "\"sm_count\": -1"), "sm_count");
  expect_parse_error(with_field(good, "\"compute_capability\": \"9.0\"",
                                "\"compute_capability\": \"nine\""),
                     "compute capability");
  expect_parse_error(with_field(good, "\"cudnn_version\": \"9.14.0\"", "\"cudnn_version\": \"none\""),
                     "cudnn_version");
  expect_parse_error(with_field(good, "\"cudnn_version\": \"9.14.0\"", "\"cudnn_version\": \"9.x\""),
                     "9.x");
  expect_parse_error(with_field(good, "\"mode\": \"eager\"", "\"mode\": \"lazy\""), "entries[0]");
  expect_parse_error(with_field(good, "\"mode\": \"eager\"", "\"mode\": \"lazy\""), "lazy");
  expect_parse_error(with_field(good, "\"min_work\": 1000000", "\"min_work\": -5"), "min_work");
  expect_parse_error(with_field(good, "\"max_work\": 1099511627776", "\"max_work\": 7"),
                     "max_work");
  expect_parse_error(with_field(good, "\"head_dim\": 128", "\"head_dim\": \"128\""), "head_dim");
  // A second entry for the same (mode, phase, head_dim).
  CrossoverTable twice = test::standard_table();
  twice.entries.push_back(twice.entries[0]);
  expect_parse_error(crossover_table_to_json(twice), "a second entry for eager prefill head_dim 128");
  // Empty measured lists claim nothing and are refused.
  CrossoverTable t = test::standard_table();
  t.entries[0].page_sizes.clear();
  expect_parse_error(crossover_table_to_json(t), "page_sizes");
}

TEST(CrossoverTable, DerivedThresholdIsTheFirstWorkFromWhichCudnnAlwaysWins) {
  // Sorted by work: losses, then wins from 4000 on.
  std::vector<CrossoverMeasurement> ms = {
      point(1000, 10, 30), point(2000, 15, 25), point(4000, 30, 20),
      point(8000, 60, 25), point(3000, 20, 21), point(16000, 100, 40)};
  const std::vector<CrossoverEntry> es = derive_crossover_entries(ms, 0.05);
  ASSERT_EQ(es.size(), 1u);
  EXPECT_EQ(es[0].min_work, 4000);
  EXPECT_EQ(es[0].max_work, 16000);
  EXPECT_EQ(es[0].points, 6);
  EXPECT_EQ(es[0].admitted_points, 3);
  EXPECT_EQ(es[0].mode, LaunchMode::kEager);
  EXPECT_EQ(es[0].phase, AttentionPhase::kPrefill);
  EXPECT_EQ(es[0].head_dim, 128);
}

TEST(CrossoverTable, ALossAboveAWinMovesTheThresholdPastIt) {
  // A ragged point at 8000 loses although 4000 won: the threshold must be above it.
  std::vector<CrossoverMeasurement> ms = {point(1000, 10, 30), point(4000, 30, 20),
                                          point(8000, 20, 25), point(16000, 100, 40)};
  const std::vector<CrossoverEntry> es = derive_crossover_entries(ms, 0.05);
  ASSERT_EQ(es.size(), 1u);
  EXPECT_EQ(es[0].min_work, 16000);
  EXPECT_EQ(es[0].admitted_points, 1);
}

TEST(CrossoverTable, ALossAtTheSameWorkExcludesThatWork) {
  std::vector<CrossoverMeasurement> ms = {point(4000, 30, 20), point(4000, 20, 25),
                                          point(4000, 40, 20), point(9000, 100, 40)};
  const std::vector<CrossoverEntry> es = derive_crossover_entries(ms, 0.05);
  ASSERT_EQ(es.size(), 1u);
  EXPECT_EQ(es[0].min_work, 9000);
}

TEST(CrossoverTable, NoEntryWhereCudnnNeverWinsAtTheTop) {
  // Wins in the middle but a loss (or a cuDNN failure) at the largest work: no entry.
  std::vector<CrossoverMeasurement> lose = {point(1000, 10, 5), point(9000, 100, 120)};
  EXPECT_TRUE(derive_crossover_entries(lose, 0.05).empty());
  std::vector<CrossoverMeasurement> failed = {point(1000, 10, 5), point(9000, 100, -1)};
  EXPECT_TRUE(derive_crossover_entries(failed, 0.05).empty());
}

TEST(CrossoverTable, MarginTurnsSmallWinsIntoLosses) {
  std::vector<CrossoverMeasurement> ms = {point(1000, 103, 100), point(2000, 110, 100)};
  EXPECT_EQ(derive_crossover_entries(ms, 0.0)[0].min_work, 1000);
  EXPECT_EQ(derive_crossover_entries(ms, 0.05)[0].min_work, 2000);
  EXPECT_TRUE(derive_crossover_entries(ms, 0.2).empty());
}

TEST(CrossoverTable, GroupsAndMeasuredSetsComeFromTheAdmittedRange) {
  std::vector<CrossoverMeasurement> ms = {
      point(1000, 10, 30, /*page=*/1), point(4000, 40, 20, 16, 32, 8),
      point(8000, 80, 20, 32, 32, 32),
      // Another group: graph decode, where cuDNN wins everywhere measured.
      point(500, 5, 4, 16, 32, 8, AttentionPhase::kDecode, LaunchMode::kGraph, 64)};
  const std::vector<CrossoverEntry> es = derive_crossover_entries(ms, 0.05);
  ASSERT_EQ(es.size(), 2u);
  const CrossoverEntry* prefill = nullptr;
  const CrossoverEntry* decode = nullptr;
  for (const CrossoverEntry& e : es) {
    (e.phase == AttentionPhase::kPrefill ? prefill : decode) = &e;
  }
  ASSERT_NE(prefill, nullptr);
  ASSERT_NE(decode, nullptr);
  // Page size 1 was measured only below the crossover: nothing is claimed for it.
  EXPECT_EQ(prefill->page_sizes, (std::vector<int32_t>{16, 32}));
  EXPECT_EQ(prefill->gqa_ratios, (std::vector<int32_t>{1, 4}));
  EXPECT_EQ(decode->mode, LaunchMode::kGraph);
  EXPECT_EQ(decode->min_work, 500);
  EXPECT_EQ(decode->max_num_seqs, 64);
}

TEST(CrossoverTable, LookupIsExactOnDeviceAndCudnnVersion) {
  CrossoverTables tables;
  tables.add(test::standard_table(91400));
  tables.add(test::standard_table(91900));
  EXPECT_EQ(tables.tables().size(), 2u);
  EXPECT_EQ(tables.find(h200(91400))->device.cudnn_version, 91400);
  EXPECT_EQ(tables.find(h200(91900))->device.cudnn_version, 91900);
  EXPECT_EQ(tables.find(h200(91401)), nullptr);
  EXPECT_NE(tables.find_other_version(h200(91401)), nullptr);
  DeviceProfile other = h200();
  other.sm_count = 114;
  EXPECT_EQ(tables.find(other), nullptr);
  EXPECT_EQ(tables.find_other_version(other), nullptr);
  // A later table for the same device and version replaces the earlier one.
  CrossoverTable replacement = test::standard_table(91400);
  replacement.measured_on = "2026-12-01";
  tables.add(replacement);
  EXPECT_EQ(tables.tables().size(), 2u);
  EXPECT_EQ(tables.find(h200(91400))->measured_on, "2026-12-01");
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/pagellm-crossover-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ + "/" + name) << text;
  }

 private:
  std::string path_;
};

TEST(CrossoverTable, LoadsCrossoverFilesFromADirectory) {
  TempDir dir;
  dir.write(crossover_file_name(h200(91400)), crossover_table_to_json(test::standard_table(91400)));
  dir.write("crossover-second.json", crossover_table_to_json(test::standard_table(91900)));
  dir.write("notes.json", "not a table");  // not crossover-*.json: ignored
  const CrossoverTables tables = CrossoverTables::load({dir.path(), dir.path() + "/missing"});
  EXPECT_EQ(tables.tables().size(), 2u);
  ASSERT_NE(tables.find(h200(91400)), nullptr);
  EXPECT_NE(tables.find(h200(91400))->origin.find(dir.path()), std::string::npos);
  EXPECT_THROW(CrossoverTables::load({dir.path() + "/missing"}, /*skip_missing=*/false), Error);
  dir.write("crossover-broken.json", "{\"format\": 1}");
  try {
    CrossoverTables::load({dir.path()});
    FAIL() << "a broken table must be reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("crossover-broken.json"), std::string::npos) << e.what();
  }
}

TEST(CrossoverTable, FileNameIsKeyedByDeviceAndCudnn) {
  EXPECT_EQ(crossover_file_name(h200(91400)), "crossover-nvidia-h200-132sm-cc90-cudnn91400.json");
  DeviceProfile odd = h200();
  odd.name = "  NVIDIA  GH200 480GB!! ";
  EXPECT_EQ(crossover_file_name(odd), "crossover-nvidia-gh200-480gb-132sm-cc90-cudnn91400.json");
}

TEST(CrossoverTable, CudnnVersionsParse) {
  EXPECT_EQ(parse_cudnn_version("9.14.0"), 91400);
  EXPECT_EQ(parse_cudnn_version("9.14"), 91400);
  EXPECT_EQ(parse_cudnn_version("9.19.1"), 91901);
  EXPECT_EQ(parse_cudnn_version("91400"), 91400);
  EXPECT_EQ(parse_cudnn_version("none"), 0);
  EXPECT_EQ(parse_cudnn_version("0"), 0);
  EXPECT_EQ(cudnn_version_string(91400), "9.14.0");
  EXPECT_EQ(cudnn_version_string(0), "none");
  for (const char* bad : {"", "9", "8.9.7", "9.14.0.1", "9.x", "8900", "-1", "9..1"}) {
    EXPECT_THROW(parse_cudnn_version(bad), Error) << bad;
  }
}

TEST(CrossoverTable, DeviceProfileJson) {
  const DeviceProfile p =
      parse_device_profile_json(device_profile_to_json(h200(91400)), "profile.json");
  EXPECT_TRUE(p.same_device(h200()));
  EXPECT_EQ(p.cudnn_version, 91400);
  const DeviceProfile q = parse_device_profile_json(
      R"({"name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "compute_capability": "9.0",
          "cudnn_version": 91002})",
      "p");
  EXPECT_EQ(q.cudnn_version, 91002);
  EXPECT_THROW(parse_device_profile_json(R"({"name": "x", "compute_capability": "9.0"})", "p"),
               Error);
  EXPECT_THROW(parse_device_profile_json(
                   R"({"name": "x", "sm_count": 1, "compute_capability": "9.0", "cudnn_version": true})",
                   "p"),
               Error);
}

// A point of class `c` (largest query q, largest KV kv).
CrossoverMeasurement class_point(int32_t q, int32_t kv, bool ragged, int64_t work,
                                 double native_us, double cudnn_us) {
  CrossoverMeasurement m = point(work, native_us, cudnn_us);
  m.max_query_len = q;
  m.max_kv_len = kv;
  m.num_tokens = q;  // one sequence (or q + rows too few to leave the bucket)
  m.ragged = ragged;
  m.shape_class = classify_shape(q, q, kv, ragged);
  return m;
}

TEST(CrossoverTable, DerivationIsPerShapeClassAndAWinNeverAdmitsAnotherClass) {
  // Chunks after long prefixes win; fresh prompts of larger work lose; mixed steps lose.
  // Under one threshold per (mode, phase, head_dim), the fresh losses at the top would have
  // hidden the chunk wins (no entry at all), and a win at the top would have admitted the
  // fresh prompts.
  const std::vector<CrossoverMeasurement> ms = {
      class_point(512, 8704, false, 100000, 389, 296),   // chunk 512 after 8192
      class_point(1024, 9216, false, 200000, 700, 560),  // chunk 1024 after 8192
      class_point(2048, 2048, false, 150000, 129, 187),  // fresh 2048
      class_point(2048, 4096, false, 400000, 300, 420),  // 2048 after 2048: same class
      class_point(2048, 2048, true, 160000, 167, 1188),  // 2048 + 63 one-token rows
  };
  const std::vector<CrossoverEntry> es = derive_crossover_entries(ms, 0.05);
  ASSERT_EQ(es.size(), 1u);
  EXPECT_EQ(es[0].shape_class, classify_shape(512, 512, 8704, false));
  EXPECT_EQ(es[0].min_work, 100000);
  EXPECT_EQ(es[0].max_work, 200000);
  EXPECT_EQ(es[0].points, 2);
  EXPECT_EQ(es[0].max_query_len, 1024);  // ranges are the class's own
  EXPECT_EQ(es[0].max_kv_len, 9216);
  CrossoverTable t = test::standard_table();
  t.entries = es;
  for (const CrossoverMeasurement& m : ms) {
    const bool admitted_class = m.shape_class == es[0].shape_class;
    EXPECT_EQ(t.find(LaunchMode::kEager, AttentionPhase::kPrefill, 128, m.shape_class) != nullptr,
              admitted_class)
        << shape_class_name(m.shape_class);
  }
  // The same wins in two classes give two entries with their own thresholds.
  std::vector<CrossoverMeasurement> two = ms;
  two.push_back(class_point(2048, 34816, false, 5000000, 9000, 7000));  // chunk 2048 after 32k
  two.push_back(class_point(1536, 34304, false, 4000000, 7000, 6000));
  EXPECT_EQ(derive_crossover_entries(two, 0.05).size(), 2u);
}

TEST(CrossoverTable, MeasurementClassMustAgreeWithItsShape) {
  CrossoverTable t = test::standard_table();
  t.measurements.push_back(class_point(300, 20000, false, 1000, 10, 5));
  const std::string good = crossover_table_to_json(t);
  ASSERT_NO_THROW(parse_crossover_table(good, "table.json"));
  const std::string field = "\"class\": \"q257-1024 kv16385-65536 uniform\"";
  expect_parse_error(with_field(good, field, "\"class\": \"q257-1024 kv1-256 uniform\""),
                     "measurements[0]: \"class\" is \"q257-1024 kv1-256 uniform\" but max_query_len "
                     "300, num_tokens 300, max_kv_len 20000");
  // A ragged class needs a ragged point.
  expect_parse_error(with_field(good, field, "\"class\": \"q257-1024 kv16385-65536 ragged\""),
                     "measurements[0]");
}

// The v1 text of `t`: format v1, no "class" fields.
std::string as_v1(const CrossoverTable& t) {
  std::istringstream in(crossover_table_to_json(t));
  std::string line, out;
  while (std::getline(in, line)) {
    if (line.find("\"class\":") != std::string::npos) continue;
    out += line + "\n";
  }
  return with_field(out, kCrossoverFormat, kCrossoverFormatV1);
}

TEST(CrossoverTable, V1WithoutEntriesLoadsAndItsMeasurementsGetTheirClasses) {
  CrossoverTable t = test::standard_table();
  t.entries.clear();
  t.measurements = {class_point(512, 8704, false, 1000, 10, 5),
                    class_point(2048, 2048, true, 2000, 10, 50),
                    point(300, 5, 6, 16, 32, 8, AttentionPhase::kDecode, LaunchMode::kGraph)};
  t.measurements[2].ragged = true;  // v1 decode "ragged" meant KV lengths: still decode
  const std::string v1 = as_v1(t);
  ASSERT_EQ(v1.find("\"class\""), std::string::npos);
  const CrossoverTable u = parse_crossover_table(v1, "old.json");
  EXPECT_TRUE(u.entries.empty());
  ASSERT_EQ(u.measurements.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(u.measurements[i].shape_class, t.measurements[i].shape_class) << i;
  }
  EXPECT_EQ(shape_class_name(u.measurements[1].shape_class), "q1025-4096 kv1025-4096 ragged");
  EXPECT_TRUE(u.measurements[2].shape_class.decode());
  // Written back, it is v2.
  EXPECT_NE(crossover_table_to_json(u).find(kCrossoverFormat), std::string::npos);
}

TEST(CrossoverTable, V1EntriesAreRefusedBecauseTheyHaveNoClass) {
  const std::string v1 = as_v1(test::standard_table());
  expect_parse_error(v1, "has 2 entries without a shape class");
  expect_parse_error(v1, "pagellm calibrate-attention");
}

// Every table shipped with the project parses, and claims nothing it could not have
// measured (ordered work ranges, non-empty measured sets, a real cuDNN version).
TEST(CrossoverTable, ShippedTablesAreWellFormed) {
  const char* src = std::getenv("PAGELLM_SOURCE_DIR");
  const std::string root = src ? src : PAGELLM_SOURCE_DIR;
  const std::string dir = root + "/data/attention";
  ASSERT_TRUE(fs::is_directory(dir)) << dir << " is missing";
  const CrossoverTables tables = CrossoverTables::load({dir}, /*skip_missing=*/false);
  for (const CrossoverTable& t : tables.tables()) {
    SCOPED_TRACE(t.origin);
    EXPECT_GT(t.device.cudnn_version, 0);
    EXPECT_FALSE(t.measured_on.empty()) << "a shipped table says when it was measured";
    EXPECT_EQ(fs::path(t.origin).filename().string(), crossover_file_name(t.device));
    for (const CrossoverEntry& e : t.entries) {
      EXPECT_LE(e.min_work, e.max_work);
      EXPECT_FALSE(e.page_sizes.empty());
      EXPECT_FALSE(e.gqa_ratios.empty());
      EXPECT_GT(e.admitted_points, 0);
    }
    // The entries are what the measurements in the file derive to.
    if (!t.measurements.empty()) {
      const std::vector<CrossoverEntry> derived = derive_crossover_entries(t.measurements, t.margin);
      EXPECT_EQ(derived.size(), t.entries.size());
      for (const CrossoverEntry& d : derived) {
        const CrossoverEntry* e = t.find(d.mode, d.phase, d.head_dim, d.shape_class);
        ASSERT_NE(e, nullptr);
        EXPECT_EQ(e->min_work, d.min_work);
        EXPECT_EQ(e->max_work, d.max_work);
      }
    }
  }
}

}  // namespace
}  // namespace pagellm
