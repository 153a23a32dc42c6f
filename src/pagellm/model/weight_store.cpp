#include "pagellm/model/weight_store.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "pagellm/common/check.h"

namespace pagellm {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// Reads index.json; returns tensor name -> shard file name.
std::map<std::string, std::string> read_weight_map(const std::string& index_path) {
  std::ifstream in(index_path, std::ios::binary);
  PAGELLM_CHECK(in.good()) << index_path << ": cannot open";
  std::ostringstream text;
  text << in.rdbuf();
  json index;
  try {
    index = json::parse(text.str());
  } catch (const json::exception& e) {
    PAGELLM_FAIL() << index_path << ": not valid JSON: " << e.what();
  }
  PAGELLM_CHECK(index.is_object() && index.contains("weight_map") &&
                index["weight_map"].is_object())
      << index_path << ": expected an object with \"weight_map\": {tensor name: shard file}";
  std::map<std::string, std::string> weight_map;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    PAGELLM_CHECK(it->is_string()) << index_path << ": weight_map entry for tensor '" << it.key()
                                   << "' must be a file name, got " << it->dump();
    const std::string shard = it->get<std::string>();
    // Shards live beside the index; a path would let an index read files anywhere.
    PAGELLM_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard != "." &&
                  shard != "..")
        << index_path << ": weight_map names shard \"" << shard << "\" for tensor '" << it.key()
        << "'; expected a plain file name in the same folder";
    weight_map[it.key()] = shard;
  }
  PAGELLM_CHECK(!weight_map.empty()) << index_path << ": \"weight_map\" is empty";
  return weight_map;
}

}  // namespace

void WeightStore::add_file(std::unique_ptr<SafetensorsFile> file) {
  for (const HostTensor& t : file->tensors()) {
    auto [it, inserted] = by_name_.emplace(t.name, &t);
    PAGELLM_CHECK(inserted) << "tensor '" << t.name << "' is in both " << it->second->file
                            << " and " << file->path() << "; each tensor must be in one shard";
    file_of_[t.name] = file.get();
  }
  files_.push_back(std::move(file));
}

WeightStore WeightStore::open(const std::string& path) {
  WeightStore store;
  store.source_ = path;
  PAGELLM_CHECK(fs::exists(path)) << path << ": no such file or folder";
  if (!fs::is_directory(path)) {
    store.add_file(SafetensorsFile::open(path));
    return store;
  }

  const fs::path dir(path);
  if (fs::is_regular_file(dir / kSingleFile)) {
    store.add_file(SafetensorsFile::open((dir / kSingleFile).string()));
    return store;
  }
  const std::string index_path = (dir / kIndexFile).string();
  PAGELLM_CHECK(fs::is_regular_file(index_path))
      << path << ": no " << kSingleFile << " or " << kIndexFile
      << " (expected a Hugging Face model folder with safetensors weights)";

  const std::map<std::string, std::string> weight_map = read_weight_map(index_path);
  std::set<std::string> shards;
  for (const auto& [name, shard] : weight_map) {
    if (shards.insert(shard).second) {
      PAGELLM_CHECK(fs::is_regular_file(dir / shard))
          << index_path << " maps tensor '" << name << "' to shard " << shard << ", but "
          << (dir / shard).string() << " does not exist";
    }
  }
  for (const std::string& shard : shards) store.add_file(SafetensorsFile::open((dir / shard).string()));
  for (const auto& [name, shard] : weight_map) {
    auto it = store.file_of_.find(name);
    const std::string shard_path = (dir / shard).string();
    PAGELLM_CHECK(it != store.file_of_.end() && it->second->path() == shard_path)
        << index_path << " maps tensor '" << name << "' to " << shard << ", but " << shard_path
        << " has no tensor '" << name << "'"
        << (it != store.file_of_.end() ? " (it is in " + it->second->path() + ")" : "");
  }
  return store;
}

const HostTensor& WeightStore::get(const std::string& name) const {
  const HostTensor* t = find(name);
  PAGELLM_CHECK(t != nullptr) << source_ << ": no tensor '" << name << "'";
  return *t;
}

const HostTensor* WeightStore::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& entry : by_name_) out.push_back(entry.first);
  return out;
}

std::vector<std::string> WeightStore::files() const {
  std::vector<std::string> out;
  for (const auto& f : files_) out.push_back(f->path());
  return out;
}

uint64_t WeightStore::total_bytes() const {
  uint64_t total = 0;
  for (const auto& entry : by_name_) total += entry.second->nbytes;
  return total;
}

void WeightStore::prefetch(const HostTensor& tensor) const {
  auto it = file_of_.find(tensor.name);
  if (it != file_of_.end()) it->second->prefetch(tensor);
}

}  // namespace pagellm
