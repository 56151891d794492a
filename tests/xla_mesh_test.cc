// SPMD over a device mesh (src/backends/xla/mesh.h, shard_plan.h) on XLA's CPU plugin exposing 8
// devices (cpu_device_count): mesh parsing and its errors, HloSharding strings and host shards,
// a sharded matmul at the PJRT level, and golden fixtures on meshes 1x2, 1x4, 2x2 and 4x1 against
// the same transformers references as one device (1e-4 of the largest value per tensor).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "backends/xla/compile_options.h"
#include "backends/xla/mesh.h"
#include "backends/xla/shard_plan.h"
#include "backends/xla/lower.h"
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

std::unique_ptr<Engine> MakeMeshEngine(const std::string& fixture, Mesh mesh, int chunk, int max_seqs,
                                       DType kv_type = DType::kF32) {
  XlaBackendOptions xo;
  xo.plugin_path = xla::testing_util::PluginPath();
  xo.client_options = {{"cpu_device_count", int64_t{8}}};
  xo.mesh = mesh;
  EngineOptions o;
  o.prefill_chunk = chunk;
  o.max_seqs = max_seqs;
  o.max_context = 64;
  o.kv_type = kv_type;
  return MakeEngineOn(ModelPath(fixture), MakeXlaBackend(xo), o);
}

struct MeshCase {
  std::string fixture;
  Mesh mesh;
};

class XlaMeshGoldenTest : public ::testing::TestWithParam<MeshCase> {};

// One-shot prefill against the one-device reference logits at every position.
TEST_P(XlaMeshGoldenTest, OneShotPrefillMatchesTheReference) {
  G4_REQUIRE_PJRT_PLUGIN();
  const MeshCase& c = GetParam();
  Reference ref = LoadReference(c.fixture);
  const std::vector<float> want = ref.Get("logits");
  const int V = static_cast<int>(want.size() / ref.ids.size());
  auto engine = MakeMeshEngine(c.fixture, c.mesh, 1 << 20, std::max(c.mesh.data, 2));
  ASSERT_NE(engine, nullptr);
  std::vector<float> logits;
  ASSERT_TRUE(engine->Prefill(0, ref.ids, true, &logits).ok());
  EXPECT_LT(RelErr(logits, want), kRelTol);
  EXPECT_EQ(ArgmaxRows(logits, V), ArgmaxRows(want, V));
}

// Chunked prefill (chunks of 9 across the window of 8) of the first and the last sequence slot
// (different data shards where data > 1), then batched decode of both, token by token: every
// row against the one-device reference.
TEST_P(XlaMeshGoldenTest, ChunkedPrefillAndBatchedDecodeMatchTheReference) {
  G4_REQUIRE_PJRT_PLUGIN();
  const MeshCase& c = GetParam();
  Reference ref = LoadReference(c.fixture);
  const int seqs = std::max(c.mesh.data, 2);
  auto engine = MakeMeshEngine(c.fixture, c.mesh, 9, seqs);
  ASSERT_NE(engine, nullptr);
  const std::vector<float> want = ref.Get("logits");
  const int V = RefVocab(ref);
  const int n = static_cast<int>(ref.ids.size()), decode = 4;
  const int32_t last = seqs - 1;
  std::vector<float> logits, first, row;
  ASSERT_TRUE(engine->Prefill(last, std::span<const int32_t>(ref.ids).first(n - decode), true, &logits).ok());
  ASSERT_TRUE(engine->Prefill(0, std::span<const int32_t>(ref.ids).first(n - decode), false, &first).ok());
  for (int t = n - decode; t < n; ++t) {
    const int32_t batch[2] = {last, 0}, toks[2] = {ref.ids[t], ref.ids[t]};
    ASSERT_TRUE(engine->Decode(batch, toks, &row).ok());
    ASSERT_EQ(row.size(), 2u * V);
    logits.insert(logits.end(), row.begin(), row.begin() + V);
    EXPECT_LT(RelErr(std::vector<float>(row.begin() + V, row.end()), std::vector<float>(want.begin() + t * V, want.begin() + (t + 1) * V)),
              kRelTol)
        << "sequence 0, position " << t;
  }
  EXPECT_LT(RelErr(logits, want), kRelTol) << "chunked + decode";
  EXPECT_EQ(ArgmaxRows(logits, V), ArgmaxRows(want, V));
}

