#include "pagellm/model/lora_image.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "pagellm/common/check.h"

namespace pagellm {
namespace {

// Bᵀ is written in tiles of this many B rows: the tile ([kTileRows, r] in the image dtype,
// at most 64 · 64 · 4 = 16 KiB) stays in L1 while each of its r output rows gets
// kTileRows contiguous elements, instead of one strided element per cache line.
constexpr int64_t kTileRows = 64;
constexpr int kMaxDefaultThreads = 8;

bool is_factor_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// n elements from `from` to `to`, rounding once (through float32) when they differ.
void copy_convert(const void* src, DType from, void* dst, DType to, int64_t n) {
  if (n <= 0) return;
  const size_t count = static_cast<size_t>(n);
  if (from == to) {
    std::memcpy(dst, src, count * dtype_size(to));
  } else if (to == DType::F32) {
    convert_to_f32(src, from, static_cast<float*>(dst), count);
  } else if (from == DType::F32) {
    convert_from_f32(static_cast<const float*>(src), dst, to, count);
  } else {  // bf16 <-> f16: widen a chunk, then narrow it
    constexpr size_t kChunk = 1024;
    float wide[kChunk];
    const auto* s = static_cast<const char*>(src);
    auto* d = static_cast<char*>(dst);
    for (size_t done = 0; done < count; done += kChunk) {
      const size_t k = std::min(kChunk, count - done);
      convert_to_f32(s + done * dtype_size(from), from, wide, k);
      convert_from_f32(wide, d + done * dtype_size(to), to, k);
    }
  }
}

// tile [rows, r] -> rows i < r of Bᵀ at dst (row stride `stride`), columns [0, rows); the
// part from (i0, j0) on, element by element.
template <typename Bits>
void scatter_tile_scalar(const Bits* tile, int64_t rows, int64_t r, Bits* dst, int64_t stride,
                         int64_t i0, int64_t j0) {
  for (int64_t i = 0; i < r; ++i) {
    Bits* out = dst + i * stride;
    for (int64_t j = i < i0 ? j0 : 0; j < rows; ++j) out[j] = tile[j * r + i];
  }
}

#if defined(__SSE2__)
// One 8 x 8 block of 16-bit elements: rows of `src` (stride ss) become columns of `dst`
// (stride ds). Three rounds of unpacks (16-, 32-, 64-bit) instead of 64 scalar moves.
inline void transpose_8x8_u16(const uint16_t* src, int64_t ss, uint16_t* dst, int64_t ds) {
  __m128i row[8];
  for (int k = 0; k < 8; ++k) {
    row[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k * ss));
  }
  __m128i a[8], b[8];
  for (int k = 0; k < 4; ++k) {
    a[2 * k] = _mm_unpacklo_epi16(row[2 * k], row[2 * k + 1]);
    a[2 * k + 1] = _mm_unpackhi_epi16(row[2 * k], row[2 * k + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // h: rows 0..3 or 4..7 of the source
    const __m128i* x = a + 4 * h;
    b[4 * h + 0] = _mm_unpacklo_epi32(x[0], x[2]);
    b[4 * h + 1] = _mm_unpackhi_epi32(x[0], x[2]);
    b[4 * h + 2] = _mm_unpacklo_epi32(x[1], x[3]);
    b[4 * h + 3] = _mm_unpackhi_epi32(x[1], x[3]);
  }
  for (int k = 0; k < 4; ++k) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (2 * k) * ds),
                     _mm_unpacklo_epi64(b[k], b[4 + k]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (2 * k + 1) * ds),
                     _mm_unpackhi_epi64(b[k], b[4 + k]));
  }
}
#endif

template <typename Bits>
void scatter_tile(const void* tile, int64_t rows, int64_t r, void* dst, int64_t stride) {
  const auto* t = static_cast<const Bits*>(tile);
  auto* d = static_cast<Bits*>(dst);
  int64_t i0 = 0, j0 = 0;  // the 8 x 8 blocks cover rows < i0, columns < j0
#if defined(__SSE2__)
  if constexpr (sizeof(Bits) == 2) {  // bf16 / f16 images (the cuda backend's)
    i0 = r / 8 * 8;
    j0 = rows / 8 * 8;
    for (int64_t i = 0; i < i0; i += 8) {
      for (int64_t j = 0; j < j0; j += 8) {
        transpose_8x8_u16(t + j * r + i, r, d + i * stride + j, stride);
      }
    }
  }
#endif
  scatter_tile_scalar(t, rows, r, d, stride, i0, j0);
}

// One unit of work: a block's padding, or one module's A rows or Bᵀ columns (zeros for a
// module the adapter does not target). Tasks write disjoint ranges of the image.
enum class Part : uint8_t { kPadding, kA, kB };

struct Task {
  int32_t block;
  int8_t module;
  Part part;
};

