// The safetensors reader and writer: round trips, the exact Hugging Face layout, and every
// kind of bad file, which must give an Error naming the file and tensor (never a crash).
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>

#include "model/model_test_util.h"
#include "pagellm/model/safetensors.h"

namespace pagellm {
namespace {

using testing::error_of;
using testing::safetensors_bytes;
using testing::TempDir;
using testing::write_file;

std::string open_error(const std::string& path) {
  return error_of([&] { SafetensorsFile::open(path); });
}

const HostTensor& find(const SafetensorsFile& f, const std::string& name) {
  for (const HostTensor& t : f.tensors())
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

// Deterministic bytes of a given length.
std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

class RoundTrip : public ::testing::TestWithParam<DType> {};

TEST_P(RoundTrip, WriteThenReadGivesTheSameTensors) {
  const DType dtype = GetParam();
  const size_t elem = dtype_size(dtype);
  TempDir dir;
  const std::string path = dir.file("x.safetensors");
  auto matrix = pattern(5 * 7 * elem, 1);
  auto vector = pattern(3 * elem, 2);
  auto scalar = pattern(elem, 3);
  std::vector<TensorToWrite> tensors = {
      TensorToWrite::from_memory("model.w", dtype, {5, 7}, matrix.data()),
      TensorToWrite::from_memory("model.a.bias", dtype, {3}, vector.data()),
      TensorToWrite::from_memory("scalar", dtype, {}, scalar.data()),
      TensorToWrite::from_memory("empty", dtype, {0, 4}, nullptr),
  };
  uint64_t reported = 0;
  write_safetensors(path, tensors, {{"format", "pt"}, {"note", "hi"}},
                    [&](uint64_t n) { reported += n; });
  EXPECT_EQ(reported, safetensors_file_size(tensors, {{"format", "pt"}, {"note", "hi"}}));
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));

  auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->file_size(), reported);
  ASSERT_EQ(file->tensors().size(), 4u);
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->metadata().at("note"), "hi");
  const std::vector<std::pair<std::string, std::vector<uint8_t>*>> expected = {
      {"model.w", &matrix}, {"model.a.bias", &vector}, {"scalar", &scalar}};
  for (const auto& [name, bytes] : expected) {
    const HostTensor& t = find(*file, name);
    EXPECT_EQ(t.dtype, dtype);
    EXPECT_EQ(t.file, path);
    ASSERT_EQ(t.nbytes, bytes->size());
    EXPECT_EQ(std::memcmp(t.data, bytes->data(), t.nbytes), 0) << name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % elem, 0u) << name << " is misaligned";
  }
  EXPECT_EQ(find(*file, "model.w").shape, (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(find(*file, "scalar").shape, std::vector<int64_t>{});
  EXPECT_EQ(find(*file, "scalar").numel(), 1);
  EXPECT_EQ(find(*file, "empty").shape, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(find(*file, "empty").nbytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, RoundTrip,
                         ::testing::Values(DType::F32, DType::BF16, DType::F16, DType::I32,
                                           DType::I64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(SafetensorsWriter, WritesTheBytesHuggingFaceWrites) {
  // The same tensors through Python's safetensors.numpy.save(..., metadata={"format": "pt"})
  // give exactly this header: sorted by descending dtype size, then name, compact JSON.
  TempDir dir;
  const float a[2] = {0, 1};
  const uint16_t b[3] = {0, 0x3c00, 0x4000};  // float16 0, 1, 2
  const float s = 3;
  std::vector<TensorToWrite> tensors = {
      TensorToWrite::from_memory("b", DType::F16, {3}, b),
      TensorToWrite::from_memory("a", DType::F32, {2}, a),
      TensorToWrite::from_memory("c", DType::I64, {0, 3}, nullptr),
      TensorToWrite::from_memory("s", DType::F32, {}, &s),
  };
  write_safetensors(dir.file("hf.safetensors"), tensors);
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"c":{"dtype":"I64","shape":[0,3],"data_offsets":[0,0]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("s":{"dtype":"F32","shape":[],"data_offsets":[8,12]},)"
      R"("b":{"dtype":"F16","shape":[3],"data_offsets":[12,18]}})";
  ASSERT_EQ(header.size() % 8, 0u);  // 248 bytes: no padding needed
  std::string data(18, '\0');
  std::memcpy(&data[0], a, 8);
  std::memcpy(&data[8], &s, 4);
  std::memcpy(&data[12], b, 6);
  EXPECT_EQ(testing::read_file(dir.file("hf.safetensors")), safetensors_bytes(header, data));
}

TEST(SafetensorsWriter, PadsTheHeaderWithSpacesToEightBytes) {
  TempDir dir;
  const uint16_t v[1] = {0x3f80};
  write_safetensors(dir.file("p.safetensors"),
                    {TensorToWrite::from_memory("xy", DType::BF16, {1}, v)});
  const std::string bytes = testing::read_file(dir.file("p.safetensors"));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const std::string compact =
      R"({"__metadata__":{"format":"pt"},"xy":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}})";
  ASSERT_NE(compact.size() % 8, 0u);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.substr(8, n), compact + std::string(n - compact.size(), ' '));
  EXPECT_EQ(bytes.size(), 8 + n + 2);
}

TEST(SafetensorsWriter, StreamsTensorsLargerThanAChunk) {
  // 20M int32 = 80 MB: more than one 64 MiB chunk, so a tensor is split across fill calls.
  TempDir dir;
  const int64_t n = 20'000'000;
  TensorToWrite big;
  big.name = "big";
  big.dtype = DType::I32;
  big.shape = {n};
  int fill_calls = 0;
  big.fill = [&](int64_t first, int64_t count, void* dst) {
    ++fill_calls;
    auto* out = static_cast<int32_t*>(dst);
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(first + i);
  };
  int reports = 0;
  uint64_t total = 0;
  write_safetensors(dir.file("big.safetensors"), {big}, {{"format", "pt"}},
                    [&](uint64_t b) { ++reports, total += b; });
  EXPECT_GE(fill_calls, 2);
  EXPECT_GE(reports, 2);
  auto file = SafetensorsFile::open(dir.file("big.safetensors"));
  EXPECT_EQ(total, file->file_size());
  const auto* v = static_cast<const int32_t*>(file->tensors().at(0).data);
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += v[i] != i;
  EXPECT_EQ(wrong, 0);
}

TEST(SafetensorsWriter, RejectsBadInputAndLeavesNoFile) {
  TempDir dir;
  const float v = 1;
  const std::string path = dir.file("bad.safetensors");
  std::string err = error_of([&] {
    write_safetensors(path, {TensorToWrite::from_memory("a", DType::F32, {}, &v),
                             TensorToWrite::from_memory("a", DType::F32, {}, &v)});
  });
  EXPECT_NE(err.find("'a' is listed twice"), std::string::npos) << err;
  err = error_of(
      [&] { write_safetensors(path, {TensorToWrite::from_memory("n", DType::F32, {-1}, &v)}); });
  EXPECT_NE(err.find("invalid shape"), std::string::npos) << err;
  err = error_of(
      [&] { write_safetensors(path, {TensorToWrite::from_memory("", DType::F32, {}, &v)}); });
  EXPECT_NE(err.find("empty name"), std::string::npos) << err;

  // A fill that throws halfway: no file and no .partial remain.
  TensorToWrite t;
  t.name = "t";
  t.dtype = DType::F32;
  t.shape = {4};
  t.fill = [](int64_t, int64_t, void*) { throw Error("generator failed"); };
  err = error_of([&] { write_safetensors(path, {t}); });
  EXPECT_EQ(err, "generator failed");
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));

  err = error_of([&] {
    write_safetensors(dir.file("no/such/folder/x.safetensors"),
                      {TensorToWrite::from_memory("a", DType::F32, {}, &v)});
  });
  EXPECT_NE(err.find("cannot create"), std::string::npos) << err;
}

// ---- bad files --------------------------------------------------------------------------

// A valid two-tensor file to corrupt: a F32 [2] at [0, 8) and a BF16 [4] at [8, 16).
const std::string kGoodHeader =
    R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
    R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[8,16]}})";
