// Measured crossovers between the native attention kernels and cuDNN, per device.
//
// `pagellm calibrate-attention` (attention/calibration.h, cuda/attention_calibration.h) times
// both providers over a grid of batches on the running GPU, eager and under graph replay, and
// writes one JSON table keyed by the device (name, SM count, compute capability) and the
// cuDNN version. `auto` admits cuDNN only where such a table exists and its entry for the
// call's launch mode, phase, head dim and shape class (shape_class.h) says the call's work
// is past the crossover.
//
// File format ("format": "pagellm.attention.crossover.v2"):
//   {
//     "format": "pagellm.attention.crossover.v2",
//     "device": {"name": "NVIDIA H200", "sm_count": 132, "compute_capability": "9.0"},
//     "cudnn_version": "9.14.0",
//     "measured_on": "2026-11-29", "source": "pagellm calibrate-attention --quick ...",
//     "margin": 0.05,
//     "entries": [ {"mode": "eager", "phase": "prefill", "head_dim": 128,
//                   "class": "q257-1024 kv4097-16384 uniform",
//                   "min_work": 50331648, "max_work": 68719476736,
//                   "page_sizes": [16], "gqa_ratios": [4, 8],
//                   "max_num_seqs": 256, "max_query_len": 8192, "max_kv_len": 32768,
//                   "points": 40, "admitted_points": 22}, ... ],
//     "measurements": [ {...one timed grid point, with its "class"...}, ... ]
//   }
// "work" is query heads x causal query-key pairs (attention_call.h: causal_pairs).
// Unknown fields are ignored; missing or malformed required ones are an Error naming them.
// Format v1 (no classes) is still read when it has no entries (its measurements' classes are
// derived from their shapes); a v1 file with entries is an Error: its single threshold per
// (mode, phase, head dim) would apply to every class, which is what v2 exists to avoid.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagellm/attention/device_profile.h"
#include "pagellm/attention/provider.h"
#include "pagellm/attention/shape_class.h"

namespace pagellm {

inline constexpr const char* kCrossoverFormat = "pagellm.attention.crossover.v2";
/// The previous format: no shape classes. Read only without entries.
inline constexpr const char* kCrossoverFormatV1 = "pagellm.attention.crossover.v1";

/// Where cuDNN wins for one (launch mode, phase, head dim, shape class) on one device: every
/// measured point of that class with work in [min_work, max_work] ran faster on cuDNN by
/// more than the table's margin. Outside the measured page sizes, GQA ratios and ranges
/// nothing is claimed.
struct CrossoverEntry {
  LaunchMode mode = LaunchMode::kEager;
  AttentionPhase phase = AttentionPhase::kPrefill;
  int32_t head_dim = 0;
  ShapeClass shape_class;  // decode entries have the decode class
  int64_t min_work = 0;  // admitted when work >= min_work ...
  int64_t max_work = 0;  // ... and work <= max_work (the largest measured work)
  std::vector<int32_t> page_sizes;  // measured page sizes (sorted)
  std::vector<int32_t> gqa_ratios;  // measured q-heads / kv-heads ratios (sorted)
  int32_t max_num_seqs = 0;         // largest measured batch
  int32_t max_query_len = 0;        // largest measured query length
  int32_t max_kv_len = 0;           // largest measured KV length
  int32_t points = 0;               // measured points in this group
  int32_t admitted_points = 0;      // of which at or past the crossover
};

/// One timed grid point (what calibration measures; kept in the file for inspection).
struct CrossoverMeasurement {
  LaunchMode mode = LaunchMode::kEager;
  AttentionPhase phase = AttentionPhase::kPrefill;
  int32_t head_dim = 0;
  int32_t page_size = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t num_seqs = 0;
  int32_t num_tokens = 0;
  int32_t max_query_len = 0;
  int32_t max_kv_len = 0;
  bool ragged = false;  // lengths differ between sequences (query or, for decode, KV lengths)
  /// classify_shape(max_query_len, num_tokens, max_kv_len, query lengths differ): what
  /// derivation groups by.
  ShapeClass shape_class;
  int64_t work = 0;
  double native_us = 0.0;  // microseconds per call
  double cudnn_us = -1.0;  // microseconds per call; negative: cuDNN could not run it
  std::string label;
};

/// A crossover table for one device and cuDNN version.
struct CrossoverTable {
  DeviceProfile device;  // cudnn_version included
  std::string measured_on;
  std::string source;
  double margin = 0.0;  // a point counts as a cuDNN win when native_us > cudnn_us * (1 + margin)
  std::vector<CrossoverEntry> entries;
  std::vector<CrossoverMeasurement> measurements;
  std::string origin;  // the file it was read from ("" when built in memory)

  /// The entry for (mode, phase, head_dim, class), or nullptr. No allocation.
  const CrossoverEntry* find(LaunchMode mode, AttentionPhase phase, int32_t head_dim,
                             const ShapeClass& shape_class) const;
};

/// Parses a table (v2, or v1 without entries); throws Error naming `origin`, the field and
/// what was expected.
CrossoverTable parse_crossover_table(const std::string& json_text, const std::string& origin);
/// Serialises a table (entries and measurements), pretty-printed, in format v2.
std::string crossover_table_to_json(const CrossoverTable& table);

/// Derives the entries from measurements, per (mode, phase, head dim, shape class),
/// conservatively: sorted by work, min_work is the smallest measured work from which every
/// point of the group (at that work and above, whatever its batch) is a cuDNN win by more
/// than `margin`. A group whose largest point is not a win gets no entry: cuDNN is never
/// admitted there. A win in one class never admits another.
std::vector<CrossoverEntry> derive_crossover_entries(
    const std::vector<CrossoverMeasurement>& measurements, double margin);

/// Every table `auto` may use, at most one per (device, cuDNN version).
class CrossoverTables {
 public:
  /// Adds a table; one for the same device and cuDNN version is replaced (later sources
  /// override earlier ones: a user's calibration overrides the shipped default).
  void add(CrossoverTable table);
  /// The table for this device and cuDNN version exactly, or nullptr.
  const CrossoverTable* find(const DeviceProfile& device) const;
  /// Some table for this device with another cuDNN version, or nullptr (for messages).
  const CrossoverTable* find_other_version(const DeviceProfile& device) const;
  const std::vector<CrossoverTable>& tables() const { return tables_; }
  bool empty() const { return tables_.empty(); }

  /// Loads every path: a file is parsed, a directory contributes its crossover-*.json
  /// files in name order; a missing path is skipped when `skip_missing`. Throws Error for a
  /// file that cannot be read or parsed (a broken table is a mistake to report, not to
  /// ignore).
  static CrossoverTables load(const std::vector<std::string>& paths, bool skip_missing = true);

 private:
  std::vector<CrossoverTable> tables_;
};

/// Where tables are looked for by default, in increasing priority: the shipped directory
/// (data/attention beside the source tree or the installed binary), then
/// $PAGELLM_ATTENTION_TABLES (a colon-separated list of files or directories).
std::vector<std::string> default_crossover_table_paths();
/// The shipped directory alone (default_crossover_table_paths without the environment),
/// for callers that read PAGELLM_ATTENTION_TABLES themselves (the CUDA backend's settings).
std::vector<std::string> shipped_crossover_table_paths();
/// Splits a PAGELLM_ATTENTION_TABLES value at ':' (empty items dropped).
std::vector<std::string> split_crossover_table_paths(const std::string& value);

/// The file name calibration writes for a device: "crossover-nvidia-h200-132sm-cc90-cudnn91400.json".
std::string crossover_file_name(const DeviceProfile& device);

}  // namespace pagellm
