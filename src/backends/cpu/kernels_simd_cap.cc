#include "backends/cpu/simd_cap.h"

#include <cstdlib>
#include <string>
#include <strings.h>

#include <hwy/targets.h>

namespace g4::cpu {
namespace {

struct SimdCap {
  int64_t disabled = 0;  // Highway targets ruled out (better than the cap)
  Status status;
};

// Highway numbers targets with one bit each, a lower bit for a better target of the same
// architecture (hwy/detect_targets.h), so a cap rules out every compiled target below its bit.
// DisableTargets alone does not reach the dispatch of Highway 1.0 (its SupportedTargets chooses
// the target before applying the disabled mask), so the capped set is also installed as
// Highway's test override, which the dispatch follows.
SimdCap ReadCap() {
  SimdCap cap;
  const char* value = std::getenv("GEMMA4RT_SIMD_MAX");
  if (value == nullptr || *value == '\0') return cap;
  std::string names;
  for (int64_t rest = HWY_TARGETS; rest != 0; rest &= rest - 1) {
    const int64_t bit = rest & -rest;
    const char* name = hwy::TargetName(bit);
    if (strcasecmp(name, value) == 0) {
      cap.disabled = bit - 1;
      hwy::DisableTargets(cap.disabled);
      hwy::SetSupportedTargetsForTest(hwy::SupportedTargets());
      return cap;
    }
    names += names.empty() ? name : std::string(", ") + name;
  }
  cap.status = InvalidArgument("GEMMA4RT_SIMD_MAX=" + std::string(value) +
                               " names no SIMD target of this build (" + names + ")");
  return cap;
}

const SimdCap& Cap() {
  static const SimdCap cap = ReadCap();
  return cap;
}

// Applied before main, so that Highway's first dispatch already sees it.
[[maybe_unused]] const bool applied_at_start = (Cap(), true);

}  // namespace

Status SimdCapStatus() { return Cap().status; }

bool SimdCapAllows(int64_t target) { return (Cap().disabled & target) == 0; }

void ResetSimdTargetsForTest() {
  hwy::SetSupportedTargetsForTest(0);
  if (Cap().disabled != 0) hwy::SetSupportedTargetsForTest(hwy::SupportedTargets());
}

bool SimdCapAllowsAvx512() {
#if HWY_ARCH_X86
  return SimdCapAllows(HWY_AVX3);
#else
  return true;
#endif
}

}  // namespace g4::cpu
