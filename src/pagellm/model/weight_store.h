// WeightStore: every tensor of a Hugging Face model folder, by name, memory-mapped.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pagellm/model/safetensors.h"

namespace pagellm {

/// The tensors of a model folder, read-only and memory-mapped (nothing is copied).
///
/// open(path) accepts, in the order transformers' from_pretrained looks for them:
///   - a folder with model.safetensors (one file);
///   - a folder with model.safetensors.index.json, whose "weight_map" names the shard file
///     of each tensor (every shard in the folder);
///   - a single .safetensors file.
/// It throws Error naming the file and tensor for any bad file (see SafetensorsFile), an
/// index that is not JSON or names a shard that is missing or outside the folder, a tensor
/// that the index maps to a shard that lacks it, and a tensor present in two shards.
/// Tensors that a shard holds but the index does not list are kept (transformers loads
/// whole shards too).
///
/// HostTensor pointers and views stay valid while the store lives (also across moves).
class WeightStore {
 public:
  static WeightStore open(const std::string& path);

  bool has(const std::string& name) const { return by_name_.count(name) != 0; }
  /// The tensor, or Error naming the folder when there is none.
  const HostTensor& get(const std::string& name) const;
  /// The tensor, or nullptr.
  const HostTensor* find(const std::string& name) const;
  /// Every tensor name, sorted.
  std::vector<std::string> names() const;
  size_t size() const { return by_name_.size(); }

  /// The folder or file given to open().
  const std::string& source() const { return source_; }
  /// Paths of the mapped .safetensors files.
  std::vector<std::string> files() const;
  /// Sum of all tensors' bytes.
  uint64_t total_bytes() const;
  /// Asks the kernel to read the tensor's pages ahead (madvise WILLNEED); a hint only.
  void prefetch(const HostTensor& tensor) const;

 private:
  void add_file(std::unique_ptr<SafetensorsFile> file);

  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const HostTensor*> by_name_;  // into files_' tensors
  std::map<std::string, const SafetensorsFile*> file_of_;
};

}  // namespace pagellm
