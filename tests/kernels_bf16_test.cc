// The bf16 dot-product matmul (backends/cpu/kernels_bf16.h): the activation rounding against
// hand-picked cases and, bit for bit, tensor/dtype.h's F32ToBf16 (itself checked against torch's
// rule in DTypeTest) on every CPU; on CPUs with the instruction
// (AVX512_BF16), MatMulBf16Dot against the scalar emulation of its arithmetic, bit-identical
// rows whatever the batch and the first weight row, and the scale.
#include "backends/cpu/kernels_bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tensor/dtype.h"

namespace g4 {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Bf16KernelTest, ConversionRoundsToNearestEven) {
  const std::vector<std::pair<uint32_t, uint16_t>> cases = {
      {0x3f800000u, 0x3f80}, {0x3f808000u, 0x3f80},  // 1 + 2^-8: a tie, kept even
      {0x3f818000u, 0x3f82},                          // 1 + 3 x 2^-8: a tie, up to even
      {0x3f808001u, 0x3f81}, {0xbf80ffffu, 0xbf81},  // above the tie; negative
      {0x7f800000u, 0x7f80}, {0xff800000u, 0xff80},  // infinities
      {0x7f7fffffu, 0x7f80},                          // the largest float rounds to infinity
      {0x00000000u, 0x0000}, {0x80000000u, 0x8000},  // signed zeros
  };
  std::vector<float> x;
  for (const auto& c : cases) x.push_back(FromBits(c.first));
  std::vector<uint16_t> xb(x.size());
  cpu::ConvertRowsToBf16(x.data(), 1, static_cast<int>(x.size()), xb.data());
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(xb[i], cases[i].second) << std::hex << cases[i].first;
  // NaNs stay NaNs (quiet), whatever their payload.
  const float nans[2] = {std::numeric_limits<float>::quiet_NaN(), FromBits(0x7f800001u)};
  uint16_t nb[2];
  cpu::ConvertRowsToBf16(nans, 1, 2, nb);
  for (uint16_t h : nb) EXPECT_TRUE((h & 0x7f80) == 0x7f80 && (h & 0x007f) != 0 && (h & 0x0040)) << std::hex << h;

  // 3 rows of 1001 (not a multiple of the 16 lanes) of random bit patterns -- subnormals,
  // infinities and NaNs included: every element as F32ToBf16 gives it.
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> v(3 * 1001);
  for (float& f : v) f = FromBits(bits(rng));
  std::vector<uint16_t> got(v.size());
  cpu::ConvertRowsToBf16(v.data(), 3, 1001, got.data());
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(got[i], F32ToBf16(v[i])) << "element " << i << " = " << v[i];
}

struct Shape {
  int rows, K, M;
};

std::vector<uint16_t> RandomBf16(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> f(n);
  for (float& x : f) x = d(rng);
  std::vector<uint16_t> b(n);
  cpu::ConvertRowsToBf16(f.data(), 1, static_cast<int>(n), b.data());
  return b;
}

class Bf16DotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu::HasBf16Dot()) GTEST_SKIP() << "this CPU has no bf16 dot product (AVX512_BF16)";
  }
};

TEST_F(Bf16DotTest, MatchesTheScalarEmulation) {
  std::mt19937 rng(11);
  for (const Shape s : {Shape{1, 32, 8}, Shape{1, 1536, 37}, Shape{3, 100, 9}, Shape{7, 64, 13},
                        Shape{13, 1536, 21}, Shape{6, 31, 4}, Shape{1, 2, 1}, Shape{8, 6144, 5}}) {
    const auto x = RandomBf16(static_cast<size_t>(s.rows) * s.K, rng);
    const auto w = RandomBf16(static_cast<size_t>(s.M) * s.K, rng);
    const auto* wb = reinterpret_cast<const uint8_t*>(w.data());
    std::vector<float> y(static_cast<size_t>(s.rows) * s.M), ref(y.size());
    cpu::MatMulBf16Dot(x.data(), s.rows, s.K, wb, s.M, 1.0f, y.data(), s.M);
    cpu::MatMulBf16DotReference(x.data(), s.rows, s.K, wb, s.M, 1.0f, ref.data(), s.M);
    for (int r = 0; r < s.rows; ++r) {
      for (int m = 0; m < s.M; ++m) {
        // The two differ only in the order the 16 lanes are summed: bound by the sum of |products|.
        double mag = 0;
        for (int k = 0; k < s.K; ++k)
          mag += std::fabs(static_cast<double>(Bf16ToF32(x[static_cast<size_t>(r) * s.K + k])) *
                           Bf16ToF32(w[static_cast<size_t>(m) * s.K + k]));
        const size_t i = static_cast<size_t>(r) * s.M + m;
        ASSERT_NEAR(y[i], ref[i], 1e-6 * mag + 1e-30)
            << "rows " << s.rows << " K " << s.K << " M " << s.M << " at (" << r << ", " << m << ")";
      }
    }
  }
}

TEST_F(Bf16DotTest, RowsAreTheSameBitsWhateverTheBatchAndFirstWeightRow) {
  std::mt19937 rng(3);
  const int rows = 13, K = 1000, M = 23;  // K with a tail; rows past one 6-row tile; M past 8-row tiles
  const auto x = RandomBf16(static_cast<size_t>(rows) * K, rng);
  const auto w = RandomBf16(static_cast<size_t>(M) * K, rng);
  const auto* wb = reinterpret_cast<const uint8_t*>(w.data());
  std::vector<float> all(static_cast<size_t>(rows) * M);
  cpu::MatMulBf16Dot(x.data(), rows, K, wb, M, 1.0f, all.data(), M);
  for (int r0 = 0; r0 < rows; r0 += 5) {
    const int n = std::min(5, rows - r0);
    for (int m0 : {0, 3, 9}) {
      std::vector<float> part(static_cast<size_t>(n) * M, -1.0f);
      cpu::MatMulBf16Dot(x.data() + static_cast<size_t>(r0) * K, n, K, wb + static_cast<size_t>(m0) * K * 2, M - m0, 1.0f,
                         part.data(), M);
      for (int r = 0; r < n; ++r)
        for (int m = m0; m < M; ++m) {
          const float a = all[static_cast<size_t>(r0 + r) * M + m], b = part[static_cast<size_t>(r) * M + (m - m0)];
          ASSERT_EQ(std::memcmp(&a, &b, 4), 0) << "row " << r0 + r << " col " << m << " (batch of " << n << " from weight row " << m0 << ")";
        }
    }
  }
  // One row at a time (the decode tiles) as well.
  for (int r = 0; r < rows; ++r) {
    std::vector<float> one(M);
    cpu::MatMulBf16Dot(x.data() + static_cast<size_t>(r) * K, 1, K, wb, M, 1.0f, one.data(), M);
    for (int m = 0; m < M; ++m) ASSERT_EQ(one[m], all[static_cast<size_t>(r) * M + m]) << r << ", " << m;
  }
  // The scale multiplies the finished sums.
  std::vector<float> half(all.size());
  cpu::MatMulBf16Dot(x.data(), rows, K, wb, M, 0.5f, half.data(), M);
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(half[i], all[i] * 0.5f) << i;
}

}  // namespace
}  // namespace g4
