// The i8 KV cache (DType::kI8, runtime/kv_cache.h) and the fp8 one (DType::kF8E4M3) in the
// lowering: the KV write's quantisation and the scales the attention applies to the stored values.
//
// Device layout per cache-owning layer: K and V i8 [S, slots, Nkv*D] and their scales f32
// [S, slots, Nkv], one per (slot, KV head), x = q * scale. The quantisation is the CPU backend's
// (cpu::QuantizeKvRow), op for op in IEEE f32, so both backends store the same cache bytes:
// scale = max |x| / 127 over a head's D elements, q = x * (127 / max |x|) rounded to nearest even
// and clamped to [-127, 127]; an all-zero head has scale 0 and q 0, a head with a NaN or infinity
// scale NaN and q 0. The division max |x| / 127 is rounded as the CPU's (XLA may compute it as a
// multiplication by 1/127, which the lowering corrects).
//
// fp8 (f8E4M3FN, 3 mantissa bits, largest finite 448): the same layout with scale = max |x| / 448
// and q = x * (448 / max |x|) clamped to [-448, 448] and rounded to nearest even by the convert;
// all-zero and non-finite heads as i8's. x = q * scale is then within 2^-4 |x| (a normal q: half
// of its 2^-3 relative step) plus half a subnormal step, 2^-10 scale (|q| < 2^-6), of the row's value.
// No CPU backend counterpart: only devices that compute with fp8 hold it (device_policy.h).
#pragma once

#include "backends/xla/stablehlo.h"

namespace g4::xla {

struct QuantizedKvRows {
  Value q;      // i8 or f8E4M3FN [T, Nkv*D]
  Value scale;  // f32 [T, Nkv]
};

// Rows x f32 [T, heads*D] as the cache of element type `type` (kI8 or kF8E4M3FN) holds them.
QuantizedKvRows QuantizeKvRows(Builder& b, const Value& x, int64_t heads, int64_t D, ElemType type = ElemType::kI8);

}  // namespace g4::xla
