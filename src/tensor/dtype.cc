#include "tensor/dtype.h"

#include <cmath>

#include "base/check.h"

namespace g4 {

// Block-format dequantisation (dequant.cc). Returns false for types it does not handle.
bool DequantizeRow(DType t, const void* src, float* dst, size_t n);

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kI8: return 1;
    case DType::kF8E4M3: return 1;
    default: return 0;
  }
}

int DTypeBlockElems(DType t) {
  switch (t) {
    case DType::kQ8_0: case DType::kQ4_0: case DType::kQ4_1: case DType::kQ5_0: case DType::kQ5_1:
    case DType::kW4G32: case DType::kQ4_0x4: return 32;
    case DType::kQ4_K: case DType::kQ5_K: case DType::kQ6_K: return 256;
    default: return 1;
  }
}

size_t DTypeBlockBytes(DType t) {
  switch (t) {
    case DType::kQ8_0: return 34;
    case DType::kQ4_0: return 18;
    case DType::kQ4_1: return 20;
    case DType::kQ5_0: return 22;
    case DType::kQ5_1: return 24;
    case DType::kQ4_K: return 144;
    case DType::kQ5_K: return 176;
    case DType::kQ6_K: return 210;
    case DType::kW4G32: return 18;
    case DType::kQ4_0x4: return 18;
    default: return DTypeSize(t);
  }
}

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kQ8_0: return "Q8_0";
    case DType::kQ4_0: return "Q4_0";
    case DType::kQ4_1: return "Q4_1";
    case DType::kQ5_0: return "Q5_0";
    case DType::kQ5_1: return "Q5_1";
    case DType::kQ4_K: return "Q4_K";
    case DType::kQ5_K: return "Q5_K";
    case DType::kQ6_K: return "Q6_K";
    case DType::kW4G32: return "W4G32";
    case DType::kQ4_0x4: return "Q4_0x4";
    case DType::kI8: return "I8";
    case DType::kF8E4M3: return "F8_E4M3";
  }
  return "?";
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: value = mant * 2^-24
      float f = std::ldexp(static_cast<float>(mant), -24);
      return sign ? -f : f;
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t F32ToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00u;
  if (a >= 65520.0f) return sign | 0x7c00u;  // rounds to inf
  if (a < 6.103515625e-05f) {                 // subnormal half: round(a * 2^24)
    return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));
  }
  uint32_t ua = u & 0x7fffffffu;
  // Round mantissa from 23 to 10 bits, nearest-even, then rebias exponent (127 -> 15).
  ua += 0xfffu + ((ua >> 13) & 1u);
  return sign | static_cast<uint16_t>((ua >> 13) - (112u << 10));
}

float RoundToDType(float f, DType t) {
  switch (t) {
    case DType::kBF16: return Bf16ToF32(F32ToBf16(f));
    case DType::kF16: return F16ToF32(F32ToF16(f));
    default: return f;
  }
}

void ConvertToF32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToF32(s[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = F16ToF32(s[i]);
      return;
    }
    default:
      G4_CHECK(DequantizeRow(t, src, dst, n) && "ConvertToF32 on a non-float dtype");
  }
}

}  // namespace g4
