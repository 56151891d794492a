// The int8 KV cache's attention (DType::kI8: src/runtime/kv_cache.h; cpu::QuantizeKvRow and the
// kernel's i8 rows, attention_hwy.cc) on every SIMD target this machine can run (one instance per
// target in hwy::SupportedAndGeneratedTargets(), as attention_kernels_test.cc), against f64
// evaluations of AttentionOp's definition.
//
// Each case draws f32 K/V tables by position (uniform in [-1, 1], each row times 2^e, e in -3..1,
// so the per-row scales differ), quantises every position's row once (cache rows before the step,
// step rows after it: the same int8 and scales either way, as the CPU backend does) and checks:
//  1. the SIMD kernel and the scalar reference against the f64 attention of the dequantised values
//     x8 = q * scale (exact in f64), within f32 rounding bounds (attention_kernels_test.cc's, plus
//     the roundings the int8 path adds: the score's dot product over D random f32 products,
//     gamma_{D+3} relative to sum_d |q_d k8_d| |scale|, and each weight times its V scale, one more
//     rounding per term);
//  2. the SIMD kernel against the f64 attention of the unquantised values x, within the bound of
//     the quantisation: o8 - o = sum_j (p8_j - p_j) v8_j + sum_j p_j (v8_j - v_j), where the scores
//     move by at most D8 = max_j |s8_j - s_j| and so every weight by a factor within exp(+-2 D8):
//     |o8 - o| <= (exp(2 D8) - 1) sum_j p_j |v8_j| + sum_j p_j |v8_j - v_j| (computed in f64),
//     plus bound 1. Each element is within scale / 2 = max|x| / 254 of its value;
//  3. the same bits for every thread count (1, 2, 3), for every cut of a sequence's positions into
//     cache and step (prefill chunks), and alone or batched with another sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/attention.h"
#include "base/thread_pool.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "tensor/dtype.h"

namespace g4 {
namespace {

constexpr double kU = 1.0 / (1 << 24);
double Gamma(double n) { return n * kU / (1.0 - n * kU); }

class AttentionQ8KernelsTest : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { hwy::SetSupportedTargetsForTest(GetParam()); }
  void TearDown() override { hwy::SetSupportedTargetsForTest(0); }
};

std::string TargetParamName(const ::testing::TestParamInfo<int64_t>& info) { return hwy::TargetName(info.param); }

INSTANTIATE_TEST_SUITE_P(Targets, AttentionQ8KernelsTest, ::testing::ValuesIn(hwy::SupportedAndGeneratedTargets()),
                         TargetParamName);

// One sequence's K/V by position: f32 values and their int8 rows and scales.
struct SeqKv {
  std::vector<float> k, v;         // [len, ld]
  std::vector<int8_t> k8, v8;      // [len, ld]
  std::vector<float> ks, vs;       // [len, Nkv]
};

SeqKv DrawSeq(int len, int Nkv, int D, std::mt19937& rng) {
  const int ld = Nkv * D;
  SeqKv s;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto fill = [&](std::vector<float>& x) {
    x.resize(static_cast<size_t>(len) * ld);
    for (int r = 0; r < len * Nkv; ++r) {
      const float mag = std::ldexp(1.0f, static_cast<int>(rng() % 5) - 3);
      for (int d = 0; d < D; ++d) x[static_cast<size_t>(r) * D + d] = u(rng) * mag;
    }
  };
  fill(s.k);
  fill(s.v);
  s.k8.resize(s.k.size());
  s.v8.resize(s.v.size());
  s.ks.resize(static_cast<size_t>(len) * Nkv);
  s.vs.resize(s.ks.size());
  for (int j = 0; j < len; ++j) {
    const size_t r = static_cast<size_t>(j) * ld, sr = static_cast<size_t>(j) * Nkv;
    cpu::QuantizeKvRow(s.k.data() + r, Nkv, D, s.k8.data() + r, s.ks.data() + sr);
    cpu::QuantizeKvRow(s.v.data() + r, Nkv, D, s.v8.data() + r, s.vs.data() + sr);
  }
  return s;
}

struct Scenario {
  const char* name;
  int D, Nkv, G, window, max_context;
  float scale;
  std::vector<std::pair<int, int>> seqs;  // (cached, step)
};

// One step: the caches laid out as KvCache does (ring slot = pos % slots), int8 with scales.
struct Q8Step {
  cpu::AttentionParams p;
  int ld, slots, tokens = 0;
  std::vector<const SeqKv*> kv;
  std::vector<std::vector<int8_t>> kc8, vc8;
  std::vector<std::vector<float>> kcs, vcs;
  std::vector<float> q;
  std::vector<int8_t> k8, v8;
  std::vector<float> ks, vs;
  std::vector<int32_t> positions, seq_first, seq_of;
  std::vector<const void*> kc, vc;
  std::vector<const float*> kcsp, vcsp;

