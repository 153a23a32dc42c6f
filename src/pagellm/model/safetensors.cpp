#include "pagellm/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>
#include <numeric>
#include <set>

#include <nlohmann/json.hpp>

#include "pagellm/common/check.h"

namespace pagellm {

namespace {

using json = nlohmann::json;

// The Rust library refuses headers over 100 MB; a real header is a few hundred KB.
constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;
// Bytes produced per chunk by the writer; two chunks are in memory at once.
constexpr size_t kWriteChunkBytes = 64ull << 20;

struct DTypeName {
  const char* name;
  DType dtype;
};
constexpr DTypeName kReadableDTypes[] = {{"F32", DType::F32},
                                         {"BF16", DType::BF16},
                                         {"F16", DType::F16},
                                         {"I32", DType::I32},
                                         {"I64", DType::I64}};
// Valid safetensors dtypes that pagellm does not read (so the message can say which).
const std::set<std::string> kOtherSafetensorsDTypes = {
    "BOOL", "U8", "I8", "I16", "U16", "U32", "U64", "F64", "F8_E4M3", "F8_E5M2",
    "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64"};

std::string errno_text() { return std::strerror(errno); }

// Product of dims with overflow detection; false when it does not fit in int64.
bool checked_numel(const std::vector<int64_t>& shape, int64_t* out) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return false;
  }
  *out = n;
  return true;
}

// The Rust library's sort key: descending dtype (its enum is ordered by size), then name.
int safetensors_dtype_rank(DType t) {
  switch (t) {
    case DType::F16: return 11;
    case DType::BF16: return 12;
    case DType::I32: return 13;
    case DType::F32: return 15;
    case DType::I64: return 17;
  }
  return 0;
}

}  // namespace

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string HostTensor::shape_string() const { return shape_to_string(shape); }

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

const char* safetensors_dtype_name(DType dtype) {
  for (const auto& d : kReadableDTypes)
    if (d.dtype == dtype) return d.name;
  return "?";
}

