// GEMMA4RT_SIMD_MAX (backends/cpu/simd_cap.h): the commands run the kernels on the named SIMD
// target at most, and refuse a name the build has no target for.
#include <gtest/gtest.h>

#include <string>

#include <hwy/targets.h>

#include "cli_runner.h"

namespace g4 {
namespace {

using test_util::CliResult;
using test_util::RunSh;

const std::string kInfo = "\"$BIN\" info -m '" + std::string(GEMMA4RT_TEST_DATA_DIR) + "/golden/gemma4-e2b-tiny'";

TEST(SimdCapTest, TheCommandsRunOnTheCappedTarget) {
  // Highway's lowest bit of a platform is its best target: the worst compiled one (SCALAR or
  // EMU128) runs on every CPU, the best one the CPU supports is what runs without a cap.
  int64_t worst = 0, best = 0;
  for (int64_t rest = HWY_TARGETS; rest != 0; rest &= rest - 1) worst = rest & -rest;
  for (int64_t rest = hwy::SupportedTargets() & HWY_TARGETS; rest != 0 && best == 0; rest &= rest - 1) best = rest & -rest;
  ASSERT_NE(best, 0);
  for (int64_t target : {worst, best}) {
    std::string name = hwy::TargetName(target);
    for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));  // any case
    const CliResult r = RunSh("GEMMA4RT_SIMD_MAX=" + name + " " + kInfo);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find(std::string(" simd=") + hwy::TargetName(target) + " "), std::string::npos) << r.out;
  }
}

TEST(SimdCapTest, AnUnknownTargetIsRefused) {
  for (const char* value : {"AVX9", "avx2,sse4", " "}) {
    const CliResult r = RunSh(std::string("GEMMA4RT_SIMD_MAX='") + value + "' " + kInfo);
    EXPECT_EQ(r.status, 1) << value << ": " << r.out;
    EXPECT_NE(r.out.find(std::string("gemma4rt: error: INVALID_ARGUMENT: GEMMA4RT_SIMD_MAX=") + value +
                         " names no SIMD target of this build ("),
              std::string::npos)
        << r.out;
  }
  // The usage and --help still print.
  EXPECT_EQ(RunSh("GEMMA4RT_SIMD_MAX=AVX9 \"$BIN\" --help").status, 0);
  EXPECT_EQ(RunSh("GEMMA4RT_SIMD_MAX=AVX9 \"$BIN\" info --help").status, 0);
  const CliResult usage = RunSh("GEMMA4RT_SIMD_MAX=AVX9 \"$BIN\"");
  EXPECT_EQ(usage.status, 2) << usage.out;
  EXPECT_EQ(usage.out.find("GEMMA4RT_SIMD_MAX"), std::string::npos) << usage.out;
}

}  // namespace
}  // namespace g4
