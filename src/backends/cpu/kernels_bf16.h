// BF16 weights times activations rounded to bf16, on the CPU's bf16 dot-product instruction
// (x86: AVX512_BF16 `vdpbf16ps`, Zen 4 and Cooper Lake / Sapphire Rapids on). llama.cpp computes
// BF16 matmuls the same way on these CPUs (its activations are converted to bf16 first). One
// instruction multiplies 32 bf16 pairs and adds them into 16 f32 lanes, where the f32 path (MatMul)
// widens the weights to f32 first: about twice the multiply-adds per cycle.
// The backend uses it where CpuBackendOptions::bf16_activations allows and HasBf16Dot() says.
//
// Arithmetic (the instruction's, from Intel's SDM; products of two bf16 are exact in f32):
//   per 32-column chunk c of a (weight row, activation row) pair, in order, into one 16-lane f32
//   accumulator: lane i += w[2i+1] x[2i+1], then lane i += w[2i] x[2i] (each add rounded to
//   nearest even; bf16 inputs and f32 results below 2^-126 are taken as zero); the last K % 32
//   columns as one more chunk with zeros past K; then the 16 lanes are summed (a fixed tree).
// Every dot product follows that one sequence whatever tile computes it: decode, prefill, any
// batch size, thread split or first weight row give the same bits.
#pragma once

#include <cstdint>

namespace g4::cpu {

// Whether this build and this CPU run MatMulBf16Dot (x86-64 with AVX512_BF16; false elsewhere).
bool HasBf16Dot();

// xb [rows, K] = x [rows, K] rounded to bf16: F32ToBf16 (tensor/dtype.h) of every element, round
// to nearest even (a NaN stays a quiet NaN; overflow rounds to infinity as in IEEE), SIMD where
// HasBf16Dot(). Rows are independent. Any target.
void ConvertRowsToBf16(const float* x, int rows, int K, uint16_t* xb);

// y[r * ldy + m] = scale * sum_k xb[r, k] * W[m, k] for r < rows, m < M, by the arithmetic above.
// xb [rows, K] bf16 (ConvertRowsToBf16), W [M, K] bf16 row-major at w, ldy >= M. K >= 1.
// Only where HasBf16Dot() (G4_CHECK aborts otherwise: a caller bug).
void MatMulBf16Dot(const uint16_t* xb, int rows, int K, const uint8_t* w, int M, float scale, float* y, int ldy);

// Scalar emulation of MatMulBf16Dot's arithmetic (the lanes summed left to right, so it may
// differ from the SIMD tree in the last bits). For tests; any target.
void MatMulBf16DotReference(const uint16_t* xb, int rows, int K, const uint8_t* w, int M, float scale, float* y,
                            int ldy);

}  // namespace g4::cpu
