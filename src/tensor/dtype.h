// Element types of stored tensors and the scalar conversions between them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace g4 {

// Element types. The k-quant / legacy-quant types are ggml block formats (GGUF): a row of n
// elements is n / DTypeBlockElems blocks of DTypeBlockBytes bytes each (ggml-common.h layouts).
//
// kW4G32 is ours, not ggml's: the in-memory form of compressed-tensors `pack-quantized` symmetric
// int4 weights (W4A16 checkpoints, and `--quantize w4a16`). A block is 32 elements in 18 bytes:
//   bf16 s (2 bytes, little-endian); u8 qs[16]: byte j holds element j in its low nibble and
//   element j + 16 in its high nibble (Q4_0's order, so a row is contiguous and decodes like Q4_0).
//   x = s * (nib - 8) in f32 (exact: 8 + 4 significant bits). This is what transformers computes
//   for a compressed-tensors checkpoint loaded in float32 (the scales are cast to f32, then
//   compressed-tensors' dequantize multiplies in the scale's dtype); in bfloat16 it would round
//   each product to bf16 instead.
// A row of n elements is n / 32 blocks; a checkpoint group of G = 32k elements becomes k blocks
// with the same scale. The loader repacks weight_packed (element 8c + i in bits 4i..4i+3 of int32
// word c, stored as q + 8) into this order; see src/model/compressed_tensors.h.
// kQ4_0x4: Q4_0 weights rewritten at load for the CPU's four-row kernels (PackQ4_0x4): the same
// bytes per row (DTypeRowBytes as Q4_0), but rows come in groups of four that only exist whole (a
// tensor of this type has a multiple of 4 rows, and a row range must start at a multiple of 4).
// Group g of a [M, K] matrix, nb = K / 32 blocks per row, at byte 4 g * DTypeRowBytes(K): first
// the four rows' fp16 scales block by block (nb x 8 bytes: block b, row i at 8 b + 2 i), then their
// nibbles block by block (nb x 64 bytes: block b, row i's 16 bytes at 8 nb + 64 b + 16 i), each
// block's bytes as in Q4_0. Never in a file.
// kI8: signed 8-bit integers, the int8 KV cache's elements (its scales are kept apart: kv_cache.h).
// Never a weight's type.
// kF8E4M3: OCP fp8 e4m3 "fn" (1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no infinities,
// S.1111.111 NaN, largest finite 448), the fp8 KV cache's elements on devices that compute with
// them (the XLA backend: device_policy.h); its scales are kept apart as kI8's. Never a weight's type.
enum class DType { kF32, kF16, kBF16, kI32, kI64, kQ8_0, kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ4_K, kQ5_K, kQ6_K, kW4G32, kQ4_0x4, kI8,
                   kF8E4M3 };

// Bytes per element for plain types (F32 4, F16/BF16 2, I32 4, I64 8, I8 and F8_E4M3 1); 0 for block types.
size_t DTypeSize(DType t);
// Elements per block: 1 for plain types, 32 for Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/W4G32/Q4_0x4, 256 for *_K.
int DTypeBlockElems(DType t);
// Bytes per block: DTypeSize for plain types; Q8_0 34, Q4_0 18, Q4_1 20, Q5_0 22, Q5_1 24,
// Q4_K 144, Q5_K 176, Q6_K 210, W4G32 18, Q4_0x4 18 (per row: a group of four rows holds four blocks).
size_t DTypeBlockBytes(DType t);
// Bytes of a row of n elements (n must be a multiple of DTypeBlockElems).
inline size_t DTypeRowBytes(DType t, int64_t n) { return static_cast<size_t>(n / DTypeBlockElems(t)) * DTypeBlockBytes(t); }
// "F32", "F16", "BF16", "I32", "I64", "I8", "F8_E4M3" (the safetensors spellings), "Q8_0", "Q4_K", ..., "W4G32".
std::string_view DTypeName(DType t);
// True for the types a weight can be stored in and ConvertToF32 reads (all but I32/I64/I8/F8_E4M3).
inline bool IsFloatDType(DType t) { return t != DType::kI32 && t != DType::kI64 && t != DType::kI8 && t != DType::kF8E4M3; }

// bfloat16 -> f32: exact (bf16 is the top 16 bits of an f32).
inline float Bf16ToF32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// f32 -> bfloat16 with round-to-nearest-even (what torch's .to(bfloat16) does); NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
// Rounds an f32 to the nearest value representable in `t` (identity for F32).
float RoundToDType(float f, DType t);

// IEEE half -> f32, exact for all inputs including subnormals, inf and NaN.
float F16ToF32(uint16_t h);
// f32 -> IEEE half, round-to-nearest-even, overflow to inf.
uint16_t F32ToF16(float f);

// Converts `n` elements of a float or block dtype at `src` into f32 `dst` (dequantises block
// types; n must then be a multiple of DTypeBlockElems(t), src at a block boundary).
void ConvertToF32(DType t, const void* src, float* dst, size_t n);

}  // namespace g4
