// Helpers of the CUDA backend's GPU tests: random tensors of every weight format, one step of a
// graph on any backend, and the skip where the machine has no CUDA device.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "graph/graph.h"
#include "runtime/backend.h"
#include "tensor/dtype.h"
#include "tensor/quantize.h"

#define G4_REQUIRE_CUDA_DEVICE() \
  if (::g4::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device"

namespace g4::cuda_test {

// Tensors with their bytes at stable addresses.
class TensorPool {
 public:
  explicit TensorPool(uint32_t seed) : rng_(seed) {}
  // Random values in [-1, 1) stored as `t`: F32/F16/BF16 rounded, Q8_0/Q4_0/W4G32 quantised,
  // Q4_K/Q6_K random quant bytes with scales of about 1/64 (no quantiser for those here).
  const Tensor* Random(std::vector<int64_t> shape, DType t = DType::kF32) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const int64_t K = shape.back(), rows = n / K;
    Entry& e = entries_.emplace_back();
    e.bytes.resize(rows * DTypeRowBytes(t, K));
    std::uniform_real_distribution<float> u(-1, 1);
    if (t == DType::kQ4_K || t == DType::kQ6_K) {
      for (auto& b : e.bytes) b = static_cast<uint8_t>(rng_());
      const size_t bb = DTypeBlockBytes(t);
      for (size_t i = 0; i < e.bytes.size() / bb; ++i) {
        uint8_t* blk = e.bytes.data() + i * bb;
        auto put = [&](uint8_t* p) {
          const uint16_t h = F32ToF16(std::ldexp(0.5f + 0.5f * std::abs(u(rng_)), t == DType::kQ4_K ? -9 : -11));
          p[0] = h & 0xff, p[1] = h >> 8;
        };
        if (t == DType::kQ4_K) put(blk), put(blk + 2);
        else put(blk + 208);
      }
    } else {
      std::vector<float> v(n);
      for (float& x : v) x = u(rng_);
      for (int64_t r = 0; r < rows; ++r) {
        uint8_t* dst = e.bytes.data() + r * DTypeRowBytes(t, K);
        const float* src = v.data() + r * K;
        if (t == DType::kF32) std::memcpy(dst, src, 4 * K);
        else if (t == DType::kF16 || t == DType::kBF16)
          for (int64_t j = 0; j < K; ++j) {
            const uint16_t h = t == DType::kF16 ? F32ToF16(src[j]) : F32ToBf16(src[j]);
            std::memcpy(dst + 2 * j, &h, 2);
          }
        else EXPECT_TRUE(QuantizeRow(t, src, dst, K));
      }
    }
    e.t.name = "t";
    e.t.name += std::to_string(entries_.size());
    e.t.dtype = t;
    e.t.shape = std::move(shape);
    e.t.data = e.bytes.data();
    e.t.nbytes = e.bytes.size();
    return &e.t;
  }
  std::mt19937& rng() { return rng_; }

 private:
  struct Entry {
    std::vector<uint8_t> bytes;
    Tensor t;
  };
  std::deque<Entry> entries_;
  std::mt19937 rng_;
};

struct Step {
  std::vector<int32_t> tokens, positions, seq_ids, out_rows;
};

// Runs one step of `g` on `exe`'s backend and returns every export; advances the cache lengths.
inline std::map<std::string, std::vector<float>> RunStep(Backend& backend, const Graph& g, const Step& s, KvCacheBase& cache) {
  std::map<std::string, std::vector<float>> out;
  auto exe = backend.Compile(g, static_cast<int>(s.tokens.size()), static_cast<int>(s.out_rows.size()));
  EXPECT_TRUE(exe.ok()) << exe.status().ToString();
  if (!exe.ok()) return out;
  const Status st = (*exe)->Run({s.tokens, s.positions, s.seq_ids, s.out_rows}, cache);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (!st.ok()) return out;
  for (const Node& n : g.nodes()) {
    if (n.name.empty()) continue;
    OutputView v = (*exe)->Output(n.name);
    out[n.name].assign(v.data, v.data + static_cast<size_t>(v.rows) * v.cols);
  }
  for (size_t t = 0; t < s.tokens.size(); ++t)
    cache.set_length(s.seq_ids[t], std::max(cache.length(s.seq_ids[t]), s.positions[t] + 1));
  return out;
}

// max |a - b| / max |b| (0 for two empty arrays; 1 on a size mismatch).
inline double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 1;
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, static_cast<double>(std::abs(a[i] - b[i])));
    den = std::max(den, static_cast<double>(std::abs(b[i])));
  }
  return num / den;
}

}  // namespace g4::cuda_test
