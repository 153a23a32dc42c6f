// The in-memory random weights (pagellm bench) equal the folder make-model writes.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "pagellm/model/make_model.h"
#include "pagellm/model/random_weights.h"
#include "pagellm/model/weight_store.h"

namespace pagellm {
namespace {

TEST(RandomWeights, LookupMatchesMakeModelFolder) {
  const std::string dir = (std::filesystem::temp_directory_path() / "pagellm_random_weights_test").string();
  MakeModelOptions opt;
  opt.preset = "tiny";
  opt.out_dir = dir;
  opt.seed = 42;
  opt.dtype = DType::BF16;
  make_model(opt);
  const Qwen3Config config = preset_config("tiny");
  WeightLookup lookup = random_weight_lookup(config, 42, DType::BF16);
  WeightStore store = WeightStore::open(dir);
  int checked = 0;
  for (const ExpectedWeight& w : expected_qwen3_weights(config)) {
    const HostTensor& t = store.get(w.name);
    WeightView v = lookup(w.name);
    ASSERT_EQ(v.shape, t.shape) << w.name;
    ASSERT_EQ(v.dtype, t.dtype) << w.name;
    ASSERT_EQ(std::memcmp(v.data, t.data, t.nbytes), 0) << w.name << " differs";
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(store.size()));
  // A different seed gives different weights.
  // The view lives in the lookup's buffer: keep the lookup alive while reading it (a
  // temporary lookup left `other` dangling; found by suite_address_sanitizer).
  const WeightLookup other_lookup = random_weight_lookup(config, 43, DType::BF16);
  WeightView other = other_lookup("model.norm.weight");
  EXPECT_NE(std::memcmp(other.data, store.get("model.norm.weight").data, 64), 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pagellm
