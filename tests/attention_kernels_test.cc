// The fused SIMD attention (src/backends/cpu/attention_hwy.cc, driven by cpu::Attention) against
// the scalar reference (cpu::AttentionReference), on every SIMD target this machine can run (as in
// kernels_test.cc: one instance per target in hwy::SupportedAndGeneratedTargets(), forced with
// hwy::SetSupportedTargetsForTest). Both are also checked against an f64 evaluation of AttentionOp's
// definition computed here from a table of K/V rows by absolute position, which also pins the
// semantics: causal mask, sliding window q-window+1..q, the ring's wrap, KV heads shared by groups of
// query heads, several sequences in one step.
//
// Scenarios: head_dim 256, 512, 128, 64 and 37 (a vector tail on every target), GQA groups 1, 2, 4, 6, 8, 12,
// decode (one token: split-K over 2 and 3 threads) and multi-token prefill steps, rings wrapped,
// windows smaller and larger than the context, soft-cap off and on, power-of-two and other scales.
//
// Tolerances. q, k and v are multiples of 1/8 in [-1, 1], so every product q_d k_d and every
// partial sum of a score is exact in f32 (multiples of 1/64 below 2^15): the scores are the same
// bits in any order of summation, and a power-of-two scale keeps them exact. What is left are the
// roundings of the softmax and of the weighted sum. For one output element with n keys, weights p_j
// and S = sum_j p_j |v_j[d]| (computed in f64):
//  - reference: exp (1 ulp), a recursive sum of n weights, the reciprocal, p_j = e_j * inv, and a
//    recursive sum of n products: |o_ref - o| <= gamma_{2n+8} S (Higham 3.1, gamma_k = k u / (1 - k u),
//    u = 2^-24);
//  - SIMD: Highway's Exp (1 ulp), per tile of 64 keys at most one rescale of l and acc by
//    exp(m_old - m_new) (2 roundings), a tile's weights summed per lane and then across lanes
//    (no worse than a recursive sum), the V sums in key order within and across tiles, the final
//    1 / l; the merge of the chunks (64 keys below 2048 keys, as in all rows here) adds an exp, a
//    product and a sum per chunk:
//    |o_simd - o| <= gamma_{2n+4T+16} S with T = n / 64 + 3 tiles (runs cut tiles short);
//  - score perturbations: a non-power-of-two scale rounds each score (|ds| <= u |s|); the soft-cap
//    cap * tanh(s / cap) adds a division, a multiplication and tanh (std::tanh 1 ulp, Highway's
//    Tanh 4 ulp): |ds| <= 6 u cap. A score error ds changes the normalised weights by a factor of at
//    most exp(2 |ds|), i.e. by 2 |ds| (1 + o(1)) relative, which adds 2 max|ds| S (x 1.01 margin).
// The test checks |o_simd - o_ref| <= B_ref + B_simd and |o_ref - o| <= B_ref: rigorous bounds, of
// order 1e-5 relative to S for the 1..300-key rows here (gamma_{2n} ~ 1.2e-7 n, and 12 u cap = 3.6e-5
// with the soft-cap at 50); the observed errors stay below 0.11 of them (at most 6e-6 of S).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/simd_cap.h"
#include "backends/cpu/attention.h"
#include "base/thread_pool.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "tensor/dtype.h"

namespace g4 {
namespace {

constexpr double kU = 1.0 / (1 << 24);
double Gamma(double n) { return n * kU / (1.0 - n * kU); }

class AttentionKernelsTest : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { hwy::SetSupportedTargetsForTest(GetParam()); }
  void TearDown() override { cpu::ResetSimdTargetsForTest(); }
};

std::string TargetParamName(const ::testing::TestParamInfo<int64_t>& info) { return hwy::TargetName(info.param); }

INSTANTIATE_TEST_SUITE_P(Targets, AttentionKernelsTest, ::testing::ValuesIn(hwy::SupportedAndGeneratedTargets()),
                         TargetParamName);

struct Seq {
  int cached;     // positions before the step (in the cache)
  int step;       // tokens in the step
  int total = 0;  // positions of the random K/V tables, when more than cached + step
};

struct Scenario {
  const char* name;
  int D, Nkv, G, window, max_context;
  float scale;
  std::vector<Seq> seqs;
};

// One step of one attention op: positional K/V tables, the cache laid out as KvCache does (ring
// slots = min(window, max_context), slot = pos % slots; full: slot = pos), in f32, f16 or bf16 (type),
// the step's rows. Every value is on a grid of eighths in [-1, 1], which f16 and bf16 hold exactly:
// their caches hold the same numbers as the f32 one.
struct StepCase {
  cpu::AttentionParams p;
  int ld, slots, tokens = 0;
  std::vector<std::vector<float>> k_pos, v_pos;  // per sequence: [positions, ld]
  std::vector<std::vector<float>> k_cache, v_cache;
  std::vector<std::vector<uint16_t>> kh_cache, vh_cache;  // f16 or bf16: the caches in that type
  std::vector<float> q, k, v;
  std::vector<uint16_t> kh, vh;  // f16 or bf16: the step's rows in that type, as the backend passes them
  std::vector<int32_t> positions, seq_first, seq_of;
  std::vector<const void*> kc, vc;
  DType type;
  bool half() const { return type != DType::kF32; }  // 16-bit rows

