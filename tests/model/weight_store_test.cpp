// WeightStore: single files, folders, sharded folders and their index.json errors.
#include <gtest/gtest.h>

#include <cstring>

#include "model/model_test_util.h"
#include "pagellm/model/weight_store.h"

namespace pagellm {
namespace {

using testing::error_of;
using testing::TempDir;
using testing::write_file;

const float kOnes[4] = {1, 1, 1, 1};
const float kTwos[4] = {2, 2, 2, 2};

TensorToWrite t(const std::string& name, const float* data = kOnes) {
  return TensorToWrite::from_memory(name, DType::F32, {4}, data);
}

// A folder with two shards and an index, as save_pretrained writes them.
void write_sharded(const TempDir& dir) {
  write_safetensors(dir.file("model-00001-of-00002.safetensors"), {t("x.a"), t("x.b")});
  write_safetensors(dir.file("model-00002-of-00002.safetensors"), {t("y.c", kTwos)});
  write_file(dir.file("model.safetensors.index.json"), R"({
  "metadata": {"total_size": 48},
  "weight_map": {
    "x.a": "model-00001-of-00002.safetensors",
    "x.b": "model-00001-of-00002.safetensors",
    "y.c": "model-00002-of-00002.safetensors"
  }
})");
}

std::string store_error(const std::string& path) {
  return error_of([&] { WeightStore::open(path); });
}

TEST(WeightStore, OpensAFolderWithOneFile) {
  TempDir dir;
  write_safetensors(dir.file("model.safetensors"), {t("b"), t("a", kTwos)});
  WeightStore store = WeightStore::open(dir.path());
  EXPECT_EQ(store.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(store.size(), 2u);
  EXPECT_TRUE(store.has("a"));
  EXPECT_FALSE(store.has("c"));
  EXPECT_EQ(store.find("c"), nullptr);
  EXPECT_EQ(store.files(), std::vector<std::string>{dir.file("model.safetensors")});
  EXPECT_EQ(store.total_bytes(), 32u);
  EXPECT_EQ(store.source(), dir.path());
  const HostTensor& a = store.get("a");
  EXPECT_EQ(static_cast<const float*>(a.data)[3], 2.0f);
  EXPECT_EQ(a.file, dir.file("model.safetensors"));
  store.prefetch(a);  // a hint; must not fail
  std::string err = error_of([&] { store.get("missing.weight"); });
  EXPECT_NE(err.find(dir.path()), std::string::npos) << err;
  EXPECT_NE(err.find("no tensor 'missing.weight'"), std::string::npos) << err;
}

TEST(WeightStore, OpensASingleFile) {
  TempDir dir;
  write_safetensors(dir.file("weights.safetensors"), {t("w")});
  WeightStore store = WeightStore::open(dir.file("weights.safetensors"));
  EXPECT_EQ(store.names(), std::vector<std::string>{"w"});
}

TEST(WeightStore, ViewsStayValidWhenTheStoreMoves) {
  TempDir dir;
  write_safetensors(dir.file("model.safetensors"), {t("w", kTwos)});
  WeightStore first = WeightStore::open(dir.path());
  const HostTensor* before = &first.get("w");
  WeightStore moved = std::move(first);
  EXPECT_EQ(&moved.get("w"), before);
  EXPECT_EQ(static_cast<const float*>(moved.get("w").data)[0], 2.0f);
}

TEST(WeightStore, OpensShardsThroughTheIndex) {
  TempDir dir;
  write_sharded(dir);
  WeightStore store = WeightStore::open(dir.path());
  EXPECT_EQ(store.names(), (std::vector<std::string>{"x.a", "x.b", "y.c"}));
  EXPECT_EQ(store.files().size(), 2u);
  EXPECT_EQ(store.get("x.b").file, dir.file("model-00001-of-00002.safetensors"));
  EXPECT_EQ(store.get("y.c").file, dir.file("model-00002-of-00002.safetensors"));
  EXPECT_EQ(static_cast<const float*>(store.get("y.c").data)[1], 2.0f);
}

TEST(WeightStore, PrefersModelSafetensorsOverAnIndex) {
  // transformers' from_pretrained looks for model.safetensors first.
  TempDir dir;
  write_sharded(dir);
  write_safetensors(dir.file("model.safetensors"), {t("only")});
  EXPECT_EQ(WeightStore::open(dir.path()).names(), std::vector<std::string>{"only"});
}

TEST(WeightStore, KeepsShardTensorsTheIndexDoesNotList) {
  TempDir dir;
  write_sharded(dir);
  write_file(dir.file("model.safetensors.index.json"),
             R"({"weight_map": {"x.a": "model-00001-of-00002.safetensors",
                                "y.c": "model-00002-of-00002.safetensors"}})");
  EXPECT_TRUE(WeightStore::open(dir.path()).has("x.b"));
}

