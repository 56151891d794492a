// The int8-activation matmul (src/backends/cpu/kernels_q8.h) on every SIMD target this machine
// runs (forced with hwy::SetSupportedTargetsForTest, as in kernels_test.cc), against its scalar
// reference, plus the activation quantiser's exact values.
//
// Tolerance of MatMulQ8 vs MatMulQ8Reference: both use the same quantised activations and the
// SIMD kernel's integer sums are exact (|sum| < 2^24, so also exact in f32; the AVX-512 Q6_K row
// kernel's per-superblock lanes can reach ~2^25.6 and round by a few units in f32), so the two differ
// only by f32 rounding: the product a_h * dx, one fused multiply-add per unit into an accumulator
// of at most K / 32 terms (plus the lane sum), and the offsets' dot product b_h * sd_h. The
// offset form a_h u + b_h can cancel (for the random blocks below |b_h| <= 63 |a_h|, so each term
// is at most ~64 |w_k x_k| in magnitude), and each term passes through at most K / 32 + 8
// roundings: |y - y_ref| <= gamma_{K/32+8} * 64 * sum_k |w_k x_k| ~ 1e-4 * sum_k |w_k x_k| for
// K = 512 (gamma_24 ~ 1.4e-6), the tolerance used; the tolerance tests keep K <= 512. A decoding error (a wrong
// nibble, bit or scale) moves a result by more than 1e-2 relative (two such mutations were run:
// both failed the test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/simd_cap.h"
#include "backends/cpu/kernels_q8.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "tensor/dtype.h"
#include "tensor/quantize.h"

namespace g4 {
namespace {

class KernelsQ8Test : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { hwy::SetSupportedTargetsForTest(GetParam()); }
  void TearDown() override { cpu::ResetSimdTargetsForTest(); }
};

std::string TargetParamName(const ::testing::TestParamInfo<int64_t>& info) { return hwy::TargetName(info.param); }

INSTANTIATE_TEST_SUITE_P(Targets, KernelsQ8Test, ::testing::ValuesIn(hwy::SupportedAndGeneratedTargets()),
                         TargetParamName);

const DType kQ8Types[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                          DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

void PutHalf(uint8_t* p, float v) {
  const uint16_t h = F32ToF16(v);
  p[0] = static_cast<uint8_t>(h & 0xff);
  p[1] = static_cast<uint8_t>(h >> 8);
}

// M rows of K weights of type t: random bytes, with every f16 scale field set to a finite value.
std::vector<uint8_t> RandomWeights(DType t, int M, int K, std::mt19937& rng) {
  std::vector<uint8_t> w(DTypeRowBytes(t, K) * M);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(-0.02f, 0.02f);
  const size_t bb = DTypeBlockBytes(t);
  for (size_t i = 0; i < w.size() / bb; ++i) {
    uint8_t* blk = w.data() + i * bb;
    switch (t) {
      case DType::kQ8_0:
      case DType::kQ4_0:
      case DType::kQ5_0: PutHalf(blk, scale(rng)); break;
      case DType::kQ4_1:
      case DType::kQ5_1:
      case DType::kQ4_K:
      case DType::kQ5_K:
        PutHalf(blk, scale(rng));
        PutHalf(blk + 2, scale(rng));
        break;
      case DType::kQ6_K: PutHalf(blk + 208, scale(rng)); break;
      default: ADD_FAILURE() << "no scale layout for " << DTypeName(t);
    }
  }
  return w;
}

// Activations with a spread of magnitudes, one all-zero block and one block with a large outlier.
std::vector<float> RandomActs(int rows, int K, std::mt19937& rng) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows) * K);
  for (auto& v : x) v = n(rng);
  for (int k = 0; k < 32; ++k) x[k] = 0.0f;
  if (x.size() > 64) x[40] = 300.0f;
  return x;
}

// sum_k |w[m, k] * x[r, k]| with x the dequantised activation blocks: the scale of the tolerance
// (see the top of the file).
double ProductMagnitude(const std::vector<float>& wf, const std::vector<cpu::ActBlockQ8>& xq, int K, int r, int m) {
  double mag = 0;
  for (int k = 0; k < K; ++k) {
    const cpu::ActBlockQ8& b = xq[(static_cast<size_t>(r) * K + k) / 32];
    mag += std::fabs(wf[static_cast<size_t>(m) * K + k] * b.d * b.q[k % 32]);
  }
  return mag;
}

