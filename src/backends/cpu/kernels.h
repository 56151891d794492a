// CPU reference kernels (scalar, f32 accumulation). Each follows the transformers function named
// in its comment. Issue "CPU speed" adds SIMD versions beside these, tested against them.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace g4::cpu {

// gelu with the tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// (torch gelu(approximate="tanh"), ACT2FN["gelu_pytorch_tanh"]).
float GeluTanh(float x);

// y[n * ldy + m] = scale * sum_k x[n, k] * W[m, k] for n < rows, m < M.  x [rows, K] f32;
// W [M, K] stored as `wt` (any float or block dtype) at `w`; y rows have stride ldy (>= M).
// `scratch` holds K floats (one converted weight row).
void MatMul(const float* x, int rows, int K, const uint8_t* w, DType wt, int M, float scale, float* y, int ldy,
            float* scratch);

// Per row and per group of `group` columns: y = x * (mean(x^2) + eps)^-1/2 * (offset + w[j]),
// or without the weight factor when w == nullptr (Gemma4RMSNorm / Gemma3RMSNorm).
// x, y [rows, cols]; cols % group == 0; w [group] of dtype wt. x may equal y.
void RmsNorm(const float* x, int rows, int cols, int group, const uint8_t* w, DType wt, float eps, float offset, float* y);

// NeoX RoPE in place: for each row r and head of `head_dim` columns, pair (j, j + D/2) is
// rotated by angle positions[r] * inv_freq[j] (angle, cos and sin in f32 as transformers).
void Rope(float* x, int rows, int cols, int head_dim, const float* inv_freq, const int32_t* positions);

// out = gelu_tanh(a) * b, n elements.
void GeGlu(const float* a, const float* b, int64_t n, float* out);

// out = cap * tanh(x / cap), n elements.
void Softcap(const float* x, int64_t n, float cap, float* out);

}  // namespace g4::cpu
