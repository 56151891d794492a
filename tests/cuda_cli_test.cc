// `--backend cuda` through the CLI where it cannot run: a build without the CUDA backend, or a
// machine without a CUDA device, refuses with the reason and a non-zero exit, never a crash.
#include <gtest/gtest.h>

#include <string>

#include "cli_runner.h"
#if GEMMA4RT_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace g4 {
namespace {

using test_util::CliResult;
using test_util::RunCli;

std::string Fixture(const std::string& name) { return std::string(GEMMA4RT_TEST_DATA_DIR) + "/golden/" + name; }

TEST(CudaCliTest, BackendCudaWithoutDeviceOrBuildIsRefused) {
#if GEMMA4RT_HAVE_CUDA
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "this machine has a CUDA device (the GPU tests run instead)";
  const std::string want = "--backend cuda: no CUDA device";
#else
  const std::string want = "--backend cuda: this build has no CUDA backend";
#endif
  for (const std::string& cmd : {"generate -m " + Fixture("gemma4-e2b-tiny") + " --tokens 2,17 -n 2 --temp 0 --backend cuda",
                                "logits -m " + Fixture("gemma4-e2b-tiny") + " --tokens 2,17 --backend cuda --device 1"}) {
    CliResult r = RunCli(cmd);
    EXPECT_NE(r.status, 0) << cmd << "\n" << r.out;
    EXPECT_NE(r.status, -1) << cmd << "\n" << r.out;  // exited (no signal)
    EXPECT_NE(r.out.find(want), std::string::npos) << cmd << "\n" << r.out;
  }
}

TEST(CudaCliTest, ComputeDtypeOutsideTheListIsAUsageError) {
  CliResult r = RunCli("generate -m " + Fixture("gemma4-e2b-tiny") + " --tokens 2 -n 1 --backend cuda --compute-dtype fp8");
  EXPECT_EQ(r.status, 2) << r.out;  // CLI11's usage errors: exit 2 (parse_error.h)
  EXPECT_NE(r.out.find("--compute-dtype"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace g4
