// SPMD over a device mesh (src/backends/xla/mesh.h, shard_plan.h) on XLA's CPU plugin exposing 8
// devices (cpu_device_count): mesh parsing and its errors, HloSharding strings and host shards,
// a sharded matmul at the PJRT level, and golden fixtures on meshes 1x2, 1x4, 2x2 and 4x1 against
// the same transformers references as one device (1e-4 of the largest value per tensor).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "backends/xla/compile_options.h"
#include "backends/xla/mesh.h"
#include "backends/xla/shard_plan.h"
#include "backends/xla/sharded_buffers.h"
#include "backends/xla/xla_backend.h"
#include "model/gemma.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "golden_check.h"
#include "golden_reference.h"
#include "xla/xla_test_util.h"

namespace g4 {
namespace {

using namespace golden;
using xla::Mesh;
using xla::TensorSplit;

TEST(MeshTest, ParsesAxesInEitherOrder) {
  auto m = xla::ParseMesh("data=2,model=4");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->data, 2);
  EXPECT_EQ(m->model, 4);
  m = xla::ParseMesh("model=3");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->data, 1);
  EXPECT_EQ(m->model, 3);
  m = xla::ParseMesh("model=2,data=1");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->ToString(), "data=1,model=2");
  auto d = xla::MeshOfDevices(4);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->ToString(), "data=1,model=4");
}

TEST(MeshTest, RefusesMalformedMeshesWithTheReason) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "empty"},
      {"data=2,", "'' is not AXIS=SIZE"},
      {"model", "'model' is not AXIS=SIZE"},
      {"model=0", "the size of 'model' must be at least 1"},
      {"model=x", "the size of 'model' is not a number"},
      {"model=2x", "the size of 'model' is not a number"},
      {"data=2,data=2", "data given twice"},
      {"rows=2", "unknown axis 'rows' (the axes are data and model)"},
      {"data=64,model=65", "more than 4096 devices"},
      {"data=65536,model=65536", "more than 4096 devices"},
  };
  for (const auto& [text, why] : cases) {
    auto m = xla::ParseMesh(text);
    ASSERT_FALSE(m.ok()) << text;
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find(why), std::string::npos) << m.status().message();
  }
  EXPECT_FALSE(xla::MeshOfDevices(0).ok());
  EXPECT_EQ(xla::MeshOfDevices(9999).status().message(), "--devices must be at most 4096, got 9999");
  EXPECT_EQ(xla::MeshOfDevices(4096)->model, 4096);
  Status s = xla::CheckMeshFits(Mesh{2, 4}, 4, "cpu");
  EXPECT_EQ(s.message(), "--mesh data=2,model=4 needs 8 devices; the cpu PJRT client has 4");
  EXPECT_TRUE(xla::CheckMeshFits(Mesh{2, 2}, 4, "cpu").ok());
}

TEST(MeshTest, HloShardingListsDevicesDataMajor) {
  const Mesh m22{2, 2}, m14{1, 4}, m41{4, 1};
  EXPECT_EQ(xla::HloSharding(m14, 2, {-1, -1}), "{replicated}");
  EXPECT_EQ(xla::HloSharding(m14, 2, {-1, 0}), "{devices=[4,1]0,1,2,3}");
  EXPECT_EQ(xla::HloSharding(m14, 2, {-1, 1}), "{devices=[1,4]0,1,2,3}");
  EXPECT_EQ(xla::HloSharding(m41, 2, {-1, 0}), "{replicated}");  // a model axis of 1 splits nothing
  EXPECT_EQ(xla::HloSharding(m41, 3, {0, -1}), "{devices=[4,1,1]0,1,2,3}");
  // Device d * 2 + m; model splits dim 1, replicated over data.
  EXPECT_EQ(xla::HloSharding(m22, 2, {-1, 1}), "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}");
  EXPECT_EQ(xla::HloSharding(m22, 3, {0, -1}), "{devices=[2,1,1,2]0,1,2,3 last_tile_dim_replicate}");
  EXPECT_EQ(xla::HloSharding(m22, 3, {0, 2}), "{devices=[2,1,2]0,1,2,3}");
}

TEST(MeshTest, CopyShardTakesEachDevicesSlice) {
  std::vector<int32_t> x(2 * 4 * 6);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<int32_t>(i);
  const std::vector<int64_t> dims{2, 4, 6};
  const Mesh m{2, 2};
  const TensorSplit s{0, 2};  // dim 0 over data, dim 2 over model
  EXPECT_EQ(xla::ShardDims(m, dims, s), (std::vector<int64_t>{1, 4, 3}));
  std::vector<int32_t> got(12);
  xla::CopyShard(m, reinterpret_cast<const uint8_t*>(x.data()), dims, 4, s, 3, reinterpret_cast<uint8_t*>(got.data()));
  // device 3: d=1, m=1: x[1, :, 3:6]
  std::vector<int32_t> want;
  for (int j = 0; j < 4; ++j)
    for (int k = 3; k < 6; ++k) want.push_back(24 + j * 6 + k);
  EXPECT_EQ(got, want);
}

