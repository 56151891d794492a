// Activation quantisation for the int8-activation matmul (kernels_q8.h), one source for every
// Highway target: QuantizeRowsQ8 and PrepareActSuperblocks.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backends/cpu/kernels_q8.h"
#include "base/check.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/cpu/kernels_q8_act_hwy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace g4::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// QuantizeRowsQ8 (kernels_q8.h), bit-identical to the scalar version in kernels_q8.cc: the same
// max, the same f32 multiply, round-to-nearest-even (the default rounding mode) and exact sums.
void QuantizeRowsQ8Hwy(const float* HWY_RESTRICT x, int rows, int K, ActBlockQ8* HWY_RESTRICT out,
                       float* HWY_RESTRICT sums, int group) {
  const hn::CappedTag<float, 16> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<int8_t, decltype(df)> d8;
  const size_t N = hn::Lanes(df);
  const int64_t groups = static_cast<int64_t>(rows) * (K / group);
  const int per = group / 32;
  for (int64_t g = 0; g < groups; ++g) {
    const float* HWY_RESTRICT xg = x + g * group;
    auto vmax = hn::Zero(df);
    for (size_t e = 0; e < static_cast<size_t>(group); e += N) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(df, xg + e)));
    float amax = hn::GetLane(hn::MaxOfLanes(df, vmax));
    if (!std::isfinite(amax)) amax = INFINITY;
    const float d = amax / 127.0f;
    const auto id = hn::Set(df, amax > 0.0f ? 127.0f / amax : 0.0f);
    for (int i = 0; i < per; ++i) {
      const int64_t b = g * per + i;
      const float* HWY_RESTRICT xb = x + b * 32;
      ActBlockQ8& o = out[b];
      o.d = d;
      auto h0 = hn::Zero(di), h1 = hn::Zero(di);
      for (size_t e = 0; e < 32; e += N) {
        const auto q = hn::NearestInt(hn::Mul(hn::LoadU(df, xb + e), id));
        hn::StoreU(hn::DemoteTo(d8, q), d8, o.q + e);
        if (e < 16) {
          h0 = hn::Add(h0, q);
        } else {
          h1 = hn::Add(h1, q);
        }
      }
      sums[2 * b] = o.d * static_cast<float>(hn::GetLane(hn::SumOfLanes(di, h0)));
      sums[2 * b + 1] = o.d * static_cast<float>(hn::GetLane(hn::SumOfLanes(di, h1)));
    }
  }
}

// PrepareActSuperblocks (kernels_q8.h): the units copied as they are, each 16-element sum of q
// as the sum of (q + 128) over its bytes (SumsOf8: psadbw on x86) less 16 * 128, exact. It runs
// ahead of every such matmul on the calling thread alone, so it sums by vectors, not bytes.
void PrepareActSuperblocksHwy(const ActBlockQ8* HWY_RESTRICT xq, int rows, int K, ActSuperblockQ8* HWY_RESTRICT out) {
  static constexpr int kQ4KUnitAt[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  const size_t n = static_cast<size_t>(rows) * (K / 256);
  for (size_t i = 0; i < n; ++i) {
    const ActBlockQ8* u = xq + 8 * i;
    ActSuperblockQ8& a = out[2 * i];
    ActSuperblockQ8& b = out[2 * i + 1];
    for (int k = 0; k < 8; ++k) {
      std::memcpy(a.q[k / 2] + 32 * (k % 2), u[k].q, 32);
      std::memcpy(b.q[k / 2] + 32 * (k % 2), u[kQ4KUnitAt[k]].q, 32);
    }
    for (int g = 0; g < 16; ++g) {
      const int8_t* q = u[g / 2].q + 16 * (g % 2);
      int t = 0;
#if HWY_TARGET == HWY_SCALAR
      for (int l = 0; l < 16; ++l) t += q[l];
#else
      const hn::CappedTag<uint8_t, 16> du8;
      const hn::Repartition<uint64_t, decltype(du8)> du64;
      for (size_t l = 0; l < 16; l += hn::Lanes(du8)) {
        const auto v = hn::Xor(hn::LoadU(du8, reinterpret_cast<const uint8_t*>(q + l)), hn::Set(du8, 0x80));
        t += static_cast<int>(hn::GetLane(hn::SumOfLanes(du64, hn::SumsOf8(v)))) - 128 * static_cast<int>(hn::Lanes(du8));
      }
#endif
      a.s[g] = static_cast<int16_t>(t);
      b.s[g] = static_cast<int16_t>(-t);
    }
    a.dx = b.dx = u[0].d;
  }
}

}  // namespace g4::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace g4::cpu {

HWY_EXPORT(QuantizeRowsQ8Hwy);
HWY_EXPORT(PrepareActSuperblocksHwy);

void PrepareActSuperblocks(const ActBlockQ8* xq, int rows, int K, ActSuperblockQ8* out) {
  G4_CHECK(K % 256 == 0);
  HWY_DYNAMIC_DISPATCH(PrepareActSuperblocksHwy)(xq, rows, K, out);
}

void QuantizeRowsQ8(const float* x, int rows, int K, ActBlockQ8* blocks, float* sums, int group) {
  G4_CHECK((group == 32 || group == 256) && K % group == 0);
  HWY_DYNAMIC_DISPATCH(QuantizeRowsQ8Hwy)(x, rows, K, blocks, sums, group);
}

}  // namespace g4::cpu
#endif  // HWY_ONCE
