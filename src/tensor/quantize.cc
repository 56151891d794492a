#include "tensor/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/check.h"

// Same reason as dequant.cc: x * id + 8.5 must round twice, as in ggml's C and numpy.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace g4 {
namespace {

void PutU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v & 0xff);
  p[1] = static_cast<uint8_t>(v >> 8);
}

void QuantQ8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  PutU16(b, F32ToF16(d));
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));
}

void QuantQ4_0(const float* x, uint8_t* b) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  PutU16(b, F32ToF16(d));
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
    const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
    b[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

void QuantW4G32(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const uint16_t sb = F32ToBf16(amax / 7.5f);
  const float s = Bf16ToF32(sb);
  PutU16(b, sb);
  auto q = [&](float v) {
    if (s == 0.0f) return 8;
    const float r = std::nearbyint(v / s);  // default rounding mode: half to even, as torch.round
    return static_cast<int>(std::clamp(r, -8.0f, 7.0f)) + 8;
  };
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(q(x[j]) | (q(x[j + 16]) << 4));
}

}  // namespace

bool QuantizeRow(DType t, const float* x, uint8_t* out, size_t n) {
  void (*fn)(const float*, uint8_t*) = nullptr;
  switch (t) {
    case DType::kQ8_0: fn = QuantQ8_0; break;
    case DType::kQ4_0: fn = QuantQ4_0; break;
    case DType::kW4G32: fn = QuantW4G32; break;
    default: return false;
  }
  G4_CHECK(n % 32 == 0);
  const size_t bytes = DTypeBlockBytes(t);
  for (size_t i = 0; i < n / 32; ++i) fn(x + 32 * i, out + i * bytes);
  return true;
}

bool Q4_0x4Packable(DType t, const std::vector<int64_t>& shape) {
  return t == DType::kQ4_0 && shape.size() == 2 && shape[0] % 4 == 0;
}

void PackQ4_0x4InPlace(uint8_t* data, int64_t M, int64_t K) {
  const size_t nb = static_cast<size_t>(K / 32), row = nb * 18;
  std::vector<uint8_t> rows(4 * row);
  for (int64_t g = 0; g < M / 4; ++g) {
    uint8_t* group = data + static_cast<size_t>(g) * 4 * row;
    std::memcpy(rows.data(), group, 4 * row);
    for (size_t b = 0; b < nb; ++b) {
      for (size_t i = 0; i < 4; ++i) {
        const uint8_t* blk = rows.data() + i * row + b * 18;
        std::memcpy(group + 8 * b + 2 * i, blk, 2);
        std::memcpy(group + 8 * nb + 64 * b + 16 * i, blk + 2, 16);
      }
    }
  }
}

void UnpackQ4_0x4Group(const uint8_t* group, int64_t K, uint8_t* rows) {
  const size_t nb = static_cast<size_t>(K / 32), row = nb * 18;
  for (size_t b = 0; b < nb; ++b) {
    for (size_t i = 0; i < 4; ++i) {
      uint8_t* blk = rows + i * row + b * 18;
      std::memcpy(blk, group + 8 * b + 2 * i, 2);
      std::memcpy(blk + 2, group + 8 * nb + 64 * b + 16 * i, 16);
    }
  }
}

}  // namespace g4