TEST(KernelsQ8Quantize, ExactBlockValues) {
  std::vector<float> x(64, 0.0f);
  for (int k = 0; k < 32; ++k) x[k] = static_cast<float>(k - 16) * 0.5f;  // amax 8 at k = 0
  x[5] = 8.0f;                                                          // ties the max
  std::vector<cpu::ActBlockQ8> q(2);
  std::vector<float> sums(4);
  cpu::QuantizeRowsQ8(x.data(), 1, 64, q.data(), sums.data());
  EXPECT_FLOAT_EQ(q[0].d, 8.0f / 127.0f);
  int s0 = 0, s1 = 0;
  for (int k = 0; k < 32; ++k) {
    const int want = static_cast<int>(std::nearbyint(x[k] * (127.0f / 8.0f)));
    EXPECT_EQ(q[0].q[k], want) << k;
    (k < 16 ? s0 : s1) += want;
  }
  EXPECT_EQ(q[0].q[0], -127);
  EXPECT_EQ(q[0].q[5], 127);
  EXPECT_EQ(q[0].q[16], 0);
  EXPECT_FLOAT_EQ(sums[0], q[0].d * s0);
  EXPECT_FLOAT_EQ(sums[1], q[0].d * s1);
  // An all-zero block: d = 0 and q = 0, not NaN.
  EXPECT_EQ(q[1].d, 0.0f);
  EXPECT_EQ(sums[2], 0.0f);
  EXPECT_EQ(sums[3], 0.0f);
  for (int k = 0; k < 32; ++k) EXPECT_EQ(q[1].q[k], 0);
}

TEST(KernelsQ8Quantize, ErrorIsAtMostHalfAStep) {
  std::mt19937 rng(3);
  const std::vector<float> x = RandomActs(3, 256, rng);
  std::vector<cpu::ActBlockQ8> q(3 * 8);
  std::vector<float> sums(3 * 16);
  cpu::QuantizeRowsQ8(x.data(), 3, 256, q.data(), sums.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const cpu::ActBlockQ8& b = q[i / 32];
    EXPECT_LE(std::fabs(x[i] - b.d * b.q[i % 32]), 0.5001f * b.d) << i;
  }
}

// On a CPU with Armv8.2's dot product (qemu -cpu max) the tests below run MatMulQ8 both with it
// (SDOT) and without it (the widening path, as on a CPU without it, qemu -cpu cortex-a57).
std::vector<bool> ArmDotprodModes() { return cpu::HasArmDotprod() ? std::vector<bool>{true, false} : std::vector<bool>{true}; }
struct ArmDotprodRestorer {
  ~ArmDotprodRestorer() { cpu::SetArmDotprodForTest(true); }
};

TEST_P(KernelsQ8Test, MatchesTheReferenceForEveryFormatAndRowCount) {
  ArmDotprodRestorer restore;
  for (bool dotprod : ArmDotprodModes()) {
    SCOPED_TRACE(dotprod ? "Arm dot product (if any)" : "Arm dot product off");
    cpu::SetArmDotprodForTest(dotprod);
    std::mt19937 rng(11);
    // Activation groups 32 and 256 (the eight blocks of 256 elements share one scale: the K-quants'
    // superblock tiles).
    for (int group : {32, 256})
    for (DType t : kQ8Types) {
      ASSERT_TRUE(cpu::MatMulQ8Supports(t)) << DTypeName(t);
      for (int K : {256, 512}) {
        const int M = 13;
        const std::vector<uint8_t> w = RandomWeights(t, M, K, rng);
        std::vector<float> wf(static_cast<size_t>(M) * K);
        ConvertToF32(t, w.data(), wf.data(), wf.size());
        for (int rows : {1, 2, 3, 4, 5, 7, 9}) {
          const std::vector<float> x = RandomActs(rows, K, rng);
          std::vector<cpu::ActBlockQ8> xq(static_cast<size_t>(rows) * K / 32);
          std::vector<float> sums(static_cast<size_t>(rows) * K / 16);
          cpu::QuantizeRowsQ8(x.data(), rows, K, xq.data(), sums.data(), group);
          const int ldy = M + 2;
          std::vector<float> y(static_cast<size_t>(rows) * ldy, 777.0f), ref = y;
          cpu::MatMulQ8(xq.data(), sums.data(), rows, K, w.data(), t, M, 0.5f, y.data(), ldy, group);
          cpu::MatMulQ8Reference(xq.data(), rows, K, w.data(), t, M, 0.5f, ref.data(), ldy);
          for (int r = 0; r < rows; ++r) {
            for (int m = 0; m < M; ++m) {
              const double mag = ProductMagnitude(wf, xq, K, r, m);
              const size_t i = static_cast<size_t>(r) * ldy + m;
              EXPECT_NEAR(y[i], ref[i], 1e-4 * 0.5 * mag + 1e-30)
                  << DTypeName(t) << " group=" << group << " K=" << K << " rows=" << rows << " r=" << r << " m=" << m;
            }
            EXPECT_EQ(y[static_cast<size_t>(r) * ldy + M], 777.0f) << "wrote past M";
          }
        }
      }
    }
  }
}

