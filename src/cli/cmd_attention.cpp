// attention-plan: explains which attention provider a batch would get, and why, on any
// machine (no GPU needed: the device is a profile). calibrate-attention: the GPU
// calibration (a library call, engine/attention_calibration.h) that writes a crossover
// table.
#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "pagellm/attention/explain.h"
#include "pagellm/attention/planner.h"
#include "pagellm/common/check.h"
#include "pagellm/engine/attention_calibration.h"

namespace pagellm::cli {
namespace {

namespace fs = std::filesystem;

struct PlanArgs {
  std::string q_lens;
  std::string kv_lens;
  std::string batch_file;
  int32_t heads = 32;
  int32_t kv_heads = 8;
  int32_t head_dim = 128;
  int32_t page_size = 16;
  std::string dtype = "bf16";
  int32_t max_pages_per_seq = 0;
  int64_t declared_tokens = -1;
  int64_t declared_max_q = -1;
  int64_t declared_max_kv = -1;
  int32_t kv_capacity = 0;
  std::string device_profile;
  std::string device_name;
  int32_t sm_count = 0;
  std::string compute_capability;
  std::string cudnn_version = "none";
  bool device_from_table = false;
  std::vector<std::string> tables;
  bool no_default_tables = false;
  std::string mode = "eager";
  std::string backend = "auto";
  bool json = false;
};

// "128,128,1" or "128x64" (64 sequences of length 128), comma-separated and combinable:
// "2048,1x63".
std::vector<int32_t> parse_lengths(const std::string& text, const char* what) {
  std::vector<int32_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.find_first_not_of(" \t") == std::string::npos) continue;
    long long value = 0, count = 1;
    char* end = nullptr;
    errno = 0;
    value = std::strtoll(item.c_str(), &end, 10);
    bool ok = end != item.c_str() && errno == 0;
    if (ok && *end == 'x') {
      const char* start = end + 1;
      count = std::strtoll(start, &end, 10);
      ok = end != start && errno == 0;
    }
    ok = ok && *end == '\0' && value >= 0 && value <= INT32_MAX && count >= 1 &&
         count <= (1 << 20);
    PAGELLM_CHECK(ok) << "cannot read '" << item << "' in " << what << " '" << text
                      << "' (expected comma-separated lengths, LENxCOUNT for repeats, e.g. "
                         "2048,1x63)";
    out.insert(out.end(), static_cast<size_t>(count), static_cast<int32_t>(value));
  }
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  PAGELLM_CHECK(f.good()) << "cannot read " << path;
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// --batch FILE: {"q_lens": [...], "kv_lens": [...]} (kv_lens optional).
void read_batch_file(const std::string& path, std::vector<int32_t>& q, std::vector<int32_t>& kv) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    PAGELLM_FAIL() << path << ": not valid JSON (" << e.what() << ")";
  }
  const auto ints = [&](const char* key, std::vector<int32_t>& out) {
    if (!j.contains(key)) return;
    PAGELLM_CHECK(j[key].is_array()) << path << ": \"" << key << "\" must be a list of lengths";
    for (const auto& v : j[key]) {
      PAGELLM_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX)
          << path << ": \"" << key << "\" holds " << v.dump() << " (expected non-negative integers)";
      out.push_back(v.get<int32_t>());
    }
  };
  PAGELLM_CHECK(j.is_object() && j.contains("q_lens"))
      << path << ": expected an object with \"q_lens\" (and optionally \"kv_lens\")";
  ints("q_lens", q);
  ints("kv_lens", kv);
}

