// Weight element decoding and KV-cache index math shared by the CUDA kernels and the host: every
// function is __host__ __device__ (G4_HD) under nvcc and plain inline C++ under a host compiler,
// so the host tests check the exact code the kernels run against src/tensor/dequant.cc.
//
// A row of K weights is read in chunks of 32 consecutive elements (K is a multiple of the block
// size, so a chunk never straddles a block): chunk c of a 256-element K-quant block is its
// sub-block c % 8. Results are bit-identical to DequantizeRow / ConvertToF32: products and
// differences are rounded one by one (no fused multiply-add: __fmul_rn / __fsub_rn on the device,
// -ffp-contract=off for the host tests).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define G4_HD __host__ __device__ __forceinline__
#else
#define G4_HD inline
#endif

namespace g4::cuda {

// Weight formats the kernels read (template arguments; DType values differ per backend build).
enum WeightFormat : int { kWF32 = 0, kWF16, kWBF16, kWQ8_0, kWQ4_0, kWQ4_K, kWQ6_K, kWW4G32, kWNumFormats };

G4_HD float BitsToF32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
G4_HD float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
G4_HD float Sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

G4_HD uint16_t Load16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// IEEE binary16 bits -> f32, exact for every input (subnormals, inf, NaN keep their payload).
G4_HD float HalfBitsToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return BitsToF32(sign);
    const float m = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24, exact
    return sign ? -m : m;
  }
  if (exp == 31) return BitsToF32(sign | 0x7f800000u | (mant << 13));
  return BitsToF32(sign | ((exp + 112u) << 23) | (mant << 13));
}
G4_HD float Bf16BitsToF32(uint16_t h) { return BitsToF32(static_cast<uint32_t>(h) << 16); }

// Elements per block and bytes per block of each format (dense formats: one element).
G4_HD int FormatBlockElems(int f) { return f == kWQ4_K || f == kWQ6_K ? 256 : (f <= kWBF16 ? 1 : 32); }
G4_HD int FormatBlockBytes(int f) {
  switch (f) {
    case kWF32: return 4;
    case kWF16: case kWBF16: return 2;
    case kWQ8_0: return 34;
    case kWQ4_0: case kWW4G32: return 18;
    case kWQ4_K: return 144;
    case kWQ6_K: return 210;
    default: return 0;
  }
}

// The 6-bit scale and min of sub-block s of a Q4_K block's 12 packed scale bytes (block_fields.h).
G4_HD void ScaleMinQ4K(const uint8_t* sc, int s, int* scale, int* min) {
  if (s < 4) {
    *scale = sc[s] & 63;
    *min = sc[s + 4] & 63;
  } else {
    *scale = (sc[s + 4] & 0x0f) | ((sc[s - 4] >> 6) << 4);
    *min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
  }
}

// Elements 32c .. 32c+31 of a row of format F (row: the row's first byte) into y[0..31].
template <int F>
G4_HD void DecodeChunk32(const uint8_t* row, int c, float* y) {
  if constexpr (F == kWF32) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t* p = row + 4 * (32 * c + l);
      y[l] = BitsToF32(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                       (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24));
    }
  } else if constexpr (F == kWF16 || F == kWBF16) {
    for (int l = 0; l < 32; ++l) {
      const uint16_t h = Load16(row + 2 * (32 * c + l));
      y[l] = F == kWF16 ? HalfBitsToF32(h) : Bf16BitsToF32(h);
    }
  } else if constexpr (F == kWQ8_0) {
    const uint8_t* b = row + 34 * c;
    const float d = HalfBitsToF32(Load16(b));
    for (int l = 0; l < 32; ++l) y[l] = Mul(static_cast<float>(static_cast<int8_t>(b[2 + l])), d);
  } else if constexpr (F == kWQ4_0 || F == kWW4G32) {
    const uint8_t* b = row + 18 * c;
    const float d = F == kWQ4_0 ? HalfBitsToF32(Load16(b)) : Bf16BitsToF32(Load16(b));
    for (int l = 0; l < 16; ++l) {
      y[l] = Mul(d, static_cast<float>(static_cast<int>(b[2 + l] & 0x0f) - 8));
      y[l + 16] = Mul(d, static_cast<float>(static_cast<int>(b[2 + l] >> 4) - 8));
    }
  } else if constexpr (F == kWQ4_K) {
    const uint8_t* b = row + 144 * (c / 8);
    const int s = c % 8;
    int sc, mn;
    ScaleMinQ4K(b + 4, s, &sc, &mn);
    const float ds = Mul(HalfBitsToF32(Load16(b)), static_cast<float>(sc));
    const float dm = Mul(HalfBitsToF32(Load16(b + 2)), static_cast<float>(mn));
    const uint8_t* q = b + 16 + 32 * (s / 2);
    const int shift = (s % 2) * 4;
    for (int l = 0; l < 32; ++l) y[l] = Sub(Mul(ds, static_cast<float>((q[l] >> shift) & 0x0f)), dm);
  } else if constexpr (F == kWQ6_K) {
    // Element e = 128 h + r: low 4 bits nibble r / 64 of ql[64 h + r % 64], top 2 bits field
    // r / 32 of qh[32 h + r % 32]; scale scales[e / 16].
    const uint8_t* b = row + 210 * (c / 8);
    const float d = HalfBitsToF32(Load16(b + 208));
    const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
    for (int l = 0; l < 32; ++l) {
      const int e = 32 * (c % 8) + l, h = e / 128, r = e % 128;
      const int lo = (b[64 * h + r % 64] >> (4 * (r / 64))) & 0x0f;
      const int hi = (b[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 0x03;
      y[l] = Mul(Mul(d, static_cast<float>(scales[e / 16])), static_cast<float>((lo | (hi << 4)) - 32));
    }
  }
}

// The cache slot of absolute position `pos` in a layer's KV cache of `slots` rows: a ring
// (pos % slots) on a sliding layer (window > 0), else the position (runtime/kv_cache.h).
G4_HD int KvSlot(int pos, int window, int slots) { return window > 0 ? pos % slots : pos; }
// The first key position a query at `pos` attends to: pos - window + 1 on a sliding layer, else 0.
G4_HD int FirstKey(int pos, int window) { return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0; }
// Whether step token t's K/V row is stored by KvWrite: on a ring, a later token of the same step
// and sequence (t + slots, same sequence: positions are consecutive) takes the same slot and wins.
G4_HD bool KvRowSurvives(int t, int tokens, const int32_t* seq_ids, int window, int slots) {
  return !(window > 0 && t + slots < tokens && seq_ids[t + slots] == seq_ids[t]);
}

}  // namespace g4::cuda