TEST_P(KernelsQ8Test, QuantizerMatchesTheReferenceBitForBit) {
  for (int group : {32, 256}) {
    std::mt19937 rng(21);
    const int rows = 5, K = group == 32 ? 320 : 512;
    std::vector<float> x = RandomActs(rows, K, rng);
    x[70] = 1e-30f;  // tiny values and exact halves (ties)
    for (int k = 96; k < 128; ++k) x[k] = 0.5f * static_cast<float>(k - 112);
    std::vector<cpu::ActBlockQ8> q(rows * K / 32), qr(q.size());
    std::vector<float> s(rows * K / 16), sr(s.size());
    cpu::QuantizeRowsQ8(x.data(), rows, K, q.data(), s.data(), group);
    cpu::QuantizeRowsQ8Reference(x.data(), rows, K, qr.data(), sr.data(), group);
    for (size_t b = 0; b < q.size(); ++b) {
      EXPECT_EQ(q[b].d, qr[b].d) << b;
      EXPECT_EQ(std::memcmp(q[b].q, qr[b].q, 32), 0) << b;
      // One scale per group: the largest magnitude of the group's 256 or 32 elements / 127.
      const size_t g0 = b / (group / 32) * group;
      float amax = 0.0f;
      for (int k = 0; k < group; ++k) amax = std::max(amax, std::fabs(x[g0 + k]));
      EXPECT_EQ(q[b].d, amax / 127.0f) << "group=" << group << " b=" << b;
    }
    EXPECT_EQ(s, sr);
  }
}

