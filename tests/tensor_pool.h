// Random tensors for the backends' op tests, with their bytes at stable addresses.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tensor/dtype.h"
#include "tensor/quantize.h"
#include "tensor/tensor.h"

namespace g4::test_util {

// Tensors with their bytes, at stable addresses.
class TensorPool {
 public:
  explicit TensorPool(uint32_t seed) : rng_(seed) {}
  // Random values in [lo, hi) stored as `dtype`: F32/F16/BF16 rounded, Q8_0/Q4_0/W4G32 quantised
  // (FromF32); Q4_K/Q6_K random quant bytes with scales of about 1/64 (no quantiser for those).
  const Tensor* Random(std::vector<int64_t> shape, DType dtype = DType::kF32, float lo = -1, float hi = 1) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    if (dtype == DType::kQ4_K || dtype == DType::kQ6_K) return RandomKQuant(std::move(shape), dtype);
    std::vector<float> v(n);
    std::uniform_real_distribution<float> u(lo, hi);
    for (float& x : v) x = u(rng_);
    return FromF32(std::move(shape), v, dtype);
  }
  const Tensor* FromF32(std::vector<int64_t> shape, const std::vector<float>& v, DType dtype = DType::kF32) {
    std::vector<uint8_t> bytes;
    if (DTypeSize(dtype) == 0) {  // a block type: each row of shape.back() elements quantised
      const int64_t K = shape.back(), rows = static_cast<int64_t>(v.size()) / K;
      bytes.resize(rows * DTypeRowBytes(dtype, K));
      for (int64_t r = 0; r < rows; ++r)
        EXPECT_TRUE(QuantizeRow(dtype, v.data() + r * K, bytes.data() + r * DTypeRowBytes(dtype, K), K));
    } else {
      bytes.resize(v.size() * DTypeSize(dtype));
      for (size_t i = 0; i < v.size(); ++i) {
        if (dtype == DType::kF32) std::memcpy(bytes.data() + 4 * i, &v[i], 4);
        else {
          const uint16_t h = dtype == DType::kF16 ? F32ToF16(v[i]) : F32ToBf16(v[i]);
          std::memcpy(bytes.data() + 2 * i, &h, 2);
        }
      }
    }
    return Stored(std::move(shape), dtype, std::move(bytes));
  }
  std::mt19937& rng() { return rng_; }

 private:
  const Tensor* RandomKQuant(std::vector<int64_t> shape, DType t) {
    const int64_t K = shape.back();
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
    std::vector<uint8_t> bytes(rows * DTypeRowBytes(t, K));
    for (auto& b : bytes) b = static_cast<uint8_t>(rng_());
    std::uniform_real_distribution<float> u(-1, 1);
    const size_t bb = DTypeBlockBytes(t);
    for (size_t i = 0; i < bytes.size() / bb; ++i) {
      uint8_t* blk = bytes.data() + i * bb;
      auto put = [&](uint8_t* p) {  // an f16 block scale (Q4_K: d and dmin; Q6_K: d at byte 208)
        const uint16_t h = F32ToF16(std::ldexp(0.5f + 0.5f * std::abs(u(rng_)), t == DType::kQ4_K ? -9 : -11));
        p[0] = h & 0xff, p[1] = h >> 8;
      };
      if (t == DType::kQ4_K) put(blk), put(blk + 2);
      else put(blk + 208);
    }
    return Stored(std::move(shape), t, std::move(bytes));
  }
  const Tensor* Stored(std::vector<int64_t> shape, DType t, std::vector<uint8_t> bytes) {
    auto& e = entries_.emplace_back();
    e.bytes = std::move(bytes);
    e.t.name = "t" + std::to_string(entries_.size());
    e.t.dtype = t;
    e.t.shape = std::move(shape);
    e.t.data = e.bytes.data();
    e.t.nbytes = e.bytes.size();
    return &e.t;
  }
  struct Entry {
    std::vector<uint8_t> bytes;
    Tensor t;
  };
  std::deque<Entry> entries_;
  std::mt19937 rng_;
};

}  // namespace g4::test_util