  // seqs: per sequence its tables, positions before the step and tokens in it; q [tokens, Nq*D].
  Q8Step(const Scenario& sc, const std::vector<const SeqKv*>& tables, const std::vector<std::pair<int, int>>& cuts,
         const std::vector<float>& queries)
      : kv(tables), q(queries) {
    p = {sc.G * sc.Nkv, sc.Nkv, sc.D, sc.window, sc.scale, 0.0f};
    ld = sc.Nkv * sc.D;
    slots = sc.window > 0 ? std::min(sc.window, sc.max_context) : sc.max_context;
    for (size_t s = 0; s < cuts.size(); ++s) {
      const SeqKv& t = *tables[s];
      const auto [cached, step] = cuts[s];
      std::vector<int8_t> k(static_cast<size_t>(slots) * ld, 0), v(k.size(), 0);
      std::vector<float> ksc(static_cast<size_t>(slots) * sc.Nkv, NAN), vsc(ksc.size(), NAN);  // unwritten: NaN
      for (int j = 0; j < cached; ++j) {
        const int slot = sc.window > 0 ? j % slots : j;
        std::copy_n(t.k8.begin() + static_cast<size_t>(j) * ld, ld, k.begin() + static_cast<size_t>(slot) * ld);
        std::copy_n(t.v8.begin() + static_cast<size_t>(j) * ld, ld, v.begin() + static_cast<size_t>(slot) * ld);
        std::copy_n(t.ks.begin() + static_cast<size_t>(j) * sc.Nkv, sc.Nkv, ksc.begin() + static_cast<size_t>(slot) * sc.Nkv);
        std::copy_n(t.vs.begin() + static_cast<size_t>(j) * sc.Nkv, sc.Nkv, vsc.begin() + static_cast<size_t>(slot) * sc.Nkv);
      }
      const int first = tokens;
      for (int i = 0; i < step; ++i) {
        const int j = cached + i;
        k8.insert(k8.end(), t.k8.begin() + static_cast<size_t>(j) * ld, t.k8.begin() + static_cast<size_t>(j + 1) * ld);
        v8.insert(v8.end(), t.v8.begin() + static_cast<size_t>(j) * ld, t.v8.begin() + static_cast<size_t>(j + 1) * ld);
        ks.insert(ks.end(), t.ks.begin() + static_cast<size_t>(j) * sc.Nkv, t.ks.begin() + static_cast<size_t>(j + 1) * sc.Nkv);
        vs.insert(vs.end(), t.vs.begin() + static_cast<size_t>(j) * sc.Nkv, t.vs.begin() + static_cast<size_t>(j + 1) * sc.Nkv);
        positions.push_back(j);
        seq_first.push_back(first);
        seq_of.push_back(static_cast<int32_t>(s));
        ++tokens;
      }
      kc8.push_back(std::move(k));
      vc8.push_back(std::move(v));
      kcs.push_back(std::move(ksc));
      vcs.push_back(std::move(vsc));
    }
    for (int t = 0; t < tokens; ++t) {
      kc.push_back(kc8[seq_of[t]].data());
      vc.push_back(vc8[seq_of[t]].data());
      kcsp.push_back(kcs[seq_of[t]].data());
      vcsp.push_back(vcs[seq_of[t]].data());
    }
  }

