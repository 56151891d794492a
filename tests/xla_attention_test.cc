// The XLA lowering of AttentionOp and KvWriteOp against the CPU backend over a run of steps on a
// shared cache: a sliding layer whose ring (4 slots) a 6-token chunk overfills and later chunks
// wrap, a full layer with a larger head dim and soft-capped scores, two KV-shared layers reading
// the owners' caches, prefill chunks (StepMode::kOneSequence) and batched decode
// (kOneTokenPerSequence) of sequences at different lengths, with and without padding rows, f32,
// f16 and i8 caches. Outputs and the whole caches are compared after every step: the caches' bytes
// (i8: the integers and the scales' bits) must be equal, the outputs within f32 rounding; with the
// i8 cache the outputs are also checked against the CPU backend's with an f32 cache, within the
// quantisation's bound. The fp8 cache (no CPU backend counterpart): RunFp8Scenario. Stale rows
// with NaN scales in unwritten slots. Needs GEMMA4RT_PJRT_PLUGIN (skipped otherwise).
#include <gtest/gtest.h>

#include <algorithm>
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

// v (|v| <= 448) rounded to the nearest fp8 e4m3 value, ties to even: 3 mantissa bits, exponents
// down to -6, subnormals in steps of 2^-9 (what the device's f32 -> f8E4M3FN convert does).
float RoundE4M3(float v) {
  const float a = std::fabs(v);
  if (a == 0) return v;
  int e;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  const float quantum = std::ldexp(1.0f, std::max(e - 1, -6) - 3);
  return std::copysign(std::nearbyint(a / quantum) * quantum, v);
}

// An f8E4M3FN byte's value (S.1111.111 is NaN; no infinities).
float E4M3ToF32(uint8_t b) {
  const int exp = (b >> 3) & 15, mant = b & 7;
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  if (exp == 15 && mant == 7) return NAN;
  return sign * (exp == 0 ? std::ldexp(static_cast<float>(mant), -9) : std::ldexp(1.0f + mant / 8.0f, exp - 7));
}

// A row of heads x D f32 values as the fp8 cache gives them back: per head s = max|x| / 448 and
// x' = e4m3(x * (448 / max|x|)) * s (lower_kv.h).
void RoundRowAsFp8(float* x, int heads, int D) {
  for (int h = 0; h < heads; ++h) {
    float* xh = x + h * D;
    float amax = 0;
    for (int d = 0; d < D; ++d) amax = std::max(amax, std::fabs(xh[d]));
    if (amax == 0) continue;
    const float inv = 448.0f / amax, s = amax / 448.0f;
    for (int d = 0; d < D; ++d) xh[d] = RoundE4M3(std::clamp(xh[d] * inv, -448.0f, 448.0f)) * s;
  }
}

struct Fixture {
  ModelConfig config;
  Graph graph;
  TensorPool pool{7};