// ---- reader -----------------------------------------------------------------------------

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;

  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  PAGELLM_CHECK(fd >= 0) << path << ": cannot open: " << errno_text();
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    PAGELLM_FAIL() << path << ": not a regular file";
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    PAGELLM_FAIL() << path << ": truncated: the file is " << size
                   << " bytes, but a safetensors file starts with an 8-byte header length";
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const std::string map_error = errno_text();
  ::close(fd);
  PAGELLM_CHECK(map != MAP_FAILED) << path << ": cannot mmap " << size << " bytes: " << map_error;
  file->map_ = map;
  file->size_ = size;

  const auto* bytes = static_cast<const uint8_t*>(map);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | bytes[i];  // little-endian
  PAGELLM_CHECK(header_len <= size - 8)
      << path << ": truncated or not a safetensors file: the header length is " << header_len
      << " bytes, which runs past the end of the file (" << size << " bytes)";
  PAGELLM_CHECK(header_len <= kMaxHeaderBytes)
      << path << ": the header length is " << header_len << " bytes, over the "
      << kMaxHeaderBytes << "-byte limit; not a safetensors file?";
  const char* header_begin = reinterpret_cast<const char*>(bytes + 8);
  const char* header_end = header_begin + header_len;
  const uint64_t data_size = size - 8 - header_len;
  const uint8_t* data = bytes + 8 + header_len;

  // JSON objects may repeat a key (the parser keeps the last); in a header that would hide a
  // tensor, so the callback notes top-level duplicates.
  std::set<std::string> keys;
  std::string duplicate;
  json::parser_callback_t note_keys = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string() &&
        !keys.insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  json header;
  try {
    header = json::parse(header_begin, header_end, note_keys);
  } catch (const json::exception& e) {
    PAGELLM_FAIL() << path << ": the header is not valid JSON: " << e.what();
  }
  PAGELLM_CHECK(duplicate.empty()) << path << ": tensor '" << duplicate
                                   << "' appears twice in the header";
  PAGELLM_CHECK(header.is_object())
      << path << ": the header must be a JSON object of tensors, got a " << header.type_name();

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == "__metadata__") {
      PAGELLM_CHECK(entry.is_object() || entry.is_null())
          << path << ": \"__metadata__\" must be an object of strings";
      if (entry.is_object())
        for (auto m = entry.begin(); m != entry.end(); ++m)
          file->metadata_[m.key()] = m->is_string() ? m->get<std::string>() : m->dump();
      continue;
    }
    const std::string where = path + ": tensor '" + name + "'";
    PAGELLM_CHECK(entry.is_object())
        << where << ": expected {\"dtype\", \"shape\", \"data_offsets\"}, got " << entry.dump();
    PAGELLM_CHECK(entry.contains("dtype") && entry["dtype"].is_string())
        << where << ": missing string \"dtype\"";
    PAGELLM_CHECK(entry.contains("shape") && entry["shape"].is_array())
        << where << ": missing list \"shape\"";
    PAGELLM_CHECK(entry.contains("data_offsets") && entry["data_offsets"].is_array() &&
                  entry["data_offsets"].size() == 2)
        << where << ": missing \"data_offsets\" [begin, end]";

    HostTensor t;
    t.name = name;
    t.file = path;
    const std::string dtype = entry["dtype"].get<std::string>();
    bool known = false;
    for (const auto& d : kReadableDTypes) {
      if (dtype == d.name) {
        t.dtype = d.dtype;
        known = true;
      }
    }
    PAGELLM_CHECK(known) << where << ": "
                         << (kOtherSafetensorsDTypes.count(dtype) ? "unsupported" : "unknown")
                         << " dtype \"" << dtype
                         << "\" (pagellm reads F32, BF16, F16, I32 and I64)";
    for (const json& d : entry["shape"]) {
      PAGELLM_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0)
          << where << ": shape " << entry["shape"].dump()
          << " must be a list of non-negative integers";
      t.shape.push_back(d.get<int64_t>());
    }
    for (const json& o : entry["data_offsets"]) {
      PAGELLM_CHECK(o.is_number_unsigned())
          << where << ": data_offsets " << entry["data_offsets"].dump()
          << " must be two non-negative integers";
    }
    const uint64_t begin = entry["data_offsets"][0].get<uint64_t>();
    const uint64_t end = entry["data_offsets"][1].get<uint64_t>();
    PAGELLM_CHECK(begin <= end) << where << ": data_offsets [" << begin << ", " << end
                                << "] end before they begin";
    PAGELLM_CHECK(end <= data_size)
        << where << ": data_offsets [" << begin << ", " << end
        << "] run past the end of the data section (" << data_size
        << " bytes): the file is truncated or the header is wrong";
    int64_t numel = 0;
    uint64_t expected = 0;
    PAGELLM_CHECK(checked_numel(t.shape, &numel) &&
                  !__builtin_mul_overflow(static_cast<uint64_t>(numel),
                                          static_cast<uint64_t>(dtype_size(t.dtype)), &expected))
        << where << ": shape " << t.shape_string() << " is too large";
    PAGELLM_CHECK(end - begin == expected)
        << where << ": data_offsets [" << begin << ", " << end << "] hold " << end - begin
        << " bytes, but dtype " << dtype << " with shape " << t.shape_string() << " needs "
        << expected << " bytes";
    t.data = data + begin;
    t.nbytes = static_cast<size_t>(expected);
    file->tensors_.push_back(std::move(t));
  }

  // Data order, then overlap: each tensor must end at or before the next one begins.
  auto offset = [data](const HostTensor& t) { return static_cast<const uint8_t*>(t.data) - data; };
  std::sort(file->tensors_.begin(), file->tensors_.end(),
            [&](const HostTensor& a, const HostTensor& b) {
              return offset(a) != offset(b) ? offset(a) < offset(b) : a.nbytes < b.nbytes;
            });
  const HostTensor* previous = nullptr;
  for (const HostTensor& t : file->tensors_) {
    if (t.nbytes == 0) continue;
    if (previous != nullptr) {
      PAGELLM_CHECK(offset(*previous) + static_cast<ptrdiff_t>(previous->nbytes) <= offset(t))
          << path << ": tensors '" << previous->name << "' (data_offsets [" << offset(*previous)
          << ", " << offset(*previous) + previous->nbytes << "]) and '" << t.name
          << "' (data_offsets [" << offset(t) << ", " << offset(t) + t.nbytes
          << "]) overlap";
    }
    previous = &t;
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

void SafetensorsFile::prefetch(const HostTensor& tensor) const {
  if (tensor.nbytes == 0) return;
  const long page = ::sysconf(_SC_PAGESIZE);
  auto begin = reinterpret_cast<uintptr_t>(tensor.data) & ~static_cast<uintptr_t>(page - 1);
  auto end = reinterpret_cast<uintptr_t>(tensor.data) + tensor.nbytes;
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);  // a hint: ignore errors
}