  StepCase(const Scenario& sc, float softcap, std::mt19937& rng, DType cache_type = DType::kF32) : type(cache_type) {
    p = {sc.G * sc.Nkv, sc.Nkv, sc.D, sc.window, sc.scale, softcap};
    ld = sc.Nkv * sc.D;
    slots = sc.window > 0 ? std::min(sc.window, sc.max_context) : sc.max_context;
    auto grid = [&] { return static_cast<float>(static_cast<int>(rng() % 17) - 8) / 8.0f; };
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (const Seq& s : sc.seqs) {
      const int len = std::max(s.total, s.cached + s.step);
      EXPECT_LE(len, sc.max_context);
      std::vector<float> kp(static_cast<size_t>(len) * ld), vp(kp.size());
      for (auto& x : kp) x = grid();
      for (auto& x : vp) x = grid();
      // Unwritten cache rows are NaN, so reading one poisons the output.
      std::vector<float> kc_rows(static_cast<size_t>(slots) * ld, nan), vc_rows(kc_rows.size(), nan);
      for (int j = 0; j < s.cached; ++j) {
        const int slot = sc.window > 0 ? j % slots : j;
        std::copy_n(kp.begin() + static_cast<size_t>(j) * ld, ld, kc_rows.begin() + static_cast<size_t>(slot) * ld);
        std::copy_n(vp.begin() + static_cast<size_t>(j) * ld, ld, vc_rows.begin() + static_cast<size_t>(slot) * ld);
      }
      // A full ring's oldest position (cached - slots) is outside every window of the step: poison it too.
      if (sc.window > 0 && sc.window <= sc.max_context && s.cached >= slots) {
        const size_t slot = static_cast<size_t>(s.cached % slots);
        std::fill_n(kc_rows.begin() + slot * ld, ld, nan);
        std::fill_n(vc_rows.begin() + slot * ld, ld, nan);
      }
      const int first = tokens;
      for (int i = 0; i < s.step; ++i) {
        const size_t src = static_cast<size_t>(s.cached + i) * ld;
        k.insert(k.end(), kp.begin() + src, kp.begin() + src + ld);
        v.insert(v.end(), vp.begin() + src, vp.begin() + src + ld);
        positions.push_back(s.cached + i);
        seq_first.push_back(first);
        seq_of.push_back(static_cast<int32_t>(k_pos.size()));
        ++tokens;
      }
      k_pos.push_back(std::move(kp));
      v_pos.push_back(std::move(vp));
      k_cache.push_back(std::move(kc_rows));
      v_cache.push_back(std::move(vc_rows));
    }
    q.resize(static_cast<size_t>(tokens) * p.num_heads * sc.D);
    for (auto& x : q) x = grid();
    if (half()) {
      auto to_f16 = [&](const std::vector<float>& f) {
        std::vector<uint16_t> h(f.size());
        for (size_t i = 0; i < f.size(); ++i)
          h[i] = type == DType::kF16 ? F32ToF16(f[i]) : F32ToBf16(f[i]);  // NaN poison stays NaN
        return h;
      };
      for (size_t i = 0; i < k_cache.size(); ++i) {
        kh_cache.push_back(to_f16(k_cache[i]));
        vh_cache.push_back(to_f16(v_cache[i]));
      }
      kh = to_f16(k);
      vh = to_f16(v);
    }
    for (int t = 0; t < tokens; ++t) {
      kc.push_back(half() ? static_cast<const void*>(kh_cache[seq_of[t]].data()) : k_cache[seq_of[t]].data());
      vc.push_back(half() ? static_cast<const void*>(vh_cache[seq_of[t]].data()) : v_cache[seq_of[t]].data());
    }
  }

