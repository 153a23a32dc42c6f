// Decode matrix products: cuBLASLt with the heuristic's first algorithm, cuBLASLt autotuned
// (LtMatmul's timing of up to 16 heuristic candidates), and the skinny weight-streaming
// kernel, each against the device-to-device copy bandwidth this run measures.
//
//   matmul_bench [--quick] [--out FILE.csv] [--lora-only] [--lora-timeline] [--prefill]
//
// For each Qwen3-4B and Qwen3-0.6B product (q|k|v, o_proj, gate|up, down, lm_head with
// float32 logits) and M in {1, 8, 32, 64, 128, 256}: time = median over graph replays of a
// graph of 20 launches that rotate over enough weight copies to exceed 4x the L2, divided
// by 20; bytes = weights + x + out; printed as µs, GB/s and % of the copy bandwidth: the
// better of a plain cudaMemcpyAsync (device to device, on a stream, not in a graph: a
// graph's memcpy node may run on a copy engine at ~2.8 TB/s where the SM copy reaches ~4.2
// on an H200) and a 16-byte-vector copy kernel, 2 GiB, bytes read + bytes written. Then the
// autotuned plan (algorithm, split-K, rank in the heuristic's list) and the relative
// difference of the tuned and skinny outputs from the heuristic one (a sanity check; the
// tests check correctness). Last, "full decode step" lines: Qwen3-4B's four layer products
// x 36 + lm_head at M = 32, summed per variant, against the copy bandwidth. In between, the
// skinny kernel's time on the Qwen3-4B layer products for every forced split-K factor, and
// on row-major against packed weights (pack_skinny_weights, what the engine streams).
// Launches in a graph follow each other with programmatic dependent launch (as in the
// decode step), so the skinny kernel's weight prefetch overlaps the previous launch.
// Last (or alone with --lora-only), LoRA inside the skinny products: Qwen3-4B's four layer
// products at M = 32 (qkv with a plain epilogue) without LoRA, as a LoRA launch whose rows
// all have no adapter (what the LoRA-capable kernel and its idle LoRA tile cost by
// themselves), with one r = 32 adapter for every row, with 8 adapters across the rows (the engine's one launch, and the shrink launch
// + expand launch it falls back to, which must give the same bits), each adapter's factors
// rotated like the weights so that they come from HBM; per layer, the fraction of the
// product time without LoRA (issue 19's decode targets are 85 % and 80 % of the whole step).
// --lora-timeline adds, per product and LoRA variant, where the last launch of a timed
// graph spent its time: each CTA's thread 0 reads the global timer at the kernel's phase
// boundaries (SkinnyLora::stamps), printed as median / maximum over the CTAs of a kind in
// µs from the launch's first CTA.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "pagellm/common/check.h"
#include "pagellm/cuda/lora/lora.h"
#include "pagellm/cuda/matmul/matmul.h"
#include "pagellm/cuda/matmul/skinny_gemm.h"

namespace {

using pagellm::cuda::LtMatmul;
using pagellm::cuda::MatmulPath;

}  // namespace

#include "cuda_bench_util.cuh"