// ---- writer -----------------------------------------------------------------------------

int64_t TensorToWrite::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t TensorToWrite::nbytes() const {
  return static_cast<uint64_t>(numel()) * dtype_size(dtype);
}

TensorToWrite TensorToWrite::from_memory(std::string name, DType dtype,
                                         std::vector<int64_t> shape, const void* data) {
  TensorToWrite t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  const size_t elem = dtype_size(dtype);
  t.fill = [data, elem](int64_t first, int64_t count, void* dst) {
    std::memcpy(dst, static_cast<const char*>(data) + first * elem, count * elem);
  };
  return t;
}

namespace {

struct WritePlan {
  std::string header;          // padded JSON, without the 8-byte length
  std::vector<size_t> order;   // indices into the tensor list, in data order
  uint64_t data_bytes = 0;
  uint64_t file_bytes() const { return 8 + header.size() + data_bytes; }
};

WritePlan plan_write(const std::string& path, const std::vector<TensorToWrite>& tensors,
                     const std::map<std::string, std::string>& metadata) {
  WritePlan plan;
  std::set<std::string> seen;
  for (const TensorToWrite& t : tensors) {
    PAGELLM_CHECK(!t.name.empty()) << path << ": a tensor has an empty name";
    PAGELLM_CHECK(t.name != "__metadata__") << path << ": \"__metadata__\" is not a tensor name";
    PAGELLM_CHECK(seen.insert(t.name).second) << path << ": tensor '" << t.name
                                              << "' is listed twice";
    int64_t numel = 0;
    PAGELLM_CHECK(checked_numel(t.shape, &numel))
        << path << ": tensor '" << t.name << "' has an invalid shape " << shape_to_string(t.shape);
    PAGELLM_CHECK(t.fill || numel == 0) << path << ": tensor '" << t.name << "' has no data";
  }
  plan.order.resize(tensors.size());
  std::iota(plan.order.begin(), plan.order.end(), size_t{0});
  std::sort(plan.order.begin(), plan.order.end(), [&](size_t a, size_t b) {
    int ra = safetensors_dtype_rank(tensors[a].dtype), rb = safetensors_dtype_rank(tensors[b].dtype);
    return ra != rb ? ra > rb : tensors[a].name < tensors[b].name;
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (size_t i : plan.order) {
    const TensorToWrite& t = tensors[i];
    const uint64_t begin = plan.data_bytes;
    plan.data_bytes += t.nbytes();
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {begin, plan.data_bytes}}};
  }
  plan.header = header.dump();
  plan.header.append((8 - plan.header.size() % 8) % 8, ' ');
  return plan;
}

// Writes a byte stream to path + ".partial" through two buffers: the caller fills one while
// a background task writes the other. finish() renames the file into place.
class DoubleBufferedFile {
 public:
  DoubleBufferedFile(const std::string& path, size_t chunk_bytes)
      : path_(path), partial_(path + ".partial"), chunk_(chunk_bytes) {
    fd_ = ::open(partial_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    PAGELLM_CHECK(fd_ >= 0) << partial_ << ": cannot create: " << errno_text();
    buffers_[0].reset(new char[chunk_]);
    buffers_[1].reset(new char[chunk_]);
  }
  ~DoubleBufferedFile() {
    if (pending_.valid()) pending_.wait();
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(partial_.c_str());  // not finished: leave no half-written file behind
    }
  }

