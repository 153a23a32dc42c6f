// The safetensors file format: a memory-mapped reader and a streaming writer.
//
// Layout (https://github.com/huggingface/safetensors): an 8-byte little-endian header length
// N, then N bytes of JSON header, then the data section. The header maps each tensor name
// to {"dtype", "shape", "data_offsets": [begin, end]} (byte offsets into the data section),
// plus an optional "__metadata__" object of strings. Hugging Face pads the header with
// spaces to a multiple of 8 bytes and orders tensors by descending element size, then name,
// so every tensor's data is aligned to its element size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pagellm/common/dtype.h"

namespace pagellm {

/// A read-only host view of one tensor inside a memory-mapped safetensors file. It stays
/// valid while the SafetensorsFile (or WeightStore) that produced it is alive.
struct HostTensor {
  std::string name;
  std::string file;  // path of the .safetensors file that holds the data
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // row-major; [] is a scalar
  const void* data = nullptr;  // nbytes of dtype elements, read-only mapping
  size_t nbytes = 0;

  int64_t numel() const;
  /// "[151936, 1024]"
  std::string shape_string() const;
};

/// Converts a shape to "[a, b, c]" for messages.
std::string shape_to_string(const std::vector<int64_t>& shape);
/// The safetensors spelling of a dtype: "F32", "BF16", "F16", "I32", "I64".
const char* safetensors_dtype_name(DType dtype);

/// One .safetensors file, memory-mapped read-only, with its header parsed and checked.
///
/// open() throws Error naming the file (and the tensor) for: a file shorter than the 8-byte
/// length prefix, a header length past the end of the file, a header that is not a JSON
/// object, a malformed entry, an unknown or unsupported dtype, data_offsets that do not
/// match dtype × shape, run past the data section, or overlap another tensor. Once open()
/// returns, every HostTensor lies wholly inside the mapping.
///
/// (The mapping reflects the file: truncating it on disk while it is open makes later
/// reads fault, as with any mmap.)
class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  /// Tensors in the order of their data (ascending data_offsets).
  const std::vector<HostTensor>& tensors() const { return tensors_; }
  /// The "__metadata__" entries (Hugging Face writes {"format": "pt"}).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Size of the whole file in bytes.
  size_t file_size() const { return size_; }

  /// Asks the kernel to start reading a tensor's pages (madvise WILLNEED); optional.
  void prefetch(const HostTensor& tensor) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::vector<HostTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// A tensor to write. `fill(first, count, dst)` writes elements [first, first + count) of the
/// tensor (row-major, dtype elements) into dst; the writer calls it on consecutive ranges
/// and may split a tensor into several calls.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::function<void(int64_t first, int64_t count, void* dst)> fill;

  int64_t numel() const;
  uint64_t nbytes() const;
  /// A tensor whose bytes are copied from memory that outlives the write.
  static TensorToWrite from_memory(std::string name, DType dtype, std::vector<int64_t> shape,
                                   const void* data);
};

/// Writes a .safetensors file as Hugging Face's `safetensors` library does: tensors sorted
/// by descending element size then name, a compact JSON header ("__metadata__" first, then
/// each tensor's "dtype", "shape", "data_offsets" in data order) padded with spaces to a
/// multiple of 8 bytes. The file appears under `path` only when complete (written to
/// path + ".partial", then renamed). Data is produced in chunks of up to 64 MiB while the
/// previous chunk is written, so fill() (which may use OpenMP) overlaps the disk.
/// `on_bytes(n)` is called on the calling thread after each chunk with the bytes just
/// produced; the n add up to the file size.
/// Throws Error for duplicate or empty names, negative dims, or an I/O failure (naming
/// path and errno text).
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}},
                       const std::function<void(uint64_t bytes)>& on_bytes = {});

/// The size in bytes of the file write_safetensors would produce.
uint64_t safetensors_file_size(const std::vector<TensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata = {
                                   {"format", "pt"}});

}  // namespace pagellm
