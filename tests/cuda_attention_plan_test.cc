// The CUDA attention kernels' host-side math (src/backends/cuda/attention_plan.h), run on the host:
// the int8 KV cache's quantisation bit for bit against the CPU backend's KV write
// (cpu::QuantizeKvRow), in the whole-head form and in the kernel's form (amax reduced first, then
// per element); the flash-decoding split plan and key ranges; the log-sum-exp merge of split
// partials against a one-pass softmax; the kernel launch checks (cuda_policy.h); and the arena's
// attention scratch (arena_plan.h). In every build: none of it needs the CUDA toolkit or a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "backends/cpu/attention.h"
#include "backends/cuda/arena_plan.h"
#include "backends/cuda/attention_plan.h"
#include "backends/cuda/cuda_policy.h"

namespace g4::cuda {
namespace {

// Heads of D floats: random magnitudes over many exponents, exact ties (x * 127 / amax = k + 0.5),
// zeros, a NaN head, an infinite head, a subnormal head, negative zeros.
std::vector<float> TestHeads(int heads, int D, std::mt19937& rng) {
  std::vector<float> x(static_cast<size_t>(heads) * D);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int h = 0; h < heads; ++h) {
    float* xh = x.data() + static_cast<size_t>(h) * D;
    const float mag = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    for (int d = 0; d < D; ++d) xh[d] = u(rng) * mag;
    switch (h % 8) {
      case 1:  // ties: amax 127, elements k + 0.5 round to even
        for (int d = 0; d < D; ++d) xh[d] = static_cast<float>(static_cast<int>(rng() % 253) - 126) + 0.5f;
        xh[0] = 127.0f;
        break;
      case 2: std::fill(xh, xh + D, 0.0f); xh[D / 2] = -0.0f; break;
      case 3: xh[rng() % D] = std::numeric_limits<float>::quiet_NaN(); break;
      case 4: xh[rng() % D] = -std::numeric_limits<float>::infinity(); break;
      case 5: for (int d = 0; d < D; ++d) xh[d] = u(rng) * 1e-40f; break;  // subnormal
      case 6: xh[rng() % D] = 3.0e38f; break;                            // near FLT_MAX
      default: break;
    }
  }
  return x;
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

TEST(CudaAttentionPlanTest, Int8KvQuantisationMatchesTheCpuKvWriteBitForBit) {
  std::mt19937 rng(7);
  for (int D : {32, 64, 128, 256, 512}) {
    for (int rep = 0; rep < 20; ++rep) {
      const int heads = 8;
      const std::vector<float> x = TestHeads(heads, D, rng);
      std::vector<int8_t> want_q(x.size()), got_q(x.size()), split_q(x.size());
      std::vector<float> want_s(heads), got_s(heads), split_s(heads);
      cpu::QuantizeKvRow(x.data(), heads, D, want_q.data(), want_s.data());
      for (int h = 0; h < heads; ++h) {
        const float* xh = x.data() + static_cast<size_t>(h) * D;
        QuantizeKvHead(xh, D, got_q.data() + static_cast<size_t>(h) * D, &got_s[h]);
        // The kernel's form: 32 lanes' partial amax and finiteness, combined, then per element.
        float lane_amax[32] = {};
        bool lane_finite[32];
        std::fill(lane_finite, lane_finite + 32, true);
        for (int d = 0; d < D; ++d) {
          const float a = std::fabs(xh[d]);
          lane_finite[d % 32] = lane_finite[d % 32] && a <= 3.402823466e38f;
          lane_amax[d % 32] = std::fmax(lane_amax[d % 32], a);
        }
        float amax = 0.0f;
        bool finite = true;
        for (int l = 0; l < 32; ++l) amax = std::fmax(amax, lane_amax[l]), finite = finite && lane_finite[l];
        const KvQuantParams p = KvQuantFor(amax, finite);
        split_s[h] = p.scale;
        for (int d = 0; d < D; ++d) split_q[static_cast<size_t>(h) * D + d] = KvQuantElem(xh[d], p.inv);
      }
      for (int h = 0; h < heads; ++h) {
        EXPECT_TRUE(SameBits(got_s[h], want_s[h])) << "D=" << D << " head " << h << ": " << got_s[h] << " vs " << want_s[h];
        EXPECT_TRUE(SameBits(split_s[h], want_s[h])) << "D=" << D << " head " << h;
      }
      ASSERT_EQ(got_q, want_q) << "D=" << D << " rep " << rep;
      ASSERT_EQ(split_q, want_q) << "D=" << D << " rep " << rep;
    }
  }
  // The tie head rounds to even: 126.5 -> 126, 125.5 -> 126, -0.5 -> 0.
  EXPECT_EQ(KvQuantElem(126.5f, 1.0f), 126);
  EXPECT_EQ(KvQuantElem(125.5f, 1.0f), 126);
  EXPECT_EQ(KvQuantElem(-0.5f, 1.0f), 0);
  EXPECT_EQ(KvQuantElem(1000.0f, 1.0f), 127);  // clamped
  EXPECT_TRUE(std::isnan(KvQuantFor(1.0f, false).scale));
  EXPECT_EQ(KvQuantFor(0.0f, true).scale, 0.0f);
}

TEST(CudaAttentionPlanTest, DecodeSplitPlanAndKeyRanges) {
  struct Want {
    int tokens, kv_heads, keys, sms, splits, keys_per_split;
  };
  for (const Want& w : {
           // One token, one KV head, 4096 keys on 132 multiprocessors: 264 blocks wanted, 64
           // splits of 64 keys (kDecodeMinKeys) at most.
           Want{1, 1, 4096, 132, 64, 64},
           // Eight tokens: 33 splits wanted, 32 allowed (tokens x splits <= 256), 128 keys each.
           Want{8, 1, 4096, 132, 32, 128},
           // 32 tokens, 2 KV heads, 8192 keys: ceil(264 / 64) = 5 splits of 1640 keys (a multiple of 8).
           Want{32, 2, 8192, 132, 5, 1640},
           // Few keys: one split covering them all.
           Want{2, 1, 21, 132, 1, 24},
           // A wide device and a batch filling it: one split of every key.
           Want{32, 8, 100000, 16, 1, 100000},
       }) {
    const DecodeSplit p = PlanDecodeSplit(w.tokens, w.kv_heads, w.keys, w.sms);
    EXPECT_EQ(p.splits, w.splits) << w.tokens << " tokens, " << w.keys << " keys";
    EXPECT_EQ(p.keys_per_split, w.keys_per_split) << w.tokens << " tokens, " << w.keys << " keys";
  }
  DecodeSplit p;
  for (int T : {1, 3, 8, 32})
    for (int keys : {1, 7, 8, 63, 64, 65, 500, 4096, 32768, 131072})
      for (int sm : {1, 40, 132}) {
        p = PlanDecodeSplit(T, 1, keys, sm);
        ASSERT_GE(p.splits, 1);
        EXPECT_LE(T * p.splits, kDecodeTokenSplits);
        EXPECT_EQ(p.keys_per_split % kAttentionTile, 0);
        EXPECT_GE(static_cast<int64_t>(p.splits) * p.keys_per_split, keys);      // every key covered
        EXPECT_LT(static_cast<int64_t>(p.splits - 1) * p.keys_per_split, keys);  // no split left empty
      }
  // The ranges of a token partition its keys exactly, on rings and full layers, for tokens with
  // fewer keys than the step's longest (later splits empty).
  for (int window : {0, 8, 512}) {
    for (int pos : {0, 5, 7, 8, 100, 511, 512, 5000}) {
      p = PlanDecodeSplit(1, 1, 5001, 132);
      std::vector<int> seen;
      for (int sp = 0; sp < p.splits; ++sp) {
        int b, e;
        SplitKeyRange(pos, window, sp, p.keys_per_split, &b, &e);
        for (int j = b; j < e; ++j) seen.push_back(j);
      }
      std::vector<int> want;
      for (int j = FirstKey(pos, window); j <= pos; ++j) want.push_back(j);
      EXPECT_EQ(seen, want) << "window " << window << " pos " << pos;
    }
  }
}

// The key count a split plan is made for: a power of two at least the longest range, capped at
// the layer's slots; the plan then changes only when that count does (a captured graph holds it).
TEST(CudaAttentionPlanTest, DecodePlanKeysArePowersOfTwoUpToTheSlots) {
  EXPECT_EQ(DecodePlanKeys(1, 4096), 1);
  EXPECT_EQ(DecodePlanKeys(5, 4096), 8);
  EXPECT_EQ(DecodePlanKeys(64, 4096), 64);
  EXPECT_EQ(DecodePlanKeys(65, 4096), 128);
  EXPECT_EQ(DecodePlanKeys(3000, 4096), 4096);
  EXPECT_EQ(DecodePlanKeys(300, 512), 512);  // a ring of 512 slots
  EXPECT_EQ(DecodePlanKeys(512, 512), 512);
  EXPECT_EQ(DecodePlanKeys(600, 1000), 1000);
  for (int keys = 1; keys <= 5000; ++keys)
    for (int slots : {keys, 512, 4096, 5000}) {
      if (slots < keys) continue;
      const int k = DecodePlanKeys(keys, slots);
      ASSERT_GE(k, keys);
      ASSERT_LE(k, slots);
    }
  // Over a 4096-token context a one-token decode on 132 multiprocessors sees 10 plans (1 x 8, 16,
  // 32, 64 keys, then 2..64 splits of 64), not one per 64 tokens.
  std::set<std::pair<int, int>> plans;
  for (int keys = 1; keys <= 4096; ++keys) {
    const DecodeSplit p = PlanDecodeSplit(1, 1, DecodePlanKeys(keys, 4096), 132);
    plans.insert({p.splits, p.keys_per_split});
  }
  EXPECT_EQ(plans.size(), 10u);
}

// The decode kernel's per-split online softmax and the combine kernel's merge (MergeFactor), in
// f64-free f32 on the host, against a one-pass softmax in double.
TEST(CudaAttentionPlanTest, SplitPartialsMergeToTheSoftmax) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 4.0f);
  for (int keys : {1, 9, 200}) {
    const int D = 4, per = 16, splits = 3 + keys / per;  // the last splits may be empty
    std::vector<float> score(keys), v(static_cast<size_t>(keys) * D);
    for (auto& s : score) s = n(rng);
    for (auto& x : v) x = n(rng);
    std::vector<float> m(splits, -INFINITY), l(splits, 0.0f), acc(static_cast<size_t>(splits) * D, 0.0f);
    for (int sp = 0; sp < splits; ++sp)
      for (int j = sp * per; j < std::min(keys, (sp + 1) * per); ++j) {
        const float m_new = std::max(m[sp], score[j]);
        const float c = std::exp(m[sp] - m_new), w = std::exp(score[j] - m_new);
        l[sp] = l[sp] * c + w;
        for (int d = 0; d < D; ++d) acc[sp * D + d] = acc[sp * D + d] * c + w * v[j * D + d];
        m[sp] = m_new;
      }
    float M = -INFINITY, L = 0;
    for (int sp = 0; sp < splits; ++sp) M = std::max(M, m[sp]);
    for (int sp = 0; sp < splits; ++sp) L += l[sp] * MergeFactor(m[sp], M);
    double mx = -1e30;
    for (float s : score) mx = std::max(mx, static_cast<double>(s));
    double sum = 0;
    for (float s : score) sum += std::exp(s - mx);
    for (int d = 0; d < D; ++d) {
      float out = 0;
      for (int sp = 0; sp < splits; ++sp) out += acc[sp * D + d] * MergeFactor(m[sp], M);
      out /= L;
      double want = 0;
      for (int j = 0; j < keys; ++j) want += std::exp(score[j] - mx) / sum * v[j * D + d];
      EXPECT_NEAR(out, want, 1e-5 * (1 + std::fabs(want))) << keys << " keys, d " << d;
    }
  }
}

TEST(CudaAttentionPlanTest, KernelLaunchChecksNameTheLimit) {
  const DeviceLimits h200{1024, 48 * 1024, 65536};
  const KernelResources k{1024, 64, 0};
  EXPECT_TRUE(CheckKernelLaunch("node %3 (attention)", "attention", k, 256, 32832, h200).ok());
  Status s = CheckKernelLaunch("node %3 (attention)", "attention", k, 2048, 0, h200);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("2048 threads per block > the device's 1024"), std::string::npos) << s.message();
  s = CheckKernelLaunch("n", "decode attention", KernelResources{512, 128, 0}, 1024, 0, h200);
  EXPECT_NE(s.message().find("1024 threads x 128 registers per block > the device's 65536"), std::string::npos)
      << s.message();
  s = CheckKernelLaunch("n", "attention", KernelResources{1024, 32, 1024}, 128, 48 * 1024, h200);
  EXPECT_NE(s.message().find("1024 + 49152 bytes of shared memory per block > the device's 49152"), std::string::npos)
      << s.message();
  // head_dim 512's tiles fit the default 48 KiB.
  EXPECT_LE(AttentionSharedBytes(512), 48u * 1024);
}

}  // namespace
}  // namespace g4::cuda
