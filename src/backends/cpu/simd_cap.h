// The best SIMD target the CPU kernels may use, capped by the environment variable
// GEMMA4RT_SIMD_MAX (a Highway target name such as AVX3, AVX2, SSE4, SSSE3, NEON, SVE, SCALAR; any
// case): the kernels then run as on a CPU whose best target is that one. Tests use it to run, on an
// AVX-512 machine, what an AVX2-only machine runs; users may use it to rule out a target.
// Read once, before the first kernel call (a static initializer).
#pragma once

#include <cstdint>

#include "base/status.h"

namespace g4::cpu {

// OK when GEMMA4RT_SIMD_MAX is unset or empty or names a target this build has; otherwise
// InvalidArgument naming the value and the build's targets (the cap is then not applied). The
// commands check it at start-up.
Status SimdCapStatus();

// Whether the cap allows the Highway target `target` (one HWY_* bit): true without a cap.
bool SimdCapAllows(int64_t target);

// Undoes hwy::SetSupportedTargetsForTest (tests that force each target in turn): the CPU's
// targets less those the cap rules out.
void ResetSimdTargetsForTest();

// Whether the cap allows AVX-512 instructions outside Highway's dispatch (the bf16 dot product,
// VNNI): true without a cap or when it is an AVX3 target.
bool SimdCapAllowsAvx512();

}  // namespace g4::cpu