  cpu::AttentionStep Step(float* out) const {
    cpu::AttentionStep s{tokens, q.data(), k8.data(), v8.data(), out, positions.data(), seq_first.data(), kc.data(),
                         vc.data(), slots, p.window > 0, DType::kI8, DType::kI8};
    s.k_scale = ks.data();
    s.v_scale = vs.data();
    s.k_scale_cache = kcsp.data();
    s.v_scale_cache = vcsp.data();
    return s;
  }
};

// f64 attention of token t from the tables: o8 on the dequantised values and o on the f32 ones, and
// per element the f32 bounds of the kernel (b_simd) and the reference (b_ref) around o8, and the
// quantisation bound (b_q) of |o8 - o| (see the file comment).
struct Expected {
  std::vector<double> o8, o, b_simd, b_ref, b_q, mag, row_mag;  // row_mag: sum_j p_j max|v_j| (the row's scale x 127)
};

Expected Exact(const Q8Step& s, double softcap) {
  const int D = s.p.head_dim, Nq = s.p.num_heads, Nkv = s.p.num_kv_heads, G = Nq / Nkv;
  Expected e;
  const size_t total = static_cast<size_t>(s.tokens) * Nq * D;
  for (auto* v : {&e.o8, &e.o, &e.b_simd, &e.b_ref, &e.b_q, &e.mag, &e.row_mag}) v->assign(total, 0.0);
  for (int t = 0; t < s.tokens; ++t) {
    const SeqKv& kv = *s.kv[s.seq_of[t]];
    const int pos = s.positions[t];
    const int lo = s.p.window > 0 ? std::max(0, pos - s.p.window + 1) : 0;
    const int n = pos - lo + 1;
    for (int h = 0; h < Nq; ++h) {
      const float* qh = s.q.data() + (static_cast<size_t>(t) * Nq + h) * D;
      const int kvh = h / G;
      std::vector<double> s8(n), s32(n);
      double ds_simd = 0, ds_ref = 0, dq = 0;
      for (int j = 0; j < n; ++j) {
        const size_t r = static_cast<size_t>(lo + j) * s.ld + static_cast<size_t>(kvh) * D;
        const double ksc = kv.ks[static_cast<size_t>(lo + j) * Nkv + kvh];
        double d8 = 0, d32 = 0, abs8 = 0;
        for (int d = 0; d < D; ++d) {
          const double k8 = kv.k8[r + d] * ksc;
          d8 += qh[d] * k8;
          d32 += static_cast<double>(qh[d]) * kv.k[r + d];
          abs8 += std::abs(qh[d] * k8);
        }
        const double sc = std::abs(static_cast<double>(s.p.scale));
        d8 *= s.p.scale;
        d32 *= s.p.scale;
        // Kernel: fl(fl(fl(q . k_int) * ks) * scale); reference: dequantised f32 elements, f32 dot, * scale.
        ds_simd = std::max(ds_simd, Gamma(D + 3) * abs8 * sc);
        ds_ref = std::max(ds_ref, Gamma(D + 3) * abs8 * sc);
        if (softcap > 0) {
          d8 = softcap * std::tanh(d8 / softcap);
          d32 = softcap * std::tanh(d32 / softcap);
        }
        s8[j] = d8;
        s32[j] = d32;
        dq = std::max(dq, std::abs(d8 - d32));
      }
      if (softcap > 0) {
        ds_simd += 6 * kU * softcap;
        ds_ref += 3 * kU * softcap;
      }
      auto softmax = [](std::vector<double>& x) {
        const double mx = *std::max_element(x.begin(), x.end());
        double sum = 0;
        for (double& y : x) sum += y = std::exp(y - mx);
        for (double& y : x) y /= sum;
      };
      softmax(s8);
      softmax(s32);
      const double tiles = n / 64 + 3;
      for (int d = 0; d < D; ++d) {
        double o8 = 0, o = 0, mag8 = 0, mag_v8 = 0, dv = 0, row_mag = 0;
        for (int j = 0; j < n; ++j) {
          const size_t r = static_cast<size_t>(lo + j) * s.ld + static_cast<size_t>(kvh) * D + d;
          const double v8 = kv.v8[r] * static_cast<double>(kv.vs[static_cast<size_t>(lo + j) * Nkv + kvh]);
          o8 += s8[j] * v8;
          o += s32[j] * kv.v[r];
          mag8 += s8[j] * std::abs(v8);
          mag_v8 += s32[j] * std::abs(v8);
          dv += s32[j] * std::abs(v8 - kv.v[r]);
          row_mag += s32[j] * 127.0 * kv.vs[static_cast<size_t>(lo + j) * Nkv + kvh];
        }
        const size_t i = (static_cast<size_t>(t) * Nq + h) * D + d;
        e.o8[i] = o8;
        e.o[i] = o;
        e.mag[i] = mag8;
        e.row_mag[i] = row_mag;
        e.b_simd[i] = (Gamma(2 * n + 4 * tiles + 18) + 2.02 * ds_simd) * mag8;
        e.b_ref[i] = (Gamma(2 * n + 10) + 2.02 * ds_ref) * mag8;
        e.b_q[i] = std::expm1(2 * dq) * mag_v8 + dv;
      }
    }
  }
  return e;
}

const Scenario kScenarios[] = {
    // Gemma 3 270M geometry (MQA, 4 heads, D 256, scale 1/16): a sliding ring past its wrap.
    {"mqa256_ring_decode", 256, 1, 4, 48, 256, 1.0f / 16, {{100, 1}}},
    {"mqa256_ring_prefill", 256, 1, 4, 48, 256, 1.0f / 16, {{100, 7}}},
    // Gemma 4 full and sliding layers (D 512 and 256, G 8, scale 1), decode over a long cache.
    {"mqa512_full_decode", 512, 1, 8, 0, 1200, 1.0f, {{1100, 1}}},
    {"mqa256_g8_ring_decode", 256, 1, 8, 160, 1100, 1.0f, {{1000, 1}}},
    {"gqa512_two_seqs", 512, 2, 2, 0, 300, 1.0f, {{130, 3}, {0, 5}}},
    // Odd head dim (vector tails), prefill longer than the window, G 6 and 12.
    {"odd37_window_lt_step", 37, 2, 2, 16, 128, 0.0883883f, {{70, 20}}},
    {"g6_full_decode", 256, 1, 6, 0, 300, 1.0f / 16, {{200, 1}}},
    {"g12_ring_prefill", 128, 1, 12, 40, 200, 1.0f / 16, {{90, 5}}},
};

std::vector<float> DrawQueries(int tokens, int width, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(tokens) * width);
  for (float& x : q) x = u(rng);
  return q;
}

