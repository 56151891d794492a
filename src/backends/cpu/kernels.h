// CPU kernels. Each op has a scalar reference version (`...Reference`, kernels.cc, f32
// accumulation, following the transformers function named in its comment) and a SIMD version
// (kernels_hwy.cc, Google Highway, one source compiled for every x86 target from SSSE3 to AVX-512
// and for NEON/SVE on Arm, the best one the CPU supports picked at run time). The SIMD versions are
// the ones the backend calls; the tests check them against the references on every target the
// machine can run.
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
//
// MatMul reads every weight block in its stored form and multiplies it with up to four activation
// rows at once without writing the dequantised row anywhere (fused kernels for F32, F16, BF16 and
// all ggml block types). The dequantised weights are bit-identical to ConvertToF32's and the sums
// are f32, so MatMul differs from MatMulReference only in the order of the additions (and in
// fused multiply-adds where the CPU has them). `scratch` is then unused.
void MatMul(const float* x, int rows, int K, const uint8_t* w, DType wt, int M, float scale, float* y, int ldy,
            float* scratch);
// Some weight types' SIMD kernels read the activations in another column order, which MatMul
// writes first (rows x K floats per call and thread): BF16 weights are widened as u32 lanes, even
// elements from the low halves and odd ones from the high halves, so x is read per chunk of 2N
// columns (N = f32 lanes of the target: 8 on AVX2) as the chunk's even columns, then its odd ones.
// A caller that splits one matmul across threads or runs several on one x (q, k, v; gate, up) can
// reorder once and share it:
//   MatMulReordersActivations(wt, K): whether MatMul reorders x for weights of type wt and inner
//     size K (BF16 with K >= 2N on SIMD targets; false for every other type).
//   ReorderActivations(wt, x, rows, K, xr): xr [rows, K] = x [rows, K] in that order; rows are
//     independent (a thread may reorder a range of them). Only where MatMulReordersActivations
//     (G4_CHECK aborts otherwise: a caller bug, not an input error).
//   MatMulReordered(xr, ...): MatMul(x, ...) with x given as ReorderActivations wrote it for the
//     same wt and K; the same bits as MatMul. The same precondition.
bool MatMulReordersActivations(DType wt, int K);
void ReorderActivations(DType wt, const float* x, int rows, int K, float* xr);
void MatMulReordered(const float* xr, int rows, int K, const uint8_t* w, DType wt, int M, float scale, float* y,
                     int ldy);
// Scalar reference: converts each weight row with ConvertToF32, then f32 dot products with eight
// interleaved accumulators.
void MatMulReference(const float* x, int rows, int K, const uint8_t* w, DType wt, int M, float scale, float* y,
                     int ldy, float* scratch);

// sum_i a[i] * b[i] in f32 (SIMD, several accumulators). For attention scores.
float Dot(const float* a, const float* b, int n);
// y[i] += alpha * x[i] (SIMD). For the attention-weighted sum of values.
void Axpy(float alpha, const float* x, float* y, int n);

// Per row and per group of `group` columns: y = x * (mean(x^2) + eps)^-1/2 * (offset + w[j]),
// or without the weight factor when w == nullptr (Gemma4RMSNorm / Gemma3RMSNorm).
// x, y [rows, cols]; cols % group == 0; w [group] of dtype wt. x may equal y.
// The SIMD version sums the squares in f64 like the reference and applies the same f32 operations
// in the same order, so it differs only by the order of that f64 sum.
void RmsNorm(const float* x, int rows, int cols, int group, const uint8_t* w, DType wt, float eps, float offset, float* y);
void RmsNormReference(const float* x, int rows, int cols, int group, const uint8_t* w, DType wt, float eps,
                      float offset, float* y);

// NeoX RoPE, in two parts. RopeTable: the cos and sin of every row's angles, cs [rows, head_dim]:
// cs[r][j] = cos(positions[r] * inv_freq[j]) and cs[r][head_dim / 2 + j] = sin(...), j <
// head_dim / 2 (angle, cos and sin in f32 as transformers; positions [rows], inv_freq
// [head_dim / 2]). One table serves every node with the same inv_freq in a step (Gemma 4 E2B: 2
// tables per step instead of cos/sin in each of its 50 Rope nodes).
void RopeTable(int rows, int head_dim, const float* inv_freq, const int32_t* positions, float* cs);
// RopeApply: in place, for each row r and head of `head_dim` columns of x [rows, cols] (cols %
// head_dim == 0), pair (j, j + head_dim / 2) rotated by row r's angle j from the table RopeTable
// made for the same rows, head_dim and inv_freq (cs must not overlap x); pairs with inv_freq[j]
// == 0 (proportional RoPE's unrotated ones) are left as they are. The same bits as computing
// cos/sin per row (kernels.cc is built without fused multiply-adds).
void RopeApply(float* x, int rows, int cols, int head_dim, const float* inv_freq, const float* cs);

// out = gelu_tanh(a) * b, n elements; `out` may be `a` (in place), not `b`. The SIMD version uses
// Highway's vector tanh (a few ulp from std::tanh), otherwise the reference's f32 operations in the
// same order.
void GeGlu(const float* a, const float* b, int64_t n, float* out);
void GeGluReference(const float* a, const float* b, int64_t n, float* out);

// out = cap * tanh(x / cap), n elements (SIMD version: Highway's vector tanh).
void Softcap(const float* x, int64_t n, float cap, float* out);
void SoftcapReference(const float* x, int64_t n, float cap, float* out);

// Name of the SIMD target the kernels above run on ("AVX2", "AVX3", "SSE4", "NEON", "SVE",
// "Scalar", ...): the best one this CPU supports among those compiled. For the device-policy line.
const char* SimdTargetName();

}  // namespace g4::cpu
