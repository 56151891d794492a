// Per-op conformance of the XLA lowering (src/backends/xla/lower.h): every op of
// src/graph/graph.h lowered alone (fed by embeddings of random tables) and run through XLA's CPU
// plugin, against the CPU backend with f32 activations on the same inputs; attention and the KV
// cache over several steps: rings across the window edge, both head dims, shared KV, soft-cap,
// prefill chunks and batched decode, padding rows; the i8 cache's KV write on rows that test its
// rounding. Needs GEMMA4RT_PJRT_PLUGIN (skipped otherwise).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/attention.h"
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

// The i8 cache's KV write (lower_kv.h) stores the bytes cpu::QuantizeKvRow gives, on rows chosen
// for its edges (2 KV heads of 8): an all-zero head, NaN and infinity (scale NaN, q 0), exact
// rounding midpoints (max |x| 127: x * 127 / max = x, so 0.5, 1.5, 2.5, -2.5, 126.5 round to even),
// tiny and huge magnitudes, maxima whose division by 127 a multiplication by 1/127 would round the
// other way, random values; and an i8 cache without head counts is refused.
TEST(XlaLoweringTest, I8KvWriteStoresTheCpuBackendsBytes) {
  G4_REQUIRE_PJRT_PLUGIN();
  constexpr int kHeads = 2, kD = 8, kW = kHeads * kD, kRows = 7, kSlots = 8;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> rows = {
      0, 0, 0, 0, 0, 0, 0, 0, 0.25f, -1, 3, 0, 0.5f, 2, -7, 1,                              // zero head
      1, nan, 2, 3, 0, 0, 0, 0, 1, 2, inf, 3, 4, 5, 6, 7,                                    // NaN, infinity
      0.5f, 1.5f, 2.5f, -0.5f, -2.5f, 126.5f, 127, -3.5f, -127, 63.5f, -64.5f, 0.5f, 1, 2, 3, 4,  // midpoints
      1e-30f, -3e-31f, 0, 2e-31f, 1e-35f, 0, 5e-31f, -1e-30f, 1e30f, -2e29f, 3e30f, 0, 1, -1e30f, 7e29f, 2e30f,
      // max |x| / 127 differs from max |x| * (1 / 127) in f32 (as for about 5% of floats)
      788.428894f, -3, 1, 0.25f, 500, -600, 2, 1, 2.36342478f, -1, 0.5f, 2, -2, 1.5f, 0, 1,
  };
  TensorPool p(11);
  std::uniform_real_distribution<float> u(-3, 3);
  for (int i = 0; i < 2 * kW; ++i) rows.push_back(u(p.rng()));  // two random rows
  ASSERT_EQ(rows.size(), static_cast<size_t>(kRows * kW));
  const Tensor* table = p.FromF32({kRows, kW}, rows);
  Graph g;
  const int k = g.Add(EmbedOp{table, 1.0f}, {}, kW, "k");
  g.Add(KvWriteOp{0}, {k, k}, 0);
  StepInputs in;
  for (int t = 0; t < kRows; ++t) {
    in.tokens.push_back(t);
    in.positions.push_back(t);
    in.seq_ids.push_back(0);
    in.out_rows.push_back(t);
  }
  in.kv_len = {0};
  in.kv_end = {kRows};
  StepShape sh;
  sh.tokens = sh.output_rows = kRows;
  sh.kv_type = DType::kI8;
  sh.caches = {{0, kSlots, 0, kW, kHeads}};
  HostCache hc = testing_util::ZeroCache(sh);
  RunXlaStep(g, sh, in, hc);
  ASSERT_EQ(hc.k[0].size(), static_cast<size_t>(kSlots * kW));
  ASSERT_EQ(hc.ks[0].size(), static_cast<size_t>(kSlots * kHeads));
  for (int r = 0; r < kRows; ++r) {
    int8_t q[kW];
    float scale[kHeads];
    cpu::QuantizeKvRow(rows.data() + r * kW, kHeads, kD, q, scale);
    for (const auto* cache : {&hc.k[0], &hc.v[0]})
      EXPECT_EQ(0, std::memcmp(cache->data() + r * kW, q, kW)) << "row " << r;
    for (const auto* scales : {&hc.ks[0], &hc.vs[0]})
      EXPECT_EQ(0, std::memcmp(scales->data() + r * kHeads, scale, sizeof(scale)))
          << "row " << r << ": " << (*scales)[r * kHeads] << ", " << (*scales)[r * kHeads + 1] << " vs " << scale[0] << ", " << scale[1];
  }
  // The midpoints' row as the rounding rule says (max 127: q = x rounded to nearest even).
  const int8_t want[kD] = {0, 2, 2, 0, -2, 126, 127, -4};
  EXPECT_EQ(0, std::memcmp(hc.k[0].data() + 2 * kW, want, kD));
  EXPECT_TRUE(std::isnan(hc.ks[0][2]) && std::isnan(hc.ks[0][3]));  // row 1: NaN in head 0, infinity in head 1
  EXPECT_EQ(hc.ks[0][0], 0.0f);                                      // row 0: the zero head
  // Rows past the step keep their zeros.
  for (int i = kRows * kW; i < kSlots * kW; ++i) ASSERT_EQ(hc.k[0][i], 0) << i;
  sh.caches[0].heads = 0;
  auto refused = LowerGraph(g, sh);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("KV head count"), std::string::npos) << refused.status().message();
}

}  // namespace
}  // namespace g4::xla
