// f32 -> block formats, for quantising float checkpoints at load (`--quantize`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tensor/dtype.h"

namespace g4 {

// Quantises n elements (a multiple of 32) of x into blocks of `t` at out
// (DTypeRowBytes(t, n) bytes). Supported: kQ8_0, kQ4_0, kW4G32; returns false for other types.
//
// Q8_0 and Q4_0 follow ggml's reference quantisers (quantize_row_q8_0_ref / _q4_0_ref), which the
// gguf Python package's gguf.quants.quantize reproduces bit for bit, so the bytes are the same:
//   Q8_0: d = amax / 127, id = d ? 1 / d : 0, q = roundf(x * id) (half away from zero), fp16(d).
//   Q4_0: m = the first element of largest |x| (signed), d = m / -8, id = d ? 1 / d : 0,
//         q = min(15, (int)(x * id + 8.5)), fp16(d).
// W4G32 (dtype.h) follows compressed-tensors' symmetric int4 group-32 scheme with a min-max
// observer, scale stored as bf16:
//   s = bf16(amax / 7.5), q = clamp(round_half_even(x / s), -8, 7) (q = 0 when s == 0).
// All arithmetic is f32 without contraction, as in those references.
bool QuantizeRow(DType t, const float* x, uint8_t* out, size_t n);

// Whether a tensor of type t and this shape can become kQ4_0x4: Q4_0, 2-D [M, K], M % 4 == 0.
bool Q4_0x4Packable(DType t, const std::vector<int64_t>& shape);
// Q4_0 [M, K] at `data` rewritten in place as kQ4_0x4 (dtype.h: per group of four rows, the
// scales, then the nibbles, block by block); the same bytes, only moved. M % 4 == 0, K % 32 == 0.
// Uses a buffer of one group (4 * DTypeRowBytes(kQ4_0, K) bytes).
void PackQ4_0x4InPlace(uint8_t* data, int64_t M, int64_t K);
// One kQ4_0x4 group (four rows of K elements at `group`) back as four Q4_0 rows at `rows`
// (4 * DTypeRowBytes(kQ4_0, K) bytes, row i at i * DTypeRowBytes(kQ4_0, K)).
void UnpackQ4_0x4Group(const uint8_t* group, int64_t K, uint8_t* rows);

}  // namespace g4
