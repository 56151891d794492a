#include "tensor/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace g4 {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

bool IsF16NaN(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0; }

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI32), 4u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeName(DType::kF32), "F32");
  EXPECT_EQ(DTypeName(DType::kF16), "F16");
  EXPECT_EQ(DTypeName(DType::kBF16), "BF16");
  EXPECT_EQ(DTypeName(DType::kI32), "I32");
  EXPECT_EQ(DTypeName(DType::kI64), "I64");
  EXPECT_TRUE(IsFloatDType(DType::kF32));
  EXPECT_TRUE(IsFloatDType(DType::kF16));
  EXPECT_TRUE(IsFloatDType(DType::kBF16));
  EXPECT_FALSE(IsFloatDType(DType::kI32));
  EXPECT_FALSE(IsFloatDType(DType::kI64));
}

TEST(DTypeTest, Bf16ToF32IsExact) {
  EXPECT_EQ(Bf16ToF32(0x3F80), 1.0f);
  EXPECT_EQ(Bf16ToF32(0xBF80), -1.0f);
  EXPECT_EQ(Bf16ToF32(0x4000), 2.0f);
  EXPECT_EQ(Bf16ToF32(0x421D), 39.25f);
  EXPECT_EQ(Bf16ToF32(0x0000), 0.0f);
  EXPECT_TRUE(std::signbit(Bf16ToF32(0x8000)));
  EXPECT_EQ(Bf16ToF32(0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(Bf16ToF32(0xFF80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(Bf16ToF32(0x7FC0)));
  EXPECT_EQ(Bf16ToF32(0x0001), std::ldexp(1.0f, -133));  // smallest bf16 subnormal
}

TEST(DTypeTest, F32ToBf16RoundsToNearestEven) {
  // Exactly representable values are unchanged.
  EXPECT_EQ(F32ToBf16(1.0f), 0x3F80);
  EXPECT_EQ(F32ToBf16(-2.0f), 0xC000);
  EXPECT_EQ(F32ToBf16(0.0f), 0x0000);
  EXPECT_EQ(F32ToBf16(-0.0f), 0x8000);
  // 1 + 2^-8 is halfway between 1.0 (even mantissa) and 1 + 2^-7: rounds down to 1.0.
  EXPECT_EQ(F32ToBf16(1.00390625f), 0x3F80);
  // 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up to 1.015625.
  EXPECT_EQ(F32ToBf16(1.01171875f), 0x3F82);
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.01171875f)), 1.015625f);
  // Just above / below a tie rounds to nearest.
  EXPECT_EQ(F32ToBf16(std::nextafter(1.00390625f, 2.0f)), 0x3F81);
  EXPECT_EQ(F32ToBf16(std::nextafter(1.01171875f, 0.0f)), 0x3F81);
  EXPECT_EQ(F32ToBf16(-1.00390625f), 0xBF80);
  // Overflow rounds to inf; inf stays inf; NaN stays NaN (quiet).
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(F32ToBf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
  // A signalling NaN whose payload lives only in the low 16 bits must not become inf.
  uint32_t snan_bits = 0x7F800001u;
  float snan;
  std::memcpy(&snan, &snan_bits, 4);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(snan))));
}

TEST(DTypeTest, Bf16RoundTripOfAllNonNaNValues) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    if ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0) continue;  // NaN
    ASSERT_EQ(F32ToBf16(Bf16ToF32(h)), h) << std::hex << i;
  }
}

