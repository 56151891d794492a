// The PJRT layer (src/backends/xla/pjrt.h) against XLA's CPU plugin, whose path the environment
// variable GEMMA4RT_PJRT_PLUGIN gives (scripts/setup-xla.sh prints it); without it the tests that
// need the plugin are skipped, visibly. The loader's error paths also run against stand-in
// plugins built with the tests.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backends/xla/compile_options.h"
#include "backends/xla/pjrt.h"

namespace g4::xla {
namespace {

std::string PluginPath() {
  const char* p = std::getenv("GEMMA4RT_PJRT_PLUGIN");
  return p ? p : "";
}

#define REQUIRE_PLUGIN()                                                                        \
  if (PluginPath().empty()) GTEST_SKIP() << "GEMMA4RT_PJRT_PLUGIN is not set (scripts/setup-xla.sh)"

std::unique_ptr<Client> MakeClient(int devices = 1) {
  auto plugin = Plugin::Load(PluginPath());
  EXPECT_TRUE(plugin.ok()) << plugin.status().message();
  if (!plugin.ok()) return nullptr;
  auto client = Client::Create(*plugin, {{"cpu_device_count", int64_t{devices}}});
  EXPECT_TRUE(client.ok()) << client.status().message();
  return client.ok() ? std::move(*client) : nullptr;
}

TEST(XlaCompileOptionsTest, DefaultsAreOneReplicaOnePartition) {
  EXPECT_EQ(SerializeCompileOptions(), std::string("\x1a\x04\x20\x01\x28\x01", 6));
  CompileOptions spmd;
  spmd.num_partitions = 4;
  spmd.use_spmd_partitioning = true;
  spmd.use_shardy_partitioner = true;
  EXPECT_EQ(SerializeCompileOptions(spmd), std::string("\x1a\x09\x20\x01\x28\x04\x30\x01\x98\x01\x01", 11));
  CompileOptions big;
  big.num_replicas = 300;  // a two-byte varint: ac 02
  EXPECT_EQ(SerializeCompileOptions(big), std::string("\x1a\x05\x20\xac\x02\x28\x01", 7));
}

TEST(XlaPjrtTest, RunsAStableHloModule) {
  REQUIRE_PLUGIN();
  auto client = MakeClient();
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->platform_name(), "cpu");
  EXPECT_EQ(client->num_devices(), 1);
  const std::string module = R"(
module @m {
  func.func public @main(%a: tensor<2x3xf32>, %b: tensor<3x2xf32>) -> (tensor<2x2xf32>, tensor<2x3xf32>) {
    %d = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>
    %s = stablehlo.add %a, %a : tensor<2x3xf32>
    return %d, %s : tensor<2x2xf32>, tensor<2x3xf32>
  }
})";
  auto exe = client->Compile(module, SerializeCompileOptions());
  ASSERT_TRUE(exe.ok()) << exe.status().message();
  const float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 1, 1, 1};
  const int64_t da[2] = {2, 3}, db[2] = {3, 2};
  auto ba = client->Upload(a, PJRT_Buffer_Type_F32, da);
  auto bb = client->Upload(b, PJRT_Buffer_Type_F32, db);
  ASSERT_TRUE(ba.ok() && bb.ok());
  PJRT_Buffer* args[2] = {ba->get(), bb->get()};
  const int64_t keep[2] = {0, 1};
  auto out = (*exe)->Execute(args, keep);
  ASSERT_TRUE(out.ok()) << out.status().message();
  ASSERT_EQ(out->size(), 2u);
  auto dims = (*out)[0].Dimensions();
  ASSERT_TRUE(dims.ok());
  EXPECT_EQ(*dims, (std::vector<int64_t>{2, 2}));
  float d[4], s[6];
  ASSERT_TRUE((*out)[0].ToHost(d, sizeof(d)).ok());
  ASSERT_TRUE((*out)[1].ToHost(s, sizeof(s)).ok());
  EXPECT_EQ(std::vector<float>(d, d + 4), (std::vector<float>{4, 5, 10, 11}));
  EXPECT_EQ(std::vector<float>(s, s + 6), (std::vector<float>{2, 4, 6, 8, 10, 12}));
  // Too little room for a copy is an error, not an overrun.
  EXPECT_FALSE((*out)[0].ToHost(d, 8).ok());
}

