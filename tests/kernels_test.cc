// The Highway CPU kernels (src/backends/cpu/kernels_hwy.cc) against the scalar references
// (kernels.cc), on every SIMD target this machine can run: each test runs once per target in
// hwy::SupportedAndGeneratedTargets() (e.g. KernelsTest.MatMulExact/AVX2, .../SSE4, .../SSSE3,
// .../SCALAR here; AVX3 on AVX-512 machines; NEON/SVE on Arm), forced with
// hwy::SetSupportedTargetsForTest so that HWY_DYNAMIC_DISPATCH picks that target.
//
// Tolerances. MatMul rebuilds every weight bit-identically to ConvertToF32 (MatMulExact checks this
// with data on which every product and partial sum is exact in f32, so any order of summation
// gives the same bits) and then differs from MatMulReference only in the order of the f32
// additions and in fused multiply-adds. For a dot product whose terms pass through at most n
// roundings, |computed - exact| <= gamma_n * sum_k |w_k x_k| (Higham, "Accuracy and Stability of
// Numerical Algorithms", 3.1), gamma_n = n u / (1 - n u), u = 2^-24. The reference chains K/8 + 4
// roundings per term (eight interleaved accumulators, three pairwise adds, the product); the SIMD
// kernels at most K/2 + 16 (the scalar target: two accumulators of one lane, plus tails and the
// final lane sum; prefill adds the partial sums of 512-column slices, which only shortens chains); `scale` adds one rounding to each. So |y - y_ref| <= (gamma_{K/8+5} +
// gamma_{K/2+17}) * |scale| * sum_k |w_k x_k| -- a rigorous bound, not a fudge factor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cpu/simd_cap.h"
#include "backends/cpu/kernels.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "tensor/dtype.h"

namespace g4 {
namespace {

constexpr double kU = 1.0 / (1 << 24);  // unit roundoff of f32

// Activation row counts: every decode tile (1-4 rows) and the prefill tiles (8, then 4..1 left).
const int kRowCounts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 19};

double Gamma(double n) { return n * kU / (1.0 - n * kU); }

class KernelsTest : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { hwy::SetSupportedTargetsForTest(GetParam()); }
  void TearDown() override { cpu::ResetSimdTargetsForTest(); }
};

std::string TargetParamName(const ::testing::TestParamInfo<int64_t>& info) { return hwy::TargetName(info.param); }

INSTANTIATE_TEST_SUITE_P(Targets, KernelsTest, ::testing::ValuesIn(hwy::SupportedAndGeneratedTargets()),
                         TargetParamName);

const DType kAllWeightTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,
                                 DType::kQ5_0, DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

void PutU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v & 0xff);
  p[1] = static_cast<uint8_t>(v >> 8);
}

// Byte offsets of the fp16 scales of one block of `t` (d, and m / dmin where the format has it).
std::vector<size_t> ScaleOffsets(DType t) {
  switch (t) {
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ5_0: return {0};
    case DType::kQ4_1:
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ5_K: return {0, 2};
    case DType::kQ6_K: return {208};
    default: return {};
  }
}

// M rows of K weights in `t`. Random quant bytes; fp16 scales drawn by `scale()`. Plain float types
// get values from `value()` rounded to the type.
template <class ScaleFn, class ValueFn>
std::vector<uint8_t> MakeWeights(DType t, int M, int K, std::mt19937& rng, ScaleFn scale, ValueFn value) {
  std::vector<uint8_t> w(DTypeRowBytes(t, K) * M);
  if (DTypeBlockElems(t) == 1) {
    for (size_t i = 0; i < static_cast<size_t>(M) * K; ++i) {
      const float v = value();
      if (t == DType::kF32) std::memcpy(w.data() + 4 * i, &v, 4);
      if (t == DType::kF16) PutU16(w.data() + 2 * i, F32ToF16(v));
      if (t == DType::kBF16) PutU16(w.data() + 2 * i, F32ToBf16(v));
    }
    return w;
  }
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  const size_t bb = DTypeBlockBytes(t);
  for (size_t i = 0; i < w.size() / bb; ++i)
    for (size_t off : ScaleOffsets(t)) PutU16(w.data() + i * bb + off, scale());
  return w;
}

