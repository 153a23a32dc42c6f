// What attention calibration measures, host side: the options, the grid of call shapes
// timed on both providers, the observer that reports progress, and writing the resulting
// crossover table. The timing itself runs on the GPU (cuda/attention_calibration.h,
// reached through engine/attention_calibration.h); everything here is host-only, so the
// grid and the writer are tested without a GPU.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "pagellm/attention/crossover_table.h"

namespace pagellm {

/// One paged-attention call's shape, as calibration and the route benchmark time it:
/// bf16, `num_q_heads` / `num_kv_heads` heads of `head_dim`, pages of `page_size` tokens,
/// per sequence a query length q[i] and a KV length kv[i] (new tokens included).
struct AttentionCallShape {
  std::string label;  // e.g. "prefill 32/8 16x512+4096 ragged"
  int32_t num_q_heads = 32;
  int32_t num_kv_heads = 8;
  int32_t head_dim = 128;
  int32_t page_size = 16;
  std::vector<int32_t> q;
  std::vector<int32_t> kv;
  bool ragged = false;  // lengths differ between sequences

  int32_t num_tokens() const;
  /// Every query is one token.
  bool decode() const;
  /// Query lengths differ between sequences (what the shape class calls ragged).
  bool ragged_query() const;
  /// classify_shape of the largest query, the query tokens, the largest KV and
  /// ragged_query().
  ShapeClass shape_class() const;
  /// Query heads x causal query-key pairs: the crossover tables' measure of work.
  int64_t work() const;
};

/// How to calibrate. The defaults are what `pagellm calibrate-attention` runs.
struct CalibrationOptions {
  /// A smaller grid (one head configuration, fewer batches and lengths; 80 shapes): about
  /// two minutes on an H200 instead of tens.
  bool quick = false;
  std::vector<int32_t> page_sizes = {16};
  /// A point counts as a cuDNN win when native_us > cudnn_us * (1 + margin).
  double margin = 0.05;
  /// Back-to-back calls per eager timing (graph timings replay max(2, iters / 4) times).
  int32_t iters = 20;
  /// Calls captured in one graph for graph-mode timings (a model's layers).
  int32_t layers = 36;
  /// Seeds the ragged lengths and the page tables.
  uint32_t seed = 1;
  /// CUDA device to measure.
  int32_t device = 0;

  /// Throws Error naming the option and the accepted range: iters and layers >= 1, margin
  /// finite and >= 0, at least one page size, each in [1, 1024], device >= 0.
  void validate() const;
  /// How a table records what made it: "pagellm calibrate-attention --quick --iters 20 --margin 0.05
  /// --layers 36 --page-sizes 16 --seed 1" (every option that shapes the measurement).
  std::string source() const;
};

/// Progress of a calibration, for a front end to print. Either callback may be empty.
struct CalibrationObserver {
  /// Before the first timing: the device measured, the grid's size.
  std::function<void(const DeviceProfile& device, size_t num_points)> started;
  /// After each measurement; `cudnn_error` says why cuDNN could not run the point
  /// (measurement.cudnn_us is then negative), empty otherwise.
  std::function<void(const CrossoverMeasurement& measurement, const std::string& cudnn_error)>
      measured;
};

/// The grid calibration times: for each page size and head configuration (32/8 when quick;
/// 16/8, 32/8 and 64/8 otherwise), head_dim 128:
///   prefill  fresh and after a 4096-token prefix; uniform and ragged (one long request, the
///            rest a sixteenth of it); at most 32768 tokens;
///   chunk    uniform chunks of 64..2048 tokens after cached prefixes of 2048..32768 (two
///            query lengths per query bucket, prefixes in three KV buckets), batch 1 and 4
///            (and 16 in the full grid; the quick grid times batch 4 after 8192 and
///            32768 only);
///   mixed    one or a few chunks after a prefix (0, 8192, 32768, ...) plus 63 or 255
///            one-token decode rows with KV lengths drawn from `rng` in [1, 8192]: the
///            engine's mixed steps (ragged);
///   decode   uniform and ragged KV lengths drawn from `rng`.
/// The classes cuDNN may win (short chunks over long prefixes) get several points each, so
/// that a class's entry rests on more than one measurement.
std::vector<AttentionCallShape> calibration_grid(const CalibrationOptions& options,
                                                 std::mt19937& rng);

/// Writes `table` as JSON (crossover_table_to_json). `out` is a file, or an existing folder
/// that receives crossover_file_name(table.device); empty means "data/attention". Returns
/// the path written; throws Error naming it when it cannot be written.
std::string write_crossover_table(const CrossoverTable& table, const std::string& out);

/// Today's date (UTC) as "2026-11-29": what calibration puts in measured_on.
std::string utc_date_today();

}  // namespace pagellm
