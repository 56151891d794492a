// The CUDA fp8 (e4m3 FN) KV cache's host-side math (src/backends/cuda/attention_plan.h), run on
// the host: decode of all 256 codes against the format's definition, encode against an exhaustive
// nearest-code search (ties to even, saturation, NaN), the head quantisation's bound, the bytes
// counted, and the policy that holds fp8 from compute capability 8.9 (cuda_policy.h). In every build.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backends/cuda/attention_plan.h"
#include "backends/cuda/cuda_policy.h"
#include "runtime/kv_cache.h"

namespace g4::cuda {
namespace {

// The value of code b by the format's definition: (-1)^s 2^(e-7) (1 + m/8), subnormal 2^-6 m/8.
double E4m3Value(int b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}
bool IsNanCode(int b) { return (b & 0x7f) == 0x7f; }

TEST(CudaFp8Test, EveryCodeDecodesToItsValue) {
  for (int b = 0; b < 256; ++b) {
    const float got = E4m3ToF32(static_cast<uint8_t>(b));
    if (IsNanCode(b)) {
      EXPECT_TRUE(std::isnan(got)) << b;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), E4m3Value(b)) << b;
    EXPECT_EQ(std::signbit(got), b >= 128) << b;  // -0 is 0x80
  }
  EXPECT_EQ(E4m3ToF32(0x7e), 448.0f);
  EXPECT_EQ(E4m3ToF32(0x01), 0.001953125f);  // 2^-9
  EXPECT_EQ(E4m3ToF32(0x08), 0.015625f);     // 2^-6
}

TEST(CudaFp8Test, EveryCodeRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    if (IsNanCode(b)) continue;
    EXPECT_EQ(F32ToE4m3(E4m3ToF32(static_cast<uint8_t>(b))), b) << b;
  }
}

// The nearest finite code to x (|x| <= 448), ties to the even mantissa (code's low bit 0).
int NearestCode(float x) {
  int best = -1;
  double best_d = 0;
  for (int b = 0; b < 256; ++b) {
    if (IsNanCode(b) || (b >= 128) != std::signbit(x)) continue;
    const double d = std::fabs(E4m3Value(b) - static_cast<double>(x));
    if (best < 0 || d < best_d || (d == best_d && (b & 1) == 0)) best = b, best_d = d;
  }
  return best;
}

TEST(CudaFp8Test, EncodeIsTheNearestCodeTiesToEven) {
  // Every midpoint between neighbouring codes (the ties) and points just either side of it.
  for (int b = 0; b < 0x7e; ++b) {
    for (float sign : {1.0f, -1.0f}) {
      const float lo = E4m3ToF32(static_cast<uint8_t>(b)), hi = E4m3ToF32(static_cast<uint8_t>(b + 1));
      const float mid = sign * (lo + (hi - lo) / 2);  // exact in f32
      const int s = sign < 0 ? 0x80 : 0;
      EXPECT_EQ(F32ToE4m3(mid), s | ((b & 1) ? b + 1 : b)) << mid;
      EXPECT_EQ(F32ToE4m3(std::nextafter(mid, 0.0f)), s | b) << mid;
      EXPECT_EQ(F32ToE4m3(std::nextafter(mid, sign * 1e9f)), s | (b + 1)) << mid;
    }
  }
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = u(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 24) - 14);  // 2^-14 .. 2^9
    if (std::fabs(x) > 448.0f) continue;
    ASSERT_EQ(F32ToE4m3(x), NearestCode(x)) << x;
  }
  EXPECT_EQ(F32ToE4m3(1e-30f), 0);  // below half the smallest subnormal: zero of x's sign
  EXPECT_EQ(F32ToE4m3(-1e-45f), 0x80);
}

