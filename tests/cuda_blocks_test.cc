// The CUDA kernels' weight decoding and KV index math (src/backends/cuda/blocks.h), run on the
// host: the same functions the kernels run, against src/tensor/dequant.cc (ConvertToF32) bit for
// bit on random blocks of every format, and against KvCache's slot rule. Also the compute-dtype
// policy (cuda_policy.h). In every build: none of it needs the CUDA toolkit or a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backends/cuda/blocks.h"
#include "backends/cuda/cuda_policy.h"
#include "runtime/kv_cache.h"
#include "tensor/dtype.h"

namespace g4::cuda {
namespace {

// A random f16 scale: normal values over a wide exponent range, some subnormal, some zero.
uint16_t RandomHalfScale(std::mt19937& rng) {
  const int kind = static_cast<int>(rng() % 16);
  if (kind == 0) return 0;
  if (kind == 1) return static_cast<uint16_t>((rng() & 0x83ffu) | 1u);  // subnormal
  const uint32_t exp = 1 + rng() % 30;
  return static_cast<uint16_t>((rng() & 0x8000u) | (exp << 10) | (rng() & 0x3ffu));
}

// A random row of `blocks` blocks of `t`: random quant bytes, finite f16/bf16 scale fields.
std::vector<uint8_t> RandomRow(DType t, int blocks, std::mt19937& rng) {
  std::vector<uint8_t> b(blocks * DTypeBlockBytes(t));
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  auto put16 = [&](uint8_t* p, uint16_t h) { p[0] = h & 0xff, p[1] = h >> 8; };
  for (int i = 0; i < blocks; ++i) {
    uint8_t* blk = b.data() + i * DTypeBlockBytes(t);
    switch (t) {
      case DType::kQ8_0: case DType::kQ4_0: put16(blk, RandomHalfScale(rng)); break;
      case DType::kQ4_K: put16(blk, RandomHalfScale(rng)), put16(blk + 2, RandomHalfScale(rng)); break;
      case DType::kQ6_K: put16(blk + 208, RandomHalfScale(rng)); break;
      case DType::kW4G32: put16(blk, F32ToBf16(std::ldexp(static_cast<float>(rng() % 1000) - 500, -static_cast<int>(rng() % 40)))); break;
      case DType::kF16: for (int e = 0; e < 1; ++e) put16(blk, RandomHalfScale(rng)); break;
      case DType::kF32: { const float f = std::ldexp(static_cast<float>(static_cast<int32_t>(rng())), -40); std::memcpy(blk, &f, 4); break; }
      default: break;
    }
  }
  return b;
}

template <int F>
std::vector<float> DecodeRow(const std::vector<uint8_t>& row, int K) {
  std::vector<float> y(K);
  for (int c = 0; c < K / 32; ++c) DecodeChunk32<F>(row.data(), c, y.data() + 32 * c);
  return y;
}

template <int F>
void ExpectSameBitsAsDequant(DType t) {
  std::mt19937 rng(static_cast<uint32_t>(F) * 7919u + 1);
  ASSERT_EQ(FormatBlockBytes(F), static_cast<int>(DTypeBlockBytes(t)));
  ASSERT_EQ(FormatBlockElems(F), DTypeBlockElems(t));
  for (int trial = 0; trial < 200; ++trial) {
    const int K = 256 * (1 + trial % 4);
    const std::vector<uint8_t> row = RandomRow(t, K / DTypeBlockElems(t), rng);
    std::vector<float> want(K);
    ConvertToF32(t, row.data(), want.data(), K);
    const std::vector<float> got = DecodeRow<F>(row, K);
    for (int i = 0; i < K; ++i) {
      uint32_t a, b;
      std::memcpy(&a, &got[i], 4);
      std::memcpy(&b, &want[i], 4);
      ASSERT_EQ(a, b) << DTypeName(t) << " element " << i << " of " << K << ": " << got[i] << " vs " << want[i];
    }
  }
}

TEST(CudaBlocksTest, Q8_0DecodesAsDequant) { ExpectSameBitsAsDequant<kWQ8_0>(DType::kQ8_0); }
TEST(CudaBlocksTest, Q4_0DecodesAsDequant) { ExpectSameBitsAsDequant<kWQ4_0>(DType::kQ4_0); }
TEST(CudaBlocksTest, Q4_KDecodesAsDequant) { ExpectSameBitsAsDequant<kWQ4_K>(DType::kQ4_K); }
TEST(CudaBlocksTest, Q6_KDecodesAsDequant) { ExpectSameBitsAsDequant<kWQ6_K>(DType::kQ6_K); }
TEST(CudaBlocksTest, W4G32DecodesAsDequant) { ExpectSameBitsAsDequant<kWW4G32>(DType::kW4G32); }
TEST(CudaBlocksTest, DenseFormatsDecodeAsConvert) {
  ExpectSameBitsAsDequant<kWF16>(DType::kF16);
  ExpectSameBitsAsDequant<kWF32>(DType::kF32);
}

TEST(CudaBlocksTest, BF16DecodesAsConvert) {
  std::mt19937 rng(5);
  std::vector<uint8_t> row(2 * 64);
  for (auto& x : row) x = static_cast<uint8_t>(rng());
  std::vector<float> want(64);
  ConvertToF32(DType::kBF16, row.data(), want.data(), 64);
  const std::vector<float> got = DecodeRow<kWBF16>(row, 64);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), 64 * sizeof(float)), 0);
}