// Every golden fixture XlaGoldenTest runs on one device (GQA with 2 KV heads; 1 KV head with PLE
// and shared KV; a dense 31B-like model; 8 experts; bf16 shards; W4G32 blocks split by rows and by
// blocks; the GGUF conversions) on every mesh. Each case is one ctest entry per test, so `ctest -j`
// runs them side by side.
std::vector<MeshCase> MeshCases() {
  std::vector<MeshCase> out;
  for (const std::string& f : AllFixtureParams())
    for (const Mesh m : {Mesh{1, 2}, Mesh{1, 4}, Mesh{2, 2}, Mesh{4, 1}}) out.push_back({f, m});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Meshes, XlaMeshGoldenTest, ::testing::ValuesIn(MeshCases()), [](const auto& info) {
  std::string s = info.param.fixture + "_" + std::to_string(info.param.mesh.data) + "x" + std::to_string(info.param.mesh.model);
  std::replace(s.begin(), s.end(), '-', '_');
  std::replace(s.begin(), s.end(), '+', '_');
  return s;
});

// Sequences in different data shards decoded in one batch give each one's own logits, the rows
// regrouped by data shard (sequences 0-1 on shard 0, 2-3 on shard 1) and mapped back: batches
// across both shards, all on one shard (the other shard's group is padding) and of uneven groups.
TEST(XlaMeshBatchTest, BatchedDecodeOnTwoByTwoMatchesEachSequenceAlone) {
  G4_REQUIRE_PJRT_PLUGIN();
  Reference ref = LoadReference("gemma3-tiny");
  auto engine = MakeMeshEngine("gemma3-tiny", Mesh{2, 2}, 8, 4);
  ASSERT_NE(engine, nullptr);
  const std::vector<float> want = ref.Get("logits");
  const int V = RefVocab(ref);
  std::vector<float> unused, lg;
  int p[4] = {11, 4, 17, 9};
  for (int s = 0; s < 4; ++s) ASSERT_TRUE(engine->Prefill(s, std::span<const int32_t>(ref.ids).first(p[s]), false, &unused).ok());
  const std::vector<std::vector<int32_t>> batches = {{3, 0, 2, 1}, {3, 0, 2, 1}, {1, 0}, {2, 0, 3}, {3, 2}, {1, 3, 0, 2}};
  for (const std::vector<int32_t>& seqs : batches) {
    std::vector<int32_t> toks;
    for (int32_t s : seqs) toks.push_back(ref.ids[p[s]]);
    ASSERT_TRUE(engine->Decode(seqs, toks, &lg).ok());
    ASSERT_EQ(lg.size(), seqs.size() * V);
    for (size_t b = 0; b < seqs.size(); ++b) {
      const int s = seqs[b];
      const std::vector<float> got(lg.begin() + b * V, lg.begin() + (b + 1) * V);
      EXPECT_LT(RelErr(got, std::vector<float>(want.begin() + p[s] * V, want.begin() + (p[s] + 1) * V)), kRelTol)
          << "seq " << s << " position " << p[s];
    }
    for (int32_t s : seqs) ++p[s];
  }
}

// Warm-up compiles every program a batched decode step on a data axis can run: after it, batches
// of any spread over the two data shards (one shard's group setting the bucket) compile nothing.
TEST(XlaMeshBatchTest, WarmupCompilesEveryDecodeGroupBucket) {
  G4_REQUIRE_PJRT_PLUGIN();
  auto engine = MakeMeshEngine("gemma3-tiny", Mesh{2, 2}, 8, 4);
  ASSERT_NE(engine, nullptr);
  auto steps = engine->Warmup(8);
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  const int programs = XlaProgramCount(engine->backend());
  EXPECT_GT(programs, 0);
  for (const std::vector<int32_t>& seqs : std::vector<std::vector<int32_t>>{{0, 2}, {0, 1}, {1, 3, 2}, {0, 1, 3}, {3, 2, 1, 0}}) {
    std::vector<float> lg;
    ASSERT_TRUE(engine->Decode(seqs, std::vector<int32_t>(seqs.size(), 5), &lg).ok());
    for (int32_t s : seqs) engine->ResetSequence(s);
    EXPECT_EQ(XlaProgramCount(engine->backend()), programs) << "a batch of " << seqs.size();
  }
}

// A cache-owning layer list of `config` for caches of max_context 64 (as CreateKvCache's).
std::vector<xla::CacheLayer> CacheLayers(const ModelConfig& config) {
  std::vector<xla::CacheLayer> out;
  for (int l = 0; l < config.num_layers; ++l) {
    const LayerPlan& lp = config.layers[l];
    if (lp.kv_donor >= 0) continue;
    out.push_back({l, lp.window ? std::min(lp.window, 64) : 64, lp.window, lp.num_kv_heads * lp.head_dim, lp.num_kv_heads});
  }
  return out;
}