void run_attention_plan(const PlanArgs& a) {
  std::vector<int32_t> q, kv;
  if (!a.batch_file.empty()) read_batch_file(a.batch_file, q, kv);
  if (!a.q_lens.empty()) q = parse_lengths(a.q_lens, "--q-lens");
  if (!a.kv_lens.empty()) kv = parse_lengths(a.kv_lens, "--kv-lens");
  PAGELLM_CHECK(!q.empty()) << "attention-plan needs query lengths: --q-lens (e.g. 512x8) or "
                               "--batch FILE";
  if (kv.empty()) kv = q;  // a fresh prefill: every sequence's KV is its query
  PAGELLM_CHECK(kv.size() == q.size())
      << "--kv-lens has " << kv.size() << " lengths for " << q.size() << " query lengths";

  AttentionDomain domain;
  domain.dtype = parse_dtype(a.dtype);
  domain.num_q_heads = a.heads;
  domain.num_kv_heads = a.kv_heads;
  domain.head_dim = a.head_dim;
  domain.page_size = a.page_size;
  domain.scale = a.head_dim > 0 ? 1.0f / std::sqrt(static_cast<float>(a.head_dim)) : 0.0f;

  // The batch as the engine would build it; declared values may be overridden to see the
  // consistency rule at work.
  ForwardBatch batch;
  batch.page_size = std::max(a.page_size, 1);
  batch.query_start.push_back(0);
  int32_t longest = 1;
  for (size_t i = 0; i < q.size(); ++i) {
    batch.query_start.push_back(batch.query_start.back() + q[i]);
    longest = std::max(longest, kv[i]);
  }
  batch.kv_lens = kv;
  batch.max_pages_per_seq = a.max_pages_per_seq > 0
                                ? a.max_pages_per_seq
                                : (std::max(longest, a.kv_capacity) + batch.page_size - 1) /
                                      batch.page_size;
  batch.page_table.assign(q.size() * static_cast<size_t>(batch.max_pages_per_seq), 1);
  batch.kv_len_capacity = a.kv_capacity;
  AttentionBatchView view;
  view.query_start = batch.query_start.data();
  view.query_start_size = batch.query_start.size();
  view.kv_lens = batch.kv_lens.data();
  view.kv_lens_size = batch.kv_lens.size();
  view.page_table_size = batch.page_table.size();
  view.max_pages_per_seq = batch.max_pages_per_seq;
  view.num_seqs = batch.num_seqs();
  view.num_tokens = batch.query_start.back();
  view.max_query_len = batch.max_query_len();
  view.max_kv_len = batch.max_kv_len();
  view.kv_len_capacity = a.kv_capacity;
  if (a.declared_tokens >= 0) view.num_tokens = static_cast<int32_t>(a.declared_tokens);
  if (a.declared_max_q >= 0) view.max_query_len = static_cast<int32_t>(a.declared_max_q);
  if (a.declared_max_kv >= 0) view.max_kv_len = static_cast<int32_t>(a.declared_max_kv);

  for (const std::string& t : a.tables) {
    PAGELLM_CHECK(fs::exists(t)) << "--table " << t
                                 << " does not exist (expected a crossover JSON file or a folder)";
  }
  std::vector<std::string> paths;
  if (!a.no_default_tables) paths = default_crossover_table_paths();
  paths.insert(paths.end(), a.tables.begin(), a.tables.end());
  const CrossoverTables tables = CrossoverTables::load(paths, /*skip_missing=*/true);

  DeviceProfile device;
  if (!a.device_profile.empty()) {
    device = parse_device_profile_json(read_text(a.device_profile), a.device_profile);
  } else if (a.device_from_table) {
    PAGELLM_CHECK(!tables.empty())
        << "--device-from-table: no crossover table was found (give one with --table)";
    device = tables.tables().back().device;
  } else {
    device.name = a.device_name;
    device.sm_count = a.sm_count;
    if (!a.compute_capability.empty()) {
      parse_compute_capability(a.compute_capability, device.cc_major, device.cc_minor);
    }
    device.cudnn_version = parse_cudnn_version(a.cudnn_version);
  }

  AttentionPlannerConfig config;
  config.choice = parse_attention_backend(a.backend);
  config.device = device;
  config.tables = &tables;
  AttentionPlanner planner(config);
  const AttentionPlan& plan = planner.plan(domain, view, parse_launch_mode(a.mode));
  std::cout << (a.json ? explain_json(plan, domain, device) : explain_text(plan, domain, device));
  if (!a.json) {
    std::cout << "tables:      ";
    if (tables.empty()) {
      std::cout << "none found";
    } else {
      for (size_t i = 0; i < tables.tables().size(); ++i) {
        std::cout << (i ? "; " : "") << tables.tables()[i].origin;
      }
    }
    std::cout << "\n";
  }
}

