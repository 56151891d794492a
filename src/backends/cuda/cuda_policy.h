// The CUDA backend's compute-dtype choice, apart from the CUDA runtime so that every build (and
// its tests) has it: bf16 on compute capability >= 8.0 (Ampere on: bf16 tensor cores), f16
// below, f32 accumulation either way; BF16 weights become F16 at load below 8.0 (never emulated).
#pragma once

#include <string>

#include "base/status.h"

namespace g4::cuda {

struct ComputeChoice {
  std::string dtype;   // "bf16" or "f16"
  std::string reason;  // for the device-policy line
};

// `requested`: --compute-dtype ("auto", "bf16", "f16", "f32"). Errors: InvalidArgument naming why
// the device cannot honour it (bf16 below compute capability 8.0; f32: no f32 kernels).
inline StatusOr<ComputeChoice> ChooseComputeDtype(int cc_major, int cc_minor, const std::string& requested) {
  const std::string cc = std::to_string(cc_major) + "." + std::to_string(cc_minor);
  const bool bf16_ok = cc_major >= 8;
  if (requested == "auto" || requested.empty())
    return ComputeChoice{bf16_ok ? "bf16" : "f16", bf16_ok ? "cc" + cc + ">=8.0" : "cc" + cc + "<8.0:no-bf16-tensor-cores"};
  if (requested == "bf16") {
    if (!bf16_ok)
      return InvalidArgument("--compute-dtype bf16: compute capability " + cc +
                             " has no bf16 arithmetic (needs 8.0 or later); use f16 (the default below 8.0)");
    return ComputeChoice{"bf16", "requested"};
  }
  if (requested == "f16") return ComputeChoice{"f16", "requested"};
  if (requested == "f32")
    return InvalidArgument("--compute-dtype f32: the CUDA backend's kernels compute in bf16 or f16 with f32 "
                           "accumulation; it has no f32 weight path");
  return InvalidArgument("--compute-dtype must be auto, bf16, f16 or f32, got '" + requested + "'");
}

}  // namespace g4::cuda