  cpu::AttentionStep Step(float* out) const {
    cpu::AttentionStep s{tokens, q.data(), k.data(), v.data(), out, positions.data(), seq_first.data(),
                         kc.data(), vc.data(), slots, p.window > 0, type, type};
    if (half()) {
      s.k = kh.data();
      s.v = vh.data();
    }
    return s;
  }
};

// f64 AttentionOp from the positional tables: out [tokens, Nq*D], and per element the error bounds
// of the reference and of the SIMD kernel (see the file comment), and S = sum_j p_j |v_j[d]|.
void Exact(const StepCase& s, std::vector<double>* out, std::vector<double>* b_ref, std::vector<double>* b_simd,
           std::vector<double>* mags) {
  const int D = s.p.head_dim, Nq = s.p.num_heads, G = Nq / s.p.num_kv_heads;
  out->assign(static_cast<size_t>(s.tokens) * Nq * D, 0.0);
  b_ref->assign(out->size(), 0.0);
  b_simd->assign(out->size(), 0.0);
  mags->assign(out->size(), 0.0);
  int exponent;
  const bool exact_scale = std::frexp(s.p.scale, &exponent) == 0.5f;  // a power of two
  for (int t = 0; t < s.tokens; ++t) {
    const int pos = s.positions[t];
    const int lo = s.p.window > 0 ? std::max(0, pos - s.p.window + 1) : 0;
    const int n = pos - lo + 1;
    const std::vector<float>& kp = s.k_pos[s.seq_of[t]];
    const std::vector<float>& vp = s.v_pos[s.seq_of[t]];
    for (int h = 0; h < Nq; ++h) {
      const float* qh = s.q.data() + (static_cast<size_t>(t) * Nq + h) * D;
      const int kvh = h / G;
      std::vector<double> sc(n);
      double mx = -INFINITY, max_abs = 0;
      for (int j = 0; j < n; ++j) {
        const float* kr = kp.data() + static_cast<size_t>(lo + j) * s.ld + kvh * D;
        double d = 0;
        for (int e = 0; e < D; ++e) d += static_cast<double>(qh[e]) * kr[e];
        d *= s.p.scale;
        if (s.p.softcap > 0) d = s.p.softcap * std::tanh(d / s.p.softcap);
        sc[j] = d;
        mx = std::max(mx, d);
        max_abs = std::max(max_abs, std::abs(d));
      }
      double sum = 0;
      for (double& x : sc) sum += x = std::exp(x - mx);
      double ds = exact_scale ? 0.0 : kU * max_abs;
      const double ds_ref = ds + (s.p.softcap > 0 ? 3 * kU * s.p.softcap : 0.0);
      const double ds_simd = ds + (s.p.softcap > 0 ? 6 * kU * s.p.softcap : 0.0);
      const double tiles = n / 64 + 3;
      for (int e = 0; e < D; ++e) {
        double o = 0, mag = 0;
        for (int j = 0; j < n; ++j) {
          const double vj = vp[static_cast<size_t>(lo + j) * s.ld + kvh * D + e];
          o += sc[j] / sum * vj;
          mag += sc[j] / sum * std::abs(vj);
        }
        const size_t i = (static_cast<size_t>(t) * Nq + h) * D + e;
        (*out)[i] = o;
        (*mags)[i] = mag;
        (*b_ref)[i] = (Gamma(2 * n + 8) + 2.02 * ds_ref) * mag;
        (*b_simd)[i] = (Gamma(2 * n + 4 * tiles + 16) + 2.02 * ds_simd) * mag;
      }
    }
  }
}

const Scenario kScenarios[] = {
    // Gemma 3 270M geometry (MQA, 4 heads, D 256, scale 1/16): sliding decode past the ring's wrap.
    {"mqa256_ring_decode", 256, 1, 4, 48, 256, 1.0f / 16, {{100, 1}}},
    {"mqa256_ring_prefill", 256, 1, 4, 48, 256, 1.0f / 16, {{100, 7}}},
    {"mqa256_ring_decode_long", 256, 1, 8, 160, 1100, 1.0f / 16, {{1000, 1}}},
    // Gemma 4 full layers (D 512, scale 1): prefill from an empty cache, decode over a full cache.
    {"gqa512_full_prefill", 512, 2, 2, 0, 300, 1.0f, {{0, 9}}},
    {"gqa512_full_decode", 512, 2, 2, 0, 300, 1.0f, {{250, 1}}},
    {"mqa512_two_seqs", 512, 1, 8, 0, 200, 1.0f, {{130, 3}, {0, 5}}},
    {"gqa256_full_decode_4kv", 256, 4, 2, 0, 300, 1.0f / 16, {{200, 1}}},
    // Window larger than the context (ring without wrap), G 1.
    {"mha64_window_gt_context", 64, 3, 1, 200, 150, 0.125f, {{60, 4}}},
    // Odd head dim (vector tails), prefill longer than the window, non-power-of-two scale.
    {"odd37_window_lt_step", 37, 2, 2, 16, 128, 0.0883883f, {{70, 20}}},
    {"odd37_decode_split", 37, 1, 2, 0, 400, 0.0883883f, {{300, 1}}},
    // Head blocks of 6 (one partial block of the 8 a 32-register target holds) and of 8 + 4 (G 12).
    {"g6_full_decode", 256, 1, 6, 0, 300, 1.0f / 16, {{200, 1}}},
    {"g12_ring_prefill", 128, 1, 12, 40, 200, 1.0f / 16, {{90, 5}}},
    // D a multiple of 32 but not of 64 (the bf16 kernels' last 32 elements alone), blocks of 5 and 3 heads.
    {"g5_d160_decode", 160, 1, 5, 0, 300, 1.0f / 16, {{200, 1}}},
    {"g3_d96_ring_prefill", 96, 2, 3, 40, 200, 1.0f / 16, {{90, 4}}},
};

TEST_P(AttentionKernelsTest, MatchesReferenceAndDefinition) {
  std::mt19937 rng(1234);
  ThreadPool pool2(2), pool3(3);
  ThreadPool* pools[] = {nullptr, &pool2, &pool3};
  double worst_simd = 0, worst_ref = 0, worst_rel = 0, worst_bf16 = 0;
  for (const Scenario& sc : kScenarios) {
    for (float softcap : {0.0f, 50.0f}) {
      std::mt19937 rng_half = rng, rng_bf16 = rng;  // the same tables again, with an f16 and a bf16 cache
      const StepCase s(sc, softcap, rng);
      const StepCase s_half(sc, softcap, rng_half, DType::kF16);
      const StepCase s_bf16(sc, softcap, rng_bf16, DType::kBF16);
      std::vector<double> exact, b_ref, b_simd, mags;
      Exact(s, &exact, &b_ref, &b_simd, &mags);
      std::vector<float> ref(exact.size(), 777.0f);
      cpu::AttentionReference(s.p, s.Step(ref.data()));
      for (size_t i = 0; i < ref.size(); ++i) {
        ASSERT_LE(std::abs(ref[i] - exact[i]), b_ref[i]) << sc.name << " softcap " << softcap << " i " << i;
        if (b_ref[i] > 0) worst_ref = std::max(worst_ref, std::abs(ref[i] - exact[i]) / b_ref[i]);
      }
      for (ThreadPool* pool : pools) {
        const int threads = pool != nullptr ? pool->size() : 1;
        std::vector<float> out(exact.size(), 777.0f);
        cpu::AttentionScratch scratch;
        cpu::Attention(s.p, s.Step(out.data()), pool, &scratch);
        // The f16 cache and f16 step rows hold the same values: the kernel's f16 path gives the
        // same bits, and the reference reads them the same.
        std::vector<float> out_half(exact.size(), 777.0f), ref_half(exact.size(), 777.0f);
        cpu::Attention(s_half.p, s_half.Step(out_half.data()), pool, &scratch);
        ASSERT_EQ(out_half, out) << sc.name << " softcap " << softcap << " threads " << threads << ": f16 cache";
        cpu::AttentionReference(s_half.p, s_half.Step(ref_half.data()));
        ASSERT_EQ(ref_half, ref) << sc.name << " softcap " << softcap << ": reference, f16 cache";
        // The bf16 cache holds the same values too, but its kernel also rounds the softmax weights
        // to bf16 before the V sums (q is on the grid, which bf16 holds): each weight moves by at
        // most 2^-8 of itself (bf16 keeps 8 significant bits), so the output by at most 2^-8 S
        // beyond the f32 kernel's bound.
        std::vector<float> out_bf16(exact.size(), 777.0f);
        cpu::Attention(s_bf16.p, s_bf16.Step(out_bf16.data()), pool, &scratch);
        for (size_t i = 0; i < out_bf16.size(); ++i) {
          const double err = std::abs(static_cast<double>(out_bf16[i]) - exact[i]);
          ASSERT_LE(err, b_simd[i] + 1.01 * std::ldexp(mags[i], -8))
              << sc.name << " softcap " << softcap << " threads " << threads << " i " << i << ": bf16 cache "
              << out_bf16[i] << " vs " << exact[i];
          if (mags[i] > 0) worst_bf16 = std::max(worst_bf16, err / mags[i]);
        }
        for (size_t i = 0; i < out.size(); ++i) {
          const double err = std::abs(static_cast<double>(out[i]) - ref[i]);
          ASSERT_LE(err, b_ref[i] + b_simd[i])
              << sc.name << " softcap " << softcap << " threads " << threads << " i " << i << ": " << out[i]
              << " vs " << ref[i];
          if (b_simd[i] > 0) worst_simd = std::max(worst_simd, err / (b_ref[i] + b_simd[i]));
          if (mags[i] > 0) worst_rel = std::max(worst_rel, err / mags[i]);
        }
      }
    }
  }
  // For the record: the largest errors as fractions of their bounds, and relative to S.
  std::printf("worst |ref - exact| / bound %.3g, |simd - ref| / bound %.3g, |simd - ref| / S %.3g, bf16 cache "
              "|simd - exact| / S %.3g\n",
              worst_ref, worst_simd, worst_rel, worst_bf16);
}

// The f16 conversions (ToF16 for the cache and the step's rows, RoundToF16 for f16 values as f32) are
// F32ToF16's round-to-nearest-even on every target, bit for bit: ties, subnormals, the overflow to
// infinity, signed zeros; NaN stays NaN. A length that is no multiple of any lane count covers the
// tails.
TEST_P(AttentionKernelsTest, F16ConversionsAreRoundToNearestEven) {
  std::vector<float> x = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, -70000.0f, 1e-8f, -3e-8f,
                          5.9604645e-08f, 2.9802322e-08f, 8.940697e-08f, 6.1035156e-05f, 6.0975552e-05f,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()};
  // Ties: 1 + (2k + 1) 2^-11 lies halfway between two halves.
  for (int k = 0; k < 40; ++k) x.push_back(1.0f + static_cast<float>(2 * k + 1) / 2048.0f);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  while (x.size() < 1003) {
    const int e = static_cast<int>(rng() % 52) - 32;  // 2^-32 .. 2^19: subnormal to overflow
    x.push_back((rng() % 2 ? -1.0f : 1.0f) * std::ldexp(mant(rng), e));
  }
  std::vector<uint16_t> h(x.size());
  cpu::ToF16(x.data(), static_cast<int64_t>(x.size()), h.data());
  std::vector<float> r = x;
  cpu::RoundToF16(r.data(), static_cast<int64_t>(r.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const uint16_t want = F32ToF16(x[i]);
    if (std::isnan(x[i])) {
      EXPECT_EQ(h[i] & 0x7c00u, 0x7c00u) << i;
      EXPECT_NE(h[i] & 0x03ffu, 0u) << i;
      EXPECT_TRUE(std::isnan(r[i])) << i;
      continue;
    }
    ASSERT_EQ(h[i], want) << "x[" << i << "] = " << x[i];
    const float back = F16ToF32(want);
    ASSERT_EQ(std::memcmp(&r[i], &back, sizeof(float)), 0) << "x[" << i << "] = " << x[i] << ": " << r[i] << " vs " << back;
  }
}

// A bf16 cache's kernel rounds q and the softmax weights to bf16 on every target, the bf16
// dot-product kernels (AVX3 where the CPU has AVX512_BF16, D a multiple of 32) and the f32 ones
// alike. Two keys: k1 = (1, 0, ...), k2 = 0, scale 1, so s1 = q_0 (as bf16) and s2 = 0; the state
// after s1 > 0 weighs key 1 by exp(0) = 1 and key 2 by exp(-s1). With V rows (1, ..., 1) and 0 the
// output is 1 / (1 + exp(-s1)), which shows q's rounding (q_0 = 1 + 2^-10 is 1 in bf16: 0.731059
// against 0.731251); with V rows 0 and (1, ..., 1) it is bf16(exp(-s1)) / (1 + exp(-s1)), which
// shows the weight's (exp(-1) = 0.367879 is 0.367188 in bf16: 0.268434 against 0.268941). The
// f32 error is ~1e-7. Found by review: leaving out either rounding on the f32 path kept every
// other test passing.
TEST_P(AttentionKernelsTest, Bf16CacheRoundsQueriesAndWeightsOnEveryTarget) {
  for (const int D : {64, 37}) {
    for (const int G : {8, 3}) {
      const float q0 = 1.0f + std::ldexp(1.0f, -10);
      std::vector<float> q(static_cast<size_t>(G) * D, 0.0f);
      for (int g = 0; g < G; ++g) q[static_cast<size_t>(g) * D] = q0;
      std::vector<uint16_t> k(2 * static_cast<size_t>(D), 0), v(k.size(), 0);
      k[0] = F32ToBf16(1.0f);
      for (const int weighted : {0, 1}) {  // the key whose V row is ones
        std::fill(v.begin(), v.end(), 0);
        std::fill_n(v.begin() + static_cast<size_t>(weighted) * D, D, F32ToBf16(1.0f));
        const cpu::KvRun run{k.data(), v.data(), 2, DType::kBF16};
        std::vector<float> m(G), l(G), acc(static_cast<size_t>(G) * D), out(acc.size());
        cpu::AttentionPartial(q.data(), G, D, &run, 1, D, 1.0f, 0.0f, m.data(), l.data(), acc.data());
        cpu::AttentionMerge(G, D, 1, m.data(), l.data(), acc.data(), out.data());
        const double s1 = Bf16ToF32(F32ToBf16(q0));  // 1.0
        const double e2 = std::exp(-s1);
        const double want = weighted == 0 ? 1.0 / (1.0 + e2) : Bf16ToF32(F32ToBf16(static_cast<float>(e2))) / (1.0 + e2);
        for (size_t i = 0; i < out.size(); ++i)
          ASSERT_NEAR(out[i], want, 1e-6) << "D " << D << " G " << G << " V ones on key " << weighted + 1 << " i " << i;
      }
    }
  }
}

// Split-K directly: any cut of the keys into chunks, merged, equals the whole.
TEST_P(AttentionKernelsTest, PartialsMerge) {
  std::mt19937 rng(99);
  const int G = 3, D = 256, n = 300;
  const int64_t ld = 2 * D;  // two KV heads per row; kernel reads head 1
  std::vector<float> q(G * D), k(static_cast<size_t>(n) * ld), v(k.size());
  auto grid = [&] { return static_cast<float>(static_cast<int>(rng() % 17) - 8) / 8.0f; };
  for (auto& x : q) x = grid();
  for (auto& x : k) x = grid();
  for (auto& x : v) x = grid();
  const cpu::KvRun all{k.data() + D, v.data() + D, n};
  std::vector<float> m(G), l(G), acc(G * D), whole(G * D);
  cpu::AttentionPartial(q.data(), G, D, &all, 1, ld, 1.0f / 16, 0.0f, m.data(), l.data(), acc.data());
  cpu::AttentionMerge(G, D, 1, m.data(), l.data(), acc.data(), whole.data());
  for (const std::vector<int>& cuts : {std::vector<int>{0, 1, n}, {0, 64, 65, 200, n}, {0, 150, n}}) {
    const int parts = static_cast<int>(cuts.size()) - 1;
    std::vector<float> pm(parts * G), pl(parts * G), pacc(static_cast<size_t>(parts) * G * D), out(G * D);
    for (int c = 0; c < parts; ++c) {
      cpu::KvRun sliced[3];
      const int nr = cpu::SliceKeyRuns(&all, 1, cuts[c], cuts[c + 1], ld, sliced);
      ASSERT_EQ(nr, 1);
      cpu::AttentionPartial(q.data(), G, D, sliced, nr, ld, 1.0f / 16, 0.0f, &pm[c * G], &pl[c * G],
                            &pacc[static_cast<size_t>(c) * G * D]);
    }
    cpu::AttentionMerge(G, D, parts, pm.data(), pl.data(), pacc.data(), out.data());
    for (int i = 0; i < G * D; ++i) {
      // Both within gamma_{2n+4T+16} S of the exact value, S <= max |v| = 1.
      EXPECT_NEAR(out[i], whole[i], 2 * Gamma(2 * n + 4 * 8 + 16)) << "cuts " << parts << " i " << i;
    }
  }
}

// Softmax weights below exp(cpu::kWeightFloor) = exp(-64) are 0 (cpu::SoftmaxWeight), in a tile,
// in the rescale when a later tile raises the maximum, and in the split-K merge, so that no
// subnormal float is made (each costs a microcode assist on Intel cores). Each case puts a small
// weight on a value row of ones next to a weight of 1 on a row of zeros, so the output is exactly
// 0 where the weight is dropped: exp(-95) (without the floor a subnormal, 5.5e-42, left in acc) and
// exp(-70) (4e-31, a normal float: the floor's place) in a tile, exp(-95) in the rescale and the
// merge. A weight above the floor, exp(-60) = 8.8e-27, stays.
TEST_P(AttentionKernelsTest, WeightsBelowTheFloorAreZero) {
  constexpr int D = 16;
  std::vector<float> q(D, 0.0f);
  q[0] = 1.0f;  // score of key j = k_j[0] (scale 1, no soft-cap)
  const auto run = [&](const std::vector<float>& first, const std::vector<float>& v_ones, std::vector<float>* acc,
                       float* m, float* l) {
    const int n = static_cast<int>(first.size());
    std::vector<float> k(static_cast<size_t>(n) * D, 0.0f), v(k.size(), 0.0f);
    for (int j = 0; j < n; ++j) {
      k[static_cast<size_t>(j) * D] = first[j];
      std::fill_n(v.begin() + static_cast<size_t>(j) * D, D, v_ones[j]);
    }
    const cpu::KvRun all{k.data(), v.data(), n};
    acc->assign(D, 777.0f);
    cpu::AttentionPartial(q.data(), 1, D, &all, 1, D, 1.0f, 0.0f, m, l, acc->data());
  };
  std::vector<float> acc;
  float m, l;
  // In one tile: scores 0 (v 0) and -95 or -70 (v 1).
  for (float low : {-95.0f, -70.0f}) {
    run({0.0f, low}, {0.0f, 1.0f}, &acc, &m, &l);
    EXPECT_EQ(m, 0.0f);
    EXPECT_EQ(l, 1.0f);
    for (float x : acc) ASSERT_EQ(x, 0.0f) << "a weight of exp(" << low << ") in a tile";
  }
  // Above the floor: exp(-60) within 4 u relative (Highway's Exp: 1 ulp).
  run({0.0f, -60.0f}, {0.0f, 1.0f}, &acc, &m, &l);
  for (float x : acc) ASSERT_NEAR(x, std::exp(-60.0), 4 * std::exp(-60.0) * kU) << "a weight of exp(-60)";
  // The rescale: a first tile of 64 keys at score 0 (v 1), then one at 95 (v 0): alpha = exp(-95).
  std::vector<float> first(65, 0.0f), ones(65, 1.0f);
  first[64] = 95.0f;
  ones[64] = 0.0f;
  run(first, ones, &acc, &m, &l);
  EXPECT_EQ(m, 95.0f);
  EXPECT_EQ(l, 1.0f);
  for (float x : acc) ASSERT_EQ(x, 0.0f) << "the rescale by exp(-95)";
  // The merge: a part with maximum 0 (acc 1) folded with one at 95 (acc 0).
  const std::vector<float> pm = {0.0f, 95.0f}, pl = {1.0f, 1.0f};
  std::vector<float> pacc(2 * D, 0.0f), out(D, 777.0f);
  std::fill_n(pacc.begin(), D, 1.0f);
  cpu::AttentionMerge(1, D, 2, pm.data(), pl.data(), pacc.data(), out.data());
  for (float x : out) ASSERT_EQ(x, 0.0f) << "the merge's fold by exp(-95)";
}

// A token's output must be the same bits however the step is cut (where the cache ends and the
// step's rows begin: chunked prefill), whatever else is in the step (the batch) and whatever the
// thread count: int8 activations downstream turn a last-bit difference into a different token
// (found by a fresh user: greedy output changed with --chunk, -t and concurrent requests).
// q of every token of sc: floats in [-1, 1) off the grid (rounded partial sums), a function of the
// token's position and sequence only.
void FillQOffGrid(StepCase& sc, int D) {
  const size_t row = static_cast<size_t>(sc.p.num_heads) * D;
  for (int t = 0; t < sc.tokens; ++t) {
    std::mt19937 qr(static_cast<uint32_t>(1000 + sc.positions[t] + 7919 * sc.seq_of[t]));
    for (size_t i = 0; i < row; ++i) sc.q[t * row + i] = static_cast<float>(qr() >> 8) / 8388608.0f - 1.0f;
  }
}

// Decode steps whose split-K merges are large enough to run per head over the pool (attention.cc:
// kParallelMergeFloats): the same bits as on one thread, in place too. E2B's full layers (D 512,
// G 8 on one KV head): 2151 keys (17 chunks of 128) on 2 and 3 threads; 200 keys (4 chunks) on 16
// threads, which also cuts the heads into 4 groups.
TEST_P(AttentionKernelsTest, ParallelMergesGiveTheSameBits) {
  struct Case {
    int keys, threads;
  };
  for (const Case& c : {Case{2151, 2}, Case{2151, 3}, Case{200, 16}}) {
    for (DType type : {DType::kF16, DType::kBF16}) {
      std::mt19937 rng(5);
      Scenario sc{"mqa512_merge", 512, 1, 8, 0, c.keys, 1.0f / 16, {{c.keys - 1, 1}}};
      StepCase s(sc, 0.0f, rng, type);
      FillQOffGrid(s, sc.D);
      const std::string what = std::to_string(c.keys) + " keys, " + std::to_string(c.threads) + " threads, " +
                               std::string(DTypeName(type)) + " cache";
      const size_t n = static_cast<size_t>(s.p.num_heads) * sc.D;
      std::vector<float> one(n, 777.0f), many(n, 777.0f);
      cpu::AttentionScratch scratch;
      cpu::Attention(s.p, s.Step(one.data()), nullptr, &scratch);
      ThreadPool pool(c.threads);
      cpu::Attention(s.p, s.Step(many.data()), &pool, &scratch);
      ASSERT_EQ(many, one) << what;
      std::vector<float> in_place(s.q.begin(), s.q.end());
      cpu::AttentionStep over_q = s.Step(in_place.data());
      over_q.q = in_place.data();
      cpu::Attention(s.p, over_q, &pool, &scratch);
      ASSERT_EQ(in_place, one) << what << ", in place";
      for (float x : one) ASSERT_TRUE(std::isfinite(x));
    }
  }
}

TEST_P(AttentionKernelsTest, OutputIsTheSameBitsHoweverTheStepIsCut) {
  struct Layer {
    const char* name;
    int D, Nkv, G, window, len;
  };
  // Short steps after each cut (1 token: split over threads; 3: whole items), so that the test
  // stays quick under qemu (scripts/test-arm.sh).
  // mqa256_g8 (E2B's 8 query heads on one KV head): decode below 128 keys splits the heads into
  // groups (4 + 4 on 2 threads, 2 + 3 + 3 on 3).
  const Layer layers[] = {{"mqa256_full", 256, 1, 4, 0, 200},
                          {"mqa256_g8", 256, 1, 8, 0, 140},
                          {"mqa256_ring", 256, 1, 4, 96, 200},
                          {"gqa64_full", 64, 2, 3, 0, 160},
                          {"odd37_ring", 37, 1, 2, 50, 150},
                          // From 2048 keys the chunks are longer (128 keys at 2048-3071): tokens
                          // on both sides of that switch (cached 2046, step 3).
                          {"long_mqa16", 16, 1, 2, 0, 2100}};
  ThreadPool pool2(2), pool3(3);
  ThreadPool* pools[] = {nullptr, &pool2, &pool3};
  for (const Layer& ly : layers) {
    // Positional q: the same for a position in every cut. Off the grid of eighths (any float in
    // [-1, 1)), so that the scores' partial sums round and a summation order that depended on the
    // cut, the thread or a key's place in a register block would show.
    auto fill_q = [&](StepCase& sc) { FillQOffGrid(sc, ly.D); };
    // Reference cut: the whole sequence in one step, no cache, one thread; with f32 rows (which
    // f16 holds exactly) and with bf16 rows (whose kernel rounds q and the weights to bf16).
    std::vector<float> whole, whole_bf16;
    for (DType type : {DType::kF32, DType::kBF16}) {
      std::mt19937 rng(77);
      Scenario sc{ly.name, ly.D, ly.Nkv, ly.G, ly.window, ly.len, 0.0625f, {{0, ly.len}}};
      StepCase c(sc, 0.0f, rng, type);
      fill_q(c);
      std::vector<float>& w = type == DType::kBF16 ? whole_bf16 : whole;
      w.assign(static_cast<size_t>(c.tokens) * c.p.num_heads * ly.D, 0.0f);
      cpu::AttentionScratch scratch;
      cpu::Attention(c.p, c.Step(w.data()), nullptr, &scratch);
    }
    const size_t row = static_cast<size_t>(ly.G) * ly.Nkv * ly.D;
    std::vector<int> cuts = {1, 64, 65, 129, ly.len - 3};
    if (ly.len > 2049) cuts.push_back(2046);
    for (int cached : cuts)
    for (int step : {1, 3}) {
      for (int variant = 0; variant < 4; ++variant) {
        // 0: alone, 1: batched with another sequence, 2: alone with an f16 cache (same values), 3:
        // alone with a bf16 cache (its own reference: the keys of a tile pair up by their index in
        // it, across the cache's end and the ring's wrap, on the bf16 dot-product kernels).
        const bool batched = variant == 1;
        std::mt19937 rng(77);  // the same K/V for the sequence (generated first)
        std::vector<Seq> seqs = {{cached, step, ly.len}};
        if (batched) seqs.push_back({5, 3});  // another sequence in the same step
        Scenario sc{ly.name, ly.D, ly.Nkv, ly.G, ly.window, ly.len, 0.0625f, seqs};
        StepCase c(sc, 0.0f, rng, variant == 2 ? DType::kF16 : variant == 3 ? DType::kBF16 : DType::kF32);
        fill_q(c);
        for (ThreadPool* pool : pools) {
          std::vector<float> out(static_cast<size_t>(c.tokens) * row, 777.0f);
          cpu::AttentionScratch scratch;
          cpu::Attention(c.p, c.Step(out.data()), pool, &scratch);
          // In place (out == q, as the CPU backend plans it when q dies there): the same bits.
          std::vector<float> in_place(c.q.begin(), c.q.end());
          ASSERT_EQ(in_place.size(), out.size());
          cpu::AttentionStep over_q = c.Step(in_place.data());
          over_q.q = in_place.data();
          cpu::Attention(c.p, over_q, pool, &scratch);
          ASSERT_EQ(in_place, out) << ly.name << " in place, cached " << cached << " step " << step;
          for (int t = 0; t < c.tokens; ++t) {
            if (c.seq_of[t] != 0) continue;
            const int pos = c.positions[t];
            for (size_t i = 0; i < row; ++i) {
              ASSERT_EQ(out[t * row + i], (variant == 3 ? whole_bf16 : whole)[pos * row + i])
                  << ly.name << " cached " << cached << " step " << step << (batched ? " batched" : "")
                  << (c.half() ? DTypeName(c.type) : "") << " threads "
                  << (pool != nullptr ? pool->size() : 1) << " position " << pos << " i " << i;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace g4
