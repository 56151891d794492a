// Scalar references of the activation quantiser and the int8-activation matmul (kernels_q8.h).
#include "backends/cpu/kernels_q8.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/simd_cap.h"
#include "base/check.h"
#include "tensor/quantize.h"

#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace g4::cpu {
namespace {
std::atomic<bool> vnni_allowed{true};    // SetInt8VnniForTest
std::atomic<bool> dotprod_allowed{true};  // SetArmDotprodForTest
}  // namespace

bool HasInt8Vnni() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
                          SimdCapAllowsAvx512();
  return has;
#else
  return false;
#endif
}

bool UseInt8Vnni() { return vnni_allowed.load(std::memory_order_relaxed) && HasInt8Vnni(); }

void SetInt8VnniForTest(bool enabled) { vnni_allowed.store(enabled, std::memory_order_relaxed); }

bool HasArmDotprod() {
#if defined(__aarch64__) && defined(__linux__)
  static const bool has = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
  return has;
#else
  return false;
#endif
}

bool UseArmDotprod() { return dotprod_allowed.load(std::memory_order_relaxed) && HasArmDotprod(); }

void SetArmDotprodForTest(bool enabled) { dotprod_allowed.store(enabled, std::memory_order_relaxed); }

bool MatMulQ8Supports(DType t) {
  switch (t) {
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kQ4_0x4: return true;
    default: return false;
  }
}

int PreferredActGroup(DType wt, int K) {
  return (wt == DType::kQ4_K || wt == DType::kQ5_K || wt == DType::kQ6_K) && K % 256 == 0 ? 256 : 32;
}

void QuantizeRowsQ8Reference(const float* x, int rows, int K, ActBlockQ8* out, float* sums, int group) {
  G4_CHECK((group == 32 || group == 256) && K % group == 0);
  const int64_t groups = static_cast<int64_t>(rows) * (K / group);
  const int per = group / 32;
  for (int64_t g = 0; g < groups; ++g) {
    const float* xg = x + g * group;
    float amax = 0.0f;
    for (int k = 0; k < group; ++k) amax = std::max(amax, std::fabs(xg[k]));
    if (!std::isfinite(amax)) amax = INFINITY;
    const float d = amax / 127.0f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int i = 0; i < per; ++i) {
      const int64_t b = g * per + i;
      const float* xb = x + b * 32;
      ActBlockQ8& o = out[b];
      o.d = d;
      int s0 = 0, s1 = 0;
      for (int k = 0; k < 32; ++k) {
        const int q = static_cast<int>(std::nearbyint(xb[k] * id));
        o.q[k] = static_cast<int8_t>(q);
        (k < 16 ? s0 : s1) += q;
      }
      sums[2 * b] = o.d * static_cast<float>(s0);
      sums[2 * b + 1] = o.d * static_cast<float>(s1);
    }
  }
}

void MatMulQ8Reference(const ActBlockQ8* xq, int rows, int K, const uint8_t* w, DType wt, int M, float scale,
                       float* y, int ldy) {
  G4_CHECK(K % 32 == 0 && MatMulQ8Supports(wt));
  const size_t row_bytes = DTypeRowBytes(wt, K);
  std::vector<float> wf(K);
  std::vector<uint8_t> rows4(wt == DType::kQ4_0x4 ? 4 * row_bytes : 0);  // a kQ4_0x4 group as Q4_0 rows
  if (wt == DType::kQ4_0x4) G4_CHECK(M % 4 == 0);
  for (int m = 0; m < M; ++m) {
    if (wt == DType::kQ4_0x4) {
      if (m % 4 == 0) UnpackQ4_0x4Group(w + m * row_bytes, K, rows4.data());
      ConvertToF32(DType::kQ4_0, rows4.data() + (m % 4) * row_bytes, wf.data(), K);
    } else {
      ConvertToF32(wt, w + m * row_bytes, wf.data(), K);
    }
    for (int n = 0; n < rows; ++n) {
      const ActBlockQ8* xb = xq + static_cast<size_t>(n) * (K / 32);
      double s = 0;
      for (int k = 0; k < K; ++k) s += static_cast<double>(wf[k]) * xb[k / 32].d * xb[k / 32].q[k % 32];
      y[static_cast<size_t>(n) * ldy + m] = static_cast<float>(s) * scale;
    }
  }
}

}  // namespace g4::cpu