std::unique_ptr<xla::Client> EightDeviceClient() {
  auto plugin = xla::Plugin::Load(xla::testing_util::PluginPath());
  EXPECT_TRUE(plugin.ok()) << plugin.status().message();
  if (!plugin.ok()) return nullptr;
  auto c = xla::Client::Create(*plugin, {{"cpu_device_count", int64_t{8}}});
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? std::move(*c) : nullptr;
}

// y[2,4] = x[2,8] . w[4,8]^T with w's rows over model=4 (column-parallel) and over 2x2.
TEST(MeshPjrtTest, ShardedMatmulRunsOnEveryDeviceAndReplicatesItsResult) {
  G4_REQUIRE_PJRT_PLUGIN();
  auto client = EightDeviceClient();
  ASSERT_NE(client, nullptr);
  ASSERT_EQ(client->num_devices(), 8);
  std::vector<float> x(16), w(32), want(8, 0);
  for (int i = 0; i < 16; ++i) x[i] = static_cast<float>(i % 5) - 2;
  for (int i = 0; i < 32; ++i) w[i] = 0.5f * static_cast<float>(i % 7) - 1;
  for (int r = 0; r < 2; ++r)
    for (int n = 0; n < 4; ++n)
      for (int k = 0; k < 8; ++k) want[r * 4 + n] += x[r * 8 + k] * w[n * 8 + k];
  for (const Mesh mesh : {Mesh{1, 4}, Mesh{2, 2}, Mesh{1, 2}}) {
    const TensorSplit split{-1, 0};
    xla::Builder b;
    b.SetNumPartitions(mesh.size());
    xla::Value px = b.Param({2, 8}, xla::ElemType::kF32), pw = b.Param({4, 8}, xla::ElemType::kF32);
    b.ShardParam(px, "{replicated}");
    b.ShardParam(pw, xla::HloSharding(mesh, 2, split));
    b.ShardResults({"{replicated}"});
    const std::string module = b.Module({b.Dot(px, pw, {}, {}, {1}, {1})});
    EXPECT_NE(module.find("mhlo.num_partitions = " + std::to_string(mesh.size()) + " : i32"), std::string::npos);
    xla::CompileOptions co;
    co.num_partitions = mesh.size();
    co.use_spmd_partitioning = true;
    auto exe = client->Compile(module, xla::SerializeCompileOptions(co));
    ASSERT_TRUE(exe.ok()) << exe.status().message() << "\n" << module;
    auto devices = (*exe)->AddressableDevices();
    ASSERT_TRUE(devices.ok());
    ASSERT_EQ(devices->size(), static_cast<size_t>(mesh.size()));
    for (int i = 0; i < mesh.size(); ++i) EXPECT_EQ(client->DeviceIndex((*devices)[i]), i);
    auto bx = xla::UploadShards(*client, mesh, x.data(), PJRT_Buffer_Type_F32, 4, {2, 8}, TensorSplit{});
    auto bw = xla::UploadShards(*client, mesh, w.data(), PJRT_Buffer_Type_F32, 4, {4, 8}, split);
    ASSERT_TRUE(bx.ok() && bw.ok());
    auto wd = (*bw)[0].Dimensions();
    ASSERT_TRUE(wd.ok());
    EXPECT_EQ(*wd, (std::vector<int64_t>{4 / mesh.model, 8}));  // each device holds only its shard
    std::vector<std::vector<PJRT_Buffer*>> args;
    for (int d = 0; d < mesh.size(); ++d) args.push_back({(*bx)[d].get(), (*bw)[d].get()});
    const int64_t keep[] = {0, 1};
    auto outs = (*exe)->ExecuteSharded(args, keep);
    ASSERT_TRUE(outs.ok()) << outs.status().message();
    for (int d = 0; d < mesh.size(); ++d) {
      std::vector<float> y(8);
      ASSERT_TRUE((*outs)[d][0].ToHost(y.data(), 32).ok());
      for (int i = 0; i < 8; ++i) EXPECT_NEAR(y[i], want[i], 1e-5) << "device " << d << " element " << i;
    }
  }
}