struct Case {
  DType t;
  int M, K;
};

// Runs MatMul and MatMulReference on the same inputs; y has row stride M + 3, filled with a
// sentinel that must survive in the gaps.
void RunBoth(const Case& c, const std::vector<uint8_t>& w, const std::vector<float>& x, int rows, float scale,
             std::vector<float>* y, std::vector<float>* y_ref) {
  const int ldy = c.M + 3;
  y->assign(static_cast<size_t>(rows) * ldy, 12345.0f);
  y_ref->assign(y->size(), 12345.0f);
  std::vector<float> scratch(c.K, 0.0f), scratch_ref(c.K, 0.0f);
  cpu::MatMul(x.data(), rows, c.K, w.data(), c.t, c.M, scale, y->data(), ldy, scratch.data());
  cpu::MatMulReference(x.data(), rows, c.K, w.data(), c.t, c.M, scale, y_ref->data(), ldy, scratch_ref.data());
}

TEST_P(KernelsTest, DispatchesToTheTargetUnderTest) {
  EXPECT_STREQ(cpu::SimdTargetName(), hwy::TargetName(GetParam()));
}

// Scales +-2^-6, activations integers in [-4, 4], K <= 512: every weight is a multiple of 2^-6
// below 2^6 in magnitude (Q6_K: 128 * 32 * 2^-6), so every product and every partial sum is a
// multiple of 2^-6 below 2^23 * 2^-6 in magnitude, hence exact in f32: the result is the same for
// any summation order and must match the reference bit for bit. This pins the decoding of every
// weight format (nibble order, fifth bits, 6-bit scales, ...) on every target.
TEST_P(KernelsTest, MatMulExact) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> small(-4, 4), ival(-64, 64);
  auto scale = [&] { return F32ToF16(rng() % 2 ? 0.015625f : -0.015625f); };  // +-2^-6
  auto value = [&] { return std::ldexp(static_cast<float>(ival(rng)), -4); };
  for (DType t : kAllWeightTypes) {
    for (const Case& c : {Case{t, 37, 512}, Case{t, 1, 512}, Case{t, 301, 256}}) {
      if (c.K % DTypeBlockElems(t) != 0) continue;
      const std::vector<uint8_t> w = MakeWeights(t, c.M, c.K, rng, scale, value);
      for (int rows : kRowCounts) {
        std::vector<float> x(static_cast<size_t>(rows) * c.K);
        for (auto& v : x) v = static_cast<float>(small(rng));
        for (float s : {1.0f, 0.125f}) {
          std::vector<float> y, y_ref;
          RunBoth(c, w, x, rows, s, &y, &y_ref);
          for (size_t i = 0; i < y.size(); ++i) {
            ASSERT_EQ(y[i], y_ref[i]) << DTypeName(t) << " M=" << c.M << " K=" << c.K << " rows=" << rows
                                      << " scale=" << s << " at " << i;
          }
        }
      }
    }
  }
}