  /// Space for up to `want` bytes in the current buffer (at least one byte).
  char* reserve(size_t want, size_t* got) {
    if (used_ == chunk_) flush();
    *got = std::min(want, chunk_ - used_);
    return buffers_[current_].get() + used_;
  }
  void commit(size_t n) { used_ += n; }
  /// Bytes committed since the last call.
  size_t take_committed() {
    size_t n = committed_total_ - reported_;
    reported_ = committed_total_;
    return n;
  }
  void flush() {
    if (used_ == 0) return;
    if (pending_.valid()) pending_.get();  // the other buffer is free again; rethrows
    const char* buf = buffers_[current_].get();
    const size_t n = used_;
    pending_ = std::async(std::launch::async, [this, buf, n] { write_all(buf, n); });
    current_ ^= 1;
    used_ = 0;
    committed_total_ += n;
  }
  void finish() {
    flush();
    if (pending_.valid()) pending_.get();
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) {
      ::unlink(partial_.c_str());
      PAGELLM_FAIL() << partial_ << ": close failed: " << errno_text();
    }
    if (std::rename(partial_.c_str(), path_.c_str()) != 0) {
      const std::string err = errno_text();
      ::unlink(partial_.c_str());
      PAGELLM_FAIL() << "cannot rename " << partial_ << " to " << path_ << ": " << err;
    }
  }

 private:
  void write_all(const char* buf, size_t n) {
    while (n > 0) {
      ssize_t w = ::write(fd_, buf, n);
      if (w < 0 && errno == EINTR) continue;
      PAGELLM_CHECK(w > 0) << partial_ << ": write failed: " << errno_text();
      buf += w;
      n -= static_cast<size_t>(w);
    }
  }

  std::string path_, partial_;
  size_t chunk_;
  int fd_ = -1;
  std::unique_ptr<char[]> buffers_[2];
  int current_ = 0;
  size_t used_ = 0;
  size_t committed_total_ = 0, reported_ = 0;
  std::future<void> pending_;
};

}  // namespace

uint64_t safetensors_file_size(const std::vector<TensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  return plan_write("(size)", tensors, metadata).file_bytes();
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const std::function<void(uint64_t bytes)>& on_bytes) {
  const WritePlan plan = plan_write(path, tensors, metadata);
  // Every tensor starts at a multiple of its element size (descending-size order, header
  // padded to 8), and so does every chunk boundary, because the chunk size is a multiple of 8.
  const size_t chunk = static_cast<size_t>(
      std::min<uint64_t>(kWriteChunkBytes, (plan.file_bytes() + 7) / 8 * 8));
  DoubleBufferedFile out(path, chunk);
  auto report = [&] {
    if (on_bytes) {
      size_t n = out.take_committed();
      if (n) on_bytes(n);
    }
  };
  auto put_bytes = [&](const char* src, size_t n) {
    while (n > 0) {
      size_t got = 0;
      char* dst = out.reserve(n, &got);
      std::memcpy(dst, src, got);
      out.commit(got);
      src += got;
      n -= got;
    }
  };

  char length[8];
  const uint64_t header_len = plan.header.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>(header_len >> (8 * i) & 0xff);
  put_bytes(length, 8);
  put_bytes(plan.header.data(), plan.header.size());

  for (size_t i : plan.order) {
    const TensorToWrite& t = tensors[i];
    const size_t elem = dtype_size(t.dtype);
    const int64_t numel = t.numel();
    for (int64_t first = 0; first < numel;) {
      size_t got = 0;
      char* dst = out.reserve(static_cast<size_t>(numel - first) * elem, &got);
      const int64_t count = static_cast<int64_t>(got / elem);
      PAGELLM_ASSERT(count > 0 && got % elem == 0) << "unaligned chunk";
      t.fill(first, count, dst);
      out.commit(static_cast<size_t>(count) * elem);
      first += count;
      report();
    }
  }
  out.finish();
  report();
}

}  // namespace pagellm
