// Per-op conformance of the CUDA backend against the CPU backend (f32 activations) on random
// inputs: every op of src/graph/graph.h, every weight format, the matrix-vector (<= 8 rows) and
// cuBLAS (more rows) matmul paths, attention with KV writes over several steps (head_dim 256 and
// 512, sliding rings across the window edge and full caches, soft-cap, GQA, f32/f16/bf16/int8/fp8
// caches, prefill chunks on both attention kernels and batched decode with the keys split over
// blocks), MoE. Skipped where the machine has no CUDA device.
//
// Tolerances (max |cuda - cpu| / max |cpu|): 1e-4 where both compute in f32 on the same weight
// values (block formats, F16 weights, the matrix-vector path; F16 tables feed the other ops);
// 2e-2 where the GPU rounds to its compute dtype (F32/BF16 weights as bf16 or f16, activations
// rounded for cuBLAS, bf16 caches); 2^-4 for the fp8 cache against the CPU backend's f32 cache
// (each stored element within half a step of 3 mantissa bits, 2^-4 of its value, so a softmax
// average of V rows within 2^-4 of max |v|; the keys' rounding errors move the scores by far less
// on these random inputs).
// fp8 needs compute capability 8.9: skipped below, as without a device.
#include <gtest/gtest.h>

#include <cstdlib>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "cuda/cuda_test_util.h"
#include "model/config.h"

namespace g4 {
namespace {

using cuda_test::RelErr;
using cuda_test::RunStep;
using cuda_test::Step;
using cuda_test::TensorPool;

std::unique_ptr<Backend> Cuda() {
  auto b = MakeCudaBackend({});
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::move(b).value() : nullptr;
}
std::unique_ptr<Backend> Cpu() { return MakeCpuBackend(1, CpuBackendOptionsFor(true)); }

Step OneSequence(int T, int V, std::mt19937& rng, int first_pos = 0, int seq = 0) {
  Step s;
  std::uniform_int_distribution<int> tok(0, V - 1);
  for (int t = 0; t < T; ++t) {
    s.tokens.push_back(tok(rng));
    s.positions.push_back(first_pos + t);
    s.seq_ids.push_back(seq);
    s.out_rows.push_back(t);
  }
  return s;
}

// The CPU backend and a CUDA backend, each with a KV cache for cfg (cpu_type and gpu_type).
struct Both {
  std::unique_ptr<Backend> cpu, gpu;
  std::unique_ptr<KvCacheBase> cpu_cache, gpu_cache;
};
void MakeBoth(const ModelConfig& cfg, int seqs, int context, DType cpu_type, DType gpu_type, Both* b) {
  b->cpu = Cpu();
  b->gpu = Cuda();
  ASSERT_NE(b->gpu, nullptr);
  auto cc = b->cpu->CreateKvCache(cfg, seqs, context, cpu_type);
  auto gc = b->gpu->CreateKvCache(cfg, seqs, context, gpu_type);
  ASSERT_TRUE(cc.ok()) << cc.status().ToString();
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  b->cpu_cache = std::move(cc).value();
  b->gpu_cache = std::move(gc).value();
}

// Every export of a stateless graph on both backends, within `tol`.
void CompareStateless(const Graph& g, const Step& s, double tol) {
  Both b;
  ASSERT_NO_FATAL_FAILURE(MakeBoth(ModelConfig{}, 1, 8192, DType::kF32, DType::kF32, &b));
  b.cpu_cache->set_length(0, s.positions[0]);  // the step continues the sequence at its first position
  b.gpu_cache->set_length(0, s.positions[0]);
  auto want = RunStep(*b.cpu, g, s, *b.cpu_cache);
  auto got = RunStep(*b.gpu, g, s, *b.gpu_cache);
  ASSERT_EQ(got.size(), want.size());
  for (auto& [name, v] : want) EXPECT_LT(RelErr(got[name], v), tol) << name << " at " << s.tokens.size() << " tokens";
}

TEST(CudaGpuOpsTest, EmbedAndMatMulOfEveryWeightFormatBothPaths) {
  G4_REQUIRE_CUDA_DEVICE();
  TensorPool p(1);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ6_K,
                   DType::kW4G32}) {
    const bool exact = dt != DType::kF32 && dt != DType::kBF16;  // stored as the GPU reads them
    Graph g;
    int x = g.Add(EmbedOp{p.Random({13, 512}, dt), 1.5f}, {}, 512, "embed");
    g.Add(MatMulOp{p.Random({40, 512}, dt), 0.25f}, {x}, 40, "mm");
    g.Add(MatMulOp{p.Random({4100, 512}, dt)}, {x}, 4100, "mm_two_tiles");
    for (int T : {1, 5, 8, 24}) {
      SCOPED_TRACE(testing::Message() << DTypeName(dt) << " T=" << T);
      CompareStateless(g, OneSequence(T, 13, p.rng()), exact && T <= 8 ? 1e-4 : 2e-2);
    }
  }
}

