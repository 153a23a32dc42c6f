// attention_route_bench: what `--attention-backend auto` makes of the crossover tables on
// this GPU, route by route. (The tables themselves are measured by `pagellm
// calibrate-attention`, the library's calibrate_attention; this program's former
// `calibrate` mode is that command now.)
//
//   attention_route_bench routes [--table FILE|DIR] [--iters 20] [--layers 36] [--quick]
//     Over a fixed grid of routes, times native, cuDNN and auto (auto pays one plan() and,
//     for cuDNN prefill, one upload per forward of --layers calls), prints each route's
//     speedup of auto over native, and the spread of auto/native over the routes auto kept
//     on native (plan() overhead: must stay within the native-vs-native noise, also
//     printed), each route's shape class and whether auto picked the faster provider
//     ("tie" within 5 %). Prints Markdown for docs/PERFORMANCE.md.
//
// Each call's time is the mean over a loop of back-to-back launches between two CUDA
// events (eager: host submission cost included whenever it exceeds the kernel's time), by
// the library's AttentionTimer (src/pagellm/cuda/attention_timing.h). Roofline columns:
// prefill against 989 TFLOP/s (H100/H200 dense bf16 datasheet), decode against 4.8 TB/s
// (H200 HBM3e datasheet); the work is 4 * head_dim FLOPs per causal query-key pair, decode
// reads every K/V byte once.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "pagellm/attention/calibration.h"
#include "pagellm/attention/crossover_table.h"
#include "pagellm/attention/planner.h"
#include "pagellm/common/check.h"
#include "pagellm/cuda/attention/attention.h"
#include "pagellm/cuda/attention/attention_timing.h"
#include "pagellm/cuda/attention/cudnn_attention.h"
#include "pagellm/cuda/support/cuda_check.h"

using namespace pagellm;
using namespace pagellm::cuda;

namespace {

constexpr double kPeakTflops = 989.0;  // dense bf16, H100/H200 SXM datasheet
constexpr double kPeakTbps = 4.8;      // H200 HBM3e datasheet

struct Args {
  std::vector<std::string> tables;
  int iters = 20;
  int layers = 36;
  bool quick = false;
  uint32_t seed = 1;
};

[[noreturn]] void usage(const char* error) {
  std::fprintf(stderr,
               "%s%s"
               "usage: attention_route_bench routes [--table FILE|DIR]... [--iters 20] [--layers 36]\n"
               "                                    [--quick] [--seed 1]\n"
               "  --quick: 10 iterations (a minute or two on an H200). From a bundle, pass --table\n"
               "  explicitly (data/attention is otherwise looked for beside the binary).\n"
               "  Crossover tables are measured by `pagellm calibrate-attention`.\n",
               error ? error : "", error ? "\n" : "");
  std::exit(error ? 2 : 0);
}

Args parse_args(int argc, char** argv) {
  Args a;
  if (argc < 2) usage("missing mode (routes)");
  const std::string mode = argv[1];
  if (mode == "--help" || mode == "-h") usage(nullptr);
  if (mode == "calibrate") {
    usage("the calibrate mode is now `pagellm calibrate-attention` (same options: --out, "
          "--quick, --page-sizes, --margin, --iters, --layers, --seed)");
  }
  if (mode != "routes") usage("mode must be routes");
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + k).c_str());
      return argv[++i];
    };
    if (k == "--table") a.tables.push_back(value());
    else if (k == "--iters") a.iters = std::stoi(value());
    else if (k == "--layers") a.layers = std::stoi(value());
    else if (k == "--seed") a.seed = static_cast<uint32_t>(std::stoul(value()));
    else if (k == "--quick") a.quick = true;
    else if (k == "--help" || k == "-h") usage(nullptr);
    else usage(("unknown option " + k).c_str());
  }
  PAGELLM_CHECK(a.iters > 0 && a.layers > 0) << "--iters and --layers must be positive";
  if (a.quick) a.iters = std::min(a.iters, 10);
  return a;
}