std::unique_ptr<Engine> MakeMeshEngine(const std::string& fixture, Mesh mesh, int chunk, int max_seqs) {
  XlaBackendOptions xo;
  xo.plugin_path = xla::testing_util::PluginPath();
  xo.client_options = {{"cpu_device_count", int64_t{8}}};
  xo.mesh = mesh;
  EngineOptions o;
  o.prefill_chunk = chunk;
  o.max_seqs = max_seqs;
  o.max_context = 64;
  return MakeEngineOn(ModelPath(fixture), MakeXlaBackend(xo), o);
}

struct MeshCase {
  std::string fixture;
  Mesh mesh;
};

class XlaMeshGoldenTest : public ::testing::TestWithParam<MeshCase> {};

// One-shot prefill, chunked prefill (chunks of 9 across the window of 8) and token-by-token
// decode of the last tokens, each against the one-device reference logits.
TEST_P(XlaMeshGoldenTest, PrefillChunkedAndDecodeMatchTheReference) {
  G4_REQUIRE_PJRT_PLUGIN();
  const MeshCase& c = GetParam();
  Reference ref = LoadReference(c.fixture);
  const int seqs = std::max(c.mesh.data, 2);
  auto engine = MakeMeshEngine(c.fixture, c.mesh, 1 << 20, seqs);
  ASSERT_NE(engine, nullptr);
  ExpectOneShotPrefillMatches(*engine, ref, /*layers=*/false);

  auto chunked = MakeMeshEngine(c.fixture, c.mesh, 9, seqs);
  ASSERT_NE(chunked, nullptr);
  // The last 4 tokens decoded in the last data shard's slot.
  ExpectDecodeMatches(*chunked, ref, ref.ids.size() - 4, kRelTol, /*argmax=*/true, /*seq=*/seqs - 1);
}

// A representative fixture set per mesh (every mesh costs a compile per step shape): GQA with 2 KV
// heads (split at model=2), 1 KV head with PLE and shared KV (replicated), 8 experts (split by
// expert), W4G32 blocks (split by rows and by blocks).
std::vector<MeshCase> MeshCases() {
  const std::pair<const char*, Mesh> cases[] = {
      {"gemma3-tiny", Mesh{1, 2}},         {"gemma3-tiny", Mesh{2, 2}},           {"gemma4-e2b-tiny", Mesh{1, 4}},
      {"gemma4-e2b-tiny", Mesh{4, 1}},     {"gemma4-26b-a4b-tiny", Mesh{1, 2}},   {"gemma4-26b-a4b-tiny", Mesh{2, 2}},
      {"gemma4-31b-tiny-w4a16", Mesh{1, 4}},
  };
  std::vector<MeshCase> out;
  for (const auto& [f, m] : cases)
    if (std::filesystem::exists(FixtureDir(f) + "/reference.safetensors")) out.push_back({f, m});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Meshes, XlaMeshGoldenTest, ::testing::ValuesIn(MeshCases()), [](const auto& info) {
  std::string s = info.param.fixture + "_" + std::to_string(info.param.mesh.data) + "x" + std::to_string(info.param.mesh.model);
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
});

// Sequences in different data shards decoded in one batch give each one's own logits.
TEST(XlaMeshBatchTest, BatchedDecodeOnTwoByTwoMatchesEachSequenceAlone) {
  G4_REQUIRE_PJRT_PLUGIN();
  Reference ref = LoadReference("gemma3-tiny");
  auto engine = MakeMeshEngine("gemma3-tiny", Mesh{2, 2}, 8, 4);
  ASSERT_NE(engine, nullptr);
  ExpectBatchedDecodeMatches(*engine, ref, {11, 4, 17, 9}, {3, 0, 2, 1}, kRelTol, /*steps=*/3);
}

// Meshes that cannot run are refused with the reason before any step.
TEST(XlaMeshErrorsTest, InvalidMeshesAreRefusedWithMessages) {
  G4_REQUIRE_PJRT_PLUGIN();
  XlaBackendOptions xo;
  xo.plugin_path = xla::testing_util::PluginPath();
  xo.client_options = {{"cpu_device_count", int64_t{4}}};
  xo.mesh = Mesh{2, 4};
  auto too_many = MakeXlaBackend(xo);
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("--mesh data=2,model=4 needs 8 devices; the cpu PJRT client has 4"),
            std::string::npos)
      << too_many.status().message();

  // Without a device count given, XLA's CPU plugin is not asked for more than 1024 devices.
  xo.client_options = {};
  xo.mesh = Mesh{2, 1000};
  auto too_many_cpu = MakeXlaBackend(xo);
  ASSERT_FALSE(too_many_cpu.ok());
  EXPECT_EQ(too_many_cpu.status().message(),
            "--mesh data=2,model=1000 needs 2000 devices; XLA's CPU plugin is given at most 1024");
  xo.client_options = {{"cpu_device_count", int64_t{4}}};

  // model=3 divides no head count (4), MLP width (128), vocabulary (512).
  xo.mesh = Mesh{1, 3};
  EngineOptions o;
  o.max_seqs = 2;
  o.max_context = 64;
  auto e = CreateEngine(ModelPath("gemma3-tiny"), MakeXlaBackend(xo), o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("the model axis divides no weight of this model"), std::string::npos)
      << e.status().message();

  // data=2 with 3 sequence slots.
  xo.mesh = Mesh{2, 1};
  o.max_seqs = 3;
  auto e2 = CreateEngine(ModelPath("gemma3-tiny"), MakeXlaBackend(xo), o);
  ASSERT_FALSE(e2.ok());
  EXPECT_NE(e2.status().message().find("3 slot(s) do not divide by data=2"), std::string::npos) << e2.status().message();
}

