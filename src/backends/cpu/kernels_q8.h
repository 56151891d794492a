// Matrix products of block-quantised weights with int8-quantised activations (the "W4A8"/"W8A8"
// path of llama.cpp's CPU backend, ggml's vec_dot_type): activations are quantised per row in
// blocks of 32 to int8 with an f32 scale (shared by the eight blocks of each 256 elements for
// Q4_K/Q5_K weights, as llama.cpp's Q8_K), and each 32-element unit of weights is multiplied with
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
// error up to 1/254 of each group's largest magnitude), so logits move by about as much as
// llama.cpp's do (its CPU backend quantises activations the same way, to Q8_0/Q8_K; measured
// accuracy: docs/NUMERICS.md). K-quant matmuls take groups of 256 (faster tiles, a little less
// accurate than 32), the rest groups of 32 (PreferredActGroup). The engine
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

// True when MatMulQ8 handles weights of type `t`: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K,
// Q4_0x4 (M a multiple of 4, and w at the start of a group of four rows).
bool MatMulQ8Supports(DType t);

// Quantises x [rows, K] (K % group == 0) into rows * K / 32 blocks (row after row), one scale
// per `group` consecutive elements of a row: group 32 (llama.cpp's Q8_0: each block its own
// scale) or 256 (like llama.cpp's Q8_K: the eight blocks of each 256 elements share it, which lets
// the K-quant kernels apply their integer sub-block scales in integers). Per group,
// d = max|x_k| / 127, written to each of its blocks, and q_k = x_k * (127 / max|x_k|) rounded to
// nearest (ties to even), so |q_k| <= 127; an all-zero group gets d = 0, q = 0. Non-finite inputs
// give non-finite d. sums [rows, K / 16]: sums[r * K / 16 + 2 u + h] = d * (sum of q over half h
// of block u of row r; h = 0: elements 0-15), for the weight formats' offsets b_h.
// SIMD; QuantizeRowsQ8Reference is the scalar definition and gives identical bytes.
void QuantizeRowsQ8(const float* x, int rows, int K, ActBlockQ8* blocks, float* sums, int group = 32);
void QuantizeRowsQ8Reference(const float* x, int rows, int K, ActBlockQ8* blocks, float* sums, int group = 32);

// The activation group QuantizeRowsQ8 should use for weights of type `wt` with rows of K:
// 256 for Q4_K, Q5_K and Q6_K when K % 256 == 0 (their fast tiles need it; llama.cpp's Q8_K
// activations for these types), else 32.
int PreferredActGroup(DType wt, int K);

// One 256-element superblock of an activation row quantised with group 256, laid out for the
// AVX-512 Q4_K and Q6_K kernels (kernels_q8_hwy.cc), which multiply a 512-bit register of one
// weight row's elements (two 32-element units: blocks of ActBlockQ8) with one of q's rows.
struct alignas(64) ActSuperblockQ8 {
  // Q6_K's order: units [0 | 1], [2 | 3], [4 | 5], [6 | 7] (ql's low, high nibbles);
  // Q4_K's: units [0 | 2], [1 | 3], [4 | 6], [5 | 7] (qs's low, high nibbles).
  int8_t q[4][64];
  // s[g] = the sum of q over elements 16 g .. 16 g + 15 (|s| <= 16 * 127); negated in Q4_K's
  // order (the kernel's mins term then needs no sign change).
  int16_t s[16];
  float dx;       // the scale the superblock's eight blocks share
};
static_assert(sizeof(ActSuperblockQ8) == 320);

// Superblocks of xq [rows, K / 32] quantised with group 256 (K % 256 == 0): superblock j = r * K
// / 256 + i (i < K / 256) in Q6_K's order at out[2 j] and in Q4_K's at out[2 j + 1] (2 rows * K /
// 256 in all; Q4_K's with s negated). Integers copied and summed exactly: the same bytes for every
// caller and SIMD target (kernels_q8_hwy.cc).
void PrepareActSuperblocks(const ActBlockQ8* xq, int rows, int K, ActSuperblockQ8* out);