// Checks y against y_ref with the summation-order bound from the file comment.
void ExpectWithinSummationBound(const Case& c, const std::vector<uint8_t>& w, const std::vector<float>& x, int rows,
                                float scale, const std::vector<float>& y, const std::vector<float>& y_ref,
                                const std::string& what) {
  const int ldy = c.M + 3;
  const size_t row_bytes = DTypeRowBytes(c.t, c.K);
  const double gamma = Gamma(c.K / 8.0 + 5) + Gamma(c.K / 2.0 + 17);
  std::vector<float> wf(c.K);
  int checked = 0;
  for (int m = 0; m < c.M; ++m) {
    ConvertToF32(c.t, w.data() + m * row_bytes, wf.data(), c.K);
    for (int n = 0; n < rows; ++n) {
      double abs_sum = 0;
      for (int k = 0; k < c.K; ++k) abs_sum += std::fabs(static_cast<double>(wf[k]) * x[static_cast<size_t>(n) * c.K + k]);
      const size_t i = static_cast<size_t>(n) * ldy + m;
      ASSERT_TRUE(std::isfinite(y_ref[i])) << what;
      const double bound = gamma * std::fabs(scale) * abs_sum;
      ASSERT_LE(std::fabs(static_cast<double>(y[i]) - y_ref[i]), bound)
          << what << " " << DTypeName(c.t) << " M=" << c.M << " K=" << c.K << " rows=" << rows << " m=" << m
          << " n=" << n << " y=" << y[i] << " ref=" << y_ref[i];
      ++checked;
    }
    for (int n = 0; n < rows; ++n)
      for (int j = c.M; j < ldy; ++j) ASSERT_EQ(y[static_cast<size_t>(n) * ldy + j], 12345.0f) << what << " gap";
  }
  EXPECT_EQ(checked, c.M * rows);
}

// Random quant bytes with random finite fp16 scales of any exponent, Gaussian activations; plain
// float weights of any size, and K values that leave vector tails for them.
TEST_P(KernelsTest, MatMulRandom) {
  std::mt19937 rng(99);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-14, 4);
  auto scale = [&] {
    // Finite, normal or subnormal, either sign.
    const float v = std::ldexp(1.0f + static_cast<float>(rng() % 1024) / 1024.0f, expo(rng)) * (rng() % 2 ? 1 : -1);
    return rng() % 16 == 0 ? static_cast<uint16_t>(rng() % 1024) /* subnormal or zero */ : F32ToF16(v);
  };
  auto value = [&] { return gauss(rng) * 0.05f; };
  for (DType t : kAllWeightTypes) {
    std::vector<Case> cases;
    if (DTypeBlockElems(t) == 1) {
      cases = {{t, 37, 1}, {t, 37, 7}, {t, 37, 37}, {t, 21, 640}, {t, 9, 1029}};
    } else if (DTypeBlockElems(t) == 32) {
      cases = {{t, 37, 32}, {t, 37, 96}, {t, 21, 640}};
    } else {
      cases = {{t, 37, 256}, {t, 13, 1024}};
    }
    for (const Case& c : cases) {
      const std::vector<uint8_t> w = MakeWeights(t, c.M, c.K, rng, scale, value);
      for (int rows : kRowCounts) {
        std::vector<float> x(static_cast<size_t>(rows) * c.K);
        for (auto& v : x) v = gauss(rng);
        const float s = rows % 2 ? 1.0f : 0.0625f * 3;
        std::vector<float> y, y_ref;
        RunBoth(c, w, x, rows, s, &y, &y_ref);
        ExpectWithinSummationBound(c, w, x, rows, s, y, y_ref, "random");
      }
    }
  }
}

// Float weights (F32, BF16, F16): a row's products are bit-identical whether it is multiplied
// alone (decode), in a small batch or in a prefill tile, and wherever the weight range starts
// (threads split the weight rows anywhere; the prefill tile takes them two at a time).
TEST_P(KernelsTest, FloatWeightRowsAreIndependentOfTheBatch) {
  std::mt19937 rng(41);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  auto scale = [&] { return F32ToF16(0.01f); };
  auto value = [&] { return gauss(rng) * 0.05f; };
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    const int M = 11, K = 203, rows = 10;  // K: two-vector steps, a one-vector step and a scalar tail
    const std::vector<uint8_t> w = MakeWeights(t, M, K, rng, scale, value);
    std::vector<float> x(static_cast<size_t>(rows) * K), scratch(K);
    for (auto& v : x) v = gauss(rng);
    std::vector<float> batch(static_cast<size_t>(rows) * M);
    cpu::MatMul(x.data(), rows, K, w.data(), t, M, 1.0f, batch.data(), M, scratch.data());
    const size_t row_bytes = DTypeRowBytes(t, K);
    for (int r = 0; r < rows; ++r) {
      std::vector<float> solo(M);
      cpu::MatMul(x.data() + static_cast<size_t>(r) * K, 1, K, w.data(), t, M, 1.0f, solo.data(), M, scratch.data());
      for (int m = 0; m < M; ++m) EXPECT_EQ(solo[m], batch[static_cast<size_t>(r) * M + m]) << DTypeName(t) << " r=" << r;
    }
    std::vector<float> part(static_cast<size_t>(rows) * M);
    cpu::MatMul(x.data(), rows, K, w.data() + row_bytes, t, M - 1, 1.0f, part.data() + 1, M, scratch.data());
    for (int r = 0; r < rows; ++r) {
      for (int m = 1; m < M; ++m) {
        EXPECT_EQ(part[static_cast<size_t>(r) * M + m], batch[static_cast<size_t>(r) * M + m])
            << DTypeName(t) << " r=" << r << " m=" << m;
      }
    }
  }
}