TEST(WeightStore, IndexNamingAMissingShard) {
  TempDir dir;
  write_sharded(dir);
  std::filesystem::remove(dir.file("model-00002-of-00002.safetensors"));
  std::string err = store_error(dir.path());
  EXPECT_NE(err.find("model.safetensors.index.json"), std::string::npos) << err;
  EXPECT_NE(err.find("'y.c'"), std::string::npos) << err;
  EXPECT_NE(err.find(dir.file("model-00002-of-00002.safetensors") + " does not exist"),
            std::string::npos)
      << err;
}

TEST(WeightStore, IndexNamingATensorItsShardLacks) {
  TempDir dir;
  write_sharded(dir);
  write_file(dir.file("model.safetensors.index.json"),
             R"({"weight_map": {"x.a": "model-00001-of-00002.safetensors",
                                "ghost": "model-00002-of-00002.safetensors"}})");
  std::string err = store_error(dir.path());
  EXPECT_NE(err.find("maps tensor 'ghost' to model-00002-of-00002.safetensors"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("has no tensor 'ghost'"), std::string::npos) << err;

  // Listed under the wrong shard: the message says where it is.
  write_file(dir.file("model.safetensors.index.json"),
             R"({"weight_map": {"x.a": "model-00002-of-00002.safetensors",
                                "x.b": "model-00001-of-00002.safetensors",
                                "y.c": "model-00002-of-00002.safetensors"}})");
  err = store_error(dir.path());
  EXPECT_NE(err.find("has no tensor 'x.a' (it is in " +
                     dir.file("model-00001-of-00002.safetensors") + ")"),
            std::string::npos)
      << err;
}

TEST(WeightStore, DuplicateTensorAcrossShards) {
  TempDir dir;
  write_sharded(dir);
  write_safetensors(dir.file("model-00002-of-00002.safetensors"), {t("y.c"), t("x.a")});
  std::string err = store_error(dir.path());
  EXPECT_NE(err.find("tensor 'x.a' is in both"), std::string::npos) << err;
  EXPECT_NE(err.find("model-00001-of-00002.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("model-00002-of-00002.safetensors"), std::string::npos) << err;
}

TEST(WeightStore, BadIndexFiles) {
  TempDir dir;
  write_sharded(dir);
  const std::string index = dir.file("model.safetensors.index.json");
  write_file(index, "{\"weight_map\": ");
  std::string err = store_error(dir.path());
  EXPECT_NE(err.find(index + ": not valid JSON"), std::string::npos) << err;
  // nlohmann throws out_of_range (not parse_error) for this; it must still be our Error.
  write_file(index, R"({"metadata": {"total_size": 1e400}, "weight_map": {}})");
  err = store_error(dir.path());
  EXPECT_NE(err.find(index + ": not valid JSON"), std::string::npos) << err;
  write_file(index, R"({"metadata": {}})");
  EXPECT_NE(store_error(dir.path()).find("\"weight_map\""), std::string::npos);
  write_file(index, R"({"weight_map": {}})");
  EXPECT_NE(store_error(dir.path()).find("empty"), std::string::npos);
  write_file(index, R"({"weight_map": {"x.a": 3}})");
  EXPECT_NE(store_error(dir.path()).find("must be a file name"), std::string::npos);
  write_file(index, R"({"weight_map": {"x.a": "../model-00001-of-00002.safetensors"}})");
  err = store_error(dir.path());
  EXPECT_NE(err.find("plain file name"), std::string::npos) << err;
}

TEST(WeightStore, BadShardIsNamed) {
  TempDir dir;
  write_sharded(dir);
  write_file(dir.file("model-00002-of-00002.safetensors"), "garbage");
  std::string err = store_error(dir.path());
  EXPECT_NE(err.find(dir.file("model-00002-of-00002.safetensors")), std::string::npos) << err;
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
}

TEST(WeightStore, FoldersWithoutWeights) {
  TempDir dir;
  std::string err = store_error(dir.path());
  EXPECT_NE(err.find("no model.safetensors or model.safetensors.index.json"), std::string::npos)
      << err;
  err = store_error(dir.file("nope"));
  EXPECT_NE(err.find("no such file or folder"), std::string::npos) << err;
}

}  // namespace
}  // namespace pagellm