TEST(CudaGpuOpsTest, NormRopeElementwiseSliceSelectRows) {
  G4_REQUIRE_CUDA_DEVICE();
  TensorPool p(3);
  Graph g;
  // F16 tables: the GPU holds them as stored, so both backends start from the same values.
  int x = g.Add(EmbedOp{p.Random({9, 512}, DType::kF16), 1.0f}, {}, 512);
  int y = g.Add(EmbedOp{p.Random({9, 512}, DType::kF16), 1.0f}, {}, 512);
  g.Add(RmsNormOp{p.Random({512}), 512, 1e-6f, 1.0f}, {x}, 512, "norm_offset1");
  g.Add(RmsNormOp{p.Random({256}, DType::kBF16), 256, 1e-6f, 0.0f}, {x}, 512, "norm_groups");
  g.Add(RmsNormOp{nullptr, 256, 1e-5f, 0.0f}, {x}, 512, "norm_scale_free");
  std::vector<float> f256, f512;
  for (int j = 0; j < 128; ++j) f256.push_back(std::pow(10000.0f, -2.0f * j / 256));
  for (int j = 0; j < 256; ++j) f512.push_back(j < 64 ? std::pow(1000000.0f, -2.0f * j / 512) : 0.0f);
  g.Add(RopeOp{256, f256}, {x}, 512, "rope256");
  g.Add(RopeOp{512, f512}, {x}, 512, "rope512_partial");
  g.Add(GeGluOp{}, {x, y}, 512, "geglu");
  g.Add(AddOp{0.5f}, {x, y}, 512, "add");
  g.Add(ScaleOp{3.0f}, {x}, 512, "scale");
  g.Add(SoftcapOp{0.5f}, {x}, 512, "softcap");
  g.Add(SliceOp{128}, {x}, 256, "slice");
  int sel = g.Add(SelectRowsOp{}, {y}, 512);
  Step s = OneSequence(6, 9, p.rng(), 4090);
  s.out_rows = {5, 2};
  g.Export(sel, "select");
  CompareStateless(g, s, 2e-4);
}

// The cache plan of a one-layer model: a sliding layer where window > 0, else a full one.
ModelConfig OneLayer(int head_dim, int kv_heads, int window) {
  ModelConfig cfg;
  cfg.num_layers = 1;
  cfg.layers.resize(1);
  cfg.layers[0].head_dim = head_dim;
  cfg.layers[0].num_kv_heads = kv_heads;
  cfg.layers[0].window = window;
  cfg.layers[0].type = window ? LayerType::kSliding : LayerType::kFull;
  return cfg;
}

// A one-layer attention graph: q, k, v from embeddings; KvWrite after the attention.
struct AttnCase {
  int heads, kv_heads, head_dim, window;
  float softcap;
  DType cache;
  bool long_context = false;  // prefill of 40 and 300 tokens (the prefill kernel), decode over split keys
};