namespace {
using namespace pagellm_bench;

struct Shape {
  const char* model;
  const char* name;
  int64_t N, K;
  bool f32_out;
};

struct Result {
  double us = 0, gbs = 0, frac = 0;
};

/// Relative L2 difference of two outputs (float32 view).
double rel_diff(const void* a, const void* b, size_t count, bool f32) {
  std::vector<float> fa(count), fb(count);
  if (f32) {
    CHECK_CUDA(cudaMemcpy(fa.data(), a, count * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(fb.data(), b, count * 4, cudaMemcpyDeviceToHost));
  } else {
    std::vector<__nv_bfloat16> ha(count), hb(count);
    CHECK_CUDA(cudaMemcpy(ha.data(), a, count * 2, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(hb.data(), b, count * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; ++i) {
      fa[i] = __bfloat162float(ha[i]);
      fb[i] = __bfloat162float(hb[i]);
    }
  }
  double d2 = 0, r2 = 0;
  for (size_t i = 0; i < count; ++i) {
    const double d = static_cast<double>(fa[i]) - fb[i];
    d2 += std::isfinite(d) ? d * d : 1e30;
    r2 += static_cast<double>(fb[i]) * fb[i];
  }
  return std::sqrt(d2) / std::max(std::sqrt(r2), 1e-30);
}

/// Prints the phase stamps of one LoRA launch (SkinnyLora::stamps, `ctas` CTAs).
void print_lora_stamps(const char* product, const char* variant,
                       const std::vector<unsigned long long>& st, size_t ctas) {
  namespace pc = pagellm::cuda;
  constexpr int S = pc::kSkinnyStamps;
  unsigned long long t0 = ~0ull;
  for (size_t c = 0; c < ctas; ++c) {
    if (st[c * S + pc::kStampEntry] != 0) t0 = std::min(t0, st[c * S + pc::kStampEntry]);
  }
  // Median and maximum (µs) of stamp b minus stamp a (a < 0: the launch's start) over the
  // CTAs of `kind` that reached both.
  const auto stat = [&](int kind, int a, int b) {
    std::vector<double> v;
    for (size_t c = 0; c < ctas; ++c) {
      const unsigned long long* x = &st[c * S];
      if (x[pc::kStampEntry] == 0 || static_cast<int>(x[pc::kStampKind]) != kind) continue;
      const unsigned long long from = a < 0 ? t0 : x[a];
      if (from == 0 || x[b] == 0) continue;
      v.push_back(1e-3 * static_cast<double>(static_cast<long long>(x[b] - from)));
    }
    if (v.empty()) return std::string("     -");
    std::sort(v.begin(), v.end());
    char buf[48];
    std::snprintf(buf, sizeof(buf), "%5.1f/%5.1f", v[v.size() / 2], v.back());
    return std::string(buf);
  };
  int count[3] = {0, 0, 0};
  for (size_t c = 0; c < ctas; ++c) {
    const unsigned long long* x = &st[c * S];
    if (x[pc::kStampEntry] != 0 && x[pc::kStampKind] < 3) ++count[x[pc::kStampKind]];
  }
  std::printf("  %-8s %-10s | LoRA tiles %3d: waited %s loop %s end %s | plain rows %3d: waited %s "
              "loop %s end %s | expanding %3d: waited %s loop %s B issued %s counter %s shrink %s "
              "tiles %s mma %s end %s\n",
              product, variant, count[1], stat(1, -1, pc::kStampWaited).c_str(),
              stat(1, -1, pc::kStampMainLoop).c_str(), stat(1, -1, pc::kStampEnd).c_str(),
              count[0], stat(0, -1, pc::kStampWaited).c_str(),
              stat(0, -1, pc::kStampMainLoop).c_str(), stat(0, -1, pc::kStampEnd).c_str(),
              count[2], stat(2, -1, pc::kStampWaited).c_str(),
              stat(2, -1, pc::kStampMainLoop).c_str(),
              stat(2, pc::kStampMainLoop, pc::kStampBIssued).c_str(),
              stat(2, pc::kStampMainLoop, pc::kStampCounterSeen).c_str(),
              stat(2, pc::kStampMainLoop, pc::kStampShrinkReady).c_str(),
              stat(2, pc::kStampShrinkReady, pc::kStampTilesReady).c_str(),
              stat(2, pc::kStampTilesReady, pc::kStampExpanded).c_str(),
              stat(2, -1, pc::kStampEnd).c_str());
}

/// The LoRA section (see the file comment): µs per product at M = 32 without LoRA, with one
/// adapter on every row and with 8 adapters, and the layer's fraction; with `timeline`, the
/// phase stamps of each LoRA variant.
void lora_section(cudaStream_t stream, const cudaDeviceProp& prop, int reps, int launches,
                  bool timeline) {
  namespace pc = pagellm::cuda;
  constexpr int64_t kM = 32, kRank = 32;
  struct Product {
    const char* name;
    int64_t N, K, inter;  // inter > 0: gated (w = [gate; up], out [M, inter])
    int modules;
    int64_t width[3];
  };
  const Product products[] = {{"qkv", 6144, 2560, 0, 3, {4096, 1024, 1024}},
                              {"o_proj", 2560, 4096, 0, 1, {2560, 0, 0}},
                              {"gate_up", 19456, 2560, 9728, 2, {9728, 9728, 0}},
                              {"down", 2560, 9728, 0, 1, {2560, 0, 0}}};
  std::printf("\nLoRA inside the skinny products: Qwen3-4B, M = %lld, rank %lld, max rank %lld "
              "(us per product; +%% over the product without LoRA)\n",
              static_cast<long long>(kM), static_cast<long long>(kRank),
              static_cast<long long>(kRank));
  std::printf("%-8s | %8s | %8s %7s | %8s %7s | %8s %7s | %9s %7s | %s\n", "op", "base",
              "no rows", "+%", "1 adapt", "+%", "8 adapt", "+%", "8, 2 lnch", "+%",
              "8: one launch vs two");
  double layer[5] = {0, 0, 0, 0, 0};
  for (const Product& pr : products) {
    const bool gated = pr.inter > 0;
    const int64_t out_cols = gated ? pr.inter : pr.N;
    const int64_t width_total = pr.width[0] + pr.width[1] + pr.width[2];
    const size_t weight_bytes = static_cast<size_t>(pr.N * pr.K) * 2;
    const size_t packed_bytes = pc::skinny_packed_bytes(pr.N, pr.K);
    const int copies = static_cast<int>(std::max<size_t>(
        2, (4 * static_cast<size_t>(prop.l2CacheSize) + packed_bytes - 1) / packed_bytes));
    void *w = nullptr, *wp = nullptr, *x = nullptr, *out_a = nullptr, *out_b = nullptr;
    CHECK_CUDA(cudaMalloc(&w, weight_bytes));
    CHECK_CUDA(cudaMalloc(&wp, packed_bytes * copies));
    CHECK_CUDA(cudaMalloc(&x, static_cast<size_t>(kM * pr.K) * 2));
    CHECK_CUDA(cudaMalloc(&out_a, static_cast<size_t>(kM * out_cols) * 2));
    CHECK_CUDA(cudaMalloc(&out_b, static_cast<size_t>(kM * out_cols) * 2));
    fill_random(w, weight_bytes / 2, 7);
    fill_random(x, static_cast<size_t>(kM * pr.K), 11);
    for (int i = 0; i < copies; ++i) {
      pc::pack_skinny_weights(w, pr.N, pr.K, pr.inter, static_cast<char*>(wp) + i * packed_bytes,
                              stream);
    }
    // 8 adapter slots per weight copy: A [modules · r, K], Bᵀ [r, width_total], packed A
    // and packed B;
    // scaled down so that the deltas stay of the products' size.
    constexpr int kSlots = 8;
    const int64_t a_rows = pr.modules * kRank;
    const size_t a_bytes = static_cast<size_t>(a_rows * pr.K) * 2;
    const size_t bt_bytes = static_cast<size_t>(kRank * width_total) * 2;
    const size_t ap_bytes = pc::lora_packed_a_bytes(a_rows, pr.K);
    const size_t bp_bytes = pc::lora_packed_b_bytes(kRank, width_total);
    const size_t factor_bytes = a_bytes + bt_bytes + ap_bytes + bp_bytes;
    void* factors = nullptr;
    CHECK_CUDA(cudaMalloc(&factors, factor_bytes * kSlots * copies));
    std::vector<pc::LoraSlotRef> refs(static_cast<size_t>(copies) * (kSlots + 1));
    for (int c = 0; c < copies; ++c) {
      for (int q = 1; q <= kSlots; ++q) {
        char* base = static_cast<char*>(factors) + (c * kSlots + q - 1) * factor_bytes;
        fill_random(base, (a_bytes + bt_bytes) / 2, 100 + q);
        char* const ap = base + a_bytes + bt_bytes;
        pc::pack_lora_a(base, a_rows, pr.K, ap, stream);
        pc::pack_lora_b(base + a_bytes, kRank, width_total, pr.inter, ap + ap_bytes, stream);
        refs[c * (kSlots + 1) + q] = {base, base + a_bytes, static_cast<int32_t>(kRank),
                                      0.5f / static_cast<float>(pr.K), ap, ap + ap_bytes};
      }
    }
    pc::LoraSlotRef* d_refs = nullptr;
    CHECK_CUDA(cudaMalloc(&d_refs, refs.size() * sizeof(refs[0])));
    CHECK_CUDA(cudaMemcpy(d_refs, refs.data(), refs.size() * sizeof(refs[0]),
                          cudaMemcpyHostToDevice));
    // Row slots: all rows slot 1, or row i slot 1 + i mod 8, or none.
    std::vector<int32_t> one(kM, 1), eight(kM), none(kM, 0);
    for (int64_t i = 0; i < kM; ++i) eight[i] = static_cast<int32_t>(1 + i % kSlots);
    int32_t *d_one = nullptr, *d_eight = nullptr, *d_none = nullptr;
    float* s = nullptr;
    uint32_t* counters = nullptr;
    CHECK_CUDA(cudaMalloc(&d_one, kM * 4));
    CHECK_CUDA(cudaMalloc(&d_eight, kM * 4));
    CHECK_CUDA(cudaMemcpy(d_one, one.data(), kM * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_eight, eight.data(), kM * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMalloc(&d_none, kM * 4));
    CHECK_CUDA(cudaMemcpy(d_none, none.data(), kM * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMalloc(&s, pc::lora_skinny_s_floats(kM, pr.modules) * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&counters, 2 * sizeof(uint32_t)));
    CHECK_CUDA(cudaMemset(counters, 0, 2 * sizeof(uint32_t)));
    // Set while the timeline runs: room for the largest grid here (224 CTAs at M = 32:
    // qkv's 8 LoRA and 48 row tiles, each split 4 ways).
    unsigned long long* stamps = nullptr;
    constexpr size_t kStampCtas = 4096;
    CHECK_CUDA(cudaStreamSynchronize(stream));

    // Variant v: 0 none, 1 one adapter, 2 eight adapters, 3 eight in two launches, 4 a
    // LoRA launch (one adapter slot) whose rows use no adapter.
    const auto lora_of = [&](int v, int copy) {
      pc::SkinnyLora l;
      l.slots = d_refs + copy * (kSlots + 1);
      l.num_slots = v == 1 || v == 4 ? 2 : kSlots + 1;
      l.row_slots = v == 1 ? d_one : v == 4 ? d_none : d_eight;
      l.num_modules = pr.modules;
      l.max_rank = static_cast<int32_t>(kRank);
      for (int m = 0; m < 3; ++m) l.width[m] = pr.width[m];
      l.s = s;
      l.counters = v == 3 ? nullptr : counters;
      l.stamps = stamps;
      return l;
    };
    const auto run = [&](int v, int i, void* out) {
      const int copy = i % copies;
      const void* wpc = static_cast<char*>(wp) + copy * packed_bytes;
      const pc::SkinnyLora l = lora_of(v, copy);
      const pc::SkinnyLora* lp = v == 0 ? nullptr : &l;
      if (gated) {
        pc::launch_skinny_gemm_silu_mul(x, w, out, kM, pr.inter, pr.K, stream, 0, wpc, false, lp);
      } else {
        pc::launch_skinny_gemm(x, w, out, false, kM, pr.N, pr.K, stream, 0, wpc, false, lp);
      }
    };
    double us[5];
    for (int v = 0; v < 5; ++v) {
      us[v] = 1e3 * time_launches([&](int i) { run(v, i, out_a); }, launches, stream, reps);
    }
    // The same copy in one launch and in two: the same bits.
    run(2, 0, out_a);
    run(3, 0, out_b);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    const size_t out_bytes = static_cast<size_t>(kM * out_cols) * 2;
    std::vector<char> a(out_bytes), b(out_bytes);
    CHECK_CUDA(cudaMemcpy(a.data(), out_a, out_bytes, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(b.data(), out_b, out_bytes, cudaMemcpyDeviceToHost));
    const bool same = std::memcmp(a.data(), b.data(), out_bytes) == 0;
    const auto pct = [&](int v) { return 100 * (us[v] / us[0] - 1); };
    std::printf("%-8s | %8.1f | %8.1f %6.1f%% | %8.1f %6.1f%% | %8.1f %6.1f%% | %9.1f %6.1f%% | %s\n",
                pr.name, us[0], us[4], pct(4), us[1], pct(1), us[2], pct(2), us[3], pct(3),
                same ? "same bits" : "OUTPUTS DIFFER");
    for (int v = 0; v < 5; ++v) layer[v] += us[v];
    if (timeline) {
      const char* names[5] = {"none", "1 adapter", "8 adapters", "8, 2 lnch", "no rows"};
      const size_t count = kStampCtas * pc::kSkinnyStamps;
      CHECK_CUDA(cudaMalloc(&stamps, count * sizeof(unsigned long long)));
      for (int v : {4, 1, 2}) {
        CHECK_CUDA(cudaMemset(stamps, 0, count * sizeof(unsigned long long)));
        time_launches([&](int i) { run(v, i, out_a); }, launches, stream, 1);
        std::vector<unsigned long long> host(count);
        CHECK_CUDA(cudaMemcpy(host.data(), stamps, count * sizeof(unsigned long long),
                              cudaMemcpyDeviceToHost));
        print_lora_stamps(pr.name, names[v], host, kStampCtas);
      }
      CHECK_CUDA(cudaFree(stamps));
      stamps = nullptr;
    }
    for (void* p : {w, wp, x, out_a, out_b, factors, static_cast<void*>(d_refs),
                    static_cast<void*>(d_one), static_cast<void*>(d_eight),
                    static_cast<void*>(d_none), static_cast<void*>(s),
                    static_cast<void*>(counters)}) {
      CHECK_CUDA(cudaFree(p));
    }
  }
  const auto lpct = [&](int v) { return 100 * (layer[v] / layer[0] - 1); };
  std::printf("layer    | %8.1f | %8.1f %6.1f%% | %8.1f %6.1f%% | %8.1f %6.1f%% | %9.1f %6.1f%% | "
              "products without LoRA / with: %.1f %% (1 adapter), %.1f %% (8)\n",
              layer[0], layer[4], lpct(4), layer[1], lpct(1), layer[2], lpct(2), layer[3],
              lpct(3), 100 * layer[0] / layer[1], 100 * layer[0] / layer[2]);
}

}  // namespace

// --prefill: Qwen3-4B's four layer products at prefill chunk sizes (M = 8,192 and 16,384)
// through cuBLASLt, the engine's way (o_proj and down adding into the residual,
// LtMatmul::run_accumulate): the heuristic's first algorithm against the fastest of its
// candidates (LtMatmul's autotuning, allowed at any M here; the engine tunes only M <= 512).
// Per product the tuned plan's line; then a layer's four products back to back, ten layers
// a run, with either set of plans: µs per layer and TFLOP/s against the 806 TFLOP/s bf16
// rate measured on the H200 (sustained, so under the board's power cap as in a prefill).
void prefill_section(cudaStream_t stream, int reps) {
  struct Product {
    const char* name;
    int64_t N, K;
    bool accumulate;
  };
  const Product products[] = {{"qkv", 6144, 2560, false},
                              {"o_proj", 2560, 4096, true},
                              {"gate_up", 19456, 2560, false},
                              {"down", 2560, 9728, true}};
  const size_t ws_bytes = size_t{32} << 20;
  void* ws = nullptr;
  CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
  for (int64_t M : {int64_t{8192}, int64_t{16384}}) {
    LtMatmul top(ws, ws_bytes), tuned(ws, ws_bytes);
    top.set_path(MatmulPath::kCublasLt);
    top.set_autotune(false);
    tuned.set_path(MatmulPath::kCublasLt);
    tuned.set_autotune(true);
    tuned.set_autotune_max_m(int64_t{1} << 40);
    std::vector<void*> xs, ws_, outs;
    double flops = 0;
    for (const Product& p : products) {
      void *x = nullptr, *w = nullptr, *out = nullptr;
      CHECK_CUDA(cudaMalloc(&x, static_cast<size_t>(M * p.K) * 2));
      CHECK_CUDA(cudaMalloc(&w, static_cast<size_t>(p.N * p.K) * 2));
      CHECK_CUDA(cudaMalloc(&out, static_cast<size_t>(M * p.N) * 2));
      fill_random(x, static_cast<size_t>(M * p.K), 11);
      fill_random(w, static_cast<size_t>(p.N * p.K), 7);
      fill_random(out, static_cast<size_t>(M * p.N), 13);
      xs.push_back(x);
      ws_.push_back(w);
      outs.push_back(out);
      flops += 2.0 * static_cast<double>(M) * static_cast<double>(p.N) * static_cast<double>(p.K);
    }
    auto run = [&](LtMatmul& lt, size_t i) {
      const Product& p = products[i];
      if (p.accumulate) {
        lt.run_accumulate(xs[i], ws_[i], outs[i], M, p.N, p.K, stream);
      } else {
        lt.run(xs[i], ws_[i], outs[i], CUDA_R_16BF, M, p.N, p.K, stream);
      }
    };
    for (size_t i = 0; i < 4; ++i) {
      run(top, i);
      run(tuned, i);
      const bool acc = products[i].accumulate;
      const pagellm::cuda::MatmulPlanInfo* info = tuned.plan_info(
          xs[i], ws_[i], outs[i], CUDA_R_16BF, M, products[i].N, products[i].K, acc);
      const pagellm::cuda::MatmulPlanInfo* top_info = top.plan_info(
          xs[i], ws_[i], outs[i], CUDA_R_16BF, M, products[i].N, products[i].K, acc);
      std::printf("prefill M=%lld %-8s%s: heuristic %s | tuned %s\n", static_cast<long long>(M),
                  products[i].name, products[i].accumulate ? " (+=)" : "",
                  top_info ? top_info->summary().c_str() : "?",
                  info ? info->summary().c_str() : "?");
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
    for (int round = 0; round < 2; ++round) {
      for (LtMatmul* lt : {&top, &tuned}) {
        const double ms = time_stream(
            [&] {
              for (int layer = 0; layer < 10; ++layer) {
                for (size_t i = 0; i < 4; ++i) run(*lt, i);
              }
            },
            stream, reps);
        const double layer_us = ms * 1e3 / 10;
        const double tflops = flops / (layer_us * 1e-6) / 1e12;
        std::printf("prefill M=%lld layer, %-9s plans: %8.1f us, %6.1f TFLOP/s (%.1f %% of 806)\n",
                    static_cast<long long>(M), lt == &top ? "heuristic" : "tuned", layer_us,
                    tflops, 100.0 * tflops / 806.0);
      }
    }
    for (size_t i = 0; i < 4; ++i) {
      CHECK_CUDA(cudaFree(xs[i]));
      CHECK_CUDA(cudaFree(ws_[i]));
      CHECK_CUDA(cudaFree(outs[i]));
    }
  }
  CHECK_CUDA(cudaFree(ws));
}

int main(int argc, char** argv) {
  bool quick = false, lora_only = false, lora_timeline = false, prefill_only = false;
  std::string csv_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--lora-only")) {
      lora_only = true;
    } else if (!std::strcmp(argv[i], "--lora-timeline")) {
      lora_timeline = true;
    } else if (!std::strcmp(argv[i], "--prefill")) {
      prefill_only = true;
    } else if (!std::strcmp(argv[i], "--out") && i + 1 < argc) {
      csv_path = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--out FILE.csv] [--lora-only] [--lora-timeline] "
                   "[--prefill]\n",
                   argv[0]);
      return 2;
    }
  }
  try {
    int device = 0;
    CHECK_CUDA(cudaGetDevice(&device));
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const CopyBandwidth bw = copy_bandwidth(stream, prop);
    const double copy_gbs = bw.best();
    std::printf("%s: %d SMs, L2 %.0f MB; copy bandwidth (read + write) %.0f GB/s "
                "(cudaMemcpyAsync %.0f, copy kernel %.0f)\n",
                prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1e6, copy_gbs,
                bw.memcpy_gbs, bw.kernel_gbs);
    if (prefill_only) {
      prefill_section(stream, quick ? 3 : 5);
      CHECK_CUDA(cudaStreamDestroy(stream));
      return 0;
    }
    if (lora_only) {
      lora_section(stream, prop, quick ? 5 : 15, 20, lora_timeline);
      CHECK_CUDA(cudaStreamDestroy(stream));
      return 0;
    }

    // Three variants on one stream; they run one after another, so they share the cuBLASLt
    // workspace.
    void* lt_workspace = nullptr;
    const size_t lt_workspace_bytes = size_t{32} << 20;
    CHECK_CUDA(cudaMalloc(&lt_workspace, lt_workspace_bytes));
    LtMatmul top(lt_workspace, lt_workspace_bytes), tuned(lt_workspace, lt_workspace_bytes),
        skinny(lt_workspace, lt_workspace_bytes);
    top.set_path(MatmulPath::kCublasLt);
    top.set_autotune(false);
    tuned.set_path(MatmulPath::kCublasLt);
    tuned.set_autotune(true);
    skinny.set_path(MatmulPath::kSkinny);
    constexpr int kVariants = 3;
    LtMatmul* variants[kVariants] = {&top, &tuned, &skinny};

    const std::vector<Shape> shapes = {
        {"4B", "qkv", 6144, 2560, false},       {"4B", "o_proj", 2560, 4096, false},
        {"4B", "gate_up", 19456, 2560, false},  {"4B", "down", 2560, 9728, false},
        {"4B", "lm_head", 151936, 2560, true},  {"0.6B", "qkv", 4096, 1024, false},
        {"0.6B", "o_proj", 1024, 2048, false},  {"0.6B", "gate_up", 6144, 1024, false},
        {"0.6B", "down", 1024, 3072, false},    {"0.6B", "lm_head", 151936, 1024, true}};
    const std::vector<int64_t> ms =
        quick ? std::vector<int64_t>{1, 32, 128} : std::vector<int64_t>{1, 8, 32, 64, 128, 256};
    const int reps = quick ? 5 : 15;
    const int launches = 20;
    const int64_t max_m = 256;

    FILE* csv = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
    if (!csv_path.empty() && !csv) {
      std::fprintf(stderr, "cannot write %s\n", csv_path.c_str());
      return 1;
    }
    if (csv) {
      std::fprintf(csv,
                   "model,op,M,N,K,out,bytes,top_us,top_gbs,top_frac,tuned_us,tuned_gbs,"
                   "tuned_frac,skinny_us,skinny_gbs,skinny_frac,top_plan,tuned_plan,"
                   "tuned_rel_diff,skinny_rel_diff\n");
    }
    std::printf("\n%-5s %-8s %4s %7s %6s | %8s %6s %6s | %8s %6s %6s | %9s %6s %6s | %9s %9s | %s\n",
                "model", "op", "M", "N", "K", "top_us", "GB/s", "%copy", "tuned_us", "GB/s",
                "%copy", "skinny_us", "GB/s", "%copy", "d(tuned)", "d(skinny)",
                "tuned plan (vs top)");

    // (model/op/M) -> times per variant, for the decode-step lines.
    std::map<std::string, std::vector<Result>> table;
    for (const Shape& s : shapes) {
      const size_t weight_bytes = static_cast<size_t>(s.N * s.K) * 2;
      const int copies = static_cast<int>(std::max<size_t>(
          2, (4 * static_cast<size_t>(prop.l2CacheSize) + weight_bytes - 1) / weight_bytes));
      void *w = nullptr, *x = nullptr;
      void* outs[kVariants] = {};
      const size_t out_elem = s.f32_out ? 4 : 2;
      CHECK_CUDA(cudaMalloc(&w, weight_bytes * copies));
      CHECK_CUDA(cudaMalloc(&x, static_cast<size_t>(max_m * s.K) * 2));
      for (void*& o : outs) CHECK_CUDA(cudaMalloc(&o, static_cast<size_t>(max_m * s.N) * out_elem));
      fill_random(w, weight_bytes / 2 * copies, 7);
      fill_random(x, static_cast<size_t>(max_m * s.K), 11);
      CHECK_CUDA(cudaDeviceSynchronize());
      const cudaDataType_t out_type = s.f32_out ? CUDA_R_32F : CUDA_R_16BF;
      auto weight = [&](int i) { return static_cast<char*>(w) + (i % copies) * weight_bytes; };

      for (int64_t M : ms) {
        const double bytes = static_cast<double>(weight_bytes) + M * s.K * 2.0 +
                             M * static_cast<double>(s.N) * out_elem;
        std::vector<Result> res(kVariants);
        for (int v = 0; v < kVariants; ++v) {
          LtMatmul& mm = *variants[v];
          // Plan (and, for `tuned`, autotune) outside capture, as the engine's warm-up does.
          mm.run(x, weight(0), outs[v], out_type, M, s.N, s.K, stream);
          CHECK_CUDA(cudaStreamSynchronize(stream));
          const double ms_per = time_launches(
              [&](int i) { mm.run(x, weight(i), outs[v], out_type, M, s.N, s.K, stream); },
              launches, stream, reps);
          res[v].us = ms_per * 1e3;
          res[v].gbs = bytes / (ms_per * 1e-3) / 1e9;
          res[v].frac = res[v].gbs / copy_gbs;
        }
        // Every output was last written from weight copy (launches - 1) % copies.
        const size_t count = static_cast<size_t>(M * s.N);
        const double d_tuned = rel_diff(outs[1], outs[0], count, s.f32_out);
        const double d_skinny = rel_diff(outs[2], outs[0], count, s.f32_out);
        const pagellm::cuda::MatmulPlanInfo* tp =
            tuned.plan_info(x, weight(0), outs[1], out_type, M, s.N, s.K);
        const pagellm::cuda::MatmulPlanInfo* hp =
            top.plan_info(x, weight(0), outs[0], out_type, M, s.N, s.K);
        const std::string tuned_plan = tp ? tp->summary() : std::string("?");
        const std::string top_plan = hp ? hp->summary() : std::string("?");
        std::printf("%-5s %-8s %4lld %7lld %6lld | %8.1f %6.0f %5.1f%% | %8.1f %6.0f %5.1f%% | "
                    "%9.1f %6.0f %5.1f%% | %9.2e %9.2e | %s%s\n",
                    s.model, s.name, static_cast<long long>(M), static_cast<long long>(s.N),
                    static_cast<long long>(s.K), res[0].us, res[0].gbs, 100 * res[0].frac,
                    res[1].us, res[1].gbs, 100 * res[1].frac, res[2].us, res[2].gbs,
                    100 * res[2].frac, d_tuned, d_skinny, tuned_plan.c_str(),
                    d_tuned > 2e-2 || d_skinny > 2e-2 ? "  <-- MISMATCH" : "");
        if (csv) {
          std::fprintf(csv,
                       "%s,%s,%lld,%lld,%lld,%s,%.0f,%.3f,%.1f,%.4f,%.3f,%.1f,%.4f,%.3f,%.1f,"
                       "%.4f,\"%s\",\"%s\",%.3e,%.3e\n",
                       s.model, s.name, static_cast<long long>(M), static_cast<long long>(s.N),
                       static_cast<long long>(s.K), s.f32_out ? "f32" : "bf16", bytes, res[0].us,
                       res[0].gbs, res[0].frac, res[1].us, res[1].gbs, res[1].frac, res[2].us,
                       res[2].gbs, res[2].frac, top_plan.c_str(), tuned_plan.c_str(), d_tuned,
                       d_skinny);
        }
        table[std::string(s.model) + "/" + s.name + "/" + std::to_string(M)] = res;
      }
      CHECK_CUDA(cudaFree(w));
      CHECK_CUDA(cudaFree(x));
      for (void* o : outs) CHECK_CUDA(cudaFree(o));
    }

    // The skinny kernel's split-K (cluster size) sweep on the Qwen3-4B layer products: the
    // data behind skinny_gemm_plan()'s choice ("*" marks it).
    {
      const int sms = prop.multiProcessorCount;
      std::printf("\nskinny kernel, forced splits (us per product; * = the plan's choice)\n");
      std::printf("%-8s %4s %7s %6s |", "op", "M", "N", "K");
      for (int sp = 1; sp <= pagellm::cuda::kSkinnyMaxSplits; ++sp) std::printf(" %7d", sp);
      std::printf("\n");
      for (const Shape& s : shapes) {
        if (std::strcmp(s.model, "4B") != 0 || s.f32_out) continue;
        const size_t weight_bytes = static_cast<size_t>(s.N * s.K) * 2;
        const int copies = static_cast<int>(std::max<size_t>(
            2, (4 * static_cast<size_t>(prop.l2CacheSize) + weight_bytes - 1) / weight_bytes));
        void *w = nullptr, *x = nullptr, *out = nullptr;
        CHECK_CUDA(cudaMalloc(&w, weight_bytes * copies));
        CHECK_CUDA(cudaMalloc(&x, static_cast<size_t>(64 * s.K) * 2));
        CHECK_CUDA(cudaMalloc(&out, static_cast<size_t>(64 * s.N) * 2));
        fill_random(w, weight_bytes / 2 * copies, 7);
        fill_random(x, static_cast<size_t>(64 * s.K), 11);
        CHECK_CUDA(cudaDeviceSynchronize());
        for (int64_t M : {int64_t{1}, int64_t{32}, int64_t{64}}) {
          const int chosen = pagellm::cuda::skinny_gemm_plan(M, s.N, s.K, sms).splits;
          std::printf("%-8s %4lld %7lld %6lld |", s.name, static_cast<long long>(M),
                      static_cast<long long>(s.N), static_cast<long long>(s.K));
          for (int sp = 1; sp <= pagellm::cuda::kSkinnyMaxSplits; ++sp) {
            const auto launch = [&](int i) {
              pagellm::cuda::launch_skinny_gemm(
                  x, static_cast<char*>(w) + (i % copies) * weight_bytes, out, false, M, s.N,
                  s.K, stream, sp);
            };
            const double us = 1e3 * time_launches(launch, launches, stream, reps);
            std::printf(" %6.1f%s", us, sp == chosen ? "*" : " ");
          }
          std::printf("\n");
        }
        CHECK_CUDA(cudaFree(w));
        CHECK_CUDA(cudaFree(x));
        CHECK_CUDA(cudaFree(out));
      }
    }

    // The skinny kernel on weights packed as its shared-memory stages (pack_skinny_weights:
    // one contiguous 16 KiB block per stage instead of 128 bytes from each of 128 rows), on
    // the Qwen3-4B products; the outputs must agree bit for bit.
    {
      std::printf("\nskinny kernel, row-major against packed weights (us per product, %% of copy "
                  "bandwidth; step: 36 layers + lm_head at M = 32)\n");
      double step_rows = 0, step_packed = 0, packed_step_bytes = 0;
      for (const Shape& s : shapes) {
        if (std::strcmp(s.model, "4B") != 0) continue;
        const size_t weight_bytes = static_cast<size_t>(s.N * s.K) * 2;
        const size_t packed_bytes = pagellm::cuda::skinny_packed_bytes(s.N, s.K);
        const int copies = static_cast<int>(std::max<size_t>(
            2, (4 * static_cast<size_t>(prop.l2CacheSize) + weight_bytes - 1) / weight_bytes));
        const size_t out_elem = s.f32_out ? 4 : 2;
        void *w = nullptr, *wp = nullptr, *x = nullptr, *out_a = nullptr, *out_b = nullptr;
        CHECK_CUDA(cudaMalloc(&w, weight_bytes * copies));
        CHECK_CUDA(cudaMalloc(&wp, packed_bytes * copies));
        CHECK_CUDA(cudaMalloc(&x, static_cast<size_t>(32 * s.K) * 2));
        CHECK_CUDA(cudaMalloc(&out_a, static_cast<size_t>(32 * s.N) * out_elem));
        CHECK_CUDA(cudaMalloc(&out_b, static_cast<size_t>(32 * s.N) * out_elem));
        fill_random(w, weight_bytes / 2 * copies, 7);
        fill_random(x, static_cast<size_t>(32 * s.K), 11);
        for (int i = 0; i < copies; ++i) {
          pagellm::cuda::pack_skinny_weights(static_cast<char*>(w) + i * weight_bytes, s.N, s.K,
                                             0, static_cast<char*>(wp) + i * packed_bytes, stream);
        }
        CHECK_CUDA(cudaStreamSynchronize(stream));
        for (int64_t M : {int64_t{1}, int64_t{32}}) {
          double us[2];
          for (int packed = 0; packed < 2; ++packed) {
            const auto launch = [&](int i) {
              pagellm::cuda::launch_skinny_gemm(
                  x, static_cast<char*>(w) + (i % copies) * weight_bytes, packed ? out_b : out_a,
                  s.f32_out, M, s.N, s.K, stream, 0,
                  packed ? static_cast<char*>(wp) + (i % copies) * packed_bytes : nullptr);
            };
            us[packed] = 1e3 * time_launches(launch, launches, stream, reps);
          }
          const size_t out_bytes = static_cast<size_t>(M * s.N) * out_elem;
          std::vector<char> a(out_bytes), b(out_bytes);
          CHECK_CUDA(cudaMemcpy(a.data(), out_a, out_bytes, cudaMemcpyDeviceToHost));
          CHECK_CUDA(cudaMemcpy(b.data(), out_b, out_bytes, cudaMemcpyDeviceToHost));
          const bool same = std::memcmp(a.data(), b.data(), out_bytes) == 0;
          const double bytes = static_cast<double>(weight_bytes) + M * s.K * 2.0 +
                               M * static_cast<double>(s.N) * out_elem;
          std::printf("%-8s %4lld %7lld %6lld | row-major %7.1f us %5.1f%% | packed %7.1f us "
                      "%5.1f%% | %s\n",
                      s.name, static_cast<long long>(M), static_cast<long long>(s.N),
                      static_cast<long long>(s.K), us[0], 100 * bytes / (us[0] * 1e3) / copy_gbs,
                      us[1], 100 * bytes / (us[1] * 1e3) / copy_gbs,
                      same ? "same bits" : "OUTPUTS DIFFER");
          if (M == 32) {
            const int times = s.f32_out ? 1 : 36;
            step_rows += times * us[0];
            step_packed += times * us[1];
            packed_step_bytes += times * bytes;
          }
        }
        CHECK_CUDA(cudaFree(w));
        CHECK_CUDA(cudaFree(wp));
        CHECK_CUDA(cudaFree(x));
        CHECK_CUDA(cudaFree(out_a));
        CHECK_CUDA(cudaFree(out_b));
      }
      const double floor_packed = packed_step_bytes / (copy_gbs * 1e9) * 1e6;
      std::printf("  step: row-major %.0f us (%.1f%%), packed %.0f us (%.1f%%)\n", step_rows,
                  100 * floor_packed / step_rows, step_packed, 100 * floor_packed / step_packed);
    }

    // Full decode step of Qwen3-4B at M = 32: 36 layers of the four products + lm_head.
    const int64_t step_m = 32;
    double sums[kVariants] = {0, 0, 0};
    double step_bytes = 0;
    for (const Shape& s : shapes) {
      if (std::strcmp(s.model, "4B") != 0) continue;
      const auto it = table.find(std::string("4B/") + s.name + "/" + std::to_string(step_m));
      if (it == table.end()) continue;
      const int times = std::strcmp(s.name, "lm_head") == 0 ? 1 : 36;
      for (int v = 0; v < kVariants; ++v) sums[v] += times * it->second[v].us;
      step_bytes += times * (s.N * s.K * 2.0 + step_m * s.K * 2.0 +
                             step_m * static_cast<double>(s.N) * (s.f32_out ? 4 : 2));
    }
    const double floor_us = step_bytes / (copy_gbs * 1e9) * 1e6;
    std::printf("\nfull decode step, Qwen3-4B matrix products at M = %lld (%.2f GB; at copy "
                "bandwidth %.0f us):\n",
                static_cast<long long>(step_m), step_bytes / 1e9, floor_us);
    const char* names[kVariants] = {"cublaslt heuristic", "cublaslt autotuned", "skinny"};
    for (int v = 0; v < kVariants; ++v) {
      std::printf("  %-19s %8.0f us  %5.1f%% of copy bandwidth\n", names[v], sums[v],
                  100 * floor_us / sums[v]);
    }
    if (csv) {
      std::fprintf(csv, "4B,decode_step,%lld,,,,%.0f,%.3f,,%.4f,%.3f,,%.4f,%.3f,,%.4f,,,,\n",
                   static_cast<long long>(step_m), step_bytes, sums[0], floor_us / sums[0],
                   sums[1], floor_us / sums[1], sums[2], floor_us / sums[2]);
      std::fclose(csv);
    }
    lora_section(stream, prop, reps, launches, lora_timeline);
    CHECK_CUDA(cudaFree(lt_workspace));
    CHECK_CUDA(cudaStreamDestroy(stream));
  } catch (const pagellm::Error& e) {
    std::fprintf(stderr, "matmul_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