// Every f16 bit pattern converts as F16ToF32 (NaN: same payload bits).
TEST(CudaBlocksTest, HalfBitsToF32IsExactForEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = HalfBitsToF32(static_cast<uint16_t>(h)), b = F16ToF32(static_cast<uint16_t>(h));
    uint32_t ua, ub;
    std::memcpy(&ua, &a, 4);
    std::memcpy(&ub, &b, 4);
    ASSERT_EQ(ua, ub) << "half 0x" << std::hex << h;
  }
}

TEST(CudaBlocksTest, KvSlotIsKvCachesSlot) {
  ModelConfig c;
  c.num_layers = 2;
  c.layers.resize(2);
  c.layers[0].head_dim = 32, c.layers[0].num_kv_heads = 1, c.layers[0].window = 5;
  c.layers[1].head_dim = 32, c.layers[1].num_kv_heads = 1, c.layers[1].type = LayerType::kFull;
  for (int max_context : {3, 5, 40}) {
    KvCache cache(c, 1, max_context);
    for (int l = 0; l < 2; ++l)
      for (int pos = 0; pos < max_context; ++pos)
        EXPECT_EQ(KvSlot(pos, cache.window(l), cache.slots(l)), cache.slot_of(l, pos)) << l << " " << pos;
  }
  EXPECT_EQ(FirstKey(3, 5), 0);
  EXPECT_EQ(FirstKey(4, 5), 0);
  EXPECT_EQ(FirstKey(5, 5), 1);
  EXPECT_EQ(FirstKey(100, 0), 0);
}

// In a step of one sequence at positions 10..21 on a ring of 5 slots only the last 5 tokens'
// rows are written (each slot once, by the latest position); full layers write every row.
TEST(CudaBlocksTest, OnlyTheLatestRowOfARingSlotIsWritten) {
  std::vector<int32_t> seqs(12, 0);
  seqs.insert(seqs.end(), {1, 1});  // a second sequence after it
  const int T = static_cast<int>(seqs.size());
  std::vector<int> written;
  for (int t = 0; t < T; ++t)
    if (KvRowSurvives(t, T, seqs.data(), 5, 5)) written.push_back(t);
  EXPECT_EQ(written, (std::vector<int>{7, 8, 9, 10, 11, 12, 13}));
  for (int t = 0; t < T; ++t) EXPECT_TRUE(KvRowSurvives(t, T, seqs.data(), 0, 64));
}

TEST(CudaPolicyTest, ComputeDtypeByComputeCapability) {
  auto h200 = ChooseComputeDtype(9, 0, "auto");
  ASSERT_TRUE(h200.ok());
  EXPECT_EQ(h200->dtype, "bf16");
  EXPECT_EQ(h200->reason, "cc9.0>=8.0");
  auto t4 = ChooseComputeDtype(7, 5, "auto");
  ASSERT_TRUE(t4.ok());
  EXPECT_EQ(t4->dtype, "f16");
  auto f16 = ChooseComputeDtype(9, 0, "f16");
  ASSERT_TRUE(f16.ok());
  EXPECT_EQ(f16->dtype, "f16");
  auto bf16_on_t4 = ChooseComputeDtype(7, 5, "bf16");
  ASSERT_FALSE(bf16_on_t4.ok());
  EXPECT_NE(bf16_on_t4.status().message().find("compute capability 7.5 has no bf16 arithmetic"), std::string::npos);
  auto f32 = ChooseComputeDtype(9, 0, "f32");
  ASSERT_FALSE(f32.ok());
  EXPECT_EQ(f32.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace g4::cuda
