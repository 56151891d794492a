// The XLA lowering of AttentionOp and KvWriteOp against the CPU backend over a run of steps on a
// shared cache: a sliding layer whose ring (4 slots) a 6-token chunk overfills and later chunks
// wrap, a full layer with a larger head dim and soft-capped scores, two KV-shared layers reading
// the owners' caches, prefill chunks (StepMode::kOneSequence) and batched decode
// (kOneTokenPerSequence) of sequences at different lengths, with and without padding rows, f32,
// f16 and i8 caches. Outputs and the whole caches are compared after every step: the caches' bytes
// (i8: the integers and the scales' bits) must be equal, the outputs within f32 rounding; with the
// i8 cache the outputs are also checked against the CPU backend's with an f32 cache, within the
// quantisation's bound. Needs GEMMA4RT_PJRT_PLUGIN (skipped otherwise).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "model/config.h"
#include "runtime/kv_cache.h"
#include "xla/xla_test_util.h"

namespace g4::xla {
namespace {

using testing_util::ExpectNear;
using testing_util::HostCache;
using testing_util::StepInputs;
using testing_util::TensorPool;

constexpr int kVocab = 64, kSeqs = 3, kContext = 16, kHeads = 4;

struct Fixture {
  ModelConfig config;
  Graph graph;
  TensorPool pool{7};

