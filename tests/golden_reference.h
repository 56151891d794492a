// The golden fixtures' references (tests/golden/<fixture>/reference.safetensors, made by
// tools/make_golden.py) and the comparisons every backend's golden tests make against them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "model/safetensors.h"

namespace g4::golden {

// max|engine - reference| <= kRelTol * max|reference| per tensor (golden_test.cc says why).
inline constexpr double kRelTol = 1e-4;

// A test parameter is a fixture name, or "<fixture>+gguf" for the same weights converted to GGUF by
// llama.cpp's own converter (tools/convert_golden_to_gguf.py): same reference, other loader.
inline std::string FixtureDir(const std::string& param) {
  return std::string(GEMMA4RT_TEST_DATA_DIR) + "/golden/" + param.substr(0, param.find('+'));
}
inline std::string ModelPath(const std::string& param) {
  return param.find("+gguf") != std::string::npos ? FixtureDir(param) + "/model-f32.gguf" : FixtureDir(param);
}

struct Reference {
  std::unique_ptr<SafetensorsStore> store;
  std::vector<int32_t> ids;
  // The tensor `name` as f32 values; empty where the reference has none.
  std::vector<float> Get(const std::string& name) const {
    const Tensor* t = store ? store->Find(name) : nullptr;
    if (t == nullptr) return {};
    std::vector<float> v(t->numel());
    for (int64_t i = 0; i < t->numel(); ++i) v[i] = t->GetF32(i);
    return v;
  }
};

inline Reference LoadReference(const std::string& fixture) {
  Reference r;
  auto s = SafetensorsStore::OpenFile(FixtureDir(fixture) + "/reference.safetensors");
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return r;
  r.store = std::move(s).value();
  const Tensor* ids = r.store->Find("input_ids");
  EXPECT_NE(ids, nullptr);
  if (ids)
    for (int64_t i = 0; i < ids->numel(); ++i) r.ids.push_back(static_cast<int32_t>(ids->GetF32(i)));
  return r;
}

// max|a-b| / max|b|; infinity where the sizes differ or b is empty.
inline double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  if (a.size() != b.size() || b.empty()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return num / std::max(den, 1e-30);
}

// The index of each row's largest value, x [rows, cols].
inline std::vector<int> ArgmaxRows(const std::vector<float>& x, int cols) {
  std::vector<int> out;
  for (size_t r = 0; r * cols < x.size(); ++r)
    out.push_back(static_cast<int>(std::max_element(x.begin() + r * cols, x.begin() + (r + 1) * cols) - (x.begin() + r * cols)));
  return out;
}

}  // namespace g4::golden