void RunAttentionCase(const AttnCase& c, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "D=" << c.head_dim << " window=" << c.window << " heads=" << c.heads << "/"
                                  << c.kv_heads << " cache=" << DTypeName(c.cache));
  TensorPool p(seed);
  const int V = 50, qw = c.heads * c.head_dim, kw = c.kv_heads * c.head_dim;
  Graph g;
  int q = g.Add(EmbedOp{p.Random({V, qw}, DType::kF16), 1.0f}, {}, qw);  // F16: the same values on both
  int k = g.Add(EmbedOp{p.Random({V, kw}, DType::kF16), 1.0f}, {}, kw);
  int v = g.Add(EmbedOp{p.Random({V, kw}, DType::kF16), 1.0f}, {}, kw);
  g.Add(AttentionOp{0, c.heads, c.kv_heads, c.head_dim, c.window, 1.0f / std::sqrt(float(c.head_dim)), c.softcap}, {q, k, v},
        qw, "attn");
  g.Add(KvWriteOp{0}, {k, v}, 0);
  const bool fp8 = c.cache == DType::kF8E4M3;
  Both both;
  ASSERT_NO_FATAL_FAILURE(MakeBoth(OneLayer(c.head_dim, c.kv_heads, c.window), 2, c.long_context ? 512 : 64,
                                   fp8 ? DType::kF32 : c.cache, c.cache, &both));
  const double tol = fp8 ? 0.0625 : c.cache == DType::kBF16 ? 2e-2 : 2e-4;
  // Sequence 0: prefill chunks of 7 and 11 (across a window of 8), then batched decode with
  // sequence 1 (prefilled with 3 tokens).
  // Long: chunks of 40 and 300 (more than kDecodeMaxTokens: the prefill kernel), then decode at
  // positions 340.. (several key splits on a full layer or a ring of 200).
  const int a = c.long_context ? 40 : 7, b = c.long_context ? 300 : 11;
  std::vector<Step> steps{OneSequence(a, V, p.rng()), OneSequence(b, V, p.rng(), a), OneSequence(3, V, p.rng(), 0, 1)};
  for (int d = 0; d < 4; ++d) {
    Step s;
    for (int seq : {0, 1}) {
      s.tokens.push_back(static_cast<int32_t>(p.rng()() % V));
      s.positions.push_back(seq == 0 ? a + b + d : 3 + d);
      s.seq_ids.push_back(seq);
    }
    s.out_rows = {0, 1};
    steps.push_back(s);
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    auto want = RunStep(*both.cpu, g, steps[i], *both.cpu_cache);
    auto got = RunStep(*both.gpu, g, steps[i], *both.gpu_cache);
    EXPECT_LT(RelErr(got["attn"], want["attn"]), tol) << "step " << i;
  }
}

// The attention shapes of every cache type, seeds from `seed` on.
void RunAttentionCases(DType cache, uint32_t& seed) {
  RunAttentionCase({8, 1, 256, 8, 0.0f, cache}, seed++);   // E2B-like sliding: MQA, ring of 8
  RunAttentionCase({8, 1, 512, 0, 0.0f, cache}, seed++);   // full layer, head_dim 512
  RunAttentionCase({4, 2, 256, 8, 50.0f, cache}, seed++);  // GQA with soft-cap (Gemma 2/3 style)
  RunAttentionCase({4, 2, 512, 0, 0.0f, cache}, seed++);
  RunAttentionCase({8, 1, 512, 0, 0.0f, cache, true}, seed++);    // flash decoding over 340+ keys
  RunAttentionCase({8, 1, 256, 200, 0.0f, cache, true}, seed++);  // split keys on a ring of 200
  RunAttentionCase({2, 1, 128, 0, 30.0f, cache, true}, seed++);   // a group of 2 (warps that only load)
}

TEST(CudaGpuOpsTest, AttentionHeadDims256And512RingsFullSoftcapGqaCacheTypesSplitKeys) {
  G4_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 10;
  for (DType cache : {DType::kF32, DType::kF16, DType::kBF16, DType::kI8}) RunAttentionCases(cache, seed);
}

