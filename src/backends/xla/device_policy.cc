#include "backends/xla/device_policy.h"

#include <cstdio>
#include <cstdlib>

#include "backends/xla/lower.h"

namespace g4::xla {

StatusOr<ComputePolicy> ChooseComputeDtype(const std::string& platform, const std::string& cc,
                                           const std::string& requested) {
  DType want;
  if (requested == "f32") want = DType::kF32;
  else if (requested == "bf16") want = DType::kBF16;
  else if (requested == "f16") want = DType::kF16;
  else if (requested != "auto") return InvalidArgument("--compute-dtype must be auto, f32, bf16 or f16, got '" + requested + "'");
  const bool explicit_dtype = requested != "auto";
  auto chosen = [&](DType d, const std::string& why) {
    return ComputePolicy{d, (explicit_dtype ? "--compute-dtype " + requested + ": " : std::string("auto: ")) + why};
  };
  if (platform == "cpu") {
    // XLA's CPU plugin runs bf16 and f16 dots (f32 accumulation) correctly; f32 is its native type.
    if (!explicit_dtype) return chosen(DType::kF32, "XLA's CPU plugin computes in f32");
    return chosen(want, "XLA's CPU plugin runs " + requested + " dots with f32 accumulation");
  }
  if (platform == "tpu") {
    if (!explicit_dtype) return chosen(DType::kBF16, "TPUs compute in bf16");
    if (want == DType::kF16) return InvalidArgument("--compute-dtype f16: TPUs have no f16 arithmetic (use bf16 or f32)");
    return chosen(want, "TPUs run bf16 and f32");
  }
  if (platform == "cuda") {
    if (cc.empty()) {
      if (!explicit_dtype) return chosen(DType::kF32, "the CUDA device reports no compute capability");
      if (want == DType::kBF16)
        return InvalidArgument("--compute-dtype bf16: the CUDA device reports no compute capability (bf16 needs 8.0 or newer)");
      return chosen(want, "CUDA devices run f16 and f32");
    }
    char* end = nullptr;
    const double v = std::strtod(cc.c_str(), &end);
    if (end == cc.c_str()) return InvalidArgument("the CUDA device's compute capability '" + cc + "' is not a number");
    const bool has_bf16 = v >= 8.0;
    if (!explicit_dtype)
      return has_bf16 ? chosen(DType::kBF16, "cuda compute capability " + cc + " >= 8.0")
                      : chosen(DType::kF16, "cuda compute capability " + cc + " < 8.0 has no bf16 arithmetic");
    if (want == DType::kBF16 && !has_bf16)
      return InvalidArgument("--compute-dtype bf16: cuda compute capability " + cc +
                             " < 8.0 has no bf16 arithmetic (use f16 or f32)");
    return chosen(want, "cuda compute capability " + cc);
  }
  if (!explicit_dtype) return chosen(DType::kF32, "no compute policy for platform '" + platform + "'");
  if (want != DType::kF32)
    return InvalidArgument("--compute-dtype " + requested + ": gemma4rt has no compute policy for platform '" + platform +
                           "' (only f32 is known to work there)");
  return chosen(want, "platform " + platform);
}

Status CheckFp8KvCache(const std::string& platform, const std::string& cc) {
  const std::string why = "--cache-type fp8: ";
  const std::string instead = " (use --cache-type q8: int8 with the same bytes per token)";
  if (platform == "tpu") return OkStatus();
  if (platform == "cpu") return InvalidArgument(why + "XLA's CPU plugin has no fp8 arithmetic" + instead);
  if (platform != "cuda") return InvalidArgument(why + "gemma4rt has no fp8 policy for platform '" + platform + "'" + instead);
  if (cc.empty()) return InvalidArgument(why + "the CUDA device reports no compute capability (fp8 needs 8.9 or newer)" + instead);
  int major = 0, minor = 0;
  char dot = 0;
  if (std::sscanf(cc.c_str(), "%d%c%d", &major, &dot, &minor) != 3 || dot != '.')
    return InvalidArgument("the CUDA device's compute capability '" + cc + "' is not major.minor");
  if (major > 8 || (major == 8 && minor >= 9)) return OkStatus();
  return InvalidArgument(why + "cuda compute capability " + cc + " < 8.9 has no fp8 arithmetic" + instead);
}

DType WeightDeviceType(const Tensor& t, DType compute) {
  if (IsDeviceQuantised(t.dtype)) return t.dtype;
  if (compute == DType::kF32)
    return t.dtype == DType::kF16 || t.dtype == DType::kBF16 ? t.dtype : DType::kF32;
  return t.shape.size() >= 2 ? compute : DType::kF32;
}

size_t WeightDeviceBytes(const Tensor& t, DType type) {
  if (IsDeviceQuantised(type)) return t.nbytes;
  return static_cast<size_t>(t.numel()) * DTypeSize(type);
}

std::string WeightsOnDevice(DType compute) {
  if (compute == DType::kF32) return "f32/f16/bf16/q8_0/q4_0/w4g32-as-stored,other-quantised-as-f32";
  const std::string c(compute == DType::kBF16 ? "bf16" : "f16");
  return "matrices-as-" + c + ",q8_0/q4_0/w4g32-as-stored-dequantised-to-" + c + ",vectors-as-f32";
}

}  // namespace g4::xla
