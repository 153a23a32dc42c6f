// Counter-based random numbers for sampling, identical on the host and in CUDA kernels.
//
// A sampled token must depend only on (request seed, output index, token id): never on
// which other requests share the batch, on the thread count, or on the order in which
// tokens are visited. So there is no generator state to advance. Each (seed, output
// index) pair names a stream key, and each token id draws its own 64 random bits from
// that key with a stateless hash. Everything up to the uniform variate uses only 64-bit
// integer adds, xors, shifts and multiplies and one exact integer-to-float conversion,
// so a CUDA kernel reproduces it bit for bit.
//
// The hash is SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
// generators", 2014) used twice: the stream key is output number `output_index` of a
// SplitMix64 generator seeded with mix(seed), and the bits of token i are output number
// i of a SplitMix64 generator whose state is the stream key. SplitMix64's finaliser has
// full avalanche, and its output sequence passes BigCrush.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define PAGELLM_HOST_DEVICE __host__ __device__
#else
#define PAGELLM_HOST_DEVICE
#endif

namespace pagellm {

/// SplitMix64's increment: 2^64 / golden ratio, odd.
constexpr uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ULL;

/// SplitMix64's output function (a variant of MurmurHash3's fmix64): a bijection on
/// 64-bit words in which every input bit affects every output bit.
PAGELLM_HOST_DEVICE inline uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// The n-th output (n = 0, 1, ...) of a SplitMix64 generator whose initial state is `state`.
PAGELLM_HOST_DEVICE inline uint64_t splitmix64_at(uint64_t state, uint64_t n) {
  return splitmix64_mix(state + (n + 1) * kSplitMix64Gamma);
}

/// Key of the random stream that samples output token number `output_index` of the
/// request with seed `seed`. Compute it once per row; draw per-token bits with
/// sampling_bits().
PAGELLM_HOST_DEVICE inline uint64_t sampling_stream_key(uint64_t seed, uint64_t output_index) {
  return splitmix64_at(splitmix64_mix(seed ^ 0x5851f42d4c957f2dULL), output_index);
}

/// 64 random bits for token `token_id` in the stream `stream_key`.
PAGELLM_HOST_DEVICE inline uint64_t sampling_bits(uint64_t stream_key, uint32_t token_id) {
  return splitmix64_at(stream_key, token_id);
}

/// Uniform double in the open interval (0, 1) from the top 53 bits: the odd multiples of
/// 2^-53, so the result lies in [2^-53, 1 - 2^-53], is exact (no rounding), and is never
/// 0 or 1. Uses 52 bits of randomness (the lowest of the 53 is forced to 1).
PAGELLM_HOST_DEVICE inline double bits_to_open_unit_double(uint64_t bits) {
  return static_cast<double>((bits >> 11) | 1ULL) * 0x1p-53;
}

/// Uniform float in the open interval (0, 1) from the top 24 bits: the odd multiples of
/// 2^-24, in [2^-24, 1 - 2^-24], exact and never 0 or 1.
PAGELLM_HOST_DEVICE inline float bits_to_open_unit_float(uint64_t bits) {
  return static_cast<float>(static_cast<uint32_t>(bits >> 40) | 1u) * 0x1p-24f;
}

/// The uniform variate u(seed, output_index, token_id) in (0, 1) that the sampler uses.
PAGELLM_HOST_DEVICE inline double sampling_uniform(uint64_t seed, uint64_t output_index,
                                                   uint32_t token_id) {
  return bits_to_open_unit_double(sampling_bits(sampling_stream_key(seed, output_index), token_id));
}

/// Gumbel noise -log(E) with E = -log(u) ~ Exponential(1), from a token's random bits.
/// argmax_i (logit_i + gumbel_i) is a sample from softmax(logit) (the Gumbel-max trick,
/// equivalently the exponential race argmin_i E_i / p_i). With u in [2^-53, 1 - 2^-53]
/// the result lies in about [-3.60, 36.74]. Both logarithms are in double: the host's and
/// CUDA's log may differ in the last bit, which changes a token only when the two best
/// scores agree to about 1e-15.
PAGELLM_HOST_DEVICE inline double gumbel_from_bits(uint64_t bits) {
  return -log(-log(bits_to_open_unit_double(bits)));
}

/// Largest value gumbel_from_bits can return, -log(-log(1 - 2^-53)), rounded up.
constexpr double kGumbelMax = 36.75;

}  // namespace pagellm