// Runs tasks against one adapter, block list and image (shared, read-only, by the workers).
class ImageWriter {
 public:
  ImageWriter(const LoraAdapter& adapter, const std::vector<LoraImageBlock>& blocks, DType dtype,
              void* image)
      : adapter_(adapter), blocks_(blocks), dtype_(dtype),
        esize_(static_cast<int64_t>(dtype_size(dtype))), image_(static_cast<char*>(image)) {}

  void run(const Task& task) const {
    const LoraImageBlock& b = blocks_[static_cast<size_t>(task.block)];
    const int64_t r = adapter_.config.rank;
    const int64_t W = b.width_total();
    if (task.part == Part::kPadding) {
      zero(b.a_offset + b.num_modules * r * b.in, b.bt_offset);
      zero(b.bt_offset + r * W, b.end);
      return;
    }
    const int mi = task.module;
    const LoraFactors& f = factors(b, mi);
    if (task.part == Part::kA) {
      const int64_t begin = b.a_offset + mi * r * b.in;
      if (f.empty()) {
        zero(begin, begin + r * b.in);
      } else {
        copy_convert(f.a.data, f.a.dtype, at(begin), dtype_, r * b.in);
      }
      return;
    }
    int64_t col = 0;
    for (int m = 0; m < mi; ++m) col += b.width[static_cast<size_t>(m)];
    const int64_t out = b.width[static_cast<size_t>(mi)];
    const int64_t first = b.bt_offset + col;  // row 0's first column of this module
    if (f.empty()) {
      for (int64_t i = 0; i < r; ++i) zero(first + i * W, first + i * W + out);
      return;
    }
    alignas(64) unsigned char tile[kTileRows * kMaxLoraRank * 4];
    const auto* src = static_cast<const char*>(f.b.data);
    const int64_t src_row_bytes = r * static_cast<int64_t>(dtype_size(f.b.dtype));
    for (int64_t j0 = 0; j0 < out; j0 += kTileRows) {
      const int64_t rows = std::min(kTileRows, out - j0);
      copy_convert(src + j0 * src_row_bytes, f.b.dtype, tile, dtype_, rows * r);
      if (esize_ == 2) {
        scatter_tile<uint16_t>(tile, rows, r, at(first + j0), W);
      } else {
        scatter_tile<uint32_t>(tile, rows, r, at(first + j0), W);
      }
    }
  }

 private:
  const LoraFactors& factors(const LoraImageBlock& b, int mi) const {
    return adapter_.layers[b.layer][static_cast<int>(b.modules[static_cast<size_t>(mi)])];
  }
  char* at(int64_t element) const { return image_ + element * esize_; }
  void zero(int64_t begin, int64_t end) const {
    if (end > begin) std::memset(at(begin), 0, static_cast<size_t>((end - begin) * esize_));
  }

  const LoraAdapter& adapter_;
  const std::vector<LoraImageBlock>& blocks_;
  DType dtype_;
  int64_t esize_;
  char* image_;
};

void check_blocks(const LoraAdapter& adapter, const std::vector<LoraImageBlock>& blocks,
                  DType dtype, const void* image, int64_t total) {
  const std::string who = "write_lora_image (adapter " + adapter.path + ")";
  PAGELLM_CHECK(is_factor_dtype(dtype))
      << who << ": image dtype " << dtype_name(dtype)
      << " is not one of float32, bfloat16, float16";
  PAGELLM_CHECK(total >= 0 && (image != nullptr || total == 0))
      << who << ": needs an image of " << total << " elements";
  const int64_t r = adapter.config.rank;
  PAGELLM_CHECK(r >= 1 && r <= kMaxLoraRank)
      << who << ": rank " << r << " is outside 1.." << kMaxLoraRank;
  int64_t next = 0;
  for (size_t k = 0; k < blocks.size(); ++k) {
    const LoraImageBlock& b = blocks[k];
    const std::string where = who + ": block " + std::to_string(k) + " (layer " +
                              std::to_string(b.layer) + ")";
    PAGELLM_CHECK(b.num_modules >= 1 && b.num_modules <= LoraImageBlock::kMaxModules)
        << where << " has " << b.num_modules << " modules; 1.." << LoraImageBlock::kMaxModules
        << " are accepted";
    PAGELLM_CHECK(b.layer < adapter.layers.size())
        << where << ": the adapter has " << adapter.layers.size() << " layers";
    PAGELLM_CHECK(b.a_offset == next && b.a_offset + b.num_modules * r * b.in <= b.bt_offset &&
                  b.bt_offset + r * b.width_total() <= b.end && b.end <= total)
        << where << ": offsets a " << b.a_offset << ", bt " << b.bt_offset << ", end " << b.end
        << " do not hold A [" << b.num_modules * r << ", " << b.in << "] and Bt [" << r
        << ", " << b.width_total() << "] in order from element " << next << " within "
        << total;
    next = b.end;
    for (int mi = 0; mi < b.num_modules; ++mi) {
      const LoraModule m = b.modules[static_cast<size_t>(mi)];
      const LoraFactors& f = adapter.layers[b.layer][static_cast<int>(m)];
      if (f.empty()) continue;
      const int64_t out = b.width[static_cast<size_t>(mi)];
      PAGELLM_CHECK(f.a.rows == r && f.a.cols == b.in && f.b.rows == out && f.b.cols == r &&
                    f.b.data != nullptr)
          << where << " " << lora_module_name(m) << ": factors [" << f.a.rows << ", "
          << f.a.cols << "] and [" << f.b.rows << ", " << f.b.cols << "] do not match ["
          << r << ", " << b.in << "] and [" << out << ", " << r << "]";
      PAGELLM_CHECK(is_factor_dtype(f.a.dtype) && is_factor_dtype(f.b.dtype))
          << where << " " << lora_module_name(m) << ": factor dtypes " << dtype_name(f.a.dtype)
          << " / " << dtype_name(f.b.dtype) << "; float32, bfloat16 and float16 are accepted";
    }
  }
  PAGELLM_CHECK(next == total) << who << ": the blocks end at element " << next
                               << ", the image has " << total;
}

}  // namespace

