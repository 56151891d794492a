// Element-wise and vector kernels (kernels.h: Dot, Axpy, GeGlu, Softcap, RmsNorm), one source for
// every Highway target, compiled with -ffp-contract=off as kernels_hwy.cc: multiply-adds only where
// written as hn::MulAdd.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels.h"
#include "tensor/dtype.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/cpu/kernels_vec_hwy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace g4::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Full vectors of f32.
using DFF = hn::ScalableTag<float>;

float DotHwy(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, int n) {
  const DFF df;
  const size_t N = hn::Lanes(df);
  const size_t len = n > 0 ? static_cast<size_t>(n) : 0;
  auto s0 = hn::Zero(df), s1 = hn::Zero(df), s2 = hn::Zero(df), s3 = hn::Zero(df);
  size_t i = 0;
  for (; i + 4 * N <= len; i += 4 * N) {
    s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(df, a + i + N), hn::LoadU(df, b + i + N), s1);
    s2 = hn::MulAdd(hn::LoadU(df, a + i + 2 * N), hn::LoadU(df, b + i + 2 * N), s2);
    s3 = hn::MulAdd(hn::LoadU(df, a + i + 3 * N), hn::LoadU(df, b + i + 3 * N), s3);
  }
  for (; i + N <= len; i += N) s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), s0);
  float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  for (; i < len; ++i) s += a[i] * b[i];
  return s;
}

void AxpyHwy(float alpha, const float* HWY_RESTRICT x, float* HWY_RESTRICT y, int n) {
  const DFF df;
  const size_t N = hn::Lanes(df);
  const size_t len = n > 0 ? static_cast<size_t>(n) : 0;
  const auto va = hn::Set(df, alpha);
  size_t i = 0;
  for (; i + N <= len; i += N) hn::StoreU(hn::MulAdd(va, hn::LoadU(df, x + i), hn::LoadU(df, y + i)), df, y + i);
  for (; i < len; ++i) y[i] += alpha * x[i];
}

// out = f(df, in0, in1) over n floats: full vectors in place, the tail through a padded buffer so
// every element goes through the same vector code. `out` may be `in0` (in place: each vector is
// loaded before its result is stored).
template <class F>
HWY_INLINE void MapN(const float* in0, const float* HWY_RESTRICT in1, size_t n, float* out, const F& f) {
  const DFF df;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(f(df, hn::LoadU(df, in0 + i), hn::LoadU(df, in1 + i)), df, out + i);
  }
  if (i < n) {
    HWY_ALIGN float b0[HWY_MAX_BYTES / sizeof(float)] = {};
    HWY_ALIGN float b1[HWY_MAX_BYTES / sizeof(float)] = {};
    const size_t rest = n - i;
    std::memcpy(b0, in0 + i, rest * sizeof(float));
    std::memcpy(b1, in1 + i, rest * sizeof(float));
    hn::Store(f(df, hn::Load(df, b0), hn::Load(df, b1)), df, b0);
    std::memcpy(out + i, b0, rest * sizeof(float));
  }
}

void GeGluHwy(const float* a, const float* b, int64_t n, float* out) {
  MapN(a, b, static_cast<size_t>(n), out, [](DFF df, hn::Vec<DFF> x, hn::Vec<DFF> g) HWY_ATTR {
    const auto beta = hn::Set(df, 0.7978845608028654f);  // sqrt(2/pi)
    const auto kappa = hn::Set(df, 0.044715f);
    // Same operations and order as GeluTanh: 0.5f * x * (1 + tanh(beta * (x + kappa * x * x * x))).
    const auto inner = hn::Mul(beta, hn::Add(x, hn::Mul(hn::Mul(hn::Mul(kappa, x), x), x)));
    const auto gelu = hn::Mul(hn::Mul(hn::Set(df, 0.5f), x), hn::Add(hn::Set(df, 1.0f), hn::Tanh(df, inner)));
    return hn::Mul(gelu, g);
  });
}