// The backend reorders a matmul's activations once, shared by its threads and by the matmuls of
// one input (q, k, v; gate, up), where MatMul would reorder them per call and thread: the reordered
// product is MatMul's bits, for any split of the rows being reordered and any first weight row.
// Only BF16 weights reorder, and only when K holds two vectors (never for K = 7 < 2 x 4 lanes).
TEST_P(KernelsTest, ReorderedActivationsGiveMatMulsBits) {
  std::mt19937 rng(47);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  auto scale = [&] { return F32ToF16(0.01f); };
  auto value = [&] { return gauss(rng) * 0.05f; };
  int reordering = 0;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kQ8_0}) {
    for (int K : {7, 203, 2048}) {
      if (K % DTypeBlockElems(t) != 0) continue;
      if (t != DType::kBF16 || K == 7) {
        EXPECT_FALSE(cpu::MatMulReordersActivations(t, K)) << DTypeName(t) << " K=" << K;
        continue;
      }
      if (!cpu::MatMulReordersActivations(t, K)) continue;  // the scalar target reads x as it is
      ++reordering;
      const int M = 13, rows = 10;
      const std::vector<uint8_t> w = MakeWeights(t, M, K, rng, scale, value);
      std::vector<float> x(static_cast<size_t>(rows) * K), scratch(K);
      for (auto& v : x) v = gauss(rng);
      std::vector<float> xr(x.size(), -1.0f);
      cpu::ReorderActivations(t, x.data(), 3, K, xr.data());  // rows 0-2, then 3-9
      cpu::ReorderActivations(t, x.data() + 3 * K, rows - 3, K, xr.data() + 3 * K);
      for (int r = 0; r < rows; ++r) {  // a permutation of each row
        std::vector<float> a(x.begin() + r * K, x.begin() + (r + 1) * K), b(xr.begin() + r * K, xr.begin() + (r + 1) * K);
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        ASSERT_EQ(a, b) << "row " << r;
      }
      const size_t row_bytes = DTypeRowBytes(t, K);
      for (int n : {1, 2, 3, rows}) {
        for (int m0 : {0, 1}) {
          std::vector<float> want(static_cast<size_t>(n) * M, 0.0f), got(want.size(), 0.0f);
          cpu::MatMul(x.data(), n, K, w.data() + m0 * row_bytes, t, M - m0, 0.5f, want.data(), M, scratch.data());
          cpu::MatMulReordered(xr.data(), n, K, w.data() + m0 * row_bytes, t, M - m0, 0.5f, got.data(), M);
          for (size_t i = 0; i < want.size(); ++i)
            ASSERT_EQ(got[i], want[i]) << "K=" << K << " rows=" << n << " first weight row " << m0 << " at " << i;
        }
      }
    }
  }
  EXPECT_EQ(reordering, std::string(cpu::SimdTargetName()) == "SCALAR" ? 0 : 2) << cpu::SimdTargetName();
}

