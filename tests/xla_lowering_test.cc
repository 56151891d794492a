// Per-op conformance of the XLA lowering (src/backends/xla/lower.h): every op of
// src/graph/graph.h lowered alone (fed by embeddings of random tables) and run through XLA's CPU
// plugin, against the CPU backend with f32 activations on the same inputs; attention and the KV
// cache over several steps: rings across the window edge, both head dims, shared KV, soft-cap,
// prefill chunks and batched decode, padding rows. Needs GEMMA4RT_PJRT_PLUGIN (skipped otherwise).
#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "model/config.h"
#include "runtime/kv_cache.h"
#include "xla/xla_test_util.h"

namespace g4::xla {
namespace {

using testing_util::ExpectNear;
using testing_util::HostCache;
using testing_util::RunXlaStep;
using testing_util::StepInputs;
using testing_util::TensorPool;

constexpr float kRtol = 1e-4f, kAtol = 1e-5f;

// A CPU reference run of `graph` on one step.
std::map<std::string, std::vector<float>> RunCpuStep(const Graph& graph, int T, int R, const StepInputs& in, KvCache& cache) {
  auto backend = MakeCpuBackend(1, CpuBackendOptionsFor(true));
  auto exe = backend->Compile(graph, T, R);
  EXPECT_TRUE(exe.ok());
  StepInput si{in.tokens, in.positions, in.seq_ids, in.out_rows};
  EXPECT_TRUE((*exe)->Run(si, cache).ok());
  std::map<std::string, std::vector<float>> out;
  for (const Node& n : graph.nodes()) {
    if (n.name.empty()) continue;
    OutputView v = (*exe)->Output(n.name);
    out[n.name].assign(v.data, v.data + static_cast<size_t>(v.rows) * v.cols);
  }
  return out;
}

// One sequence (0) of T tokens from position 0, every row an output row unless `R` given.
StepInputs OneSequence(int T, int V, std::mt19937& rng, std::vector<int32_t> out_rows = {}) {
  StepInputs in;
  std::uniform_int_distribution<int> tok(0, V - 1);
  for (int t = 0; t < T; ++t) {
    in.tokens.push_back(tok(rng));
    in.positions.push_back(t);
    in.seq_ids.push_back(0);
  }
  if (out_rows.empty())
    for (int t = 0; t < T; ++t) out_rows.push_back(t);
  in.out_rows = out_rows;
  in.kv_len = {0};
  in.kv_end = {T};
  return in;
}

// Runs a graph without attention on both backends and compares every export.
void CompareStateless(const Graph& g, const StepInputs& in, float rtol = kRtol) {
  ModelConfig c;  // no layers: no cache
  KvCache cache(c, 1, 8192);
  cache.set_length(0, in.positions[0]);
  const int T = static_cast<int>(in.tokens.size()), R = static_cast<int>(in.out_rows.size());
  auto cpu = RunCpuStep(g, T, R, in, cache);
  StepShape sh;
  sh.tokens = T;
  sh.output_rows = R;
  HostCache hc;
  auto xla = RunXlaStep(g, sh, in, hc);
  ASSERT_EQ(xla.size(), cpu.size());
  for (auto& [name, v] : cpu) {
    ASSERT_EQ(xla[name].size(), v.size()) << name;
    ExpectNear(xla[name].data(), v.data(), v.size(), rtol, kAtol, name);
  }
}

TEST(XlaLoweringTest, EmbedOfEachFloatType) {
  G4_REQUIRE_PJRT_PLUGIN();
  TensorPool p(1);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    Graph g;
    g.Add(EmbedOp{p.Random({11, 24}, dt), 1.5f}, {}, 24, "out");
    CompareStateless(g, OneSequence(7, 11, p.rng()));
  }
}

TEST(XlaLoweringTest, MatMulOfEachFloatTypeWithOutScale) {
  G4_REQUIRE_PJRT_PLUGIN();
  TensorPool p(2);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    Graph g;
    int x = g.Add(EmbedOp{p.Random({13, 96}), 1.0f}, {}, 96);
    g.Add(MatMulOp{p.Random({40, 96}, dt), 0.25f}, {x}, 40, "mm");
    g.Add(MatMulOp{p.Random({8, 96}, dt)}, {x}, 8, "mm1");
    CompareStateless(g, OneSequence(5, 13, p.rng()));
  }
}

// Q8_0, Q4_0 and W4G32 stay blocks on the device and are dequantised in the step: the same values
// as the CPU backend's f32 path reads.
TEST(XlaLoweringTest, QuantisedMatMulAndEmbedAreDequantisedInTheStep) {
  G4_REQUIRE_PJRT_PLUGIN();
  TensorPool p(8);
  for (DType dt : {DType::kQ8_0, DType::kQ4_0, DType::kW4G32}) {
    Graph g;
    int x = g.Add(EmbedOp{p.Random({13, 96}, dt), 2.0f}, {}, 96, "embed");
    g.Add(MatMulOp{p.Random({40, 96}, dt), 0.5f}, {x}, 40, "mm");
    CompareStateless(g, OneSequence(5, 13, p.rng()));
  }
}