TEST(DTypeTest, F16ToF32KnownValues) {
  EXPECT_EQ(F16ToF32(0x3C00), 1.0f);
  EXPECT_EQ(F16ToF32(0xC000), -2.0f);
  EXPECT_EQ(F16ToF32(0x3555), 0.333251953125f);
  EXPECT_EQ(F16ToF32(0x7BFF), 65504.0f);            // largest finite
  EXPECT_EQ(F16ToF32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16ToF32(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToF32(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(F16ToF32(0x0000), 0.0f);
  EXPECT_FALSE(std::signbit(F16ToF32(0x0000)));
  EXPECT_TRUE(std::signbit(F16ToF32(0x8000)));
  EXPECT_EQ(F16ToF32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(F16ToF32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(F16ToF32(0x7E00)));
  EXPECT_TRUE(std::isnan(F16ToF32(0x7C01)));
}

TEST(DTypeTest, F16RoundTripOfAllNonNaNValues) {
  int checked = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    if (IsF16NaN(h)) {
      ASSERT_TRUE(std::isnan(F16ToF32(h))) << std::hex << i;
      ASSERT_TRUE(IsF16NaN(F32ToF16(F16ToF32(h)))) << std::hex << i;
      continue;
    }
    ASSERT_EQ(F32ToF16(F16ToF32(h)), h) << std::hex << i << " -> " << F16ToF32(h);
    ++checked;
  }
  EXPECT_EQ(checked, 65536 - 2 * 1023);
}

TEST(DTypeTest, F32ToF16RoundsToNearestEvenAndOverflows) {
  // 1 + 2^-11 is halfway between 1.0 (even) and 1 + 2^-10: rounds to 1.0.
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  // 1 + 3*2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even): rounds up.
  EXPECT_EQ(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(F32ToF16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3C01);
  // Largest finite, then the rounding boundary to inf (65520 is the tie, odd mantissa -> inf).
  EXPECT_EQ(F32ToF16(65504.0f), 0x7BFF);
  EXPECT_EQ(F32ToF16(65519.99f), 0x7BFF);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7C00);
  EXPECT_EQ(F32ToF16(1e10f), 0x7C00);
  EXPECT_EQ(F32ToF16(-1e10f), 0xFC00);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::infinity()), 0x7C00);
  // Subnormals: 2^-25 is a tie between 0 (even) and 2^-24: rounds to 0; 3*2^-25 -> 2*2^-24.
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -25)), 0x0002);
  EXPECT_EQ(F32ToF16(std::ldexp(1.5f, -25) ), 0x0001);
  EXPECT_EQ(F32ToF16(-std::ldexp(1.0f, -24)), 0x8001);
  EXPECT_EQ(F32ToF16(1e-10f), 0x0000);
  EXPECT_EQ(F32ToF16(-1e-10f), 0x8000);
  // The largest subnormal rounds up into the smallest normal.
  EXPECT_EQ(F32ToF16(std::nextafter(std::ldexp(1.0f, -14), 0.0f)), 0x0400);
  EXPECT_TRUE(IsF16NaN(F32ToF16(std::numeric_limits<float>::quiet_NaN())));
}

TEST(DTypeTest, RoundToDTypeGemmaEmbeddingScales) {
  // Gemma multiplies embeddings by sqrt(hidden_size) rounded to the activation dtype:
  // sqrt(1536) = 39.19... -> 39.25 in bf16; sqrt(640) = 25.29... -> 25.25 in bf16.
  EXPECT_EQ(RoundToDType(std::sqrt(1536.0f), DType::kBF16), 39.25f);
  EXPECT_EQ(RoundToDType(std::sqrt(640.0f), DType::kBF16), 25.25f);
  EXPECT_EQ(RoundToDType(std::sqrt(1536.0f), DType::kF16), 39.1875f);
  EXPECT_EQ(RoundToDType(std::sqrt(1536.0f), DType::kF32), std::sqrt(1536.0f));
  EXPECT_EQ(Bits(RoundToDType(0.1f, DType::kF32)), Bits(0.1f));
}

TEST(DTypeTest, ConvertToF32AllFloatTypes) {
  const float f32[] = {1.0f, -0.5f, 3.0f};
  const uint16_t f16[] = {0x3C00, 0xB800, 0x4200};
  const uint16_t bf16[] = {0x3F80, 0xBF00, 0x4040};
  float out[3];
  ConvertToF32(DType::kF32, f32, out, 3);
  EXPECT_EQ(std::vector<float>(out, out + 3), std::vector<float>(f32, f32 + 3));
  ConvertToF32(DType::kF16, f16, out, 3);
  EXPECT_EQ(std::vector<float>(out, out + 3), std::vector<float>(f32, f32 + 3));
  ConvertToF32(DType::kBF16, bf16, out, 3);
  EXPECT_EQ(std::vector<float>(out, out + 3), std::vector<float>(f32, f32 + 3));
}

}  // namespace
}  // namespace g4
