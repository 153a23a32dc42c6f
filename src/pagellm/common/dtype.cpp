#include "pagellm/common/dtype.h"

#include "pagellm/common/check.h"

namespace pagellm {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  if (name == "float32" || name == "f32" || name == "F32" || name == "fp32") return DType::F32;
  if (name == "bfloat16" || name == "bf16" || name == "BF16") return DType::BF16;
  if (name == "float16" || name == "f16" || name == "F16" || name == "fp16" || name == "half")
    return DType::F16;
  PAGELLM_FAIL() << "unknown dtype '" << name << "' (expected float32, bfloat16 or float16)";
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | mant << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((u >> 23) & 0xffu);
  uint32_t mant = u & 0x7fffffu;
  if (exp == 255) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  int32_t e = exp - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | static_cast<uint32_t>(e) << 10 | mant >> 13;
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into exponent
  return static_cast<uint16_t>(half);
}

void convert_to_f32(const void* src, DType from, float* dst, size_t n) {
  if (n == 0) return;  // an empty tensor may have no storage (memcpy from null is undefined)
  switch (from) {
    case DType::F32: std::memcpy(dst, src, n * 4); return;
    case DType::BF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    default: PAGELLM_FAIL() << "cannot convert " << dtype_name(from) << " to float32";
  }
}

void convert_from_f32(const float* src, void* dst, DType to, size_t n) {
  if (n == 0) return;
  switch (to) {
    case DType::F32: std::memcpy(dst, src, n * 4); return;
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    default: PAGELLM_FAIL() << "cannot convert float32 to " << dtype_name(to);
  }
}

}  // namespace pagellm