  Fixture() {
    config.num_layers = 4;
    config.num_heads = kHeads;
    config.layers.resize(4);
    auto plan = [&](int l, int window, int D, int nkv, int donor) {
      LayerPlan& p = config.layers[l];
      p.window = window;
      p.head_dim = D;
      p.num_kv_heads = nkv;
      p.kv_donor = donor;
    };
    plan(0, 4, 8, 2, -1);   // sliding, D 8, GQA 2:1
    plan(1, 0, 16, 1, -1);  // full, D 16, MQA
    plan(2, 4, 8, 2, 0);    // shares layer 0's cache
    plan(3, 0, 16, 1, 1);   // shares layer 1's cache
    Graph& g = graph;
    auto embed = [&](int cols) { return g.Add(EmbedOp{pool.Random({kVocab, cols}, DType::kF32, -2, 2), 1.0f}, {}, cols); };
    int q0 = embed(kHeads * 8), k0 = embed(16), v0 = embed(16);
    int q1 = embed(kHeads * 16), k1 = embed(16), v1 = embed(16);
    int q2 = embed(kHeads * 8), q3 = embed(kHeads * 16);
    g.Add(AttentionOp{0, kHeads, 2, 8, 4, 0.35f, 0.0f}, {q0, k0, v0}, kHeads * 8, "a0");
    g.Add(AttentionOp{1, kHeads, 1, 16, 0, 0.25f, 5.0f}, {q1, k1, v1}, kHeads * 16, "a1");
    g.Add(AttentionOp{0, kHeads, 2, 8, 4, 1.0f, 0.0f}, {q2, k0, v0}, kHeads * 8, "a2");
    g.Add(AttentionOp{1, kHeads, 1, 16, 0, 0.5f, 0.0f}, {q3, k1, v1}, kHeads * 16, "a3");
    g.Add(KvWriteOp{0}, {k0, v0}, 0);
    g.Add(KvWriteOp{1}, {k1, v1}, 0);
  }
};

// A step: (sequence, tokens) pairs; one pair: a prefill chunk; several of one token each: decode.
using Step = std::vector<std::pair<int, int>>;

// The i8 cache against exact f32 attention: every K/V element of the fixture's rows (embeddings in
// [-2, 2]) is within max|x| / 254 <= 2 / 254 of its value, so a score moves by at most
// e = scale * sum_d |q_d| 2/254 <= scale * D * 4 / 254 (the soft-cap only shrinks it), every
// softmax weight by a factor within exp(+-2e), and an output by at most (exp(2e) - 1) max|v| + 2/254.
struct OpBound {
  const char* name;
  float scale;
  int head_dim;
};
constexpr OpBound kOps[] = {{"a0", 0.35f, 8}, {"a1", 0.25f, 16}, {"a2", 1.0f, 8}, {"a3", 0.5f, 16}};
float QuantisationBound(const OpBound& op) {
  const double e = op.scale * op.head_dim * 4.0 / 254.0;
  return static_cast<float>((std::exp(2 * e) - 1) * 2.0 + 2.0 / 254.0);
}

void RunScenario(DType kv_type, bool pad) {
  Fixture f;
  KvCache cpu_cache(f.config, kSeqs, kContext, kv_type);
  KvCache f32_cache(f.config, kSeqs, kContext, DType::kF32);  // i8: the unquantised reference
  const bool i8 = kv_type == DType::kI8;
  StepShape sh;
  sh.max_seqs = kSeqs;
  sh.kv_type = kv_type;
  sh.caches = {{0, cpu_cache.slots(0), 4, cpu_cache.kv_width(0), cpu_cache.kv_heads(0)},
               {1, cpu_cache.slots(1), 0, cpu_cache.kv_width(1), cpu_cache.kv_heads(1)}};
  HostCache xla_cache = testing_util::ZeroCache(sh);
  auto backend = MakeCpuBackend(1, CpuBackendOptionsFor(true));
  auto f32_backend = MakeCpuBackend(1, CpuBackendOptionsFor(true));  // its own workspace: both outputs stay
  std::uniform_int_distribution<int> tok(0, kVocab - 1);
  const std::vector<Step> steps = {{{0, 6}}, {{0, 3}}, {{1, 2}}, {{0, 1}, {1, 1}}, {{1, 1}, {0, 1}, {2, 1}},
                                   {{2, 5}}, {{0, 1}, {2, 1}, {1, 1}}, {{1, 1}, {2, 1}}, {{1, 1}}, {{2, 1}, {1, 1}}};
  int n = 0;
  for (const Step& step : steps) {
    SCOPED_TRACE("step " + std::to_string(n++));
    StepInputs in;
    in.kv_len.resize(kSeqs);
    for (int s = 0; s < kSeqs; ++s) in.kv_len[s] = cpu_cache.length(s);
    in.kv_end = in.kv_len;
    for (auto [seq, count] : step) {
      for (int i = 0; i < count; ++i) {
        in.tokens.push_back(tok(f.pool.rng()));
        in.positions.push_back(cpu_cache.length(seq) + i);
        in.seq_ids.push_back(seq);
      }
      in.kv_end[seq] += count;
    }
    const int T = static_cast<int>(in.tokens.size());
    for (int t = 0; t < T; ++t) in.out_rows.push_back(t);
    // CPU reference.
    auto cpu_exe = backend->Compile(f.graph, T, T);
    ASSERT_TRUE(cpu_exe.ok());
    ASSERT_TRUE((*cpu_exe)->Run(StepInput{in.tokens, in.positions, in.seq_ids, in.out_rows}, cpu_cache).ok());
    for (auto [seq, count] : step) cpu_cache.set_length(seq, cpu_cache.length(seq) + count);
    std::map<std::string, std::vector<float>> exact;  // i8: the CPU backend with an f32 cache
    if (i8) {
      auto f32_exe = f32_backend->Compile(f.graph, T, T);
      ASSERT_TRUE(f32_exe.ok());
      ASSERT_TRUE((*f32_exe)->Run(StepInput{in.tokens, in.positions, in.seq_ids, in.out_rows}, f32_cache).ok());
      for (auto [seq, count] : step) f32_cache.set_length(seq, f32_cache.length(seq) + count);
      for (const OpBound& op : kOps) {
        OutputView v = (*f32_exe)->Output(op.name);
        exact[op.name].assign(v.data, v.data + static_cast<size_t>(T) * v.cols);
      }
    }
    // XLA, padded to a bucket of 4 rows where asked (padding: seq -1, token 0, position 0).
    StepInputs xin = in;
    const int Tp = pad ? (T + 4) / 4 * 4 : T;
    for (int t = T; t < Tp; ++t) {
      xin.tokens.push_back(0);
      xin.positions.push_back(0);
      xin.seq_ids.push_back(-1);
      xin.out_rows.push_back(t);
    }
    sh.tokens = sh.output_rows = Tp;
    sh.mode = step.size() == 1 ? StepMode::kOneSequence : StepMode::kOneTokenPerSequence;
    auto out = testing_util::RunXlaStep(f.graph, sh, xin, xla_cache);
    for (const char* name : {"a0", "a1", "a2", "a3"}) {
      OutputView v = (*cpu_exe)->Output(name);
      ASSERT_EQ(out[name].size(), static_cast<size_t>(Tp) * v.cols) << name;
      ExpectNear(out[name].data(), v.data, static_cast<size_t>(T) * v.cols, 1e-4f, 1e-5f, name);
    }
    for (const OpBound& op : kOps) {
      if (!i8) break;
      const std::vector<float>& want = exact[op.name];
      ExpectNear(out[op.name].data(), want.data(), want.size(), 0, QuantisationBound(op),
                 std::string(op.name) + " (i8 against an f32 cache)");
    }
    for (int c = 0; c < 2; ++c) {
      const size_t elems = static_cast<size_t>(kSeqs) * cpu_cache.slots(c) * cpu_cache.kv_width(c);
      if (i8) {  // the same integers and the same scales' bits
        const size_t scales = static_cast<size_t>(kSeqs) * cpu_cache.slots(c) * cpu_cache.kv_heads(c);
        EXPECT_EQ(0, std::memcmp(xla_cache.k[c].data(), cpu_cache.k(c, 0, 0), elems)) << "K cache " << c;
        EXPECT_EQ(0, std::memcmp(xla_cache.v[c].data(), cpu_cache.v(c, 0, 0), elems)) << "V cache " << c;
        EXPECT_EQ(0, std::memcmp(xla_cache.ks[c].data(), cpu_cache.k_scale(c, 0, 0), scales * sizeof(float))) << "K scales " << c;
        EXPECT_EQ(0, std::memcmp(xla_cache.vs[c].data(), cpu_cache.v_scale(c, 0, 0), scales * sizeof(float))) << "V scales " << c;
        continue;
      }
      for (int kv = 0; kv < 2; ++kv) {
        std::vector<float> want(elems), got(elems);
        ConvertToF32(kv_type, kv ? cpu_cache.v(c, 0, 0) : cpu_cache.k(c, 0, 0), want.data(), elems);
        ConvertToF32(kv_type, (kv ? xla_cache.v : xla_cache.k)[c].data(), got.data(), elems);
        ExpectNear(got.data(), want.data(), elems, 0, 0, std::string(kv ? "V" : "K") + " cache " + std::to_string(c));
      }
    }
  }
}

TEST(XlaAttentionTest, F32CacheChunksAndBatchedDecode) {
  G4_REQUIRE_PJRT_PLUGIN();
  RunScenario(DType::kF32, false);
}

TEST(XlaAttentionTest, PaddingRowsNeverWriteTheCache) {
  G4_REQUIRE_PJRT_PLUGIN();
  RunScenario(DType::kF32, true);
}

TEST(XlaAttentionTest, F16Cache) {
  G4_REQUIRE_PJRT_PLUGIN();
  RunScenario(DType::kF16, true);
}

TEST(XlaAttentionTest, I8CacheSameBytesAsTheCpuBackend) {
  G4_REQUIRE_PJRT_PLUGIN();
  RunScenario(DType::kI8, false);
  RunScenario(DType::kI8, true);
}

}  // namespace
}  // namespace g4::xla