// Protobuf's wire format, enough to read an HloModuleProto: each field of one message as (number,
// varint value or length-delimited bytes); fixed-width fields are skipped.
struct PbField {
  int num = 0;
  uint64_t value = 0;
  std::string_view bytes;
};
uint64_t PbVarint(std::string_view s, size_t* i) {
  uint64_t v = 0;
  for (int shift = 0; *i < s.size() && shift < 64; shift += 7) {
    const uint8_t c = static_cast<uint8_t>(s[(*i)++]);
    v |= static_cast<uint64_t>(c & 0x7f) << shift;
    if (!(c & 0x80)) break;
  }
  return v;
}
std::vector<PbField> PbFields(std::string_view s) {
  std::vector<PbField> out;
  for (size_t i = 0; i < s.size();) {
    const uint64_t key = PbVarint(s, &i);
    PbField f{static_cast<int>(key >> 3)};
    switch (key & 7) {
      case 0: f.value = PbVarint(s, &i); break;
      case 1: i += 8; break;
      case 2: {
        const size_t n = PbVarint(s, &i);
        f.bytes = s.substr(i, n);
        i += n;
        break;
      }
      case 5: i += 4; break;
      default: return out;  // not a message
    }
    out.push_back(f);
  }
  return out;
}

// Output elements of every instruction of opcode `op` in an HloModuleProto, fused computations
// included (HloModuleProto.computations = 3, HloComputationProto.instructions = 2,
// HloInstructionProto.opcode = 2 and .shape = 3, ShapeProto.dimensions = 3).
int64_t OpElements(std::string_view module, std::string_view op) {
  int64_t total = 0;
  for (const PbField& c : PbFields(module)) {
    if (c.num != 3) continue;
    for (const PbField& in : PbFields(c.bytes)) {
      if (in.num != 2) continue;
      std::string_view opcode;
      int64_t n = 1;
      for (const PbField& f : PbFields(in.bytes)) {
        if (f.num == 2) opcode = f.bytes;
        if (f.num != 3) continue;
        for (const PbField& d : PbFields(f.bytes)) {
          if (d.num != 3) continue;
          if (d.bytes.empty()) {
            n *= static_cast<int64_t>(d.value);
          } else {  // packed
            for (size_t i = 0; i < d.bytes.size();) n *= static_cast<int64_t>(PbVarint(d.bytes, &i));
          }
        }
      }
      if (opcode == op) total += n;
    }
  }
  return total;
}

// The data axis splits a batched decode step's compute. The compiled program of one partition
// (XLA's optimized HLO after SPMD partitioning) of a decode step of 32 sequences: with the rows
// grouped by data shard, the dots of each partition of data=2 produce half the one-device
// program's elements (each computes its 16 rows); with the step inputs replicated (the layout
// before), each partition computes every row. Each device's logits are its group's rows only.
TEST(XlaMeshDataAxisTest, BatchedDecodeRowsAreComputedOnTheirDataShardOnly) {
  G4_REQUIRE_PJRT_PLUGIN();
  auto client = EightDeviceClient();
  ASSERT_NE(client, nullptr);
  auto m = LoadModel(ModelPath("gemma3-tiny"));
  ASSERT_TRUE(m.ok());
  const Graph g = BuildGemmaGraph((*m)->config, (*m)->weights, GraphOptions{});
  const Mesh mesh{2, 1};
  auto plan = xla::PlanShards(g, mesh, 32);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  // Elements out of dots per partition: one device, data=2 replicated, data=2 grouped.
  int64_t dots[3];
  for (int variant = 0; variant < 3; ++variant) {
    xla::StepShape sh;
    sh.tokens = sh.output_rows = 32;
    sh.max_seqs = 32;
    sh.mode = xla::StepMode::kOneTokenPerSequence;
    sh.caches = CacheLayers((*m)->config);
    sh.quantised_as_f32 = true;
    if (variant > 0) sh.shards = &*plan;
    if (variant == 2) sh.data_groups = 2;
    auto lowered = xla::LowerGraph(g, sh);
    ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
    xla::CompileOptions co;
    if (variant > 0) {
      co.num_partitions = 2;
      co.use_spmd_partitioning = true;
    }
    auto exe = client->Compile(lowered->module, xla::SerializeCompileOptions(co));
    ASSERT_TRUE(exe.ok()) << exe.status().message();
    std::string format;
    auto hlo = (*exe)->OptimizedProgram(&format);
    ASSERT_TRUE(hlo.ok()) << hlo.status().ToString();
    std::string_view module = *hlo;
    if (format == "hlo_with_config") {  // HloModuleProtoWithConfig.hlo_module = 1
      for (const PbField& f : PbFields(*hlo))
        if (f.num == 1) module = f.bytes;
    } else {
      ASSERT_EQ(format, "hlo");
    }
    dots[variant] = OpElements(module, "dot");
  }
  std::printf("decode of 32 sequences, dot output elements per partition: one device %lld, data=2 replicated %lld, "
              "data=2 grouped %lld\n", (long long)dots[0], (long long)dots[1], (long long)dots[2]);
  ASSERT_GT(dots[0], 0);
  EXPECT_EQ(dots[1], dots[0]);
  EXPECT_EQ(2 * dots[2], dots[0]);

  // Through the backend on 2x2: each device holds the logits of its data shard's group (2 rows).
  auto engine = MakeMeshEngine("gemma3-tiny", Mesh{2, 2}, 8, 4);
  ASSERT_NE(engine, nullptr);
  Reference ref = LoadReference("gemma3-tiny");
  std::vector<float> unused, lg;
  for (int s = 0; s < 4; ++s) ASSERT_TRUE(engine->Prefill(s, std::span<const int32_t>(ref.ids).first(5 + s), false, &unused).ok());
  const int32_t seqs[4] = {0, 1, 2, 3}, toks[4] = {ref.ids[5], ref.ids[6], ref.ids[7], ref.ids[8]};
  ASSERT_TRUE(engine->Decode(seqs, toks, &lg).ok());
  const std::vector<float> want = ref.Get("logits");
  const int V = static_cast<int>(want.size() / ref.ids.size());
  for (int b = 0; b < 4; ++b)
    EXPECT_LT(RelErr(std::vector<float>(lg.begin() + b * V, lg.begin() + (b + 1) * V),
                     std::vector<float>(want.begin() + (5 + b) * V, want.begin() + (6 + b) * V)),
              kRelTol);
}

