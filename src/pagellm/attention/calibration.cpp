#include "pagellm/attention/calibration.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "pagellm/attention/attention_call.h"
#include "pagellm/common/check.h"

namespace pagellm {

int32_t AttentionCallShape::num_tokens() const {
  int32_t t = 0;
  for (int32_t x : q) t += x;
  return t;
}

bool AttentionCallShape::decode() const {
  return std::all_of(q.begin(), q.end(), [](int32_t x) { return x == 1; });
}

bool AttentionCallShape::ragged_query() const {
  return std::adjacent_find(q.begin(), q.end(), std::not_equal_to<>()) != q.end();
}

ShapeClass AttentionCallShape::shape_class() const {
  int32_t max_q = 0, max_kv = 0;
  int64_t tokens = 0;
  for (int32_t x : q) {
    max_q = std::max(max_q, x);
    tokens += x;
  }
  for (int32_t x : kv) max_kv = std::max(max_kv, x);
  return classify_shape(max_q, tokens, max_kv, ragged_query());
}

int64_t AttentionCallShape::work() const {
  int64_t pairs = 0;
  for (size_t i = 0; i < q.size(); ++i) pairs += causal_pairs(q[i], kv[i]);
  return pairs * num_q_heads;
}

void CalibrationOptions::validate() const {
  PAGELLM_CHECK(iters >= 1) << "calibration iterations must be at least 1, got " << iters;
  PAGELLM_CHECK(layers >= 1) << "calibration layers must be at least 1, got " << layers;
  PAGELLM_CHECK(std::isfinite(margin) && margin >= 0)
      << "calibration margin must be a finite number >= 0 (0.05 is 5 %), got " << margin;
  PAGELLM_CHECK(!page_sizes.empty()) << "calibration needs at least one page size";
  for (int32_t p : page_sizes) {
    PAGELLM_CHECK(p >= 1 && p <= 1024) << "calibration page size must be in [1, 1024], got " << p;
  }
  PAGELLM_CHECK(device >= 0) << "CUDA device must be >= 0, got " << device;
}

std::string CalibrationOptions::source() const {
  std::ostringstream s;
  s << "pagellm calibrate-attention" << (quick ? " --quick" : "") << " --iters " << iters
    << " --margin " << margin << " --layers " << layers << " --page-sizes ";
  for (size_t i = 0; i < page_sizes.size(); ++i) s << (i ? "," : "") << page_sizes[i];
  s << " --seed " << seed;
  return s.str();
}

std::vector<AttentionCallShape> calibration_grid(const CalibrationOptions& a, std::mt19937& rng) {
  a.validate();
  using Heads = std::vector<std::pair<int32_t, int32_t>>;
  using Ints = std::vector<int32_t>;
  const Heads heads = a.quick ? Heads{{32, 8}} : Heads{{16, 8}, {32, 8}, {64, 8}};
  const Ints batches = a.quick ? Ints{1, 16, 64} : Ints{1, 4, 16, 64};
  const Ints qlens = a.quick ? Ints{32, 512, 4096} : Ints{32, 128, 512, 2048, 8192};
  // Chunked prefill after a cached prefix: query lengths 32 to 2048, prefixes in every KV
  // bucket from 1025-4096 to 16385-65536; with batch 4 (at most 4096 tokens), every query-
  // token bucket from 2-64 to 1025-4096 has at least two points past 4096 keys.
  const Ints chunk_q = {32, 64, 128, 256, 512, 1024, 2048};
  const Ints chunk_prefixes = a.quick ? Ints{2048, 8192, 32768} : Ints{2048, 4096, 8192, 16384, 32768};
  const Ints chunk_batches = a.quick ? Ints{1, 4} : Ints{1, 4, 16};
  // The engine's mixed steps: one or a few chunks, then one-token decode rows (KV 1..8192).
  const std::vector<std::pair<int32_t, int32_t>> mixed_chunks =
      a.quick ? std::vector<std::pair<int32_t, int32_t>>{{1, 64}, {1, 512}, {1, 2048}, {3, 512}}
              : std::vector<std::pair<int32_t, int32_t>>{{1, 64}, {1, 256}, {1, 512}, {1, 1024},
                                                         {1, 2048}, {3, 512}, {2, 2048}};
  const Ints mixed_prefixes = a.quick ? Ints{0, 8192, 32768} : Ints{0, 2048, 8192, 32768};
  const Ints mixed_rows = {63, 255};
  const Ints decode_batches = a.quick ? Ints{8, 64, 256} : Ints{1, 8, 32, 128, 256};
  const Ints decode_kv = a.quick ? Ints{512, 8192} : Ints{256, 2048, 16384};
  constexpr int64_t kMaxChunkBatchTokens = int64_t{1} << 19;  // KV tokens of one chunk point
  constexpr int32_t kMixedRowMaxKv = 8192;
  std::vector<AttentionCallShape> grid;
  for (int32_t page : a.page_sizes) {
    for (auto [hq, hkv] : heads) {
      const auto shape = [&, hq = hq, hkv = hkv](std::string label, bool ragged) {
        AttentionCallShape p;
        p.label = std::move(label);
        p.num_q_heads = hq;
        p.num_kv_heads = hkv;
        p.page_size = page;
        p.ragged = ragged;
        return p;
      };
      const std::string h = std::to_string(hq) + "/" + std::to_string(hkv) + " ";
      // Prefill: fresh and after a cached prefix; uniform and ragged (one long request and
      // the rest a sixteenth of it).
      for (int32_t b : batches) {
        for (int32_t q : qlens) {
          if (int64_t{b} * q > 32768) continue;
          for (int32_t prefix : {0, 4096}) {
            for (bool ragged : {false, true}) {
              if (ragged && b == 1) continue;
              AttentionCallShape p =
                  shape("prefill " + h + std::to_string(b) + "x" + std::to_string(q) +
                            (prefix ? "+4096" : "") + (ragged ? " ragged" : ""),
                        ragged);
              for (int32_t i = 0; i < b; ++i) {
                const int32_t qi = ragged && i > 0 ? std::max(1, q / 16) : q;
                p.q.push_back(qi);
                p.kv.push_back(qi + prefix);
              }
              grid.push_back(p);
            }
          }
        }
      }
      // Chunked prefill: b uniform chunks of q tokens after `prefix` cached ones. Quick:
      // batch 4 only after 8192 and 32768 (two points per class past 4096 keys).
      for (int32_t prefix : chunk_prefixes) {
        for (int32_t b : chunk_batches) {
          if (a.quick && b > 1 && prefix < 8192) continue;
          for (int32_t q : chunk_q) {
            if ((b > 1 && int64_t{b} * q > 4096) ||
                int64_t{b} * (prefix + q) > kMaxChunkBatchTokens) {
              continue;
            }
            AttentionCallShape p = shape("chunk " + h + std::to_string(b) + "x" +
                                             std::to_string(q) + "+" + std::to_string(prefix),
                                         false);
            p.q.assign(b, q);
            p.kv.assign(b, prefix + q);
            grid.push_back(p);
          }
        }
      }
      // Mixed steps: chunks after a prefix, then `rows` decode rows. Quick: 255 rows only
      // after 8192.
      for (auto [chunks, q] : mixed_chunks) {
        for (int32_t prefix : mixed_prefixes) {
          for (int32_t rows : mixed_rows) {
            if (a.quick && rows > 63 && prefix != 8192) continue;
            AttentionCallShape p =
                shape("mixed " + h + std::to_string(chunks) + "x" + std::to_string(q) + "+" +
                          std::to_string(prefix) + " + " + std::to_string(rows) + "x1",
                      true);
            p.q.assign(chunks, q);
            p.kv.assign(chunks, prefix + q);
            std::uniform_int_distribution<int32_t> u(1, kMixedRowMaxKv);
            for (int32_t i = 0; i < rows; ++i) {
              p.q.push_back(1);
              p.kv.push_back(u(rng));
            }
            grid.push_back(p);
          }
        }
      }
      // Decode: uniform and ragged KV lengths.
      for (int32_t b : decode_batches) {
        for (int32_t kv : decode_kv) {
          for (bool ragged : {false, true}) {
            if (ragged && b == 1) continue;
            AttentionCallShape p = shape("decode " + h + std::to_string(b) + "x" +
                                             std::to_string(kv) + (ragged ? " ragged" : ""),
                                         ragged);
            std::uniform_int_distribution<int32_t> u(1, kv);
            for (int32_t i = 0; i < b; ++i) {
              p.q.push_back(1);
              p.kv.push_back(ragged && i > 0 ? u(rng) : kv);
            }
            grid.push_back(p);
          }
        }
      }
    }
  }
  return grid;
}

std::string write_crossover_table(const CrossoverTable& table, const std::string& out) {
  std::string path = out.empty() ? "data/attention" : out;
  if (std::filesystem::is_directory(path)) {
    path = (std::filesystem::path(path) / crossover_file_name(table.device)).string();
  }
  std::ofstream f(path);
  PAGELLM_CHECK(f.good()) << "cannot write the crossover table to " << path
                          << " (give --out an existing folder or a file path)";
  f << crossover_table_to_json(table);
  f.close();
  PAGELLM_CHECK(f.good()) << "cannot write the crossover table to " << path;
  return path;
}

std::string utc_date_today() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

}  // namespace pagellm