// Microseconds per call on cuDNN, or -1 with cuDNN's reason on stderr.
double time_cudnn(AttentionTimer& timer, const Args& a) {
  std::string error;
  const double us = timer.time_cudnn(LaunchMode::kEager, a.iters, a.layers, &error);
  if (us < 0) std::fprintf(stderr, "  cuDNN: %s\n", error.c_str());
  return us;
}

// Achieved fraction of the roofline: prefill by FLOPs, decode by K/V bytes.
std::string roofline(const AttentionCallShape& pt, double us) {
  if (us <= 0) return "-";
  char buf[64];
  if (pt.decode()) {
    double bytes = 0;
    for (int32_t kv : pt.kv) bytes += 2.0 * kv * pt.num_kv_heads * pt.head_dim * 2;
    std::snprintf(buf, sizeof buf, "%.0f GB/s (%.0f%%)", bytes / us / 1e3,
                  100.0 * bytes / us / 1e6 / kPeakTbps);
  } else {
    const double tflops = 4.0 * pt.head_dim * pt.work() / us / 1e6;
    std::snprintf(buf, sizeof buf, "%.0f TFLOP/s (%.0f%%)", tflops, 100.0 * tflops / kPeakTflops);
  }
  return buf;
}

std::string format_us(double us) {
  if (us <= 0) return "failed";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", us);
  return buf;
}

// Two providers within this fraction of each other are a tie (noise, not a wrong pick).
constexpr double kTieFraction = 0.05;

// "yes" when auto chose the faster provider, "tie" when the two are within kTieFraction,
// "no" otherwise (cuDNN failing counts as native being faster).
std::string picked_faster(AttentionProvider chosen, double native_us, double cudnn_us) {
  if (cudnn_us <= 0) return chosen == AttentionProvider::kNative ? "yes" : "no";
  const double lo = std::min(native_us, cudnn_us), hi = std::max(native_us, cudnn_us);
  if (hi <= lo * (1 + kTieFraction)) return "tie";
  const AttentionProvider faster =
      cudnn_us < native_us ? AttentionProvider::kCudnn : AttentionProvider::kNative;
  return chosen == faster ? "yes" : "no";
}

// ---- routes -------------------------------------------------------------------------------

std::vector<AttentionCallShape> route_grid(std::mt19937& rng) {
  std::vector<AttentionCallShape> g;
  const auto add = [&](const std::string& label, std::vector<int32_t> q, std::vector<int32_t> kv) {
    AttentionCallShape p;
    p.label = label;
    p.q = std::move(q);
    p.kv = std::move(kv);
    p.ragged = std::adjacent_find(p.kv.begin(), p.kv.end(), std::not_equal_to<>()) != p.kv.end();
    g.push_back(p);
  };
  const auto rep = [](int n, int32_t x) { return std::vector<int32_t>(n, x); };
  // Qwen3-8B attention: 32 query heads, 8 KV heads, head_dim 128, pages of 16.
  add("prefill 1x128", {128}, {128});
  add("prefill 1x2048", {2048}, {2048});
  add("prefill 1x8192", {8192}, {8192});
  add("prefill 1x32768", {32768}, {32768});
  add("prefill 64x128", rep(64, 128), rep(64, 128));
  add("prefill 16x512", rep(16, 512), rep(16, 512));
  add("prefill 4x4096", rep(4, 4096), rep(4, 4096));
  std::vector<int32_t> q(64, 1), kv(64, 1);
  q[0] = kv[0] = 2048;
  add("ragged 1x2048 + 63x1", q, kv);
  // Chunked prefill over cached prefixes (prefix-cache hits, long prompts in chunks): the
  // classes where cuDNN may win.
  for (int32_t prefix : {8192, 32768}) {
    for (int32_t chunk : {128, 512, 2048}) {
      add("chunk " + std::to_string(chunk) + " after " + std::to_string(prefix), {chunk},
          {prefix + chunk});
    }
  }
  add("chunks 8x256 after 4096", rep(8, 256), rep(8, 4352));
  // The engine's mixed steps: a chunk after a cached prefix and 63 one-token decode rows.
  for (int32_t chunk : {512, 2048}) {
    std::vector<int32_t> mq(64, 1), mkv(64);
    std::uniform_int_distribution<int32_t> row_kv(16, 4096);
    for (int32_t& x : mkv) x = row_kv(rng);
    mq[0] = chunk;
    mkv[0] = 8192 + chunk;
    add("chunk " + std::to_string(chunk) + " after 8192 + 63x1", mq, mkv);
  }
  add("decode 1x4096", {1}, {4096});
  add("decode 64x1024", rep(64, 1), rep(64, 1024));
  add("decode 64x8192", rep(64, 1), rep(64, 8192));
  std::vector<int32_t> mixed(256);
  std::uniform_int_distribution<int32_t> u(16, 4096);
  for (int32_t& x : mixed) x = u(rng);
  add("decode 256 ragged <=4096", rep(256, 1), mixed);
  return g;
}