TEST_P(KernelsQ8Test, EachRowIsIndependentOfTheBatch) {
  // A row's result must be bit-identical whether it is multiplied alone or inside a batch.
  ArmDotprodRestorer restore;
  for (bool dotprod : ArmDotprodModes()) {
    SCOPED_TRACE(dotprod ? "Arm dot product (if any)" : "Arm dot product off");
    cpu::SetArmDotprodForTest(dotprod);
    std::mt19937 rng(5);
    // Tiles of 8 + 3 (portable path and AVX-512 Q4_K/Q6_K at group 256), 6 + 5 (AVX2/AVX-512
    // elsewhere); the solo calls below run the one-row kernels (on AVX-512, Q4_K and Q6_K at
    // group 256: KQuantRowPipelined).
    const int M = 9, rows = 11;
    // K of one, two and three superblocks: the one-row K-quant kernel's pipeline (AVX-512) has a
    // prologue and an epilogue around its loop.
    for (int K : {256, 512, 768})
    for (int group : {32, 256})
    for (DType t : kQ8Types) {
      SCOPED_TRACE("K=" + std::to_string(K));
      const std::vector<uint8_t> w = RandomWeights(t, M, K, rng);
      const std::vector<float> x = RandomActs(rows, K, rng);
      std::vector<cpu::ActBlockQ8> xq(static_cast<size_t>(rows) * K / 32);
      std::vector<float> sums(static_cast<size_t>(rows) * K / 16);
      cpu::QuantizeRowsQ8(x.data(), rows, K, xq.data(), sums.data(), group);
      std::vector<float> batch(static_cast<size_t>(rows) * M);
      cpu::MatMulQ8(xq.data(), sums.data(), rows, K, w.data(), t, M, 1.0f, batch.data(), M, group);
      for (int r = 0; r < rows; ++r) {
        std::vector<float> solo(M);
        cpu::MatMulQ8(xq.data() + static_cast<size_t>(r) * K / 32, sums.data() + static_cast<size_t>(r) * K / 16, 1, K,
                      w.data(), t, M, 1.0f, solo.data(), M, group);
        for (int m = 0; m < M; ++m) {
          EXPECT_EQ(solo[m], batch[static_cast<size_t>(r) * M + m]) << DTypeName(t) << " group=" << group << " r=" << r;
        }
      }
      // Nor on where its weight row falls in a tile: threads split the weight rows anywhere, and
      // the SIMD kernel takes them four at a time from the start of its range.
      const size_t row_bytes = DTypeRowBytes(t, K);
      for (int m0 = 1; m0 < 4; ++m0) {
        std::vector<float> part(static_cast<size_t>(rows) * M, 777.0f);
        cpu::MatMulQ8(xq.data(), sums.data(), rows, K, w.data() + m0 * row_bytes, t, M - m0, 1.0f, part.data() + m0, M,
                      group);
        for (int r = 0; r < rows; ++r) {
          for (int m = m0; m < M; ++m) {
            EXPECT_EQ(part[static_cast<size_t>(r) * M + m], batch[static_cast<size_t>(r) * M + m])
                << DTypeName(t) << " group=" << group << " m0=" << m0 << " r=" << r << " m=" << m;
          }
        }
        // One activation row (the one-row kernels) from the same offset.
        std::vector<float> one(M, 777.0f);
        cpu::MatMulQ8(xq.data(), sums.data(), 1, K, w.data() + m0 * row_bytes, t, M - m0, 1.0f, one.data() + m0, M,
                      group);
        for (int m = m0; m < M; ++m) {
          EXPECT_EQ(one[m], batch[m]) << DTypeName(t) << " group=" << group << " m0=" << m0 << " one row, m=" << m;
        }
      }
    }
  }
}

// K = 0 (no elements): every output is the empty sum, 0, whatever the format, group or row
// count (the one-row K-quant kernel reads a first superblock before its loop, so it must not be
// reached; a review found that it was).
TEST_P(KernelsQ8Test, AnEmptyDotProductIsZero) {
  const cpu::ActBlockQ8 xq[1] = {};
  const float sums[2] = {};
  const uint8_t w[1] = {};
  for (int group : {32, 256})
  for (int rows : {1, 3, 9})
  for (DType t : kQ8Types) {
    std::vector<float> y(static_cast<size_t>(rows) * 5, 777.0f);
    cpu::MatMulQ8(xq, sums, rows, 0, w, t, 5, 1.0f, y.data(), 5, group);
    for (float v : y) EXPECT_EQ(v, 0.0f) << DTypeName(t) << " group=" << group << " rows=" << rows;
  }
}

// AVX-512 VNNI (vpdpbusd, on the AVX3 target where the CPU has it) gives the bits of the byte
// multiply-add sequence it replaces, for every format, activation group and row count.
TEST_P(KernelsQ8Test, VnniGivesTheSameBitsAsByteMultiplyAdds) {
  if (!cpu::HasInt8Vnni()) GTEST_SKIP() << "this CPU has no AVX-512 VNNI";
  if (GetParam() != HWY_AVX3) GTEST_SKIP() << "VNNI tiles are built for the AVX3 target only";
  std::mt19937 rng(17);
  const int K = 512, M = 11;
  for (int group : {32, 256})
  for (DType t : kQ8Types) {
    const std::vector<uint8_t> w = RandomWeights(t, M, K, rng);
    for (int rows : {1, 3, 6, 7, 13}) {
      const std::vector<float> x = RandomActs(rows, K, rng);
      std::vector<cpu::ActBlockQ8> xq(static_cast<size_t>(rows) * K / 32);
      std::vector<float> sums(static_cast<size_t>(rows) * K / 16);
      cpu::QuantizeRowsQ8(x.data(), rows, K, xq.data(), sums.data(), group);
      std::vector<float> with(static_cast<size_t>(rows) * M), without(with.size());
      cpu::MatMulQ8(xq.data(), sums.data(), rows, K, w.data(), t, M, 1.0f, with.data(), M, group);
      cpu::SetInt8VnniForTest(false);
      cpu::MatMulQ8(xq.data(), sums.data(), rows, K, w.data(), t, M, 1.0f, without.data(), M, group);
      cpu::SetInt8VnniForTest(true);
      for (size_t i = 0; i < with.size(); ++i)
        ASSERT_EQ(std::memcmp(&with[i], &without[i], 4), 0) << DTypeName(t) << " group=" << group << " rows=" << rows << " i=" << i;
    }
  }
}