void SoftcapHwy(const float* x, int64_t n, float cap, float* out) {
  MapN(x, x, static_cast<size_t>(n), out, [cap](DFF df, hn::Vec<DFF> v, hn::Vec<DFF>) HWY_ATTR {
    const auto c = hn::Set(df, cap);
    return hn::Mul(c, hn::Tanh(df, hn::Div(v, c)));
  });
}

// sum of x[j]^2 in f64, as RmsNormReference.
HWY_INLINE double SumSquares(const float* HWY_RESTRICT x, size_t n) {
  size_t i = 0;
  double ss = 0;
#if HWY_HAVE_FLOAT64
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dfh;
  const size_t N = hn::Lanes(dd);
  auto s0 = hn::Zero(dd), s1 = hn::Zero(dd);
  for (; i + 2 * N <= n; i += 2 * N) {
    const auto v0 = hn::PromoteTo(dd, hn::LoadU(dfh, x + i));
    const auto v1 = hn::PromoteTo(dd, hn::LoadU(dfh, x + i + N));
    s0 = hn::MulAdd(v0, v0, s0);  // exact products: a float squared fits in a double
    s1 = hn::MulAdd(v1, v1, s1);
  }
  ss = hn::GetLane(hn::SumOfLanes(dd, hn::Add(s0, s1)));
#endif
  for (; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  return ss;
}

void RmsNormHwy(const float* x, int rows, int cols, int group, const uint8_t* w, DType wt, float eps, float offset,
                float* y) {
  thread_local std::vector<float> wf;
  if (w != nullptr) {
    wf.resize(group);
    ConvertToF32(wt, w, wf.data(), group);
  }
  const DFF df;
  const size_t N = hn::Lanes(df);
  const auto voff = hn::Set(df, offset);
  for (int r = 0; r < rows; ++r) {
    for (int g0 = 0; g0 < cols; g0 += group) {
      const float* xi = x + static_cast<size_t>(r) * cols + g0;
      float* yi = y + static_cast<size_t>(r) * cols + g0;
      const float mean = static_cast<float>(SumSquares(xi, group) / group);
      const float inv = 1.0f / std::sqrt(mean + eps);
      const auto vinv = hn::Set(df, inv);
      size_t j = 0;
      for (; j + N <= static_cast<size_t>(group); j += N) {
        auto v = hn::Mul(hn::LoadU(df, xi + j), vinv);
        if (w != nullptr) v = hn::Mul(v, hn::Add(voff, hn::LoadU(df, wf.data() + j)));
        hn::StoreU(v, df, yi + j);
      }
      for (; j < static_cast<size_t>(group); ++j) {
        float v = xi[j] * inv;
        if (w != nullptr) v = v * (offset + wf[j]);
        yi[j] = v;
      }
    }
  }
}

}  // namespace g4::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace g4::cpu {

HWY_EXPORT(DotHwy);
HWY_EXPORT(AxpyHwy);
HWY_EXPORT(GeGluHwy);
HWY_EXPORT(SoftcapHwy);
HWY_EXPORT(RmsNormHwy);

float Dot(const float* a, const float* b, int n) { return HWY_DYNAMIC_DISPATCH(DotHwy)(a, b, n); }
void Axpy(float alpha, const float* x, float* y, int n) { HWY_DYNAMIC_DISPATCH(AxpyHwy)(alpha, x, y, n); }
void GeGlu(const float* a, const float* b, int64_t n, float* out) { HWY_DYNAMIC_DISPATCH(GeGluHwy)(a, b, n, out); }
void Softcap(const float* x, int64_t n, float cap, float* out) { HWY_DYNAMIC_DISPATCH(SoftcapHwy)(x, n, cap, out); }
void RmsNorm(const float* x, int rows, int cols, int group, const uint8_t* w, DType wt, float eps, float offset,
             float* y) {
  HWY_DYNAMIC_DISPATCH(RmsNormHwy)(x, rows, cols, group, w, wt, eps, offset, y);
}

}  // namespace g4::cpu
#endif  // HWY_ONCE