// The fp8 (e4m3) cache against the CPU backend's f32 cache, on devices that hold it (cc >= 8.9).
TEST(CudaGpuOpsTest, Fp8CacheAttentionWithinE4m3OfTheF32Cache) {
  G4_REQUIRE_CUDA_DEVICE();
  auto gpu = Cuda();
  ASSERT_NE(gpu, nullptr);
  const Status held = gpu->CheckKvCacheType(DType::kF8E4M3);
  if (!held.ok()) GTEST_SKIP() << held.message();
  uint32_t seed = 80;
  RunAttentionCases(DType::kF8E4M3, seed);
}

// With an int8 cache a query with a single key (position 0) returns that key's V row dequantised,
// (1 * v_scale) * v_int on both backends: the same bits where both quantise the step's V alike.
TEST(CudaGpuOpsTest, Int8CacheSingleKeyOutputsTheCpuBits) {
  G4_REQUIRE_CUDA_DEVICE();
  for (int D : {256, 512}) {
    TensorPool p(40 + D);
    Graph g;
    int q = g.Add(EmbedOp{p.Random({9, 2 * D}, DType::kF16), 1.0f}, {}, 2 * D);
    int kv = g.Add(EmbedOp{p.Random({9, D}, DType::kF16), 3.0f}, {}, D);
    g.Add(AttentionOp{0, 2, 1, D, 0, 1.0f, 0.0f}, {q, kv, kv}, 2 * D, "attn");
    g.Add(KvWriteOp{0}, {kv, kv}, 0);
    Both b;
    ASSERT_NO_FATAL_FAILURE(MakeBoth(OneLayer(D, 1, 0), 1, 16, DType::kI8, DType::kI8, &b));
    const Step s = OneSequence(1, 9, p.rng());
    auto want = RunStep(*b.cpu, g, s, *b.cpu_cache);
    auto got = RunStep(*b.gpu, g, s, *b.gpu_cache);
    ASSERT_EQ(got["attn"].size(), want["attn"].size());
    EXPECT_EQ(got["attn"], want["attn"]) << "D=" << D;
  }
}

// A decode executable replays its captured CUDA graph on later steps (the split plans change at
// 64 and 128 keys, so it is captured again there): the same bits as launching every kernel each
// step (GEMMA4RT_CUDA_GRAPHS=0), and within the CPU backend's tolerance.
TEST(CudaGpuOpsTest, DecodeGraphReplayGivesTheDirectLaunchesBits) {
  G4_REQUIRE_CUDA_DEVICE();
  TensorPool p(50);
  const int V = 50, D = 256;
  Graph g;
  int q = g.Add(EmbedOp{p.Random({V, 4 * D}, DType::kF16), 1.0f}, {}, 4 * D);
  int k = g.Add(EmbedOp{p.Random({V, D}, DType::kF16), 1.0f}, {}, D);
  int v = g.Add(EmbedOp{p.Random({V, D}, DType::kF16), 1.0f}, {}, D);
  g.Add(AttentionOp{0, 4, 1, D, 0, 1.0f / 16, 0.0f}, {q, k, v}, 4 * D, "attn");
  g.Add(KvWriteOp{0}, {k, v}, 0);
  const ModelConfig cfg = OneLayer(D, 1, 0);
  for (DType cache : {DType::kF16, DType::kI8}) {
    auto cpu = Cpu();
    auto graphed = Cuda();
    auto direct = Cuda();
    ASSERT_TRUE(graphed != nullptr && direct != nullptr);
    auto cc = cpu->CreateKvCache(cfg, 1, 256, cache);
    auto gc = graphed->CreateKvCache(cfg, 1, 256, cache);
    auto dc = direct->CreateKvCache(cfg, 1, 256, cache);
    ASSERT_TRUE(cc.ok() && gc.ok() && dc.ok());
    const Step prefill = OneSequence(50, V, p.rng());
    RunStep(*cpu, g, prefill, **cc);
    RunStep(*graphed, g, prefill, **gc);
    RunStep(*direct, g, prefill, **dc);
    auto ge = graphed->Compile(g, 1, 1);
    setenv("GEMMA4RT_CUDA_GRAPHS", "0", 1);
    auto de = direct->Compile(g, 1, 1);
    unsetenv("GEMMA4RT_CUDA_GRAPHS");
    ASSERT_TRUE(ge.ok() && de.ok());
    for (int pos = 50; pos < 140; ++pos) {
      const Step s = OneSequence(1, V, p.rng(), pos);
      const StepInput in{s.tokens, s.positions, s.seq_ids, s.out_rows};
      ASSERT_TRUE((*ge)->Run(in, **gc).ok());
      ASSERT_TRUE((*de)->Run(in, **dc).ok());
      const OutputView a = (*ge)->Output("attn"), b = (*de)->Output("attn");
      const std::vector<float> got(a.data, a.data + 4 * D), want_direct(b.data, b.data + 4 * D);
      EXPECT_EQ(got, want_direct) << "position " << pos;
      auto want = RunStep(*cpu, g, s, **cc);
      EXPECT_LT(RelErr(got, want["attn"]), 2e-4) << "position " << pos;
      (*gc)->set_length(0, pos + 1);
      (*dc)->set_length(0, pos + 1);
    }
  }
}

