// libFuzzer target: SafetensorsFile::open never crashes on any file, and every tensor it
// returns lies wholly inside the file's data section.
//
// Input: the first byte picks a mode, the rest is the payload.
//   even: the payload is the whole file (length prefix, header, data), so the length
//     prefix itself is fuzzed;
//   odd: the payload is the JSON header; the target writes the matching 8-byte length
//     before it and a data section of (first byte >> 1) * 16 bytes after it, so that
//     mutations of the header are not all rejected for a wrong length.
// The file is written to a private temporary folder (open() memory-maps a path). Each
// accepted tensor's bytes are read (a read outside the mapping faults) and its extent is
// checked against the data section.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "pagellm/common/check.h"
#include "pagellm/model/safetensors.h"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "safetensors_fuzz: property violated: %s\n", what);
  std::abort();
}

/// Removes the scratch folder when the fuzzer exits normally.
struct RemovedAtExit {
  std::filesystem::path dir;
  ~RemovedAtExit() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

// Files go to memory (/dev/shm) where there is one: every input is a file write.
std::filesystem::path scratch_root() {
  std::error_code ec;
  if (std::filesystem::is_directory("/dev/shm", ec)) return "/dev/shm";
  return std::filesystem::temp_directory_path();
}

const std::string& scratch_file() {
  static const std::string path = [] {
    const auto dir = scratch_root() / ("pagellm-safetensors-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    static const RemovedAtExit cleanup{dir};
    return (dir / "model.safetensors").string();
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string payload(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string file;
  if ((data[0] & 1) == 0) {
    file = payload;
  } else {
    const uint64_t n = payload.size();
    for (int i = 0; i < 8; ++i) file.push_back(static_cast<char>(n >> (8 * i) & 0xff));
    file += payload;
    file.append(static_cast<size_t>(data[0] >> 1) * 16, '\x5a');
  }
  {
    std::ofstream out(scratch_file(), std::ios::binary | std::ios::trunc);
    out.write(file.data(), static_cast<std::streamsize>(file.size()));
    if (!out) fail("cannot write the scratch file");
  }
  std::unique_ptr<pagellm::SafetensorsFile> st;
  try {
    st = pagellm::SafetensorsFile::open(scratch_file());
  } catch (const pagellm::Error&) {
    return 0;  // rejected with a message: fine
  }
  if (st->file_size() != file.size()) fail("file_size() differs from the file");
  // The oracle: the header as nlohmann reads it. Each tensor's bytes must be exactly the
  // file's bytes at 8 + header length + data_offsets, inside the file.
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | static_cast<uint8_t>(file[i]);
  const nlohmann::json header = nlohmann::json::parse(file.begin() + 8,
                                                      file.begin() + 8 + header_len);
  for (const pagellm::HostTensor& t : st->tensors()) {
    if (t.nbytes != static_cast<size_t>(t.numel()) * pagellm::dtype_size(t.dtype))
      fail("nbytes != numel * element size");
    const auto& offsets = header.at(t.name).at("data_offsets");
    const uint64_t begin = offsets[0].get<uint64_t>();
    const uint64_t end = offsets[1].get<uint64_t>();
    if (end - begin != t.nbytes || 8 + header_len + end > file.size())
      fail("a tensor's data_offsets do not match its bytes or run past the file");
    if (t.nbytes != 0 && std::memcmp(t.data, file.data() + 8 + header_len + begin, t.nbytes) != 0)
      fail("a tensor's bytes are not the file's bytes at its data_offsets");
  }
  return 0;
}