// Whether MatMulQ8 reads ActSuperblockQ8 for weights of type wt with rows of K and activations
// quantised with act_group: Q4_K or Q6_K, group 256, on a CPU that runs the AVX-512 target. A
// caller that splits one matmul into many MatMulQ8 calls (threads, ranges of weight rows)
// prepares them once and passes them as xs; otherwise each call prepares its own (2 rows * K /
// 256 superblocks, 2.5 bytes per element).
bool MatMulQ8UsesSuperblocks(DType wt, int K, int act_group);

// y[n * ldy + m] = scale * sum_k W[m, k] * xq[n, k] for n < rows, m < M, with xq the activation
// blocks and half sums of QuantizeRowsQ8 (K / 32 blocks and K / 16 sums per row) and W [M, K] of
// type `wt` (MatMulQ8Supports) at `w`. SIMD (Highway; x86 AVX2 and AVX-512 use byte
// multiply-adds on tiles of four weight rows by up to six activation rows; other targets one
// weight row by up to eight activation rows). Each (row, weight row) result is computed by the
// same operations whatever the tile and wherever the weight range starts, so a sequence's logits
// do not depend on what else is in the batch or on how the rows are split among threads.
// act_group: the group xq was quantised with (32 or 256; 256 needs K % 256 == 0). With 256,
// Q4_K/Q5_K weights use tiles that sum a whole 256-element superblock in i32 (sub-block scales
// applied by vpmaddwd) and convert once per superblock, and on AVX-512 Q4_K and Q6_K run one
// weight row at a time on ActSuperblockQ8 (MatMulQ8UsesSuperblocks); every format is correct
// with either group.
// xs: PrepareActSuperblocks of xq (all `rows` rows), or nullptr (read only where
// MatMulQ8UsesSuperblocks).
void MatMulQ8(const ActBlockQ8* xq, const float* sums, int rows, int K, const uint8_t* w, DType wt, int M,
              float scale, float* y, int ldy, int act_group = 32, const ActSuperblockQ8* xs = nullptr);
// Whether this CPU has AVX-512 VNNI (x86-64 with avx512vnni and avx512vl; false elsewhere). On
// the AVX-512 target MatMulQ8 then multiplies the formats with one scale per unit (Q8_0, Q4_0,
// Q4_1, Q5_0, Q5_1, Q4_0x4) with vpdpbusd, and Q4_K/Q6_K on superblocks with vpdpbusd and
// vpdpwssd, giving the same bits as without it.
bool HasInt8Vnni();
// HasInt8Vnni() unless a test turned it off. SetInt8VnniForTest(false): MatMulQ8 runs the byte
// multiply-add sequence even where VNNI is present (so tests cover both); true restores it.
bool UseInt8Vnni();
void SetInt8VnniForTest(bool enabled);
// Whether this CPU has Armv8.2's int8 dot product (AArch64 Linux with HWCAP_ASIMDDP; false
// elsewhere). On the NEON and SVE targets MatMulQ8 then multiplies each unit's bytes with SDOT
// (see kernels_q8_hwy.cc: the same integer sums, the last f32 bits can differ from the path
// without it). UseArmDotprod: HasArmDotprod() unless a test turned it off
// (SetArmDotprodForTest(false) runs the widening path; true restores it).
bool HasArmDotprod();
bool UseArmDotprod();
void SetArmDotprodForTest(bool enabled);

// Whether MatMulQ8 has a kernel of its own for kQ4_0x4 weights on this CPU (the AVX-512 target;
// elsewhere it unpacks each group of four rows and runs the Q4_0 kernel, correct but slower).
// The loader packs Q4_0 weights into kQ4_0x4 only where this is true (LoadOptions::pack_q4_0).
bool Q4_0x4KernelAvailable();

// Scalar reference: dequantises each weight row with ConvertToF32 and each activation block to
// d * q_k, and sums the products in f64 (rounded to f32 at the end, then times scale).
void MatMulQ8Reference(const ActBlockQ8* xq, int rows, int K, const uint8_t* w, DType wt, int M, float scale,
                       float* y, int ldy);

}  // namespace g4::cpu
