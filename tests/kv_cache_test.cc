// KvCache layout (src/runtime/kv_cache.h).
#include "runtime/kv_cache.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "model/config.h"

namespace g4 {
namespace {

// The attention kernel reads cache rows in whole vectors: on a cache from plain std::vector
// (glibc aligns large blocks to 16 bytes) every 64-byte load straddled two cache lines. Every row
// of every owning layer starts on a 64-byte boundary when Nkv * D is a multiple of 16 floats.
TEST(KvCacheTest, RowsStartOnCacheLines) {
  ModelConfig c;
  c.num_layers = 3;
  c.layers.resize(3);
  c.layers[0].head_dim = 256, c.layers[0].num_kv_heads = 1, c.layers[0].window = 512;
  c.layers[1].head_dim = 512, c.layers[1].num_kv_heads = 2, c.layers[1].type = LayerType::kFull;
  c.layers[2].head_dim = 256, c.layers[2].num_kv_heads = 1, c.layers[2].kv_donor = 0;
  KvCache cache(c, 3, 700);
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

}  // namespace
}  // namespace g4
