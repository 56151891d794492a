// Element types of stored tensors and the scalar conversions between them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace g4 {

enum class DType { kF32, kF16, kBF16, kI32, kI64 };

// Bytes per element. Source: IEEE 754 / bfloat16 definitions.
size_t DTypeSize(DType t);
// "F32", "F16", "BF16", "I32", "I64" (the safetensors spellings).
std::string_view DTypeName(DType t);
// True for the types a weight can be stored in (F32, F16, BF16).
inline bool IsFloatDType(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// bfloat16 -> f32: exact (bf16 is the top 16 bits of an f32).
inline float Bf16ToF32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// f32 -> bfloat16 with round-to-nearest-even (what torch's .to(bfloat16) does); NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
// Rounds an f32 to the nearest value representable in `t` (identity for F32).
float RoundToDType(float f, DType t);

// IEEE half -> f32, exact for all inputs including subnormals, inf and NaN.
float F16ToF32(uint16_t h);
// f32 -> IEEE half, round-to-nearest-even, overflow to inf.
uint16_t F32ToF16(float f);

// Converts `n` elements of a float dtype at `src` into f32 `dst`.
void ConvertToF32(DType t, const void* src, float* dst, size_t n);

}  // namespace g4