// The memory plan is per device: a model too big for one device starts on a mesh where each
// device's shard fits, and is refused with the per-device arithmetic where it does not.
TEST(XlaMeshErrorsTest, MemoryPlanIsCheckedPerDevice) {
  G4_REQUIRE_PJRT_PLUGIN();
  auto m = LoadModel(ModelPath("gemma3-tiny"));
  ASSERT_TRUE(m.ok());
  size_t whole = 0;
  for (const Tensor* t : xla::GraphWeights(BuildGemmaGraph((*m)->config, (*m)->weights, GraphOptions{true}))) whole += t->nbytes;
  const size_t kv = 2 * KvCache::BytesPerSequence((*m)->config, 64, DType::kF32);
  XlaBackendOptions xo;
  xo.plugin_path = xla::testing_util::PluginPath();
  xo.client_options = {{"cpu_device_count", int64_t{4}}};
  xo.device_memory_bytes = static_cast<int64_t>((whole + kv) * 3 / 4);  // one device: too small
  EngineOptions o;
  o.max_seqs = 2;
  o.max_context = 64;
  {
    auto e = CreateEngine(ModelPath("gemma3-tiny"), MakeXlaBackend(xo), o);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(e.status().message().find("weights " + std::to_string(whole) + " bytes + KV cache " + std::to_string(kv)),
              std::string::npos)
        << e.status().message();
  }
  xo.mesh = Mesh{1, 4};
  auto b4 = MakeXlaBackend(xo);
  ASSERT_TRUE(b4.ok());
  EXPECT_TRUE(Engine::Create(std::move(*m), std::move(*b4), o).ok());
  // Too small even split four ways: refused per device.
  xo.device_memory_bytes = static_cast<int64_t>(whole / 8);
  auto e = CreateEngine(ModelPath("gemma3-tiny"), MakeXlaBackend(xo), o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("does not fit on each device of the mesh data=1,model=4: weights "),
            std::string::npos)
      << e.status().message();
}

// The per-device plan: what is split, what is replicated and why.
TEST(XlaMeshPlanTest, PlanSplitsHeadsMlpAndVocabAndNamesWhatIsReplicated) {
  auto m = LoadModel(ModelPath("gemma4-e2b-tiny"));
  ASSERT_TRUE(m.ok());
  const Graph g = BuildGemmaGraph((*m)->config, (*m)->weights, GraphOptions{});
  auto plan = xla::PlanShards(g, Mesh{1, 2}, 2);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const LayerWeights& l0 = (*m)->weights.layers[0];
  EXPECT_EQ(plan->Weight(l0.q_proj), (TensorSplit{-1, 0}));
  EXPECT_EQ(plan->Weight(l0.o_proj), (TensorSplit{-1, 1}));
  EXPECT_EQ(plan->Weight(l0.gate_proj), (TensorSplit{-1, 0}));
  EXPECT_EQ(plan->Weight(l0.up_proj), (TensorSplit{-1, 0}));
  EXPECT_EQ(plan->Weight(l0.down_proj), (TensorSplit{-1, 1}));
  EXPECT_EQ(plan->Weight(l0.k_proj), TensorSplit{});  // one KV head
  EXPECT_EQ(plan->Weight(l0.input_norm), TensorSplit{});
  EXPECT_EQ(plan->Weight((*m)->weights.lm_head), (TensorSplit{-1, 0}));
  EXPECT_EQ(plan->Cache(0), TensorSplit{});
  ASSERT_FALSE(plan->notes.empty());
  EXPECT_NE(plan->notes.back().find("KV head count that does not divide by model=2"), std::string::npos) << plan->notes.back();
  auto dp = xla::PlanShards(g, Mesh{2, 2}, 4);
  ASSERT_TRUE(dp.ok());
  EXPECT_EQ(dp->Cache(0), (TensorSplit{0, -1}));
}

}  // namespace
}  // namespace g4