const std::string kGoodData(16, '\x01');

class BadFile : public ::testing::Test {
 protected:
  // Writes the bytes and returns open()'s error, checking it names the file.
  std::string error_for(const std::string& bytes) {
    write_file(path_, bytes);
    std::string err = open_error(path_);
    EXPECT_NE(err.find(path_), std::string::npos) << "message does not name the file: " << err;
    return err;
  }
  std::string error_for_header(const std::string& header, const std::string& data = kGoodData) {
    return error_for(safetensors_bytes(header, data));
  }
  TempDir dir_;
  std::string path_ = dir_.file("model.safetensors");
};

TEST_F(BadFile, TheGoodFileOpens) {
  write_file(path_, safetensors_bytes(kGoodHeader, kGoodData));
  auto f = SafetensorsFile::open(path_);
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors()[0].name, "a");
  EXPECT_EQ(f->tensors()[1].dtype, DType::BF16);
  EXPECT_TRUE(f->metadata().empty());
}

TEST_F(BadFile, Truncated) {
  EXPECT_NE(error_for("").find("truncated"), std::string::npos);
  EXPECT_NE(error_for("\x10\0\0").find("truncated"), std::string::npos);
  // Cut inside the data: the last tensor runs past the end.
  std::string full = safetensors_bytes(kGoodHeader, kGoodData);
  std::string err = error_for(full.substr(0, full.size() - 3));
  EXPECT_NE(err.find("tensor 'b'"), std::string::npos) << err;
  EXPECT_NE(err.find("run past the end of the data section"), std::string::npos) << err;
  // Cut inside the header.
  err = error_for(full.substr(0, 20));
  EXPECT_NE(err.find("runs past the end of the file"), std::string::npos) << err;
}

TEST_F(BadFile, HeaderLengthPastTheEnd) {
  std::string err = error_for(safetensors_bytes(kGoodHeader, kGoodData, 1u << 20));
  EXPECT_NE(err.find("header length is 1048576"), std::string::npos) << err;
  // Lengths whose sum with 8 would overflow must not wrap around.
  err = error_for(safetensors_bytes(kGoodHeader, kGoodData, UINT64_MAX - 3));
  EXPECT_NE(err.find("runs past the end of the file"), std::string::npos) << err;
}

TEST_F(BadFile, HeaderNotJson) {
  EXPECT_NE(error_for_header("{\"a\": {\"dtype\": ").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_for_header("PK\x03\x04 zip?").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_for_header("        ").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_for_header("[1, 2, 3]").find("must be a JSON object"), std::string::npos);
  EXPECT_NE(error_for_header(R"({"a": 5})").find("tensor 'a'"), std::string::npos);
}

// A number past the double range makes nlohmann throw out_of_range, not parse_error; it
// escaped open() as a non-pagellm exception until the readers caught json::exception.
TEST_F(BadFile, NumberPastTheDoubleRangeIsAJsonError) {
  const std::string err = error_for_header(R"({"__metadata__":{"x":1e400}})");
  EXPECT_NE(err.find("the header is not valid JSON"), std::string::npos) << err;
  EXPECT_NE(err.find("number overflow"), std::string::npos) << err;
}

TEST_F(BadFile, MalformedEntries) {
  std::string err = error_for_header(R"({"a":{"shape":[2],"data_offsets":[0,8]}})");
  EXPECT_NE(err.find("tensor 'a': missing string \"dtype\""), std::string::npos) << err;
  err = error_for_header(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})");
  EXPECT_NE(err.find("missing list \"shape\""), std::string::npos) << err;
  err = error_for_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})");
  EXPECT_NE(err.find("data_offsets"), std::string::npos) << err;
  err = error_for_header(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})");
  EXPECT_NE(err.find("non-negative integers"), std::string::npos) << err;
  err = error_for_header(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})");
  EXPECT_NE(err.find("non-negative integers"), std::string::npos) << err;
  err = error_for_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})");
  EXPECT_NE(err.find("two non-negative integers"), std::string::npos) << err;
  err = error_for_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})");
  EXPECT_NE(err.find("end before they begin"), std::string::npos) << err;
  err = error_for_header(R"({"__metadata__":[1],"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})");
  EXPECT_NE(err.find("__metadata__"), std::string::npos) << err;
}

