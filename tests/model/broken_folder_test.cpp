// Broken model folders (issue 21): a generated set of ways a Hugging Face folder goes bad
// (missing or truncated files, bad JSON, bad dtypes, wrong shapes, header lengths that
// overflow, an index naming shards that are not there), each loaded the way the engine
// loads a folder (Qwen3Model::load). Every one must give one Error whose first line names
// the file and what is wrong, never a crash; the unit tests of each reader
// (safetensors_test, weight_store_test, config_test, qwen3_weights_test) cover the readers'
// every message, this covers them end to end on a real folder.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "model/model_test_util.h"
#include "pagellm/cpu/cpu_backend.h"
#include "pagellm/model/make_model.h"
#include "pagellm/model/qwen3.h"

namespace pagellm {
namespace {

using testing::read_file;
using testing::TempDir;
using testing::write_file;
namespace fs = std::filesystem;

/// How a folder is broken: `edit` changes a good folder in place; the load must fail with
/// `needle` in the first line of the message (`one_line`: the whole message is one line).
struct Breakage {
  std::string name;
  bool sharded;  // starts from the sharded folder (index + shards) instead of one file
  std::function<void(const std::string& dir)> edit;
  std::string needle;
  bool one_line = true;
};

void PrintTo(const Breakage& b, std::ostream* os) { *os << b.name; }

/// The tiny preset as one file and as shards of at most 400 kB.
const std::string& good_folder(bool sharded) {
  static TempDir root;
  static const std::string one = [] {
    MakeModelOptions o;
    o.preset = "tiny";
    o.dtype = DType::F32;
    o.out_dir = root.file("one");
    make_model(o);
    return o.out_dir;
  }();
  static const std::string shards = [] {
    MakeModelOptions o;
    o.preset = "tiny";
    o.dtype = DType::F32;
    o.shard_bytes = 400'000;
    o.out_dir = root.file("shards");
    make_model(o);
    return o.out_dir;
  }();
  return sharded ? shards : one;
}

std::string first_shard(const std::string& dir) {
  return dir + "/model-00001-of-" +
         [&] {
           for (const auto& e : fs::directory_iterator(dir)) {
             const std::string n = e.path().filename().string();
             if (n.rfind("model-00001-of-", 0) == 0) return n.substr(15);
           }
           return std::string("?");
         }();
}

/// Replaces the first `from` by `to` (same length, so data offsets stay put).
void patch(const std::string& path, const std::string& from, const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  std::string bytes = read_file(path);
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos) << from << " not in " << path;
  bytes.replace(at, from.size(), to);
  write_file(path, bytes);
}

void set_header_length(const std::string& path, uint64_t n) {
  std::string bytes = read_file(path);
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i) & 0xff);
  write_file(path, bytes);
}

void truncate_to(const std::string& path, size_t size) { fs::resize_file(path, size); }