TEST(XlaPjrtTest, CpuDeviceCountSetsTheDevices) {
  REQUIRE_PLUGIN();
  auto client = MakeClient(3);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->num_devices(), 3);
  auto kind = client->DeviceKind(2);
  ASSERT_TRUE(kind.ok()) << kind.status().message();
  EXPECT_FALSE(kind->empty());
}

TEST(XlaPjrtTest, UnknownDeviceIsAnError) {
  REQUIRE_PLUGIN();
  auto client = MakeClient();
  ASSERT_NE(client, nullptr);
  auto kind = client->DeviceKind(5);
  ASSERT_FALSE(kind.ok());
  EXPECT_EQ(kind.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(kind.status().message().find("device 5 does not exist"), std::string::npos) << kind.status().message();
  const float x = 1;
  const int64_t dims[1] = {1};
  auto up = client->Upload(&x, PJRT_Buffer_Type_F32, dims, -1);
  ASSERT_FALSE(up.ok());
  EXPECT_EQ(up.status().code(), StatusCode::kInvalidArgument);
}

TEST(XlaPjrtTest, BadProgramIsThePluginsMessage) {
  REQUIRE_PLUGIN();
  auto client = MakeClient();
  ASSERT_NE(client, nullptr);
  auto exe = client->Compile("module { this is not stablehlo }", SerializeCompileOptions());
  ASSERT_FALSE(exe.ok());
  EXPECT_NE(exe.status().message().find("compile StableHLO: "), std::string::npos) << exe.status().message();
  EXPECT_GT(exe.status().message().size(), std::string("compile StableHLO: ").size() + 5);
}

TEST(XlaPluginTest, MissingFileIsNotFound) {
  auto p = Plugin::Load("/nonexistent/dir/pjrt_plugin.so");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kNotFound);
  EXPECT_NE(p.status().message().find("/nonexistent/dir/pjrt_plugin.so': no such file"), std::string::npos);
}

TEST(XlaPluginTest, AFileThatIsNotASharedLibraryIsRefused) {
  const std::string path = testing::TempDir() + "/g4_not_a_plugin.so";
  std::ofstream(path) << "not an ELF file\n";
  auto p = Plugin::Load(path);
  std::remove(path.c_str());
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("could not be loaded as a shared library"), std::string::npos)
      << p.status().message();
}

TEST(XlaPluginTest, ASharedLibraryWithoutGetPjrtApiIsRefused) {
  Dl_info info{};  // the C library this test links: a real shared library, no PJRT plugin
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&std::fclose), &info), 0);
  ASSERT_NE(info.dli_fname, nullptr);
  auto p = Plugin::Load(info.dli_fname);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("is not a PJRT plugin: it exports no GetPjrtApi"), std::string::npos)
      << p.status().message();
}

TEST(XlaPluginTest, AnotherMajorVersionIsRefused) {
  auto p = Plugin::Load(GEMMA4RT_FAKE_PJRT_MAJOR1);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(p.status().message().find("implements PJRT C API 1.1; this build speaks major version 0"),
            std::string::npos)
      << p.status().message();
}

TEST(XlaPluginTest, NoFunctionPastTheTablesEndIsCalled) {
  auto p = Plugin::Load(GEMMA4RT_FAKE_PJRT_SHORT);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_TRUE((*p)->Has(offsetof(PJRT_Api, PJRT_Plugin_Initialize)));
  EXPECT_FALSE((*p)->Has(offsetof(PJRT_Api, PJRT_Client_Create)));
  auto c = Client::Create(*p);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(c.status().message().find("the PJRT plugin (API 0.1) has no PJRT_Client_Create"), std::string::npos)
      << c.status().message();
}

}  // namespace
}  // namespace g4::xla
