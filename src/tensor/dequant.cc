// ggml block formats -> f32.
//
// Block layouts (all little-endian; "half" is an IEEE fp16 scale):
//   Q8_0  (32 elems, 34 B): half d; int8 q[32].                      x = d * q
//   Q4_0  (32 elems, 18 B): half d; u8 qs[16].                       x = d * (nib - 8)
//   Q4_1  (32 elems, 20 B): half d, m; u8 qs[16].                    x = d * nib + m
//   Q5_0  (32 elems, 22 B): half d; u32 qh; u8 qs[16].               x = d * ((nib | hb << 4) - 16)
//   Q5_1  (32 elems, 24 B): half d, m; u32 qh; u8 qs[16].            x = d * (nib | hb << 4) + m
//     In the 32-element formats byte j of qs holds element j in its low nibble and element j + 16
//     in its high nibble; bit i of qh is the fifth bit of element i.
//   Q4_K (256 elems, 144 B): half d, dmin; u8 scales[12]; u8 qs[128].
//   Q5_K (256 elems, 176 B): half d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128].
//     Eight sub-blocks of 32 with 6-bit scale sc[s] and min mn[s] packed into `scales`;
//     x = (d * sc[s]) * q - (dmin * mn[s]). Sub-blocks 2g and 2g+1 share qs[32g .. 32g+31]
//     (low and high nibble); for Q5_K bit s of qh[l] is the fifth bit of element l of sub-block s.
//   Q6_K (256 elems, 210 B): u8 ql[128]; u8 qh[64]; int8 scales[16]; half d.
//     Two halves of 128; x = (d * scales[e / 16]) * (q - 32), q a 6-bit value assembled from a
//     nibble of ql and a 2-bit field of qh (see DequantQ6K).
//   W4G32 (32 elems, 18 B, ours; src/tensor/dtype.h): bf16 s; u8 qs[16] as Q4_0.  x = s * (nib - 8)
//
// The arithmetic follows the order of the gguf Python package's dequantisers (quants.py) in f32,
// so results are bit-identical to it. Floating-point contraction is switched off for this file
// (below): with -march flags that enable FMA, a fused d * q + m rounds once instead of twice and
// would no longer match.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "base/check.h"
#include "tensor/block_fields.h"
#include "tensor/dtype.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace g4 {
namespace {

inline float Half(const uint8_t* p) {
  return F16ToF32(static_cast<uint16_t>(p[0] | (p[1] << 8)));
}

inline uint32_t U32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// d * v + m and d * v - m, the product rounded to f32 before the add (contraction is off).
inline float MulAdd(float d, float v, float m) { return d * v + m; }
inline float MulSub(float d, float v, float m) { return d * v - m; }

void DequantQ8_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

void DequantQ4_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(static_cast<int>(qs[j] & 0x0f) - 8);
    y[j + 16] = d * static_cast<float>(static_cast<int>(qs[j] >> 4) - 8);
  }
}

void DequantQ4_1(const uint8_t* b, float* y) {
  const float d = Half(b);
  const float m = Half(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = MulAdd(d, static_cast<float>(qs[j] & 0x0f), m);
    y[j + 16] = MulAdd(d, static_cast<float>(qs[j] >> 4), m);
  }
}

void DequantQ5_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  const uint32_t qh = U32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}

void DequantQ5_1(const uint8_t* b, float* y) {
  const float d = Half(b);
  const float m = Half(b + 2);
  const uint32_t qh = U32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = MulAdd(d, static_cast<float>(lo), m);
    y[j + 16] = MulAdd(d, static_cast<float>(hi), m);
  }
}

void DequantQ4K(const uint8_t* b, float* y) {
  const float d = Half(b);
  const float dmin = Half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int s = 0; s < 8; ++s) {
    int sc, mn;
    ScaleMinK4(scales, s, &sc, &mn);
    const float ds = d * static_cast<float>(sc);
    const float dm = dmin * static_cast<float>(mn);
    const uint8_t* q = qs + 32 * (s / 2);
    const int shift = (s % 2) * 4;
    for (int l = 0; l < 32; ++l) {
      y[32 * s + l] = MulSub(ds, static_cast<float>((q[l] >> shift) & 0x0f), dm);
    }
  }
}

void DequantQ5K(const uint8_t* b, float* y) {
  const float d = Half(b);
  const float dmin = Half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int s = 0; s < 8; ++s) {
    int sc, mn;
    ScaleMinK4(scales, s, &sc, &mn);
    const float ds = d * static_cast<float>(sc);
    const float dm = dmin * static_cast<float>(mn);
    const uint8_t* q = qs + 32 * (s / 2);
    const int shift = (s % 2) * 4;
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0x0f) | (((qh[l] >> s) & 1) << 4);
      y[32 * s + l] = MulSub(ds, static_cast<float>(v), dm);
    }
  }
}

// Element e = 128 h + r of a Q6_K block (h the half, r in 0..127): its low 4 bits are nibble
// r / 64 of ql[64 h + r % 64], its top 2 bits are field r / 32 of qh[32 h + r % 32].
void DequantQ6K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = Half(b + 208);
  float ds[16];
  for (int i = 0; i < 16; ++i) ds[i] = d * static_cast<float>(scales[i]);
  for (int h = 0; h < 2; ++h) {
    for (int r = 0; r < 128; ++r) {
      const int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0f;
      const int hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 0x03;
      const int q = (lo | (hi << 4)) - 32;
      const int e = 128 * h + r;
      y[e] = ds[e / 16] * static_cast<float>(q);
    }
  }
}

// compressed-tensors' dequantize with f32 scales (transformers in float32): q * scale, exact.
void DequantW4G32(const uint8_t* b, float* y) {
  const float s = Bf16ToF32(static_cast<uint16_t>(b[0] | (b[1] << 8)));
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = s * static_cast<float>(static_cast<int>(qs[j] & 0x0f) - 8);
    y[j + 16] = s * static_cast<float>(static_cast<int>(qs[j] >> 4) - 8);
  }
}

}  // namespace

// Block-format dequantisation: `n` elements (a multiple of the block size) from `src` (at a block
// boundary) into `dst`. Returns false for types that are not ggml block formats.
bool DequantizeRow(DType t, const void* src, float* dst, size_t n) {
  void (*fn)(const uint8_t*, float*) = nullptr;
  switch (t) {
    case DType::kQ8_0: fn = DequantQ8_0; break;
    case DType::kQ4_0: fn = DequantQ4_0; break;
    case DType::kQ4_1: fn = DequantQ4_1; break;
    case DType::kQ5_0: fn = DequantQ5_0; break;
    case DType::kQ5_1: fn = DequantQ5_1; break;
    case DType::kQ4_K: fn = DequantQ4K; break;
    case DType::kQ5_K: fn = DequantQ5K; break;
    case DType::kQ6_K: fn = DequantQ6K; break;
    case DType::kW4G32: fn = DequantW4G32; break;
    default: return false;
  }
  const size_t qk = static_cast<size_t>(DTypeBlockElems(t));
  const size_t bytes = DTypeBlockBytes(t);
  G4_CHECK(n % qk == 0);
  const uint8_t* b = static_cast<const uint8_t*>(src);
  for (size_t i = 0; i < n / qk; ++i) fn(b + i * bytes, dst + i * qk);
  return true;
}

}  // namespace g4
