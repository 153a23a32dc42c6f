#include "pagellm/common/kernel_timeline.h"

#include <gtest/gtest.h>

#include "pagellm/common/check.h"

namespace pagellm {
namespace {

KernelSpan span(const char* name, uint64_t start, uint64_t end) { return {name, start, end}; }

const TimelineRow* row(const KernelTimeline& t, const std::string& name) {
  for (const TimelineRow& r : t.by_name)
    if (r.label == name) return &r;
  return nullptr;
}

TEST(KernelTimeline, GapsAreIdleAndBackToBackKernelsKeepTheirTime) {
  const KernelTimeline t =
      summarize_kernel_timeline({span("b", 30, 50), span("a", 0, 10), span("c", 50, 55)});
  EXPECT_EQ(t.kernels, 3);
  EXPECT_DOUBLE_EQ(t.wall_ns, 55);
  EXPECT_DOUBLE_EQ(t.idle_ns, 20);
  ASSERT_EQ(t.by_name.size(), 3u);
  EXPECT_EQ(t.by_name[0].label, "b");  // most attributed time first
  EXPECT_DOUBLE_EQ(t.by_name[0].attributed_ns, 20);
  EXPECT_DOUBLE_EQ(row(t, "a")->attributed_ns, 10);
  EXPECT_DOUBLE_EQ(row(t, "c")->attributed_ns, 5);
}

TEST(KernelTimeline, OverlapGoesToTheOldestRunningKernelAndSumsToWallTime) {
  // PDL-style: each kernel starts before the previous one ends and waits for it.
  const KernelTimeline t = summarize_kernel_timeline(
      {span("a", 0, 10), span("b", 5, 20), span("c", 18, 25), span("d", 40, 45)});
  EXPECT_DOUBLE_EQ(t.idle_ns, 15);
  EXPECT_DOUBLE_EQ(row(t, "a")->attributed_ns, 10);
  EXPECT_DOUBLE_EQ(row(t, "b")->attributed_ns, 10);
  EXPECT_DOUBLE_EQ(row(t, "b")->duration_ns, 15);
  EXPECT_DOUBLE_EQ(row(t, "c")->attributed_ns, 5);
  double sum = t.idle_ns;
  for (const TimelineRow& r : t.by_name) sum += r.attributed_ns;
  EXPECT_DOUBLE_EQ(sum, t.wall_ns);
  // A kernel wholly inside an older one gets nothing.
  const KernelTimeline nested = summarize_kernel_timeline({span("outer", 0, 100), span("inner", 10, 20)});
  EXPECT_DOUBLE_EQ(row(nested, "inner")->attributed_ns, 0);
  EXPECT_DOUBLE_EQ(row(nested, "outer")->attributed_ns, 100);
}

TEST(KernelTimeline, FindsTheRepeatingUnitAcrossStretches) {
  // Two "steps": a head kernel, four units of (x, y, z), a tail kernel; the second step's
  // stretch starts at another phase (y, z, x) and must be aligned to the first.
  std::vector<KernelSpan> spans;
  uint64_t at = 0;
  auto add = [&](const char* name, uint64_t length) {
    spans.push_back(span(name, at, at + length));
    at += length;
  };
  add("embed", 7);
  for (int i = 0; i < 4; ++i) {
    add("x", 1);
    add("y", 2);
    add("z", 3);
  }
  add("head", 50);
  add("embed", 7);
  for (int i = 0; i < 5; ++i) {
    add("y", 2);
    add("z", 3);
    add("x", 1);
  }
  const KernelTimeline t = summarize_kernel_timeline(spans);
  EXPECT_EQ(t.period, 3);
  EXPECT_EQ(t.period_repeats, 9);
  ASSERT_EQ(t.by_position.size(), 3u);
  EXPECT_EQ(t.by_position[0].label, "x");
  EXPECT_EQ(t.by_position[1].label, "y");
  EXPECT_EQ(t.by_position[2].label, "z");
  EXPECT_EQ(t.by_position[0].count, 9);
  EXPECT_DOUBLE_EQ(t.by_position[1].attributed_ns, 9 * 2);
  EXPECT_DOUBLE_EQ(t.by_position[2].attributed_ns, 9 * 3);
}

TEST(KernelTimeline, NoRepeatingUnitAndBadSpans) {
  const KernelTimeline t = summarize_kernel_timeline({span("a", 0, 1), span("b", 1, 2)});
  EXPECT_EQ(t.period, 0);
  EXPECT_TRUE(t.by_position.empty());
  EXPECT_EQ(summarize_kernel_timeline({}).kernels, 0);
  // Host calls are not device time.
  KernelSpan call = span("cudaGraphLaunch", 0, 100);
  call.kind = KernelSpan::Kind::kHostCall;
  KernelSpan short_call = span("cudaMemcpyAsync", 70, 75);
  short_call.kind = KernelSpan::Kind::kHostCall;
  const KernelTimeline with_call =
      summarize_kernel_timeline({short_call, call, span("a", 50, 60), short_call});
  EXPECT_EQ(with_call.kernels, 1);
  EXPECT_DOUBLE_EQ(with_call.wall_ns, 10);
  // ... but are listed by name, most time first.
  ASSERT_EQ(with_call.host_calls.size(), 2u);
  EXPECT_EQ(with_call.host_calls[0].label, "cudaGraphLaunch");
  EXPECT_DOUBLE_EQ(with_call.host_calls[0].duration_ns, 100);
  EXPECT_EQ(with_call.host_calls[1].label, "cudaMemcpyAsync");
  EXPECT_EQ(with_call.host_calls[1].count, 2);
  EXPECT_DOUBLE_EQ(with_call.host_calls[1].duration_ns, 10);
  try {
    summarize_kernel_timeline({span("bad", 10, 5)});
    FAIL() << "a span ending before it starts was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'bad'"), std::string::npos) << e.what();
  }
}

TEST(KernelTimeline, ShortKernelNames) {
  EXPECT_EQ(short_kernel_name("void pagellm::cuda::(anonymous namespace)::skinny_gemm_kernel<32, "
                              "false, true>(pagellm::cuda::(anonymous namespace)::Params)"),
            "skinny_gemm_kernel<32, false, true>");
  EXPECT_EQ(short_kernel_name("void pagellm::cuda::attn::decode_split_kernel<128>(const "
                              "pagellm::cuda::attn::DecodeArgs)"),
            "decode_split_kernel<128>");
  EXPECT_EQ(short_kernel_name("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"),
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n");
  EXPECT_EQ(short_kernel_name(std::string(100, 'k')).size(), 80u);
}

}  // namespace
}  // namespace pagellm
