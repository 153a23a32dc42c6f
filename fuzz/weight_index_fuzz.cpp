// libFuzzer target: WeightStore::open on a folder whose model.safetensors.index.json is the
// input never crashes, never reads a file outside the folder, and what it accepts is
// consistent with the index.
//
// The folder (a private temporary one, made once) holds two valid shards:
//   a.safetensors: "x" F32 [2, 3], "y" I64 [4];   b.safetensors: "z" BF16 [5].
// Input: the index text (any bytes). When open() succeeds, every tensor the index maps
// must be found in the shard the index names, and every tensor the store holds must come
// from a shard of the folder.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagellm/common/check.h"
#include "pagellm/model/weight_store.h"

namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "weight_index_fuzz: property violated: %s\n", what);
  std::abort();
}

/// Removes the scratch folder when the fuzzer exits normally.
struct RemovedAtExit {
  fs::path dir;
  ~RemovedAtExit() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

const fs::path& folder() {
  static const fs::path dir = [] {
    std::error_code ec;  // in memory (/dev/shm) where there is one: every input is a file write
    const fs::path root = fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
    const fs::path d = root / ("pagellm-index-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(d);
    static const RemovedAtExit cleanup{d};
    static const std::vector<float> x = {1, 2, 3, 4, 5, 6};
    static const std::vector<int64_t> y = {7, 8, 9, 10};
    static const std::vector<uint16_t> z = {1, 2, 3, 4, 5};
    using pagellm::TensorToWrite;
    pagellm::write_safetensors((d / "a.safetensors").string(),
                               {TensorToWrite::from_memory("x", pagellm::DType::F32, {2, 3}, x.data()),
                                TensorToWrite::from_memory("y", pagellm::DType::I64, {4}, y.data())});
    pagellm::write_safetensors((d / "b.safetensors").string(),
                               {TensorToWrite::from_memory("z", pagellm::DType::BF16, {5}, z.data())});
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path index = folder() / "model.safetensors.index.json";
  {
    std::ofstream out(index, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!out) fail("cannot write the index");
  }
  pagellm::WeightStore store;
  try {
    store = pagellm::WeightStore::open(folder().string());
  } catch (const pagellm::Error&) {
    return 0;  // rejected with a message: fine
  }
  const std::string prefix = folder().string() + "/";
  for (const std::string& file : store.files()) {
    if (file.compare(0, prefix.size(), prefix) != 0 ||
        file.find('/', prefix.size()) != std::string::npos)
      fail("the store mapped a file outside the folder");
  }
  // Accepted: the index is a JSON object whose weight_map names, for each tensor, the shard
  // that holds it.
  const nlohmann::json parsed = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(data), size));
  for (const auto& [name, shard] : parsed.at("weight_map").items()) {
    const pagellm::HostTensor* t = store.find(name);
    if (t == nullptr) fail("a tensor of the index is missing from the store");
    if (t->file != prefix + shard.get<std::string>()) fail("a tensor comes from another shard");
  }
  return 0;
}
