// Matrix products of block-quantised weights with int8-quantised activations (the "W4A8"/"W8A8"
// path of llama.cpp's CPU backend, ggml's vec_dot_type): activations are quantised per row in
// blocks of 32 to int8 with an f32 scale, and each 32-element unit of weights is multiplied with
// them in integers (exact i32 sums), then scaled in f32.
//
// Every supported weight format is, per unit of 32 elements and per half (elements 0-15, 16-31)
// of the unit, an affine map of small integers: w_k = a_h * u_k + b_h, with u_k a 4-, 5-, 6- or
// 8-bit integer (Q8_0: signed) and a_h, b_h the f32 values dequant.cc computes from the block's
// scales (Q4_0: a = d, b = -8 d; Q4_1: a = d, b = m; Q5_0: a = d, b = -16 d; Q5_1: a = d, b = m;
// Q4_K/Q5_K: a = d * sc[s], b = -dmin * mn[s]; Q6_K: a_h = d * scales[unit half], b_h = -32 a_h;
// Q8_0: a = d, b = 0). With an activation block x_k = dx * q_k:
//   sum_k w_k x_k = dx * sum_h (a_h * sum_{k in h} u_k q_k + b_h * sum_{k in h} q_k).
// The integer sums are exact; the result differs from the dot product of the dequantised weights
// with the dequantised activations only by f32 rounding of a few products per unit.
//
// Cost against the f32-activation path (kernels.h MatMul): activations lose precision (relative
// error up to 1/254 of each block's largest magnitude), so logits move by about as much as
// llama.cpp's do (its CPU backend quantises activations the same way, to Q8_0/Q8_K). The engine
// uses this path for block-quantised weights unless told to use f32 activations
// (CpuBackendOptions::int8_activations, CLI --f32-activations), which the transformers-parity
// tests do.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace g4::cpu {

// One block of 32 quantised activations: x_k ~= d * q[k].
struct ActBlockQ8 {
  float d;
  int8_t q[32];
};
static_assert(sizeof(ActBlockQ8) == 36);

// True when MatMulQ8 handles weights of type `t`: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K.
bool MatMulQ8Supports(DType t);

// Quantises x [rows, K] (K % 32 == 0) into rows * K / 32 blocks (row after row): per block,
// d = max|x_k| / 127 and q_k = x_k * (127 / max|x_k|) rounded to nearest (ties to even), so
// |q_k| <= 127; an all-zero block gets d = 0, q = 0. Non-finite inputs give non-finite d.
// sums [rows, K / 16]: sums[r * K / 16 + 2 u + h] = d * (sum of q over half h of block u of row
// r; h = 0: elements 0-15), for the weight formats' offsets b_h.
// SIMD; QuantizeRowsQ8Reference is the scalar definition and gives identical bytes.
void QuantizeRowsQ8(const float* x, int rows, int K, ActBlockQ8* blocks, float* sums);
void QuantizeRowsQ8Reference(const float* x, int rows, int K, ActBlockQ8* blocks, float* sums);

// y[n * ldy + m] = scale * sum_k W[m, k] * xq[n, k] for n < rows, m < M, with xq the activation
// blocks and half sums of QuantizeRowsQ8 (K / 32 blocks and K / 16 sums per row) and W [M, K] of
// type `wt` (MatMulQ8Supports) at `w`. SIMD (Highway; x86 AVX2 and AVX-512 use byte
// multiply-adds on tiles of four weight rows by up to six activation rows; other targets one
// weight row by up to eight activation rows). Each (row, weight row) result is computed by the
// same operations whatever the tile and wherever the weight range starts, so a sequence's logits
// do not depend on what else is in the batch or on how the rows are split among threads.
void MatMulQ8(const ActBlockQ8* xq, const float* sums, int rows, int K, const uint8_t* w, DType wt, int M,
              float scale, float* y, int ldy);
// Scalar reference: dequantises each weight row with ConvertToF32 and each activation block to
// d * q_k, and sums the products in f64 (rounded to f32 at the end, then times scale).
void MatMulQ8Reference(const ActBlockQ8* xq, int rows, int K, const uint8_t* w, DType wt, int M, float scale,
                       float* y, int ldy);

}  // namespace g4::cpu
