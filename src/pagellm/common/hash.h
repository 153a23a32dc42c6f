// Hashing a key of several fields (for unordered_map caches keyed by shapes and pointers).
#pragma once

#include <cstddef>
#include <functional>

namespace pagellm {

/// Mixes std::hash of `value` into `seed` (the boost::hash_combine recipe, with the 64-bit
/// golden-ratio constant).
template <class T>
inline void hash_combine(size_t& seed, const T& value) {
  seed ^= std::hash<T>()(value) + 0x9e3779b97f4a7c15ull + (seed << 6) + (seed >> 2);
}

/// The combined hash of `first` and `rest`, in order.
template <class T, class... Rest>
inline size_t hash_values(const T& first, const Rest&... rest) {
  size_t seed = std::hash<T>()(first);
  (hash_combine(seed, rest), ...);
  return seed;
}

}  // namespace pagellm