std::vector<Breakage> breakages() {
  const std::string st = "/model.safetensors";
  const std::string index = "/model.safetensors.index.json";
  return {
      {"config_missing", false, [](const std::string& d) { fs::remove(d + "/config.json"); },
       "no config.json in"},
      {"config_truncated", false,
       [](const std::string& d) { truncate_to(d + "/config.json", 40); },
       "config.json: not valid JSON"},
      {"config_not_an_object", false,
       [](const std::string& d) { write_file(d + "/config.json", "[1, 2]"); },
       "config.json: expected a JSON object at the top level"},
      {"config_missing_field", false,
       [](const std::string& d) { patch(d + "/config.json", "\"hidden_size\"", "\"hidden_sizX\""); },
       "config.json: missing field \"hidden_size\""},
      {"config_bad_dtype", false,
       [](const std::string& d) { patch(d + "/config.json", "\"float32\"", "\"int8\"   "); },
       "config.json: \"torch_dtype\" is \"int8\""},
      {"config_heads_not_divisible", false,
       [](const std::string& d) {
         patch(d + "/config.json", "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3");
       },
       "must be a multiple of num_key_value_heads (3)"},
      {"generation_config_bad_json", false,
       [](const std::string& d) { write_file(d + "/generation_config.json", "{\"eos_token_id\": "); },
       "generation_config.json: not valid JSON"},
      {"weights_missing", false, [st](const std::string& d) { fs::remove(d + st); },
       "no model.safetensors or model.safetensors.index.json"},
      {"weights_empty", false, [st](const std::string& d) { truncate_to(d + st, 0); },
       "truncated: the file is 0 bytes"},
      {"weights_cut_in_header", false, [st](const std::string& d) { truncate_to(d + st, 100); },
       "which runs past the end of the file (100 bytes)"},
      {"weights_cut_in_data", false,
       [st](const std::string& d) { truncate_to(d + st, fs::file_size(d + st) - 4096); },
       "run past the end of the data section"},
      {"header_length_overflowing", false,
       [st](const std::string& d) { set_header_length(d + st, UINT64_MAX); },
       "the header length is 18446744073709551615 bytes, which runs past the end of the file"},
      {"header_length_wrapping", false,
       [st](const std::string& d) { set_header_length(d + st, UINT64_MAX - 6); },
       "runs past the end of the file"},
      {"header_length_short", false,
       [st](const std::string& d) { set_header_length(d + st, 16); },
       "the header is not valid JSON"},
      {"header_unknown_dtype", false,
       [st](const std::string& d) { patch(d + st, "\"F32\"", "\"Q32\""); },
       "unknown dtype \"Q32\" (pagellm reads F32, BF16, F16, I32 and I64)"},
      {"header_unsupported_dtype", false,
       [st](const std::string& d) { patch(d + st, "\"F32\"", "\"F64\""); },
       "unsupported dtype \"F64\""},
      {"header_shape_not_matching_offsets", false,
       [st](const std::string& d) { patch(d + st, "[1024,64]", "[1024,32]"); },
       "with shape [1024, 32] needs 131072 bytes"},
      {"wrong_shape_for_config", false,
       [](const std::string& d) {
         patch(d + "/config.json", "\"intermediate_size\": 192", "\"intermediate_size\": 128");
       },
       "the weights do not match config.json", false},
      {"index_missing_shard", true,
       [](const std::string& d) { fs::remove(first_shard(d)); }, "does not exist"},
      {"index_bad_json", true,
       [index](const std::string& d) { truncate_to(d + index, 30); },
       "model.safetensors.index.json: not valid JSON"},
      {"index_without_weight_map", true,
       [index](const std::string& d) { write_file(d + index, "{\"metadata\": {}}"); },
       "expected an object with \"weight_map\""},
      {"index_naming_a_path", true,
       [index](const std::string& d) { patch(d + index, "\"model-00001-of-", "\"../el-00001-of-"); },
       "expected a plain file name in the same folder"},
      {"index_naming_the_wrong_shard", true,
       [index](const std::string& d) { patch(d + index, "00001-of-", "00002-of-"); },
       "has no tensor"},
      {"shard_truncated", true,
       [](const std::string& d) { truncate_to(first_shard(d), 7); },
       "truncated: the file is 7 bytes"},
  };
}

class BrokenFolder : public ::testing::TestWithParam<Breakage> {};

TEST(BrokenFolderBase, TheGoodFoldersLoad) {
  for (bool sharded : {false, true}) {
    CpuBackend backend;
    EXPECT_NO_THROW(Qwen3Model::load(backend, good_folder(sharded))) << sharded;
  }
  EXPECT_TRUE(fs::exists(good_folder(true) + "/model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(first_shard(good_folder(true))));
}

TEST_P(BrokenFolder, GivesItsClearError) {
  const Breakage& b = GetParam();
  TempDir dir;
  const std::string folder = dir.file("model");
  fs::copy(good_folder(b.sharded), folder, fs::copy_options::recursive);
  b.edit(folder);
  CpuBackend backend;
  try {
    Qwen3Model::load(backend, folder);
    FAIL() << "the broken folder loaded";
  } catch (const Error& e) {
    const std::string what = e.what();
    const std::string first_line = what.substr(0, what.find('\n'));
    EXPECT_NE(first_line.find(b.needle), std::string::npos) << what;
    EXPECT_NE(first_line.find(folder), std::string::npos) << "names the folder or file: " << what;
    if (b.one_line) {
      EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Generated, BrokenFolder, ::testing::ValuesIn(breakages()),
                         [](const ::testing::TestParamInfo<Breakage>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace pagellm