TEST(CudaGpuOpsTest, MixtureOfExperts) {
  G4_REQUIRE_CUDA_DEVICE();
  TensorPool p(20);
  const int H = 128, E = 8, I = 64, k = 2;
  for (DType dt : {DType::kBF16, DType::kQ8_0}) {
    Graph g;
    // Inputs and router as the GPU holds them (F16, BF16), so that both pick the same experts.
    int y = g.Add(EmbedOp{p.Random({11, H}, DType::kF16), 1.0f}, {}, H);
    int r = g.Add(EmbedOp{p.Random({11, H}, DType::kF16), 1.0f}, {}, H);
    MoEOp op{p.Random({E, H}, DType::kBF16), p.Random({H}), p.Random({E}), p.Random({E, 2 * I, H}, dt),
             p.Random({E, H, I}, dt), E, k, I, 1e-6f};
    g.Add(op, {y, r}, H, "moe");
    for (int T : {1, 6}) CompareStateless(g, OneSequence(T, 11, p.rng()), 2e-3);
  }
}

// A shape with no kernel is refused at Compile with the reason, not run.
TEST(CudaGpuOpsTest, UnsupportedShapesAreRefusedAtCompile) {
  G4_REQUIRE_CUDA_DEVICE();
  TensorPool p(30);
  auto gpu = Cuda();
  ASSERT_NE(gpu, nullptr);
  Graph g;
  int q = g.Add(EmbedOp{p.Random({5, 96}), 1.0f}, {}, 96);
  g.Add(AttentionOp{0, 1, 1, 96, 0, 1.0f, 0.0f}, {q, q, q}, 96, "attn");
  auto exe = gpu->Compile(g, 1, 1);
  ASSERT_FALSE(exe.ok());
  EXPECT_NE(exe.status().message().find("head_dim 96"), std::string::npos) << exe.status().ToString();
  Graph wide;  // 64 query heads per KV head: 2048 threads per block
  int w = wide.Add(EmbedOp{p.Random({5, 64 * 32}), 1.0f}, {}, 64 * 32);
  wide.Add(AttentionOp{0, 64, 1, 32, 0, 1.0f, 0.0f}, {w, w, w}, 64 * 32, "attn");
  auto ew = gpu->Compile(wide, 1, 1);
  ASSERT_FALSE(ew.ok());
  EXPECT_NE(ew.status().message().find("2048 threads per block > the device's"), std::string::npos)
      << ew.status().ToString();
  Graph q5;
  int x = q5.Add(EmbedOp{p.Random({5, 256}), 1.0f}, {}, 256);
  Tensor t5 = *p.Random({8, 256}, DType::kQ8_0);
  t5.dtype = DType::kQ5_K;  // the bytes do not matter: refused before any read
  q5.Add(MatMulOp{&t5}, {x}, 8, "mm");
  auto e5 = gpu->Compile(q5, 1, 1);
  ASSERT_FALSE(e5.ok());
  EXPECT_NE(e5.status().message().find("Q5_K"), std::string::npos) << e5.status().ToString();
}

}  // namespace
}  // namespace g4