// The same for block-quantised weights with f32 activations (`--f32-activations`, and W4G32
// always): decode computes whole rows (four weight rows at a time), prefill 512-column slices of
// eight packed activation rows; both must give the same bits. K = 1280 ends in a short slice
// (512 + 512 + 256); rows = 11 covers the packed tile of eight and a tile of three; M = 11 the
// four-row and single-row decode tiles. Until 2026-11-29 decode summed each row in one pass with
// two accumulators, and `generate --chunk 1/7/512 --f32-activations` gave logits ~1e-5 apart.
TEST_P(KernelsTest, BlockWeightRowsAreIndependentOfTheBatch) {
  std::mt19937 rng(43);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  auto scale = [&] { return F32ToF16(0.01f); };
  auto value = [&] { return 0.0f; };
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ4_K, DType::kQ5_K,
                  DType::kQ6_K, DType::kW4G32}) {
    const int M = 11, K = 1280, rows = 11;
    std::vector<uint8_t> w = MakeWeights(t, M, K, rng, scale, value);
    if (t == DType::kW4G32)  // its scale is a bf16 at the block's start (not in ScaleOffsets)
      for (size_t i = 0; i < w.size(); i += DTypeBlockBytes(t)) PutU16(w.data() + i, F32ToBf16(0.01f));
    std::vector<float> x(static_cast<size_t>(rows) * K), scratch(K);
    for (auto& v : x) v = gauss(rng);
    std::vector<float> batch(static_cast<size_t>(rows) * M);
    cpu::MatMul(x.data(), rows, K, w.data(), t, M, 0.5f, batch.data(), M, scratch.data());
    const size_t row_bytes = DTypeRowBytes(t, K);
    for (int n : {1, 2, 3, 4}) {  // decode batches of n rows
      for (int r0 = 0; r0 + n <= rows; r0 += n) {
        std::vector<float> got(static_cast<size_t>(n) * M);
        cpu::MatMul(x.data() + static_cast<size_t>(r0) * K, n, K, w.data(), t, M, 0.5f, got.data(), M, scratch.data());
        for (int r = 0; r < n; ++r)
          for (int m = 0; m < M; ++m)
            ASSERT_EQ(got[static_cast<size_t>(r) * M + m], batch[static_cast<size_t>(r0 + r) * M + m])
                << DTypeName(t) << " batch of " << n << " row " << r0 + r << " m=" << m;
      }
    }
    std::vector<float> part(static_cast<size_t>(rows) * M);
    cpu::MatMul(x.data(), rows, K, w.data() + row_bytes, t, M - 1, 0.5f, part.data() + 1, M, scratch.data());
    for (int r = 0; r < rows; ++r)
      for (int m = 1; m < M; ++m)
        ASSERT_EQ(part[static_cast<size_t>(r) * M + m], batch[static_cast<size_t>(r) * M + m])
            << DTypeName(t) << " from weight row 1: r=" << r << " m=" << m;
  }
}