TEST(CudaFp8Test, SaturatesAndKeepsNan) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {448.0f, 449.0f, 464.0f, 480.0f, 1e9f, 3.4e38f, inf}) {
    EXPECT_EQ(F32ToE4m3(x), 0x7e) << x;
    EXPECT_EQ(F32ToE4m3(-x), 0xfe) << x;
  }
  EXPECT_EQ(F32ToE4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(F32ToE4m3(-std::numeric_limits<float>::quiet_NaN()), 0xff);
}

// Each head's elements decode to within half a step of x / scale (relative 2^-4 of the element
// for normals, 2^-10 of the head's largest element for subnormals), the largest to +-448 exactly;
// a zero head has scale 0 and zero codes, a non-finite head scale NaN and zero codes.
TEST(CudaFp8Test, HeadQuantisationBound) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int D : {32, 256, 512}) {
    for (int rep = 0; rep < 50; ++rep) {
      std::vector<float> x(D);
      const float mag = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
      for (float& e : x) e = u(rng) * mag;
      std::vector<uint8_t> q(D);
      float scale = 0;
      QuantizeKvHeadF8(x.data(), D, q.data(), &scale);
      float amax = 0;
      for (float e : x) amax = std::max(amax, std::fabs(e));
      EXPECT_EQ(scale, amax / 448.0f);
      for (int d = 0; d < D; ++d) {
        const double y = static_cast<double>(x[d]) / scale, got = E4m3ToF32(q[d]);
        EXPECT_LE(std::fabs(got - y), std::max(std::fabs(y) / 16, 1.0 / 1024)) << d;
        if (std::fabs(x[d]) == amax) {
          EXPECT_EQ(std::fabs(got), 448.0);
        }
      }
    }
  }
  std::vector<float> zero(64, 0.0f), bad(64, 1.0f);
  bad[5] = std::numeric_limits<float>::infinity();
  std::vector<uint8_t> q(64, 9);
  float scale = 1;
  QuantizeKvHeadF8(zero.data(), 64, q.data(), &scale);
  EXPECT_EQ(scale, 0.0f);
  EXPECT_EQ(q, std::vector<uint8_t>(64, 0));
  std::fill(q.begin(), q.end(), 9);
  QuantizeKvHeadF8(bad.data(), 64, q.data(), &scale);
  EXPECT_TRUE(std::isnan(scale));
  EXPECT_EQ(q, std::vector<uint8_t>(64, 0));
}

// The memory plan and `info` count a byte an element plus a 4-byte scale per KV head row, as q8.
TEST(CudaFp8Test, CacheCountsAByteAnElementPlusAScale) {
  EXPECT_EQ(KvHeadRowBytes(DType::kF8E4M3, 256), 260u);
  EXPECT_EQ(KvHeadRowBytes(DType::kF8E4M3, 512), KvHeadRowBytes(DType::kI8, 512));
}

TEST(CudaPolicyTest, Fp8CacheFromComputeCapability89) {
  EXPECT_TRUE(CheckKvCacheTypeFor(9, 0, DType::kF8E4M3).ok());  // H100, H200
  EXPECT_TRUE(CheckKvCacheTypeFor(8, 9, DType::kF8E4M3).ok());  // L4, L40S
  EXPECT_TRUE(CheckKvCacheTypeFor(10, 0, DType::kF8E4M3).ok());
  for (auto [major, minor] : {std::pair{8, 6}, {8, 0}, {7, 5}}) {
    const Status s = CheckKvCacheTypeFor(major, minor, DType::kF8E4M3);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("--cache-type fp8: compute capability " + std::to_string(major) + "." +
                               std::to_string(minor) + " has no fp8 (e4m3) arithmetic (needs 8.9 or later)"),
              std::string::npos) << s.message();
  }
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kI8}) EXPECT_TRUE(CheckKvCacheTypeFor(7, 5, t).ok());
  EXPECT_FALSE(CheckKvCacheTypeFor(9, 0, DType::kQ8_0).ok());
}

}  // namespace
}  // namespace g4::cuda
