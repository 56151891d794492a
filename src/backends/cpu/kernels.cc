// Scalar reference kernels (f32 accumulation): the definitions the SIMD kernels in kernels_hwy.cc
// are tested against, plus the ops that have no SIMD version yet (RoPE).
#include "backends/cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace g4::cpu {

float GeluTanh(float x) {
  const float kBeta = 0.7978845608028654f;  // sqrt(2/pi)
  const float kKappa = 0.044715f;
  const float inner = kBeta * (x + kKappa * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}

namespace {

// Dot product with 8 independent f32 accumulators (keeps the rounding error of long sums low and
// lets the compiler vectorise).
inline float DotReference(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void MatMulReference(const float* x, int rows, int K, const uint8_t* w, DType wt, int M, float scale, float* y,
                     int ldy, float* scratch) {
  const size_t row_bytes = DTypeRowBytes(wt, K);
  for (int m = 0; m < M; ++m) {
    const uint8_t* wrow = w + m * row_bytes;
    const float* wf;
    if (wt == DType::kF32 && reinterpret_cast<uintptr_t>(wrow) % alignof(float) == 0) {
      wf = reinterpret_cast<const float*>(wrow);
    } else {
      ConvertToF32(wt, wrow, scratch, K);
      wf = scratch;
    }
    for (int n = 0; n < rows; ++n) {
      const float d = DotReference(x + static_cast<size_t>(n) * K, wf, K);
      y[static_cast<size_t>(n) * ldy + m] = scale == 1.0f ? d : d * scale;
    }
  }
}

void RmsNormReference(const float* x, int rows, int cols, int group, const uint8_t* w, DType wt, float eps,
                      float offset, float* y) {
  // Norm weights are small: convert once per call (they may be stored in any float dtype).
  thread_local std::vector<float> wf;
  if (w != nullptr) {
    wf.resize(group);
    ConvertToF32(wt, w, wf.data(), group);
  }
  for (int r = 0; r < rows; ++r) {
    for (int g0 = 0; g0 < cols; g0 += group) {
      const float* xi = x + static_cast<size_t>(r) * cols + g0;
      float* yi = y + static_cast<size_t>(r) * cols + g0;
      double ss = 0;
      for (int j = 0; j < group; ++j) ss += static_cast<double>(xi[j]) * xi[j];
      const float mean = static_cast<float>(ss / group);
      const float inv = 1.0f / std::sqrt(mean + eps);
      for (int j = 0; j < group; ++j) {
        float v = xi[j] * inv;
        if (w != nullptr) v = v * (offset + wf[j]);
        yi[j] = v;
      }
    }
  }
}

void RopeTable(int rows, int head_dim, const float* inv_freq, const int32_t* positions, float* cs) {
  const int half = head_dim / 2;
  for (int r = 0; r < rows; ++r) {
    const float pos = static_cast<float>(positions[r]);
    float* c = cs + static_cast<size_t>(r) * head_dim;
    for (int j = 0; j < half; ++j) {
      if (inv_freq[j] == 0.0f) {  // an unrotated pair: RopeApply does not read it
        c[j] = 1.0f;
        c[half + j] = 0.0f;
        continue;
      }
      const float angle = pos * inv_freq[j];
      c[j] = std::cos(angle);
      c[half + j] = std::sin(angle);
    }
  }
}

void RopeApply(float* x, int rows, int cols, int head_dim, const float* inv_freq, const float* cs) {
  const int half = head_dim / 2;
  // Proportional RoPE leaves the pairs past its rotated ones alone (inv_freq 0): a zero suffix is
  // not visited; zeros elsewhere (no Gemma config has them) are skipped one by one.
  int rotated = half;
  while (rotated > 0 && inv_freq[rotated - 1] == 0.0f) --rotated;
  const bool gaps = std::find(inv_freq, inv_freq + rotated, 0.0f) != inv_freq + rotated;
  for (int r = 0; r < rows; ++r) {
    const size_t row = static_cast<size_t>(r) * head_dim;
    const float* __restrict c = cs + row;  // [0, rotated) of each: disjoint from each other and x
    const float* __restrict s = cs + row + half;
    for (int h0 = 0; h0 < cols; h0 += head_dim) {
      const size_t head = static_cast<size_t>(r) * cols + h0;
      float* __restrict lo = x + head;  // [0, rotated): disjoint from hi (rotated <= half)
      float* __restrict hi = x + head + half;
      if (!gaps) {
        for (int j = 0; j < rotated; ++j) {  // contiguous: the compiler vectorises it
          const float a = lo[j], b = hi[j];
          lo[j] = a * c[j] - b * s[j];
          hi[j] = b * c[j] + a * s[j];
        }
      } else {
        for (int j = 0; j < rotated; ++j) {
          if (inv_freq[j] == 0.0f) continue;
          const float a = lo[j], b = hi[j];
          lo[j] = a * c[j] - b * s[j];
          hi[j] = b * c[j] + a * s[j];
        }
      }
    }
  }
}

void GeGluReference(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = GeluTanh(a[i]) * b[i];
}

void SoftcapReference(const float* x, int64_t n, float cap, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = cap * std::tanh(x[i] / cap);
}

}  // namespace g4::cpu