struct CalibrateArgs {
  CalibrationOptions options;
  std::string out;
};

// calibrate-attention: the measurement is a library call (engine/attention_calibration.h);
// this prints its progress, the derived entries (and a Markdown table for
// docs/PERFORMANCE.md) and writes the table.
void run_calibrate(const CalibrateArgs& a) {
  using Clock = std::chrono::steady_clock;
  Clock::time_point t0;
  CalibrationObserver observer;
  observer.started = [&](const DeviceProfile& device, size_t points) {
    std::printf("calibrating on %s over %zu points (%d iterations each)\n",
                device.describe().c_str(), points, a.options.iters);
    t0 = Clock::now();
  };
  observer.measured = [&](const CrossoverMeasurement& m, const std::string& cudnn_error) {
    if (!cudnn_error.empty()) std::fprintf(stderr, "  cuDNN: %s\n", cudnn_error.c_str());
    const char* verdict = m.cudnn_us <= 0 ? "(cudnn failed)"
                          : m.native_us > m.cudnn_us * (1 + a.options.margin) ? "cudnn"
                                                                               : "native";
    std::printf("  %-40s %-5s %-32s work %14lld  native %9.2f us  cudnn %9.2f us  %s\n",
                m.label.c_str(), mode_name(m.mode), shape_class_name(m.shape_class).c_str(),
                static_cast<long long>(m.work), m.native_us, m.cudnn_us, verdict);
    std::fflush(stdout);
  };
  const CrossoverTable table = calibrate_attention(a.options, observer);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("%zu measurements in %.0f s; %zu crossover entries:\n", table.measurements.size(),
              seconds, table.entries.size());
  for (const CrossoverEntry& e : table.entries) {
    std::printf("  %s %s head_dim %d class %s: cuDNN from work %lld (of %d points, %d admitted)\n",
                mode_name(e.mode), phase_name(e.phase), e.head_dim,
                shape_class_name(e.shape_class).c_str(), static_cast<long long>(e.min_work),
                e.points, e.admitted_points);
  }
  std::printf("\n| mode | phase | head_dim | class | cuDNN from work | up to work | page sizes | "
              "GQA | points (admitted) |\n|---|---|---:|---|---:|---:|---|---|---:|\n");
  for (const CrossoverEntry& e : table.entries) {
    std::string pages, gqa;
    for (int32_t x : e.page_sizes) pages += (pages.empty() ? "" : ",") + std::to_string(x);
    for (int32_t x : e.gqa_ratios) gqa += (gqa.empty() ? "" : ",") + std::to_string(x);
    std::printf("| %s | %s | %d | %s | %lld | %lld | %s | %s | %d (%d) |\n", mode_name(e.mode),
                phase_name(e.phase), e.head_dim, shape_class_name(e.shape_class).c_str(),
                static_cast<long long>(e.min_work),
                static_cast<long long>(e.max_work), pages.c_str(), gqa.c_str(), e.points,
                e.admitted_points);
  }
  if (table.entries.empty()) std::printf("| (none: cuDNN won no group; auto stays native) |\n");
  std::printf("\n");
  std::printf("wrote %s\n", write_crossover_table(table, a.out).c_str());
}

}  // namespace