TEST_P(AttentionQ8KernelsTest, MatchesTheDefinitionWithinTheQuantisationBound) {
  std::mt19937 rng(4321);
  ThreadPool pool2(2), pool3(3);
  ThreadPool* pools[] = {nullptr, &pool2, &pool3};
  double worst_simd = 0, worst_ref = 0, worst_q = 0, worst_rel = 0;
  for (const Scenario& sc : kScenarios) {
    for (float softcap : {0.0f, 50.0f}) {
      std::vector<SeqKv> tables;
      int tokens = 0;
      for (const auto& [cached, step] : sc.seqs) {
        tables.push_back(DrawSeq(cached + step, sc.Nkv, sc.D, rng));
        tokens += step;
      }
      std::vector<const SeqKv*> ptrs;
      for (const SeqKv& t : tables) ptrs.push_back(&t);
      Q8Step s(sc, ptrs, sc.seqs, DrawQueries(tokens, sc.G * sc.Nkv * sc.D, rng));
      s.p.softcap = softcap;
      const Expected e = Exact(s, softcap);
      std::vector<float> ref(e.o.size(), 777.0f);
      cpu::AttentionReference(s.p, s.Step(ref.data()));
      std::vector<float> first;
      for (ThreadPool* pool : pools) {
        const int threads = pool != nullptr ? pool->size() : 1;
        std::vector<float> out(e.o.size(), 777.0f);
        cpu::AttentionScratch scratch;
        cpu::Attention(s.p, s.Step(out.data()), pool, &scratch);
        if (first.empty()) first = out;
        ASSERT_EQ(out, first) << sc.name << " softcap " << softcap << ": threads " << threads << " vs 1";
        for (size_t i = 0; i < out.size(); ++i) {
          const double err8 = std::abs(out[i] - e.o8[i]), err = std::abs(out[i] - e.o[i]);
          ASSERT_LE(err8, e.b_simd[i]) << sc.name << " softcap " << softcap << " threads " << threads << " i " << i
                                       << ": " << out[i] << " vs " << e.o8[i];
          ASSERT_LE(err, e.b_q[i] + e.b_simd[i]) << sc.name << " softcap " << softcap << " i " << i << ": " << out[i]
                                                 << " vs unquantised " << e.o[i];
          if (e.b_simd[i] > 0) worst_simd = std::max(worst_simd, err8 / e.b_simd[i]);
          if (e.b_q[i] > 0) worst_q = std::max(worst_q, err / (e.b_q[i] + e.b_simd[i]));
          if (e.row_mag[i] > 0) worst_rel = std::max(worst_rel, err / e.row_mag[i]);
        }
      }
      for (size_t i = 0; i < ref.size(); ++i) {
        const double err = std::abs(ref[i] - e.o8[i]);
        ASSERT_LE(err, e.b_ref[i]) << sc.name << " softcap " << softcap << " i " << i << ": reference";
        if (e.b_ref[i] > 0) worst_ref = std::max(worst_ref, err / e.b_ref[i]);
      }
    }
  }
  // The quantisation's error is far above f32's; in units of the V rows' largest elements (sum_j
  // p_j max|v_j|) it stays within 6% on these tables (measured 4.7%, at D 512 with scale 1, where
  // the scores spread over tens and their quantisation error of ~0.1 moves the weights; the bound
  // above is rigorous, this pins its size).
  EXPECT_LT(worst_rel, 0.06);
  std::printf("worst |simd - o8| / bound %.3g, |ref - o8| / bound %.3g, |simd - o| / bound %.3g, "
              "|simd - o| / sum p max|v| %.3g\n",
              worst_simd, worst_ref, worst_q, worst_rel);
}

