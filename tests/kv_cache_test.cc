// KvCache layout (src/runtime/kv_cache.h).
#include "runtime/kv_cache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>

#include "model/config.h"

namespace g4 {
namespace {

// The attention kernel reads cache rows in whole vectors: on a cache from plain std::vector
// (glibc aligns large blocks to 16 bytes) every 64-byte load straddled two cache lines. Every row
// of every owning layer starts on a 64-byte boundary when a row's bytes (Nkv * D elements of 4 or
// 2 bytes) are a multiple of 64.
ModelConfig ThreeLayers() {
  ModelConfig c;
  c.num_layers = 3;
  c.layers.resize(3);
  c.layers[0].head_dim = 256, c.layers[0].num_kv_heads = 1, c.layers[0].window = 512;
  c.layers[1].head_dim = 512, c.layers[1].num_kv_heads = 2, c.layers[1].type = LayerType::kFull;
  c.layers[2].head_dim = 256, c.layers[2].num_kv_heads = 1, c.layers[2].kv_donor = 0;
  return c;
}

TEST(KvCacheTest, RowsStartOnCacheLines) {
  const ModelConfig c = ThreeLayers();
  for (DType type : {DType::kF32, DType::kF16}) {
    KvCache cache(c, 3, 700, type);
    ASSERT_TRUE(cache.owns(0) && cache.owns(1) && !cache.owns(2));
    for (int layer = 0; layer < 2; ++layer) {
      for (int seq = 0; seq < 3; ++seq) {
        for (int slot = 0; slot < cache.slots(layer); ++slot) {
          ASSERT_EQ(reinterpret_cast<uintptr_t>(cache.k(layer, seq, slot)) % 64, 0u) << layer << " " << seq << " " << slot;
          ASSERT_EQ(reinterpret_cast<uintptr_t>(cache.v(layer, seq, slot)) % 64, 0u) << layer << " " << seq << " " << slot;
        }
      }
    }
  }
}

// Sizes: layer 0 a ring of 512 slots of 256, layer 1 700 slots of 2 x 512, layer 2 none (donor 0);
// K and V, 3 sequences; f16 and bf16 half the bytes of f32. Rows are kv_width elements apart.
TEST(KvCacheTest, F16AndBf16HoldHalfTheBytesOfF32) {
  const ModelConfig c = ThreeLayers();
  const size_t elems_per_seq = 2 * (512 * 256 + 700 * 1024);
  KvCache f32(c, 3, 700, DType::kF32), f16(c, 3, 700, DType::kF16);
  EXPECT_EQ(f32.elem_bytes(), 4u);
  EXPECT_EQ(f16.elem_bytes(), 2u);
  EXPECT_EQ(f32.bytes(), 3 * elems_per_seq * 4);
  EXPECT_EQ(f16.bytes(), 3 * elems_per_seq * 2);
  EXPECT_EQ(KvCache::BytesPerSequence(c, 700, DType::kF16), elems_per_seq * 2);
  EXPECT_EQ(KvCache::BytesPerSequence(c, 700), elems_per_seq * 4);
  EXPECT_EQ(static_cast<char*>(f16.k(1, 0, 1)) - static_cast<char*>(f16.k(1, 0, 0)), 1024 * 2);
  EXPECT_EQ(static_cast<char*>(f16.v(1, 1, 0)) - static_cast<char*>(f16.v(1, 0, 0)), 700 * 1024 * 2);
  KvCache bf16(c, 3, 700, DType::kBF16);
  EXPECT_EQ(bf16.elem_bytes(), 2u);
  EXPECT_EQ(bf16.bytes(), f16.bytes());
  EXPECT_EQ(KvCache::BytesPerSequence(c, 700, DType::kBF16), elems_per_seq * 2);
  EXPECT_THROW(KvCache(c, 1, 16, DType::kQ8_0), std::invalid_argument);
  EXPECT_THROW(KvCache::BytesPerSequence(c, 16, DType::kQ8_0), std::invalid_argument);
}

// q8 (DType::kI8): a byte per element plus one f32 scale per slot and KV head, K's and V's apart.
// Layer 0: 512 slots x 1 head x (256 + 4) bytes; layer 1: 700 slots x 2 heads x (512 + 4).
TEST(KvCacheTest, Q8HoldsAByteAnElementAndAScalePerTokenAndKvHead) {
  const ModelConfig c = ThreeLayers();
  const size_t per_seq = 2 * (512 * (256 + 4) + 700 * 2 * (512 + 4));
  KvCache q8(c, 3, 700, DType::kI8);
  EXPECT_EQ(q8.elem_bytes(), 1u);
  EXPECT_EQ(q8.bytes(), 3 * per_seq);
  EXPECT_EQ(KvCache::BytesPerSequence(c, 700, DType::kI8), per_seq);
  EXPECT_EQ(KvCache::BytesPerSequence(c, 100, DType::kI8), 2 * (100 * (256 + 4) + 100 * 2 * (512 + 4)));
  EXPECT_EQ(static_cast<char*>(q8.k(1, 0, 1)) - static_cast<char*>(q8.k(1, 0, 0)), 1024);
  EXPECT_EQ(q8.k_scale(1, 0, 1) - q8.k_scale(1, 0, 0), 2);
  EXPECT_EQ(q8.v_scale(1, 2, 0) - q8.v_scale(1, 0, 0), 2 * 700 * 2);
  EXPECT_EQ(q8.k_scale(0, 1, 3) - q8.k_scale(0, 0, 0), 512 + 3);
  EXPECT_NE(q8.k_scale(0, 0, 0), q8.v_scale(0, 0, 0));
  KvCache f16(c, 1, 16, DType::kF16);
  EXPECT_EQ(f16.k_scale(0, 0, 0), nullptr);
  EXPECT_EQ(f16.v_scale(1, 0, 0), nullptr);
}

}  // namespace
}  // namespace g4
