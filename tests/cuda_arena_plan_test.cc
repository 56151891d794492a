// The CUDA backend's step memory plan (src/backends/cuda/arena_plan.h), on the host: on the real
// graphs of the golden fixtures (dense, KV-shared, MoE), no two values alive at the same node share
// a byte, every value lies inside the values region, and reuse keeps that region well below the
// sum of all outputs.
#include <gtest/gtest.h>

#include "backends/cuda/arena_plan.h"
#include "golden_reference.h"
#include "model/gemma.h"
#include "model/model.h"

namespace g4::cuda {
namespace {

void ExpectNoLiveOverlap(const Graph& g, int T, int R, bool expect_reuse = true) {
  const ArenaPlan p = PlanArena(g, T, R);
  const std::vector<int> last = LastUse(g);
  const auto& nodes = g.nodes();
  const int n = static_cast<int>(nodes.size());
  size_t sum = 0;
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(p.bytes[i] > 0, nodes[i].cols > 0 && RowsOf(nodes[i], T, R) > 0) << i;
    ASSERT_LE(p.offset[i] + p.bytes[i], p.values) << i;
    ASSERT_GE(p.bytes[i], static_cast<size_t>(RowsOf(nodes[i], T, R)) * nodes[i].cols * sizeof(float)) << i;
    EXPECT_EQ(p.offset[i] % kArenaAlign, 0u) << i;
    sum += p.bytes[i];
    for (int j = i + 1; j < n && j <= last[i]; ++j) {  // j is born while i lives
      if (p.bytes[i] == 0 || p.bytes[j] == 0) continue;
      const bool disjoint = p.offset[i] + p.bytes[i] <= p.offset[j] || p.offset[j] + p.bytes[j] <= p.offset[i];
      ASSERT_TRUE(disjoint) << "%" << i << " (live to %" << last[i] << ") and %" << j << " share bytes at T=" << T;
    }
  }
  if (expect_reuse) {
    EXPECT_LT(p.values, sum / 2) << "T=" << T;
  }  // liveness reuse saves most of the outputs' memory
  EXPECT_EQ(p.half_x == 0, T <= kMatVecMaxRows);
}

TEST(CudaArenaPlanTest, LiveValuesNeverShareBytesOnTheFixtureGraphs) {
  for (const char* fixture : {"gemma3-tiny", "gemma4-e2b-tiny", "gemma4-26b-a4b-tiny"}) {
    SCOPED_TRACE(fixture);
    auto m = LoadModel(golden::ModelPath(fixture));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    for (bool all_logits : {false, true}) {
      const Graph g = BuildGemmaGraph((*m)->config, (*m)->weights, GraphOptions{all_logits});
      for (int T : {1, 3, 9, 64}) ExpectNoLiveOverlap(g, T, all_logits ? T : 1);
      if (!all_logits) ExpectNoLiveOverlap(g, 4, 0);  // a prefill chunk without logits
    }
  }
}

// A value read by a later node keeps its bytes until then; the reader's own output is elsewhere.
TEST(CudaArenaPlanTest, AnOutputNeverTakesItsInputsBytes) {
  Tensor w;
  w.dtype = DType::kF32;
  w.shape = {64, 64};
  Graph g;
  int x = g.Add(EmbedOp{&w, 1.0f}, {}, 64);
  int a = g.Add(ScaleOp{2.0f}, {x}, 64);
  int b = g.Add(AddOp{}, {a, x}, 64);
  int c = g.Add(ScaleOp{3.0f}, {b}, 64, "out");
  const ArenaPlan p = PlanArena(g, 2, 2);
  EXPECT_NE(p.offset[b], p.offset[a]);
  EXPECT_NE(p.offset[b], p.offset[x]);
  EXPECT_EQ(p.offset[c], p.offset[x]);  // x and a are dead after b: c reuses the first freed range
  ExpectNoLiveOverlap(g, 2, 2, false);
}

// The attention scratch: flash decoding's partials (steps of up to kDecodeMaxTokens tokens) for
// the widest attention, and the step's int8 K/V rows with their scales.
TEST(CudaArenaPlanTest, AttentionScratchCountsDecodePartialsAndInt8Rows) {
  Tensor w;
  w.dtype = DType::kF32;
  w.shape = {64, 8 * 512};
  Graph g;
  int q = g.Add(EmbedOp{&w, 1.0f}, {}, 8 * 512);
  int kv = g.Add(SliceOp{0}, {q}, 512);
  g.Add(AttentionOp{0, 8, 1, 512, 0, 1.0f, 0.0f}, {q, kv, kv}, 8 * 512, "full");
  g.Add(AttentionOp{1, 8, 1, 256, 512, 1.0f, 0.0f}, {q, kv, kv}, 8 * 256, "sliding");
  for (int T : {1, 8, kDecodeMaxTokens, kDecodeMaxTokens + 1, 512}) {
    const ArenaPlan p = PlanArena(g, T, T);
    const size_t partials = T <= kDecodeMaxTokens ? AlignUp(static_cast<size_t>(kDecodeTokenSplits) * 8 * 514 * 4) : 0;
    const size_t q8 = 2 * AlignUp(static_cast<size_t>(T) * 512) + 2 * AlignUp(static_cast<size_t>(T) * 4);
    EXPECT_EQ(p.attn_partials, partials) << "T=" << T;
    EXPECT_EQ(p.attn, partials + q8) << "T=" << T;
    EXPECT_EQ(p.total(), p.values + p.half_x + p.half_w + p.moe + p.attn + p.ints);
  }
}

}  // namespace
}  // namespace g4::cuda