// Every cut of two sequences' positions into cache and step (prefill chunks, decode), alone and
// batched together: each token's output is the same bits.
TEST_P(AttentionQ8KernelsTest, OutputIsTheSameBitsHoweverTheStepIsCut) {
  std::mt19937 rng(99);
  ThreadPool pool2(2);
  for (const Scenario& sc : {kScenarios[1], kScenarios[3], kScenarios[4], kScenarios[5]}) {
    const int len = 120;
    if (len > sc.max_context) continue;
    const SeqKv a = DrawSeq(len, sc.Nkv, sc.D, rng), b = DrawSeq(len, sc.Nkv, sc.D, rng);
    const int width = sc.G * sc.Nkv * sc.D;
    const std::vector<float> qa = DrawQueries(len, width, rng), qb = DrawQueries(len, width, rng);
    auto slice = [&](const std::vector<float>& q, int from, int count) {
      return std::vector<float>(q.begin() + static_cast<size_t>(from) * width, q.begin() + static_cast<size_t>(from + count) * width);
    };
    // The whole of a in one step: the reference bits of every position.
    Q8Step whole(sc, {&a}, {{0, len}}, qa);
    std::vector<float> want(qa.size());
    cpu::AttentionScratch scratch;
    cpu::Attention(whole.p, whole.Step(want.data()), &pool2, &scratch);
    for (int cut : {1, 37, 64, 65, 119}) {
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2}) {
        // a: positions cut..len-1 over a cache of 0..cut-1, batched with b's positions 0..cut-1.
        std::vector<float> q = slice(qa, cut, len - cut), q2 = slice(qb, 0, cut);
        q.insert(q.end(), q2.begin(), q2.end());
        Q8Step step(sc, {&a, &b}, {{cut, len - cut}, {0, cut}}, q);
        std::vector<float> out(q.size());
        cpu::Attention(step.p, step.Step(out.data()), pool, &scratch);
        for (size_t i = 0; i < static_cast<size_t>(len - cut) * width; ++i)
          ASSERT_EQ(out[i], want[static_cast<size_t>(cut) * width + i]) << sc.name << " cut " << cut << " i " << i;
      }
    }
  }
}

// QuantizeKvRow: scale = max|x| / 127 per head, q = x / scale to nearest even, |x - q scale| <=
// scale / 2 (plus f32 rounding); zero heads and non-finite heads as attention.h says.
TEST_P(AttentionQ8KernelsTest, QuantizeKvRowRoundsToTheNearestStep) {
  const float x[8] = {1.0f, -0.5f, 0.25f, 127.0f / 254, 0.0f, 0.0f, 0.0f, 0.0f};
  int8_t q[8];
  float s[2];
  cpu::QuantizeKvRow(x, 2, 4, q, s);
  EXPECT_EQ(s[0], 1.0f / 127);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], -64);  // -63.5 to even
  EXPECT_EQ(q[2], 32);   // 31.75
  EXPECT_EQ(q[3], 64);   // 63.5 to even
  EXPECT_EQ(s[1], 0.0f);
  for (int d = 4; d < 8; ++d) EXPECT_EQ(q[d], 0);
  const float bad[2] = {1.0f, INFINITY};
  cpu::QuantizeKvRow(bad, 1, 2, q, s);
  EXPECT_TRUE(std::isnan(s[0]));
  EXPECT_EQ(q[0], 0);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> row(512);
  for (float& v : row) v = u(rng);
  std::vector<int8_t> r8(512);
  float rs;
  cpu::QuantizeKvRow(row.data(), 1, 512, r8.data(), &rs);
  for (int d = 0; d < 512; ++d) ASSERT_LE(std::abs(row[d] - r8[d] * static_cast<double>(rs)), rs * (0.5 + 1e-5)) << d;
}

}  // namespace
}  // namespace g4
