// Test helpers for the XLA backend: the CPU plugin from GEMMA4RT_PJRT_PLUGIN, owned random
// tensors, and one step of a graph run through LowerGraph with host mirrors of the KV cache.
#pragma once

#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backends/xla/compile_options.h"
#include "backends/xla/lower.h"
#include "backends/xla/pjrt.h"
#include "tensor/dtype.h"
#include "tensor/quantize.h"
#include "tensor/tensor.h"
#include "../tensor_pool.h"

namespace g4::xla::testing_util {

inline std::string PluginPath() {
  const char* p = std::getenv("GEMMA4RT_PJRT_PLUGIN");
  return p ? p : "";
}

// Client create options for the plugin under test: `cpu_devices` devices of XLA's CPU plugin
// (cpu_device_count); for JAX's CUDA plugin no preallocation (a test binary holds several clients
// at once, each of which would otherwise take 75% of the GPU); none for another plugin (plugins
// refuse options they do not know).
inline std::vector<NamedOption> ClientOptions(int64_t cpu_devices = 1) {
  if (PluginPath().find("cuda") != std::string::npos) return {{"preallocate", false}};
  if (PluginPath().find("cpu") == std::string::npos) return {};
  return {{"cpu_device_count", cpu_devices}};
}

#define G4_REQUIRE_PJRT_PLUGIN() \
  if (::g4::xla::testing_util::PluginPath().empty()) {                                                  \
    GTEST_SKIP() << "GEMMA4RT_PJRT_PLUGIN is not set (scripts/setup-xla.sh)";                        \
  }                                                                                                     \
  static_assert(true)

// One client per test binary (the plugin is loaded once anyway).
inline Client* SharedClient() {
  static std::unique_ptr<Client> client = [] {
    auto plugin = Plugin::Load(PluginPath());
    if (!plugin.ok()) {
      ADD_FAILURE() << plugin.status().message();
      return std::unique_ptr<Client>();
    }
    auto c = Client::Create(*plugin, ClientOptions(1));
    if (!c.ok()) {
      ADD_FAILURE() << c.status().message();
      return std::unique_ptr<Client>();
    }
    return std::move(*c);
  }();
  return client.get();
}

using test_util::TensorPool;

inline PJRT_Buffer_Type PjrtType(DType t) {
  switch (t) {
    case DType::kF16: return PJRT_Buffer_Type_F16;
    case DType::kBF16: return PJRT_Buffer_Type_BF16;
    case DType::kI32: return PJRT_Buffer_Type_S32;
    case DType::kI8: return PJRT_Buffer_Type_S8;
    case DType::kF8E4M3: return PJRT_Buffer_Type_F8E4M3FN;
    default: return PJRT_Buffer_Type_F32;
  }
}

struct StepInputs {
  std::vector<int32_t> tokens, positions, seq_ids, out_rows, kv_len, kv_end;
};

// Host mirrors of the device KV cache: K and V bytes of every StepShape::caches entry, and with an
// i8 or fp8 cache their f32 scales [max_seqs, slots, heads] (ks, vs; empty otherwise).
struct HostCache {
  std::vector<std::vector<uint8_t>> k, v;
  std::vector<std::vector<float>> ks, vs;
};

inline HostCache ZeroCache(const StepShape& sh) {
  HostCache c;
  for (const CacheLayer& l : sh.caches) {
    const size_t rows = static_cast<size_t>(sh.max_seqs) * l.slots, n = rows * l.width * DTypeSize(sh.kv_type);
    c.k.emplace_back(n, 0);
    c.v.emplace_back(n, 0);
    if (KvBuffersPerLayer(sh.kv_type) == 2) continue;
    c.ks.emplace_back(rows * l.heads, 0.0f);
    c.vs.emplace_back(rows * l.heads, 0.0f);
  }
  return c;
}

// Lowers `graph` for `sh`, runs it once on the shared client and returns the exported outputs
// ([rows, cols] f32 by name); `cache` is uploaded before and replaced by the step's result.
inline std::map<std::string, std::vector<float>> RunXlaStep(const Graph& graph, const StepShape& sh,
                                                            const StepInputs& in, HostCache& cache) {
  std::map<std::string, std::vector<float>> result;
  Client* client = SharedClient();
  if (client == nullptr) return result;
  auto low = LowerGraph(graph, sh);
  EXPECT_TRUE(low.ok()) << low.status().message();
  if (!low.ok()) return result;
  auto exe = client->Compile(low->module, SerializeCompileOptions());
  EXPECT_TRUE(exe.ok()) << exe.status().message() << "\n" << low->module;
  if (!exe.ok()) return result;
  std::vector<Buffer> bufs;
  auto up = [&](const void* data, DType t, std::vector<int64_t> dims) {
    auto b = client->Upload(data, PjrtType(t), dims);
    EXPECT_TRUE(b.ok()) << b.status().message();
    bufs.push_back(b.ok() ? std::move(*b) : Buffer());
  };
  const int64_t T = sh.tokens, R = sh.output_rows, S = sh.max_seqs;
  EXPECT_EQ(in.tokens.size(), static_cast<size_t>(T));
  EXPECT_EQ(in.out_rows.size(), static_cast<size_t>(R));
  up(in.tokens.data(), DType::kI32, {T});
  up(in.positions.data(), DType::kI32, {T});
  up(in.seq_ids.data(), DType::kI32, {T});
  up(in.out_rows.data(), DType::kI32, {R});
  up(in.kv_len.data(), DType::kI32, {S});
  up(in.kv_end.data(), DType::kI32, {S});
  std::vector<std::vector<float>> converted;
  for (size_t i = 0; i < low->weights.size(); ++i) {
    const Tensor* t = low->weights[i];
    if (IsDeviceQuantised(t->dtype)) {
      auto b = client->Upload(t->data, PJRT_Buffer_Type_U8, DeviceShape(*t));
      EXPECT_TRUE(b.ok()) << b.status().message();
      bufs.push_back(b.ok() ? std::move(*b) : Buffer());
    } else if (low->weight_types[i] == t->dtype) {
      up(t->data, t->dtype, t->shape);
    } else {
      auto& f = converted.emplace_back(t->numel());
      ConvertToF32(t->dtype, t->data, f.data(), f.size());
      up(f.data(), DType::kF32, t->shape);
    }
  }
  const bool i8 = KvBuffersPerLayer(sh.kv_type) == 4;  // scales follow K and V (i8, fp8)
  for (size_t i = 0; i < sh.caches.size(); ++i) {
    const std::vector<int64_t> dims{S, sh.caches[i].slots, sh.caches[i].width};
    up(cache.k[i].data(), sh.kv_type, dims);
    up(cache.v[i].data(), sh.kv_type, dims);
    if (!i8) continue;
    const std::vector<int64_t> sdims{S, sh.caches[i].slots, sh.caches[i].heads};
    up(cache.ks[i].data(), DType::kF32, sdims);
    up(cache.vs[i].data(), DType::kF32, sdims);
  }
  const size_t cache_bufs = static_cast<size_t>(KvBuffersPerLayer(sh.kv_type)) * sh.caches.size();
  EXPECT_EQ(low->num_params(), static_cast<int>(bufs.size()));
  std::vector<PJRT_Buffer*> args;
  std::vector<int64_t> keep;
  for (size_t i = 0; i < bufs.size(); ++i) {
    args.push_back(bufs[i].get());
    if (i < bufs.size() - cache_bufs) keep.push_back(static_cast<int64_t>(i));
  }
  auto outs = (*exe)->Execute(args, keep);
  EXPECT_TRUE(outs.ok()) << outs.status().message();
  if (!outs.ok()) return result;
  // The donated cache buffers are invalid now (their storage became the new caches): destroy the handles.
  for (size_t i = bufs.size() - cache_bufs; i < bufs.size(); ++i) bufs[i].Reset();
  const auto& nodes = graph.nodes();
  size_t j = 0;
  for (const auto& [name, id] : low->outputs) {
    const int64_t rows = nodes[id].rows == Rows::kTokens ? T : R;
    std::vector<float> v(rows * nodes[id].cols);
    EXPECT_TRUE((*outs)[j++].ToHost(v.data(), v.size() * 4).ok());
    result[name] = std::move(v);
  }
  for (size_t i = 0; i < sh.caches.size(); ++i) {
    EXPECT_TRUE((*outs)[j++].ToHost(cache.k[i].data(), cache.k[i].size()).ok());
    EXPECT_TRUE((*outs)[j++].ToHost(cache.v[i].data(), cache.v[i].size()).ok());
    if (!i8) continue;
    EXPECT_TRUE((*outs)[j++].ToHost(cache.ks[i].data(), cache.ks[i].size() * sizeof(float)).ok());
    EXPECT_TRUE((*outs)[j++].ToHost(cache.vs[i].data(), cache.vs[i].size() * sizeof(float)).ok());
  }
  return result;
}

// |a - b| <= atol + rtol |b| elementwise, with the first mismatch reported.
inline void ExpectNear(const float* a, const float* b, size_t n, float rtol, float atol, const std::string& what) {
  for (size_t i = 0; i < n; ++i) {
    if (!(std::abs(a[i] - b[i]) <= atol + rtol * std::abs(b[i]))) {
      ADD_FAILURE() << what << ": element " << i << " of " << n << ": xla " << a[i] << " vs cpu " << b[i];
      return;
    }
  }
}

}  // namespace g4::xla::testing_util
