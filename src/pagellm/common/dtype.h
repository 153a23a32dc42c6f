// Element types and the scalar conversions between them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace pagellm {

enum class DType : uint8_t { F32, BF16, F16, I32, I64 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
/// Parses "float32"/"f32"/"bfloat16"/"bf16"/"float16"/"f16"; throws Error otherwise.
DType parse_dtype(const std::string& name);

/// bf16 <-> f32, round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
/// IEEE half <-> f32, round to nearest even.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

/// Converts n elements from src (of type from) into f32.
void convert_to_f32(const void* src, DType from, float* dst, size_t n);
/// Converts n f32 elements into dst of type to (F32, BF16 or F16).
void convert_from_f32(const float* src, void* dst, DType to, size_t n);

}  // namespace pagellm