int64_t LoraImageBlock::width_total() const {
  int64_t w = 0;
  for (int m = 0; m < num_modules; ++m) w += width[static_cast<size_t>(m)];
  return w;
}

void write_lora_image(const LoraAdapter& adapter, const std::vector<LoraImageBlock>& blocks,
                      DType dtype, void* image, int64_t total, int threads) {
  check_blocks(adapter, blocks, dtype, image, total);
  std::vector<Task> tasks;
  for (size_t k = 0; k < blocks.size(); ++k) {
    const auto block = static_cast<int32_t>(k);
    tasks.push_back({block, 0, Part::kPadding});
    for (int mi = 0; mi < blocks[k].num_modules; ++mi) {
      tasks.push_back({block, static_cast<int8_t>(mi), Part::kA});
      tasks.push_back({block, static_cast<int8_t>(mi), Part::kB});
    }
  }
  const ImageWriter writer(adapter, blocks, dtype, image);
  if (threads <= 0) {
    threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1,
                         kMaxDefaultThreads);
  }
  threads = std::max(1, std::min<int>(threads, static_cast<int>(tasks.size())));
  // Tasks are a few hundred KB each (one factor), taken in order by whichever worker is
  // free: the large ones (gate/up, down) and the small ones balance without planning.
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  const auto work = [&] {
    try {
      for (size_t t = next++; t < tasks.size(); t = next++) writer.run(tasks[t]);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      next = tasks.size();
    }
  };
  std::vector<std::thread> workers;
  for (int i = 1; i < threads; ++i) workers.emplace_back(work);
  work();
  for (std::thread& w : workers) w.join();
  if (failure) std::rethrow_exception(failure);
}

std::vector<LoraImageRun> lora_image_runs(const std::vector<LoraImageBlock>& blocks,
                                          int64_t max_elements) {
  PAGELLM_CHECK(max_elements >= 1)
      << "lora_image_runs: a run must hold at least 1 element, got " << max_elements;
  std::vector<LoraImageRun> runs;
  for (size_t k = 0; k < blocks.size(); ++k) {
    const LoraImageBlock& b = blocks[k];
    const int64_t previous_end = k == 0 ? b.a_offset : blocks[k - 1].end;
    PAGELLM_CHECK(b.a_offset == previous_end && b.end >= b.a_offset)
        << "lora_image_runs: block " << k << " (layer " << b.layer << ") spans elements ["
        << b.a_offset << ", " << b.end << "); blocks must follow one another from element "
        << previous_end;
    PAGELLM_CHECK(b.end - b.a_offset <= max_elements)
        << "lora_image_runs: block " << k << " (layer " << b.layer << ") has "
        << b.end - b.a_offset << " elements, more than a run's " << max_elements
        << " (size the runs by lora_image_largest_block)";
    if (runs.empty() || b.end - runs.back().begin > max_elements) {
      runs.push_back({k, k, b.a_offset, b.a_offset});
    }
    runs.back().end_block = k + 1;
    runs.back().end = b.end;
  }
  return runs;
}

int64_t lora_image_largest_block(const std::vector<LoraImageBlock>& blocks) {
  int64_t largest = 0;
  for (const LoraImageBlock& b : blocks) largest = std::max(largest, b.end - b.a_offset);
  return largest;
}

std::vector<LoraImageBlock> lora_image_run_blocks(const std::vector<LoraImageBlock>& blocks,
                                                  const LoraImageRun& run) {
  PAGELLM_CHECK(run.first_block <= run.end_block && run.end_block <= blocks.size())
      << "lora_image_run_blocks: blocks [" << run.first_block << ", " << run.end_block
      << ") of " << blocks.size();
  std::vector<LoraImageBlock> rebased(blocks.begin() + static_cast<std::ptrdiff_t>(run.first_block),
                                      blocks.begin() + static_cast<std::ptrdiff_t>(run.end_block));
  for (LoraImageBlock& b : rebased) {
    b.a_offset -= run.begin;
    b.bt_offset -= run.begin;
    b.end -= run.begin;
  }
  return rebased;
}

}  // namespace pagellm