std::vector<uint8_t> FromHex(const std::string& hex) {
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

// Blocks from tests/data/dequant_golden.json -- real ones from the default model (Q8_0 attn_v,
// Q5_0 attn_q, Q4_K attn_output, Q6_K ffn_down), blocks gguf.quants.quantize made from random data,
// random bytes with finite fp16 scales -- tiled into matrices: row m is the case's blocks rotated
// by m, then repeated to the row length.
TEST_P(KernelsTest, MatMulGoldenBlocks) {
  std::ifstream in(std::string(GEMMA4RT_TEST_DATA_DIR) + "/data/dequant_golden.json");
  ASSERT_TRUE(in) << "missing tests/data/dequant_golden.json";
  const nlohmann::json golden = nlohmann::json::parse(in);
  std::mt19937 rng(7);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  int cases = 0, real = 0;
  for (const auto& gc : golden["cases"]) {
    DType t = DType::kF32;
    bool known = false;
    for (DType d : kAllWeightTypes)
      if (DTypeName(d) == gc["type"].get<std::string>()) t = d, known = true;
    if (!known || DTypeBlockElems(t) == 1) continue;  // plain floats are covered above
    const std::vector<uint8_t> blocks = FromHex(gc["bytes"].get<std::string>());
    const size_t bb = DTypeBlockBytes(t);
    const size_t nb = blocks.size() / bb;
    ASSERT_GT(nb, 0u);
    for (int K : {DTypeBlockElems(t) * 2, DTypeBlockElems(t) * 5}) {
      const Case c{t, 19, K};
      const size_t row_blocks = K / DTypeBlockElems(t);
      std::vector<uint8_t> w(row_blocks * bb * c.M);
      for (int m = 0; m < c.M; ++m)
        for (size_t j = 0; j < row_blocks; ++j)
          std::memcpy(w.data() + (m * row_blocks + j) * bb, blocks.data() + ((m + j) % nb) * bb, bb);
      for (int rows : kRowCounts) {
        std::vector<float> x(static_cast<size_t>(rows) * K);
        for (auto& v : x) v = gauss(rng);
        std::vector<float> y, y_ref;
        RunBoth(c, w, x, rows, 1.0f, &y, &y_ref);
        ExpectWithinSummationBound(c, w, x, rows, 1.0f, y, y_ref, gc["source"].get<std::string>());
      }
    }
    ++cases;
    if (gc["source"].get<std::string>().rfind("real", 0) == 0) ++real;
  }
  EXPECT_GE(cases, 10);
  EXPECT_EQ(real, 4);  // Q8_0, Q5_0, Q4_K, Q6_K blocks of the default model
}

TEST_P(KernelsTest, DotAndAxpy) {
  std::mt19937 rng(5);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  for (int n : {0, 1, 3, 8, 31, 64, 256, 1000}) {
    std::vector<float> a(n), b(n), y(n);
    for (auto& v : a) v = gauss(rng);
    for (auto& v : b) v = gauss(rng);
    for (auto& v : y) v = gauss(rng);
    double exact = 0, abs_sum = 0;
    for (int i = 0; i < n; ++i) {
      exact += static_cast<double>(a[i]) * b[i];
      abs_sum += std::fabs(static_cast<double>(a[i]) * b[i]);
    }
    // Any order of summation: gamma_{n+1} sum |a_i b_i| (see the file comment).
    EXPECT_LE(std::fabs(cpu::Dot(a.data(), b.data(), n) - exact), Gamma(n + 1) * abs_sum) << n;
    // y + alpha x: one rounding of the exact value with a fused multiply-add, two without.
    const float alpha = 0.37f;
    std::vector<float> z = y;
    cpu::Axpy(alpha, a.data(), z.data(), n);
    for (int i = 0; i < n; ++i) {
      const double e = static_cast<double>(y[i]) + static_cast<double>(alpha) * a[i];
      EXPECT_LE(std::fabs(z[i] - e), 2 * kU * (std::fabs(y[i]) + std::fabs(alpha * a[i]))) << n << " " << i;
    }
  }
}

// Inputs for the elementwise kernels: zeros, tiny, moderate and large values of both signs.
std::vector<float> ElementwiseInputs(int n, std::mt19937& rng) {
  std::normal_distribution<float> gauss(0.0f, 3.0f);
  std::vector<float> v(n);
  const float special[] = {0.0f, -0.0f, 1e-30f, -1e-8f, 0.5f, -0.5f, 3.0f, -3.0f, 9.0f, -9.0f, 30.0f, -30.0f, 200.0f, -1e4f};
  for (int i = 0; i < n; ++i) v[i] = i < 14 ? special[i] : gauss(rng);
  return v;
}

TEST_P(KernelsTest, GeGluAndSoftcap) {
  std::mt19937 rng(11);
  for (int n : {1, 5, 14, 37, 1000}) {
    const std::vector<float> a = ElementwiseInputs(n, rng), b = ElementwiseInputs(n, rng);
    std::vector<float> y(n), y_ref(n);
    // GeGlu: tanh within 4 ulp of std::tanh's (Highway's documented bound) plus std::tanh's own
    // 0.5 ulp, |tanh| <= 1, so |t - t_ref| <= 5 * 2^-24; it enters as 0.5 a b t, and the rest is
    // the same f32 operations (a few roundings of the result).
    cpu::GeGlu(a.data(), b.data(), n, y.data());
    cpu::GeGluReference(a.data(), b.data(), n, y_ref.data());
    for (int i = 0; i < n; ++i) {
      const double tol = 0.5 * std::fabs(static_cast<double>(a[i]) * b[i]) * 5 * kU + 4 * kU * std::fabs(y_ref[i]);
      EXPECT_LE(std::fabs(static_cast<double>(y[i]) - y_ref[i]), tol) << "gelu n=" << n << " a=" << a[i] << " b=" << b[i];
    }
    // In place over `a` (how the CPU executable runs the MLP): the same bits as out of place.
    std::vector<float> in_place = a;
    cpu::GeGlu(in_place.data(), b.data(), n, in_place.data());
    EXPECT_EQ(in_place, y) << "gelu in place n=" << n;
    // Softcap: cap * tanh(x / cap): the same bound on tanh, times cap.
    for (float cap : {30.0f, 50.0f}) {
      cpu::Softcap(a.data(), n, cap, y.data());
      cpu::SoftcapReference(a.data(), n, cap, y_ref.data());
      for (int i = 0; i < n; ++i) {
        const double tol = cap * 5 * kU + 2 * kU * std::fabs(y_ref[i]);
        EXPECT_LE(std::fabs(static_cast<double>(y[i]) - y_ref[i]), tol) << "softcap x=" << a[i];
      }
    }
  }
}

TEST_P(KernelsTest, RmsNorm) {
  std::mt19937 rng(3);
  std::normal_distribution<float> gauss(0.0f, 2.0f);
  struct Shape { int rows, cols, group; };
  for (const Shape& s : {Shape{1, 640, 640}, Shape{3, 1024, 256}, Shape{5, 37, 37}, Shape{2, 7, 7}}) {
    std::vector<float> x(static_cast<size_t>(s.rows) * s.cols);
    for (auto& v : x) v = gauss(rng);
    for (DType wt : {DType::kF32, DType::kBF16}) {
      std::vector<uint8_t> w(DTypeRowBytes(wt, s.group));
      for (int j = 0; j < s.group; ++j) {
        const float v = gauss(rng) * 0.1f;
        if (wt == DType::kF32) std::memcpy(w.data() + 4 * j, &v, 4);
        else PutU16(w.data() + 2 * j, F32ToBf16(v));
      }
      for (bool with_w : {true, false}) {
        for (float offset : {0.0f, 1.0f}) {
          std::vector<float> y(x.size()), y_ref(x.size()), y_inplace = x;
          const uint8_t* wp = with_w ? w.data() : nullptr;
          cpu::RmsNorm(x.data(), s.rows, s.cols, s.group, wp, wt, 1e-6f, offset, y.data());
          cpu::RmsNormReference(x.data(), s.rows, s.cols, s.group, wp, wt, 1e-6f, offset, y_ref.data());
          cpu::RmsNorm(y_inplace.data(), s.rows, s.cols, s.group, wp, wt, 1e-6f, offset, y_inplace.data());
          // The same f32 operations on the same values; only the f64 sum of squares is added in
          // another order, which can move the f32 mean by one rounding: a few ulp at most.
          for (size_t i = 0; i < y.size(); ++i) {
            EXPECT_LE(std::fabs(y[i] - y_ref[i]), 4 * kU * std::fabs(y_ref[i])) << i;
            EXPECT_EQ(y_inplace[i], y[i]) << "in place " << i;
          }
        }
      }
    }
  }
}

// The RoPE loop as it was before RopeTable/RopeApply (cos and sin per row and pair, in each Rope
// node), with every product rounded to f32 on its own (volatile: no fused multiply-add, as
// kernels.cc is built).
void RopeBeforeTables(float* x, int rows, int cols, int head_dim, const float* inv_freq, const int32_t* positions) {
  const int half = head_dim / 2;
  for (int r = 0; r < rows; ++r) {
    const float pos = static_cast<float>(positions[r]);
    for (int j = 0; j < half; ++j) {
      if (inv_freq[j] == 0.0f) continue;
      const float angle = pos * inv_freq[j];
      const float c = std::cos(angle), s = std::sin(angle);
      for (int h0 = 0; h0 < cols; h0 += head_dim) {
        float* p = x + static_cast<size_t>(r) * cols + h0;
        const float a = p[j], b = p[j + half];
        volatile float ac = a * c, bs = b * s, bc = b * c, as = a * s;
        p[j] = ac - bs;
        p[j + half] = bc + as;
      }
    }
  }
}

// RoPE (RopeTable + RopeApply, scalar, kernels.cc) against the rotation computed in f64 from the same f32 angle: each
// output is a * cos - b * sin (or b * cos + a * sin) with cos and sin rounded to f32 (|error| <=
// u each) and then three f32 roundings, so |y - exact| <= 5u (|a| + |b|). Pairs with inv_freq 0
// keep their bits, the result is the loop's before the tables bit for bit, and one table
// (RopeTable) serves rows of 1 and of 8 heads alike.
TEST(RopeTest, RotatesEachPairByItsAngleAsBeforeTheTablesWithOneTableForAnyHeads) {
  std::mt19937 rng(11);
  std::normal_distribution<float> gauss(0.0f, 3.0f);
  const int rows = 5;
  const std::vector<int32_t> positions = {0, 1, 511, 4000, 131071};
  for (int head_dim : {8, 256, 512}) {
    const int half = head_dim / 2;
    for (int variant = 0; variant < 3; ++variant) {
      // 0: every pair rotated; 1: proportional (the last 3/4 of the pairs unrotated, as Gemma 4's
      // full layers); 2: zeros between rotated pairs as well.
      std::vector<float> inv_freq(half);
      for (int j = 0; j < half; ++j) inv_freq[j] = 1.0f / std::pow(10000.0f, 2.0f * j / head_dim);
      if (variant >= 1)
        for (int j = half / 4; j < half; ++j) inv_freq[j] = 0.0f;
      if (variant == 2) inv_freq[1] = 0.0f;
      std::vector<float> cs(static_cast<size_t>(rows) * head_dim);
      cpu::RopeTable(rows, head_dim, inv_freq.data(), positions.data(), cs.data());
      for (int heads : {1, 8}) {
        const int cols = heads * head_dim;
        std::vector<float> x(static_cast<size_t>(rows) * cols);
        for (float& v : x) v = gauss(rng);
        std::vector<float> y = x, y_before = x;
        cpu::RopeApply(y.data(), rows, cols, head_dim, inv_freq.data(), cs.data());
        RopeBeforeTables(y_before.data(), rows, cols, head_dim, inv_freq.data(), positions.data());
        ASSERT_EQ(0, std::memcmp(y.data(), y_before.data(), y.size() * sizeof(float))) << head_dim << " " << variant;
        for (int r = 0; r < rows; ++r) {
          for (int h = 0; h < heads; ++h) {
            const size_t base = static_cast<size_t>(r) * cols + static_cast<size_t>(h) * head_dim;
            for (int j = 0; j < half; ++j) {
              const float a = x[base + j], b = x[base + half + j];
              if (inv_freq[j] == 0.0f) {
                EXPECT_EQ(y[base + j], a);
                EXPECT_EQ(y[base + half + j], b);
                continue;
              }
              const double angle = static_cast<float>(static_cast<float>(positions[r]) * inv_freq[j]);
              const double lo = a * std::cos(angle) - b * std::sin(angle), hi = b * std::cos(angle) + a * std::sin(angle);
              const double tol = 5 * kU * (std::fabs(a) + std::fabs(b));
              EXPECT_NEAR(y[base + j], lo, tol) << "pos " << positions[r] << " j " << j;
              EXPECT_NEAR(y[base + half + j], hi, tol) << "pos " << positions[r] << " j " << j;
              if (positions[r] == 0) {
                EXPECT_EQ(y[base + j], a);
                EXPECT_EQ(y[base + half + j], b);
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace g4