  // fp8_rounded: the K and V embedding tables' rows (the keys and values of every token) rounded as
  // the fp8 cache stores them (RoundRowAsFp8); the same random values otherwise.
  explicit Fixture(bool fp8_rounded = false) {
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
    // kv_head_dim > 0: a K or V table of heads of that many elements.
    auto embed = [&](int cols, int kv_head_dim = 0) {
      const Tensor* t = pool.Random({kVocab, cols}, DType::kF32, -2, 2);
      if (fp8_rounded && kv_head_dim > 0) {
        std::vector<float> v(static_cast<size_t>(kVocab) * cols);
        std::memcpy(v.data(), t->data, v.size() * sizeof(float));
        for (int r = 0; r < kVocab; ++r) RoundRowAsFp8(v.data() + r * cols, cols / kv_head_dim, kv_head_dim);
        t = pool.FromF32({kVocab, cols}, v);
      }
      return g.Add(EmbedOp{t, 1.0f}, {}, cols);
    };
    int q0 = embed(kHeads * 8), k0 = embed(16, 8), v0 = embed(16, 8);
    int q1 = embed(kHeads * 16), k1 = embed(16, 16), v1 = embed(16, 16);
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
const std::vector<Step> kSteps = {{{0, 6}}, {{0, 3}}, {{1, 2}}, {{0, 1}, {1, 1}}, {{1, 1}, {0, 1}, {2, 1}},
                                  {{2, 5}}, {{0, 1}, {2, 1}, {1, 1}}, {{1, 1}, {2, 1}}, {{1, 1}}, {{2, 1}, {1, 1}}};

// The inputs of `step` on `cache`'s lengths, with random tokens.
StepInputs Inputs(const Step& step, const KvCacheBase& cache, TensorPool& pool) {
  std::uniform_int_distribution<int> tok(0, kVocab - 1);
  StepInputs in;
  in.kv_len.resize(kSeqs);
  for (int s = 0; s < kSeqs; ++s) in.kv_len[s] = cache.length(s);
  in.kv_end = in.kv_len;
  for (auto [seq, count] : step) {
    for (int i = 0; i < count; ++i) {
      in.tokens.push_back(tok(pool.rng()));
      in.positions.push_back(cache.length(seq) + i);
      in.seq_ids.push_back(seq);
    }
    in.kv_end[seq] += count;
  }
  for (size_t t = 0; t < in.tokens.size(); ++t) in.out_rows.push_back(static_cast<int>(t));
  return in;
}

// `in` padded to a bucket of 4 rows where asked (padding: seq -1, token 0, position 0), and `sh`'s
// rows and mode set for it.
StepInputs Padded(const StepInputs& in, bool pad, size_t step_pairs, StepShape& sh) {
  StepInputs xin = in;
  const int T = static_cast<int>(in.tokens.size()), Tp = pad ? (T + 4) / 4 * 4 : T;
  for (int t = T; t < Tp; ++t) {
    xin.tokens.push_back(0);
    xin.positions.push_back(0);
    xin.seq_ids.push_back(-1);
    xin.out_rows.push_back(t);
  }
  sh.tokens = sh.output_rows = Tp;
  sh.mode = step_pairs == 1 ? StepMode::kOneSequence : StepMode::kOneTokenPerSequence;
  return xin;
}

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

// stale (i8): every slot starts as a row a sequence before left behind whose heads were not finite:
// scale NaN (as the KV write stores for such a head), with finite integers (64). Attention must
// give such a slot no weight until it is written again: the scenario's outputs are then unchanged.
void RunScenario(DType kv_type, bool pad, bool stale = false) {
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
  if (stale) {  // the same stale rows in both caches (the CPU backend reads written slots alone)
    ASSERT_TRUE(i8);
    for (int c = 0; c < 2; ++c) {
      const size_t rows = static_cast<size_t>(kSeqs) * cpu_cache.slots(c);
      for (auto* bytes : {&xla_cache.k[c], &xla_cache.v[c]}) std::fill(bytes->begin(), bytes->end(), 64);
      for (auto* scales : {&xla_cache.ks[c], &xla_cache.vs[c]}) std::fill(scales->begin(), scales->end(), NAN);
      std::memset(cpu_cache.k(c, 0, 0), 64, rows * cpu_cache.kv_width(c));
      std::memset(cpu_cache.v(c, 0, 0), 64, rows * cpu_cache.kv_width(c));
      std::fill_n(cpu_cache.k_scale(c, 0, 0), rows * cpu_cache.kv_heads(c), NAN);
      std::fill_n(cpu_cache.v_scale(c, 0, 0), rows * cpu_cache.kv_heads(c), NAN);
    }
  }
  auto backend = MakeCpuBackend(1, CpuBackendOptionsFor(true));
  auto f32_backend = MakeCpuBackend(1, CpuBackendOptionsFor(true));  // its own workspace: both outputs stay
  int n = 0;
  for (const Step& step : kSteps) {
    SCOPED_TRACE("step " + std::to_string(n++));
    const StepInputs in = Inputs(step, cpu_cache, f.pool);
    const int T = static_cast<int>(in.tokens.size());
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
    const StepInputs xin = Padded(in, pad, step.size(), sh);
    const int Tp = sh.tokens;
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
        // Bits, NaN payloads included: the stale NaNs left in place are the same.
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

// The fp8 cache (a test-only path: XLA's CPU plugin converts f8E4M3FN but has no fp8 arithmetic,
// so the backend refuses `--cache-type fp8` there; the lowering is the same on every device). The
// reference is the CPU backend with an f32 cache over the same tokens whose keys and values were
// rounded as the fp8 cache rounds them (Fixture(true)): the outputs must agree within f32
// rounding, so attention reads exactly the stored values; and every stored element, decoded from
// its e4m3 byte times its head's scale, must be that rounded value (to an f32 ulp: XLA may divide
// by 448 as a multiplication) and within 2^-4 |x| + 2^-10 scale of the exact value (e4m3's 3
// mantissa bits: half a step of 2^-3 relative; a subnormal's step is 2^-9 scale). stale: as
// RunScenario's, stale rows of NaN scales (fp8 bytes 0x40, 2.0) must get no weight.
void RunFp8Scenario(bool pad, bool stale) {
  Fixture f, rounded(true);
  KvCache ref_cache(rounded.config, kSeqs, kContext, DType::kF32), exact_cache(f.config, kSeqs, kContext, DType::kF32);
  StepShape sh;
  sh.max_seqs = kSeqs;
  sh.kv_type = DType::kF8E4M3;
  sh.caches = {{0, ref_cache.slots(0), 4, ref_cache.kv_width(0), ref_cache.kv_heads(0)},
               {1, ref_cache.slots(1), 0, ref_cache.kv_width(1), ref_cache.kv_heads(1)}};
  HostCache xla_cache = testing_util::ZeroCache(sh);
  ASSERT_EQ(xla_cache.k[1].size(), static_cast<size_t>(kSeqs) * kContext * 16);  // 1 byte per element
  ASSERT_EQ(xla_cache.ks[1].size(), static_cast<size_t>(kSeqs) * kContext);       // + an f32 per head
  if (stale)
    for (int c = 0; c < 2; ++c) {
      for (auto* bytes : {&xla_cache.k[c], &xla_cache.v[c]}) std::fill(bytes->begin(), bytes->end(), 0x40);
      for (auto* scales : {&xla_cache.ks[c], &xla_cache.vs[c]}) std::fill(scales->begin(), scales->end(), NAN);
    }
  auto ref_backend = MakeCpuBackend(1, CpuBackendOptionsFor(true));
  auto exact_backend = MakeCpuBackend(1, CpuBackendOptionsFor(true));
  int n = 0;
  for (const Step& step : kSteps) {
    SCOPED_TRACE("step " + std::to_string(n++));
    const StepInputs in = Inputs(step, ref_cache, f.pool);
    const int T = static_cast<int>(in.tokens.size());
    const StepInput cpu_in{in.tokens, in.positions, in.seq_ids, in.out_rows};
    auto ref_exe = ref_backend->Compile(rounded.graph, T, T);
    auto exact_exe = exact_backend->Compile(f.graph, T, T);
    ASSERT_TRUE(ref_exe.ok() && exact_exe.ok());
    ASSERT_TRUE((*ref_exe)->Run(cpu_in, ref_cache).ok());
    ASSERT_TRUE((*exact_exe)->Run(cpu_in, exact_cache).ok());
    for (auto [seq, count] : step) {
      ref_cache.set_length(seq, ref_cache.length(seq) + count);
      exact_cache.set_length(seq, exact_cache.length(seq) + count);
    }
    const StepInputs xin = Padded(in, pad, step.size(), sh);
    auto out = testing_util::RunXlaStep(f.graph, sh, xin, xla_cache);
    for (const char* name : {"a0", "a1", "a2", "a3"}) {
      OutputView v = (*ref_exe)->Output(name);
      ASSERT_EQ(out[name].size(), static_cast<size_t>(sh.tokens) * v.cols) << name;
      ExpectNear(out[name].data(), v.data, static_cast<size_t>(T) * v.cols, 1e-4f, 1e-5f, name);
    }
    for (int c = 0; c < 2; ++c) {
      const int heads = ref_cache.kv_heads(c), D = ref_cache.kv_width(c) / heads;
      for (int seq = 0; seq < kSeqs; ++seq) {
        // Written slots: a ring holds the last `slots` positions.
        const int written = std::min(ref_cache.length(seq), ref_cache.slots(c));
        for (int slot = 0; slot < written; ++slot) {
          for (int kv = 0; kv < 2; ++kv) {
            const size_t row = static_cast<size_t>(seq) * ref_cache.slots(c) + slot;
            const uint8_t* q = (kv ? xla_cache.v : xla_cache.k)[c].data() + row * heads * D;
            const float* s = (kv ? xla_cache.vs : xla_cache.ks)[c].data() + row * heads;
            const auto* want = static_cast<const float*>(kv ? ref_cache.v(c, seq, slot) : ref_cache.k(c, seq, slot));
            const auto* x = static_cast<const float*>(kv ? exact_cache.v(c, seq, slot) : exact_cache.k(c, seq, slot));
            for (int i = 0; i < heads * D; ++i) {
              const float got = E4M3ToF32(q[i]) * s[i / D];
              ASSERT_NEAR(got, want[i], 3e-7f * std::fabs(want[i]))
                  << (kv ? "V" : "K") << " cache " << c << " seq " << seq << " slot " << slot << " element " << i;
              // (the factor: the f32 roundings of x * (448 / max|x|) and of the scale)
              ASSERT_LE(std::fabs(got - x[i]), (std::ldexp(std::fabs(x[i]), -4) + std::ldexp(s[i / D], -10)) * 1.00001f);
            }
          }
        }
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

TEST(XlaAttentionTest, Fp8CacheReadsTheRoundedValuesWithinE4M3Bounds) {
  G4_REQUIRE_PJRT_PLUGIN();
  RunFp8Scenario(false, false);
  RunFp8Scenario(true, false);
}

// Slots not yet written (a ring not yet full, a sequence shorter than before, another sequence's
// rows) hold stale rows with NaN scales: masked, they add nothing (0 * NaN would be NaN).
TEST(XlaAttentionTest, EightBitCacheStaleNanScalesGetNoWeight) {
  G4_REQUIRE_PJRT_PLUGIN();
  RunScenario(DType::kI8, false, true);
  RunScenario(DType::kI8, true, true);
  RunFp8Scenario(false, true);
  RunFp8Scenario(true, true);
}

}  // namespace
}  // namespace g4::xla