// What a decode graph bound to cuDNN reserves, at 16 and 256 sequences with a KV capacity
// of 32768: host bytes of the planner, device bytes of the plan cache (workspace and the
// all-ones seq_len_q), and the time of one bound re-plan (what a replay would add).
void report_graph_reservation(const DeviceProfile& dev) {
  std::printf("\n| decode graph (KV capacity 32768) | host bytes | device bytes | bound plan() ns |\n"
              "|---|---:|---:|---:|\n");
  for (int32_t n : {16, 256}) {
    AttentionPlannerConfig config;
    config.choice = AttentionBackendChoice::kCudnn;
    config.device = dev;
    CudnnPlanCache cache(0);
    config.registry = &cache;
    AttentionPlanner planner(config);
    AttentionDomain dom;
    dom.num_q_heads = 32;
    dom.num_kv_heads = 8;
    dom.head_dim = 128;
    dom.page_size = 16;
    dom.scale = 1.0f / std::sqrt(128.0f);
    ForwardBatch b;
    b.page_size = 16;
    b.max_pages_per_seq = 32768 / 16;
    for (int32_t i = 0; i < n; ++i) {
      b.query_start.push_back(i);
      b.kv_lens.push_back(1 + (i * 977) % 32768);
    }
    b.query_start.push_back(n);
    b.token_ids.assign(n, 0);
    b.page_table.assign(static_cast<size_t>(n) * b.max_pages_per_seq, 1);
    b.kv_len_capacity = 32768;
    GraphCapacity cap;
    cap.num_seqs = n;
    cap.max_num_tokens = n;
    cap.max_query_len = 1;
    cap.max_pages_per_seq = b.max_pages_per_seq;
    cap.kv_len_capacity = 32768;
    try {
      const AttentionPlan& plan = planner.bind_to_graph(dom, cap, batch_view(b));
      cache.set_num_pages(int64_t{n} * b.max_pages_per_seq + 1);
      cache.build(plan.cudnn_key);
      const AttentionBatchView view = batch_view(b);
      const int reps = 100000;
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) planner.plan(dom, view);
      const double ns =
          std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / reps;
      std::printf("| %d sequences | %zu | %zu | %.0f |\n", n, planner.reserved_bytes(),
                  cache.device_bytes(), ns);
    } catch (const Error& e) {
      std::printf("| %d sequences | - | - | - | (cuDNN: %s)\n", n, e.what());
    }
  }
}

