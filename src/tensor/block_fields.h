// Fields of ggml block formats (ggml-common.h layouts, described in dequant.cc), read by the scalar
// dequantisers (dequant.cc) and the SIMD kernels (backends/cpu/kernels_hwy.cc, kernels_q8_hwy.cc),
// so that every reader decodes them the same way.
#pragma once

#include <cstdint>
#include <cstring>

#include "tensor/dtype.h"

namespace g4 {

// The little-endian fp16 at p as f32, exactly as F16ToF32: normal halves by moving the bits
// (exponent bias 15 -> 127, no call), zero, subnormals, inf and NaN through F16ToF32.
inline float HalfAt(const uint8_t* p) {
  const uint32_t h = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8);
  const uint32_t exp = h & 0x7c00u;
  if (exp == 0 || exp == 0x7c00u) [[unlikely]] return F16ToF32(static_cast<uint16_t>(h));
  const uint32_t u = ((h & 0x8000u) << 16) | (((h & 0x7fffu) << 13) + (112u << 23));
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The 6-bit scale and min of sub-block s (0..7) from the 12 packed bytes of a Q4_K/Q5_K block.
// Bytes 0-3 hold the low 6 bits of scales 0-3, bytes 4-7 the low 6 bits of mins 0-3; scales and
// mins 4-7 take their low 4 bits from the nibbles of bytes 8-11 and their top 2 bits from the top
// 2 bits of bytes 0-3 (scales) and 4-7 (mins).
inline void ScaleMinK4(const uint8_t* sc, int s, int* scale, int* min) {
  if (s < 4) {
    *scale = sc[s] & 63;
    *min = sc[s + 4] & 63;
  } else {
    *scale = (sc[s + 4] & 0x0f) | ((sc[s - 4] >> 6) << 4);
    *min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
  }
}

}  // namespace g4