// The q8 cache on a mesh: its int8 K/V and f32 scales split like the cache (slots over data, KV
// heads over model where they divide). Chunked prefill, then batched decode of two sequences (one
// per data shard on 2x2), against the one-device q8 cache: within 1e-2 of the largest logit and the
// same top token everywhere (the model axis sums in another order, which can move an int8 by one
// step where a value lies at a rounding midpoint, as XlaQ8CacheTest against the CPU's q8).
class XlaMeshQ8Test : public ::testing::TestWithParam<std::string> {};

TEST_P(XlaMeshQ8Test, Q8CacheOnMeshesGivesTheOneDeviceLogits) {
  G4_REQUIRE_PJRT_PLUGIN();
  const std::string& fixture = GetParam();
  Reference ref = LoadReference(fixture);
  const int V = static_cast<int>(ref.Get("logits").size() / ref.ids.size());
  std::vector<float> one;
  for (const Mesh mesh : {Mesh{1, 1}, Mesh{1, 2}, Mesh{2, 2}}) {
    SCOPED_TRACE(fixture + " " + mesh.ToString());
    auto engine = MakeMeshEngine(fixture, mesh, 7, 2, DType::kI8);
    ASSERT_NE(engine, nullptr);
    EXPECT_EQ(engine->cache().type(), DType::kI8);
    std::vector<float> got, other, row;
    ASSERT_TRUE(engine->Prefill(1, std::span<const int32_t>(ref.ids).first(20), true, &got).ok());
    ASSERT_TRUE(engine->Prefill(0, std::span<const int32_t>(ref.ids).first(20), false, &other).ok());
    for (size_t t = 20; t < ref.ids.size(); ++t) {
      const int32_t seqs[2] = {1, 0}, toks[2] = {ref.ids[t], ref.ids[t]};
      ASSERT_TRUE(engine->Decode(seqs, toks, &row).ok());
      got.insert(got.end(), row.begin(), row.begin() + V);
      EXPECT_LT(RelErr(std::vector<float>(row.begin(), row.begin() + V), std::vector<float>(row.begin() + V, row.end())),
                1e-6)
          << "both sequences hold the same tokens";
    }
    if (one.empty()) {
      one = got;
      continue;
    }
    const double diff = RelErr(got, one);
    std::printf("%s %s: q8 cache against one device %.3g\n", fixture.c_str(), mesh.ToString().c_str(), diff);
    EXPECT_LT(diff, 1e-2);
    EXPECT_EQ(ArgmaxRows(got, V), ArgmaxRows(one, V));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, XlaMeshQ8Test, ::testing::Values("gemma3-tiny", "gemma4-e2b-tiny"), [](const auto& info) {
  std::string s = info.param;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
});

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