void register_attention_commands(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* plan = app.add_subcommand(
      "attention-plan",
      "explain which attention provider (native or cudnn) a batch gets, and the rule that decided");
  plan->add_option("--q-lens", a->q_lens,
                   "query lengths, comma-separated; LENxCOUNT repeats (e.g. 2048,1x63)");
  plan->add_option("--kv-lens", a->kv_lens,
                   "KV lengths (new tokens included), same syntax; default: the query lengths");
  plan->add_option("--batch", a->batch_file, "JSON file {\"q_lens\": [...], \"kv_lens\": [...]}");
  plan->add_option("--heads", a->heads, "query heads")->capture_default_str();
  plan->add_option("--kv-heads", a->kv_heads, "KV heads")->capture_default_str();
  plan->add_option("--head-dim", a->head_dim, "head dimension")->capture_default_str();
  plan->add_option("--page-size", a->page_size, "KV page size in tokens")->capture_default_str();
  plan->add_option("--dtype", a->dtype, "bf16 | f16 | f32")->capture_default_str();
  plan->add_option("--max-pages-per-seq", a->max_pages_per_seq,
                   "page-table row length (default: enough for the longest KV)");
  plan->add_option("--kv-capacity", a->kv_capacity,
                   "graph mode: KV length every replay stays within (0: the page-table row)");
  plan->add_option("--declared-tokens", a->declared_tokens,
                   "declare another total token count (to see the consistency rule)");
  plan->add_option("--declared-max-q", a->declared_max_q, "declare another max query length");
  plan->add_option("--declared-max-kv", a->declared_max_kv, "declare another max KV length");
  plan->add_option("--device-profile", a->device_profile,
                   "JSON {name, sm_count, compute_capability, cudnn_version} of the GPU to plan for");
  plan->add_option("--device-name", a->device_name, "GPU name, e.g. \"NVIDIA H200\"");
  plan->add_option("--sm-count", a->sm_count, "GPU multiprocessors");
  plan->add_option("--compute-capability", a->compute_capability, "e.g. 9.0");
  plan->add_option("--cudnn-version", a->cudnn_version, "e.g. 9.14.0, or none")
      ->capture_default_str();
  plan->add_flag("--device-from-table", a->device_from_table,
                 "plan for the device (and cuDNN) of the last crossover table loaded");
  plan->add_option("--table", a->tables, "crossover table file or directory (repeatable)");
  plan->add_flag("--no-default-tables", a->no_default_tables,
                 "ignore data/attention and $PAGELLM_ATTENTION_TABLES");
  plan->add_option("--mode", a->mode, "eager | graph")->capture_default_str();
  plan->add_option("--attention-backend", a->backend, "auto | native | cudnn")
      ->capture_default_str();
  plan->add_flag("--json", a->json, "print JSON");
  plan->callback([a] { run_attention_plan(*a); });

  auto c = std::make_shared<CalibrateArgs>();
  CLI::App* cal = app.add_subcommand(
      "calibrate-attention",
      "time native and cuDNN paged attention over a grid of batches on this GPU (eager and "
      "graph replay) and write the crossover table `--attention-backend auto` reads (needs "
      "the CUDA build with cuDNN)");
  cal->add_option("--out", c->out,
                  "table file, or an existing folder for crossover-<device>-...-cudnn<version>.json "
                  "(default: data/attention)");
  cal->add_flag("--quick", c->options.quick,
                "a smaller grid (one head configuration, 80 shapes; about two minutes on an H200)");
  cal->add_option("--page-sizes", c->options.page_sizes, "KV page sizes to measure, e.g. 16,32")
      ->delimiter(',')
      ->capture_default_str();
  cal->add_option("--margin", c->options.margin,
                  "cuDNN wins a point when native time > cuDNN time x (1 + margin)")
      ->capture_default_str();
  cal->add_option("--iters", c->options.iters, "calls per eager timing")->capture_default_str();
  cal->add_option("--layers", c->options.layers, "calls per captured graph (graph timings)")
      ->capture_default_str();
  cal->add_option("--seed", c->options.seed, "seed of the ragged lengths and page tables")
      ->capture_default_str();
  cal->add_option("--device", c->options.device, "CUDA device")->capture_default_str();
  cal->callback([c] { run_calibrate(*c); });
}

}  // namespace pagellm::cli