int run_routes(const Args& a) {
  std::mt19937 rng(a.seed);
  const std::vector<AttentionCallShape> grid = route_grid(rng);
  int64_t pool_tokens = 0, max_q = 0;
  for (const AttentionCallShape& p : grid) {
    int64_t pages = 0;
    for (int32_t kv : p.kv) pages += (kv + p.page_size - 1) / p.page_size;
    pool_tokens = std::max(pool_tokens, pages * p.page_size);
    max_q = std::max<int64_t>(max_q, int64_t{p.num_tokens()} * p.num_q_heads * p.head_dim);
  }
  AttentionTimer timer(0, pool_tokens + 1024, max_q, 8, 128);
  const DeviceProfile& dev = timer.profile();
  std::vector<std::string> paths = a.tables.empty() ? default_crossover_table_paths() : a.tables;
  const CrossoverTables tables = CrossoverTables::load(paths);
  const CrossoverTable* table = tables.find(dev);

  std::printf("## Attention routes on %s (%s)\n\n", dev.describe().c_str(), utc_date_today().c_str());
  std::printf("Crossover table: %s. Eager launches; %d calls per timing; auto pays one plan() "
              "(and for cuDNN prefill one upload) per %d calls.\n\n",
              table ? table->origin.c_str() : "none for this device (auto stays native)", a.iters,
              a.layers);
  std::printf("| route | class | work | auto | native us | cuDNN us | auto us | auto speedup | "
              "auto picked the faster | native roofline | cuDNN roofline |\n"
              "|---|---|---:|---|---:|---:|---:|---:|---|---|---|\n");
  std::vector<double> kept_ratio, noise_ratio;
  int slower_picks = 0;
  for (const AttentionCallShape& pt : grid) {
    timer.load(pt, rng);
    const double native_us = timer.time_native(LaunchMode::kEager, a.iters, a.layers);
    const double native_again = timer.time_native(LaunchMode::kEager, a.iters, a.layers);
    const double cudnn_us = time_cudnn(timer, a);
    // auto: a planner with the tables and the plan cache, warmed like a server would be
    // (requested plans built between steps).
    AttentionPlannerConfig config;
    config.device = dev;
    config.tables = &tables;
    config.registry = &timer.cache();
    AttentionPlanner planner(config);
    const AttentionDomain dom = timer.domain();
    const AttentionBatchView view = batch_view(timer.batch());
    planner.plan(dom, view);
    timer.cache().build_requested();
    const AttentionPlan* plan = &planner.plan(dom, view);
    const AttentionProvider chosen = plan->provider;
    const PagedAttentionParams p = timer.params();
    int call = 0;
    const double auto_us = timer.time(
        [&] {
          if (call++ % a.layers == 0) {
            plan = &planner.plan(dom, view);
            timer.cache().upload(*plan, timer.stream());
          }
          if (plan->provider == AttentionProvider::kCudnn) {
            timer.cache().run(p, *plan, timer.stream());
          } else {
            timer.run_native(p);
          }
        },
        LaunchMode::kEager, std::max(a.iters, a.layers), a.layers);
    if (chosen == AttentionProvider::kNative) {
      kept_ratio.push_back(auto_us / native_us);
      noise_ratio.push_back(native_again / native_us);
    }
    const std::string picked = picked_faster(chosen, native_us, cudnn_us);
    slower_picks += picked == "no";
    std::printf("| %s | %s | %lld | %s | %.1f | %s | %.1f | %.2fx | %s | %s | %s |\n",
                pt.label.c_str(), shape_class_name(pt.shape_class()).c_str(),
                static_cast<long long>(pt.work()), provider_name(chosen), native_us,
                format_us(cudnn_us).c_str(), auto_us, native_us / auto_us, picked.c_str(),
                roofline(pt, native_us).c_str(), roofline(pt, cudnn_us).c_str());
    std::fflush(stdout);
  }
  const auto spread = [](const std::vector<double>& v) {
    if (v.empty()) return std::string("none");
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    double mean = 0;
    for (double x : v) mean += x;
    char buf[96];
    std::snprintf(buf, sizeof buf, "%.3f .. %.3f (mean %.3f)", *lo, *hi, mean / v.size());
    return std::string(buf);
  };
  std::printf("\nroutes where auto picked a provider slower by more than %.0f %%: %d of %zu\n",
              100 * kTieFraction, slower_picks, grid.size());
  std::printf("auto / native over the %zu routes auto kept on native: %s\n", kept_ratio.size(),
              spread(kept_ratio).c_str());
  std::printf("native / native (noise) over the same routes: %s\n", spread(noise_ratio).c_str());
  std::printf("cuDNN plan cache after the routes: %zu plans, %.1f MiB of device memory "
              "(workspace %.1f MiB)\n",
              timer.cache().num_plans(), timer.cache().device_bytes() / 1048576.0,
              timer.cache().workspace_bytes() / 1048576.0);
  report_graph_reservation(dev);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse_args(argc, argv);
    return run_routes(a);
  } catch (const Error& e) {
    std::fprintf(stderr, "attention_route_bench: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_route_bench: error: %s (see --help)\n", e.what());
    return 2;
  }
}