// PrepareActSuperblocks (kernels_q8.h): superblock j in Q6_K's unit order at out[2 j], in Q4_K's
// at out[2 j + 1], each with the sums of q per 16 elements and the superblock's scale, on every
// SIMD target (the sums are SIMD byte sums; here also at the int8 extremes, sum -2032..2032).
TEST_P(KernelsQ8Test, SuperblocksHaveTheDocumentedLayout) {
  std::mt19937 rng(41);
  const int rows = 3, K = 512, nsb = K / 256;
  const std::vector<float> x = RandomActs(rows, K, rng);
  std::vector<cpu::ActBlockQ8> xq(static_cast<size_t>(rows) * K / 32);
  std::vector<float> sums(static_cast<size_t>(rows) * K / 16);
  cpu::QuantizeRowsQ8(x.data(), rows, K, xq.data(), sums.data(), 256);
  for (int l = 0; l < 32; ++l) xq[0].q[l] = -127, xq[1].q[l] = 127, xq[2].q[l] = static_cast<int8_t>(l % 2 ? -128 : 127);
  std::vector<cpu::ActSuperblockQ8> xs(2 * rows * nsb);
  cpu::PrepareActSuperblocks(xq.data(), rows, K, xs.data());
  const int q4k_unit[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  for (int j = 0; j < rows * nsb; ++j) {
    const cpu::ActBlockQ8* u = xq.data() + 8 * j;
    for (int k = 0; k < 8; ++k) {
      EXPECT_EQ(std::memcmp(xs[2 * j].q[k / 2] + 32 * (k % 2), u[k].q, 32), 0) << j << " " << k;
      EXPECT_EQ(std::memcmp(xs[2 * j + 1].q[k / 2] + 32 * (k % 2), u[q4k_unit[k]].q, 32), 0) << j << " " << k;
    }
    for (int g = 0; g < 16; ++g) {
      int want = 0;
      for (int l = 0; l < 16; ++l) want += u[g / 2].q[16 * (g % 2) + l];
      EXPECT_EQ(xs[2 * j].s[g], want) << j << " " << g;
      EXPECT_EQ(xs[2 * j + 1].s[g], -want) << j << " " << g;
    }
    EXPECT_EQ(xs[2 * j].dx, u[0].d);
    EXPECT_EQ(xs[2 * j + 1].dx, u[0].d);
  }
}

// Superblocks prepared once by the caller (as the CPU backend does, in ranges of rows per
// thread) give MatMulQ8 the bits of those it prepares itself, for every row count.
TEST_P(KernelsQ8Test, PreparedSuperblocksGiveTheSameBits) {
  std::mt19937 rng(43);
  const int K = 768, M = 10, nsb = K / 256;
  for (DType t : {DType::kQ4_K, DType::kQ6_K}) {
    const std::vector<uint8_t> w = RandomWeights(t, M, K, rng);
    for (int rows : {1, 2, 5, 9, 12}) {
      const std::vector<float> x = RandomActs(rows, K, rng);
      std::vector<cpu::ActBlockQ8> xq(static_cast<size_t>(rows) * K / 32);
      std::vector<float> sums(static_cast<size_t>(rows) * K / 16);
      cpu::QuantizeRowsQ8(x.data(), rows, K, xq.data(), sums.data(), 256);
      std::vector<cpu::ActSuperblockQ8> xs(2 * static_cast<size_t>(rows) * nsb);
      for (int r0 = 0; r0 < rows; r0 += 2) {  // two rows at a time, as threads would
        const int n = std::min(2, rows - r0);
        cpu::PrepareActSuperblocks(xq.data() + static_cast<size_t>(r0) * K / 32, n, K,
                                   xs.data() + 2 * static_cast<size_t>(r0) * nsb);
      }
      std::vector<float> own(static_cast<size_t>(rows) * M), given(own.size());
      cpu::MatMulQ8(xq.data(), sums.data(), rows, K, w.data(), t, M, 1.0f, own.data(), M, 256);
      cpu::MatMulQ8(xq.data(), sums.data(), rows, K, w.data(), t, M, 1.0f, given.data(), M, 256, xs.data());
      for (size_t i = 0; i < own.size(); ++i)
        ASSERT_EQ(std::memcmp(&own[i], &given[i], 4), 0) << DTypeName(t) << " rows=" << rows << " i=" << i;
    }
  }
}

// kQ4_0x4 (dtype.h): per group of four rows the scales, then the nibbles, block by block.
TEST(KernelsQ8Pack, Q4_0x4HasTheDocumentedLayoutAndUnpacksToTheRows) {
  std::mt19937 rng(31);
  const int M = 8, K = 96, nb = K / 32;
  const size_t row = DTypeRowBytes(DType::kQ4_0, K);
  const std::vector<uint8_t> w = RandomWeights(DType::kQ4_0, M, K, rng);
  std::vector<uint8_t> p = w;
  PackQ4_0x4InPlace(p.data(), M, K);
  for (int g = 0; g < M / 4; ++g) {
    const uint8_t* group = p.data() + g * 4 * row;
    for (int b = 0; b < nb; ++b) {
      for (int i = 0; i < 4; ++i) {
        const uint8_t* blk = w.data() + (4 * g + i) * row + b * 18;
        EXPECT_EQ(std::memcmp(group + 8 * b + 2 * i, blk, 2), 0) << g << " " << b << " " << i;
        EXPECT_EQ(std::memcmp(group + 8 * nb + 64 * b + 16 * i, blk + 2, 16), 0) << g << " " << b << " " << i;
      }
    }
    std::vector<uint8_t> rows(4 * row);
    UnpackQ4_0x4Group(group, K, rows.data());
    EXPECT_EQ(std::memcmp(rows.data(), w.data() + g * 4 * row, 4 * row), 0) << g;
  }
}

// MatMulQ8 on kQ4_0x4 weights: against the reference on the Q4_0 rows they were packed from
// (the tolerance of MatchesTheReferenceForEveryFormatAndRowCount), the same bits for a row alone
// or in a batch and for a range starting at any group, and with or without VNNI. M = 916 at K =
// 512 gives prefill two groups of weight rows (~256 KiB each).
TEST_P(KernelsQ8Test, Q4_0x4MatchesTheQ4_0Reference) {
  std::mt19937 rng(37);
  for (const auto& [M, K] : std::vector<std::pair<int, int>>{{12, 256}, {8, 1536}, {916, 512}}) {
    const size_t row = DTypeRowBytes(DType::kQ4_0, K);
    const std::vector<uint8_t> w = RandomWeights(DType::kQ4_0, M, K, rng);
    std::vector<uint8_t> p = w;
    PackQ4_0x4InPlace(p.data(), M, K);
    std::vector<float> wf(static_cast<size_t>(M) * K);
    ConvertToF32(DType::kQ4_0, w.data(), wf.data(), wf.size());
    for (int rows : {1, 2, 3, 4, 5, 9, 13}) {
      if (M > 100 && rows != 9) continue;
      SCOPED_TRACE("M=" + std::to_string(M) + " K=" + std::to_string(K) + " rows=" + std::to_string(rows));
      const std::vector<float> x = RandomActs(rows, K, rng);
      std::vector<cpu::ActBlockQ8> xq(static_cast<size_t>(rows) * K / 32);
      std::vector<float> sums(static_cast<size_t>(rows) * K / 16);
      cpu::QuantizeRowsQ8(x.data(), rows, K, xq.data(), sums.data());
      const int ldy = M + 2;
      std::vector<float> y(static_cast<size_t>(rows) * ldy, 777.0f), ref = y;
      cpu::MatMulQ8(xq.data(), sums.data(), rows, K, p.data(), DType::kQ4_0x4, M, 0.5f, y.data(), ldy);
      cpu::MatMulQ8Reference(xq.data(), rows, K, w.data(), DType::kQ4_0, M, 0.5f, ref.data(), ldy);
      for (int r = 0; r < rows; ++r) {
        for (int m = 0; m < M; ++m) {
          const double mag = ProductMagnitude(wf, xq, K, r, m);
          const size_t i = static_cast<size_t>(r) * ldy + m;
          ASSERT_NEAR(y[i], ref[i], 1e-4 * 0.5 * mag + 1e-30) << "r=" << r << " m=" << m;
        }
        EXPECT_EQ(y[static_cast<size_t>(r) * ldy + M], 777.0f) << "wrote past M";
      }
      // The packed reference (unpacking each group) gives the reference's bits.
      std::vector<float> ref_packed(ref.size(), 777.0f);
      cpu::MatMulQ8Reference(xq.data(), rows, K, p.data(), DType::kQ4_0x4, M, 0.5f, ref_packed.data(), ldy);
      EXPECT_EQ(ref_packed, ref);
      for (int r = 0; r < rows; ++r) {
        std::vector<float> solo(M);
        cpu::MatMulQ8(xq.data() + static_cast<size_t>(r) * K / 32, sums.data() + static_cast<size_t>(r) * K / 16, 1, K,
                      p.data(), DType::kQ4_0x4, M, 0.5f, solo.data(), M);
        for (int m = 0; m < M; ++m) ASSERT_EQ(solo[m], y[static_cast<size_t>(r) * ldy + m]) << "alone: r=" << r << " m=" << m;
      }
      // A range from the second group (threads split packed weights in fours).
      std::vector<float> part(static_cast<size_t>(rows) * ldy, 777.0f);
      cpu::MatMulQ8(xq.data(), sums.data(), rows, K, p.data() + 4 * row, DType::kQ4_0x4, M - 4, 0.5f, part.data() + 4, ldy);
      for (int r = 0; r < rows; ++r)
        for (int m = 4; m < M; ++m) ASSERT_EQ(part[r * ldy + m], y[r * ldy + m]) << "range: r=" << r << " m=" << m;
      if (cpu::HasInt8Vnni() && GetParam() == HWY_AVX3) {
        std::vector<float> without(y.size(), 777.0f);
        cpu::SetInt8VnniForTest(false);
        cpu::MatMulQ8(xq.data(), sums.data(), rows, K, p.data(), DType::kQ4_0x4, M, 0.5f, without.data(), ldy);
        cpu::SetInt8VnniForTest(true);
        for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(std::memcmp(&y[i], &without[i], 4), 0) << "VNNI off: i=" << i;
      }
    }
  }
}

TEST_P(KernelsQ8Test, CloseToTheF32ActivationProduct) {
  // The cost of quantising activations: against the exact product with f32 activations, the error
  // is bounded by sum_k |w_k| * d_block / 2 (each activation moves by at most half a step).
  std::mt19937 rng(8);
  const int K = 512, M = 5;
  for (DType t : kQ8Types) {
    const std::vector<uint8_t> w = RandomWeights(t, M, K, rng);
    std::vector<float> wf(static_cast<size_t>(M) * K);
    ConvertToF32(t, w.data(), wf.data(), wf.size());
    const std::vector<float> x = RandomActs(1, K, rng);
    std::vector<cpu::ActBlockQ8> xq(K / 32);
    std::vector<float> sums(K / 16);
    cpu::QuantizeRowsQ8(x.data(), 1, K, xq.data(), sums.data());
    std::vector<float> y(M);
    cpu::MatMulQ8(xq.data(), sums.data(), 1, K, w.data(), t, M, 1.0f, y.data(), M);
    for (int m = 0; m < M; ++m) {
      double exact = 0, bound = 0;
      for (int k = 0; k < K; ++k) {
        exact += static_cast<double>(wf[static_cast<size_t>(m) * K + k]) * x[k];
        bound += std::fabs(wf[static_cast<size_t>(m) * K + k]) * 0.5 * xq[k / 32].d;
      }
      EXPECT_NEAR(y[m], exact, bound * 1.001 + 1e-6) << DTypeName(t) << " m=" << m;
    }
  }
}

}  // namespace
}  // namespace g4