TEST_F(BadFile, DuplicateTensorInHeader) {
  std::string err = error_for_header(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})");
  EXPECT_NE(err.find("tensor 'a' appears twice"), std::string::npos) << err;
}

TEST_F(BadFile, OverlappingOffsets) {
  std::string err = error_for_header(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[4,12]}})");
  EXPECT_NE(err.find("'a'"), std::string::npos) << err;
  EXPECT_NE(err.find("'b'"), std::string::npos) << err;
  EXPECT_NE(err.find("overlap"), std::string::npos) << err;
  // The same range twice.
  err = error_for_header(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}})");
  EXPECT_NE(err.find("overlap"), std::string::npos) << err;
}

TEST_F(BadFile, OutOfRangeOffsets) {
  std::string err = error_for_header(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})");
  EXPECT_NE(err.find("tensor 'a': data_offsets [16, 24] run past the end"), std::string::npos)
      << err;
  err = error_for_header(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551608,18446744073709551615]}})");
  EXPECT_NE(err.find("run past the end"), std::string::npos) << err;
}

TEST_F(BadFile, OffsetsNotMatchingDtypeTimesShape) {
  std::string err = error_for_header(
      R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})");
  EXPECT_NE(err.find("tensor 'a'"), std::string::npos) << err;
  EXPECT_NE(err.find("hold 8 bytes"), std::string::npos) << err;
  EXPECT_NE(err.find("needs 12 bytes"), std::string::npos) << err;
  // Shapes whose byte count overflows 64 bits.
  err = error_for_header(
      R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})");
  EXPECT_NE(err.find("too large"), std::string::npos) << err;
}

TEST_F(BadFile, UnknownDtype) {
  std::string err = error_for_header(R"({"a":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,8]}})");
  EXPECT_NE(err.find("tensor 'a': unknown dtype \"Q4_K\""), std::string::npos) << err;
  EXPECT_NE(err.find("F32, BF16, F16"), std::string::npos) << err;
  err = error_for_header(R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})");
  EXPECT_NE(err.find("unsupported dtype \"F64\""), std::string::npos) << err;
}

TEST_F(BadFile, NotARegularFile) {
  std::string err = open_error(dir_.path());
  EXPECT_NE(err.find("not a regular file"), std::string::npos) << err;
  err = open_error(dir_.file("missing.safetensors"));
  EXPECT_NE(err.find("cannot open"), std::string::npos) << err;
}

// Every prefix of a valid file, and random corruptions of its header, either open or
// throw Error; none may crash or read outside the map.
TEST_F(BadFile, PrefixesAndCorruptionsNeverCrash) {
  const std::string full = safetensors_bytes(kGoodHeader, kGoodData);
  for (size_t n = 0; n < full.size(); ++n) {
    write_file(path_, full.substr(0, n));
    EXPECT_THROW(SafetensorsFile::open(path_), Error) << "prefix of " << n << " bytes";
  }
  std::mt19937 rng(7);
  int opened = 0;
  for (int iter = 0; iter < 400; ++iter) {
    std::string bytes = full;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k)
      bytes[rng() % (8 + kGoodHeader.size())] = static_cast<char>(rng());
    write_file(path_, bytes);
    try {
      auto f = SafetensorsFile::open(path_);
      // Everything handed out lies inside the file: read every byte (ASan would flag it).
      uint64_t sum = 0;
      for (const HostTensor& t : f->tensors()) {
        EXPECT_LE(t.nbytes, f->file_size());
        for (size_t i = 0; i < t.nbytes; ++i) sum += static_cast<const uint8_t*>(t.data)[i];
      }
      EXPECT_LE(sum, 255u * f->file_size());
      ++opened;
    } catch (const Error&) {
    }
  }
  EXPECT_LT(opened, 400);  // most corruptions are caught
}

}  // namespace
}  // namespace pagellm
