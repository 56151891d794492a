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
#include "../tensor_pool.h"

#define G4_REQUIRE_CUDA_DEVICE() \
  if (::g4::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device"

namespace g4::cuda_test {

using test_util::TensorPool;

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
