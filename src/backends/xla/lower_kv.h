// The i8 KV cache (DType::kI8, runtime/kv_cache.h) in the lowering: the KV write's quantisation
// and the scales the attention applies to the integers.
//
// Device layout per cache-owning layer: K and V i8 [S, slots, Nkv*D] and their scales f32
// [S, slots, Nkv], one per (slot, KV head), x = q * scale. The quantisation is the CPU backend's
// (cpu::QuantizeKvRow), op for op in IEEE f32, so both backends store the same cache bytes:
// scale = max |x| / 127 over a head's D elements, q = x * (127 / max |x|) rounded to nearest even
// and clamped to [-127, 127]; an all-zero head has scale 0 and q 0, a head with a NaN or infinity
// scale NaN and q 0. The division max |x| / 127 is rounded as the CPU's (XLA may compute it as a
// multiplication by 1/127, which the lowering corrects).
#pragma once

#include "backends/xla/stablehlo.h"

namespace g4::xla {

struct QuantizedKvRows {
  Value q;      // i8 [T, Nkv*D]
  Value scale;  // f32 [T, Nkv]
};

// Rows x f32 [T, heads*D] as the i8 cache holds them.
QuantizedKvRows QuantizeKvRows(Builder& b, const Value& x, int64_t heads, int64_t D);

}  // namespace g4::xla
