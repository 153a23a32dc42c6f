// Counter-based random numbers (common/random.h): reference values, range, uniformity.
#include "pagellm/common/random.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

namespace pagellm {
namespace {

TEST(SamplingRandom, SplitMix64MatchesReferenceSequence) {
  // The first outputs of SplitMix64 seeded with 0 (Vigna's splitmix64.c; the same values
  // are used by Java's SplittableRandom tests): state += gamma; return mix(state).
  EXPECT_EQ(splitmix64_at(0, 0), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(splitmix64_at(0, 1), 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(splitmix64_at(0, 2), 0x06c45d188009454fULL);
  EXPECT_EQ(splitmix64_at(0, 3), 0xf88bb8a8724c81ecULL);
}

TEST(SamplingRandom, UniformIsStrictlyInsideTheUnitInterval) {
  for (uint64_t bits : {uint64_t{0}, ~uint64_t{0}, uint64_t{1} << 63, (uint64_t{1} << 11) - 1,
                        uint64_t{0x7ff} << 53}) {
    const double u = bits_to_open_unit_double(bits);
    EXPECT_GT(u, 0.0) << bits;
    EXPECT_LT(u, 1.0) << bits;
    const float f = bits_to_open_unit_float(bits);
    EXPECT_GT(f, 0.0f) << bits;
    EXPECT_LT(f, 1.0f) << bits;
    const double g = gumbel_from_bits(bits);
    EXPECT_TRUE(std::isfinite(g)) << bits;
    EXPECT_LE(g, kGumbelMax) << bits;
  }
  EXPECT_EQ(bits_to_open_unit_double(0), 0x1p-53);
  EXPECT_EQ(bits_to_open_unit_double(~uint64_t{0}), 1.0 - 0x1p-53);
  EXPECT_EQ(bits_to_open_unit_float(0), 0x1p-24f);
  EXPECT_EQ(bits_to_open_unit_float(~uint64_t{0}), 1.0f - 0x1p-24f);
  // The bound kGumbelMax is tight: the largest draw comes within 0.02 of it.
  EXPECT_GT(gumbel_from_bits(~uint64_t{0}), kGumbelMax - 0.02);
}

TEST(SamplingRandom, UniformMomentsAndBuckets) {
  // Over token ids of one stream and over output indices of one token: mean 1/2,
  // variance 1/12, 16 equal buckets within a chi-square bound (df 15, p = 1e-6: 50.3).
  const int n = 1 << 18;
  for (int axis = 0; axis < 2; ++axis) {
    double sum = 0.0, sum_sq = 0.0;
    std::vector<int> buckets(16, 0);
    for (int i = 0; i < n; ++i) {
      const double u = axis == 0 ? sampling_uniform(42, 7, static_cast<uint32_t>(i))
                                 : sampling_uniform(42, static_cast<uint64_t>(i), 1234);
      sum += u;
      sum_sq += u * u;
      ++buckets[static_cast<int>(u * 16)];
    }
    const double mean = sum / n;
    EXPECT_NEAR(mean, 0.5, 0.003) << axis;
    EXPECT_NEAR(sum_sq / n - mean * mean, 1.0 / 12, 0.002) << axis;
    double chi2 = 0.0;
    for (int b : buckets) chi2 += (b - n / 16.0) * (b - n / 16.0) / (n / 16.0);
    EXPECT_LT(chi2, 50.3) << axis;
  }
}

TEST(SamplingRandom, StreamsOfNeighbouringSeedsAndIndicesAreUncorrelated) {
  // Correlation between u(seed, i, t) and u(seed + 1, i, t), and u(seed, i + 1, t).
  const int n = 1 << 16;
  for (int which = 0; which < 2; ++which) {
    double sa = 0, sb = 0, sab = 0, saa = 0, sbb = 0;
    for (int t = 0; t < n; ++t) {
      const double a = sampling_uniform(1000, 5, static_cast<uint32_t>(t));
      const double b = which == 0 ? sampling_uniform(1001, 5, static_cast<uint32_t>(t))
                                  : sampling_uniform(1000, 6, static_cast<uint32_t>(t));
      sa += a;
      sb += b;
      sab += a * b;
      saa += a * a;
      sbb += b * b;
    }
    const double cov = sab / n - (sa / n) * (sb / n);
    const double corr = cov / std::sqrt((saa / n - (sa / n) * (sa / n)) * (sbb / n - (sb / n) * (sb / n)));
    EXPECT_LT(std::fabs(corr), 0.02) << which;  // 5 standard deviations at n = 65536
  }
}

TEST(SamplingRandom, KeysDifferAcrossSeedsAndIndices) {
  std::set<uint64_t> keys;
  for (uint64_t seed = 0; seed < 64; ++seed)
    for (uint64_t index = 0; index < 64; ++index) keys.insert(sampling_stream_key(seed, index));
  EXPECT_EQ(keys.size(), 64u * 64u);
}

}  // namespace
}  // namespace pagellm