TEST(XlaLoweringTest, RmsNormWithAndWithoutWeightsAndGroups) {
  G4_REQUIRE_PJRT_PLUGIN();
  TensorPool p(3);
  Graph g;
  int x = g.Add(EmbedOp{p.Random({9, 64}, DType::kF32, -3, 3), 1.0f}, {}, 64);
  g.Add(RmsNormOp{p.Random({64}), 64, 1e-6f, 1.0f}, {x}, 64, "full_offset1");
  g.Add(RmsNormOp{p.Random({16}, DType::kBF16), 16, 1e-6f, 0.0f}, {x}, 64, "groups16");
  g.Add(RmsNormOp{nullptr, 32, 1e-5f, 0.0f}, {x}, 64, "scale_free");
  CompareStateless(g, OneSequence(6, 9, p.rng()));
}

TEST(XlaLoweringTest, RopeBothHeadDimsAndProportional) {
  G4_REQUIRE_PJRT_PLUGIN();
  TensorPool p(4);
  Graph g;
  int x = g.Add(EmbedOp{p.Random({9, 64}), 1.0f}, {}, 64);
  std::vector<float> f16, f32;
  for (int j = 0; j < 8; ++j) f16.push_back(std::pow(10000.0f, -2.0f * j / 16));
  for (int j = 0; j < 16; ++j) f32.push_back(j < 4 ? std::pow(1000000.0f, -2.0f * j / 32) : 0.0f);  // partial rotation
  g.Add(RopeOp{16, f16}, {x}, 64, "d16");
  g.Add(RopeOp{32, f32}, {x}, 64, "d32_partial");
  CompareStateless(g, OneSequence(6, 9, p.rng()));
  StepInputs in = OneSequence(6, 9, p.rng());
  for (int t = 0; t < 6; ++t) in.positions[t] = 4090 + t;  // large angles (the op reads positions only)
  CompareStateless(g, in, 2e-4f);
}

TEST(XlaLoweringTest, ElementwiseOpsSliceAndSelectRows) {
  G4_REQUIRE_PJRT_PLUGIN();
  TensorPool p(5);
  Graph g;
  int a = g.Add(EmbedOp{p.Random({9, 48}, DType::kF32, -4, 4), 1.0f}, {}, 48);
  int b = g.Add(EmbedOp{p.Random({9, 48}, DType::kF32, -4, 4), 1.0f}, {}, 48);
  g.Add(GeGluOp{}, {a, b}, 48, "geglu");
  g.Add(AddOp{}, {a, b}, 48, "add");
  g.Add(AddOp{0.70710677f}, {a, b}, 48, "add_scaled");
  g.Add(ScaleOp{0.3f}, {a}, 48, "scale");
  g.Add(SoftcapOp{3.0f}, {a}, 48, "softcap");
  g.Add(SliceOp{16}, {a}, 16, "slice");
  int s = g.Add(SelectRowsOp{}, {b}, 48, "rows");
  g.Add(ScaleOp{2.0f}, {s}, 48, "rows_scaled");
  CompareStateless(g, OneSequence(7, 9, p.rng(), {6, 2, 2}));
}

TEST(XlaLoweringTest, MoEWithTopKRouting) {
  G4_REQUIRE_PJRT_PLUGIN();
  TensorPool p(6);
  const int H = 32, E = 6, I = 16, k = 2;
  Graph g;
  int y = g.Add(EmbedOp{p.Random({9, H}), 1.0f}, {}, H);
  int r = g.Add(EmbedOp{p.Random({9, H}, DType::kF32, -2, 2), 1.0f}, {}, H);
  MoEOp op{p.Random({E, H}), p.Random({H}, DType::kF32, 0.5f, 1.5f), p.Random({E}, DType::kF32, 0.5f, 1.5f),
           p.Random({E, 2 * I, H}, DType::kBF16), p.Random({E, H, I}, DType::kBF16), E, k, I, 1e-6f};
  g.Add(op, {y, r}, H, "moe");
  CompareStateless(g, OneSequence(8, 9, p.rng()));
  // Experts in Q4_0 / Q8_0 blocks (rows of 32 elements), dequantised in the step.
  Graph gq;
  y = gq.Add(EmbedOp{p.Random({9, H}), 1.0f}, {}, H);
  r = gq.Add(EmbedOp{p.Random({9, H}, DType::kF32, -2, 2), 1.0f}, {}, H);
  MoEOp q = op;
  q.width = 32;
  q.gate_up = p.Random({E, 64, H}, DType::kQ4_0);
  q.down = p.Random({E, H, 32}, DType::kQ8_0);
  gq.Add(q, {y, r}, H, "moe_q");
  CompareStateless(gq, OneSequence(8, 9, p.rng()));
}

}  // namespace
}  // namespace g4::xla
