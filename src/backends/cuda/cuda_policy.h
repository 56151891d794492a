// The CUDA backend's compute-dtype choice, apart from the CUDA runtime so that every build (and
// its tests) has it: bf16 on compute capability >= 8.0 (Ampere on: bf16 tensor cores), f16
// below, f32 accumulation either way; BF16 weights become F16 at load below 8.0 (never emulated).
// Also the KV cache types the device holds (fp8 from 8.9) and the kernel launch checks.
#pragma once

#include <cstddef>
#include <string>

#include "base/status.h"
#include "runtime/kv_cache.h"

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

// `--cache-type` on a device of compute capability major.minor: f32, f16, bf16 and q8 everywhere;
// fp8 (e4m3) from 8.9 (Ada, Hopper: fp8 tensor cores) and refused below with the reason.
inline Status CheckKvCacheTypeFor(int cc_major, int cc_minor, DType type) {
  if (type == DType::kF8E4M3) {
    if (cc_major > 8 || (cc_major == 8 && cc_minor >= 9)) return OkStatus();
    return InvalidArgument("--cache-type fp8: compute capability " + std::to_string(cc_major) + "." +
                           std::to_string(cc_minor) + " has no fp8 (e4m3) arithmetic (needs 8.9 or later); use "
                           "--cache-type q8 (int8 with the same bytes per token)");
  }
  if (!IsHostKvCacheType(type)) return InvalidArgument("the CUDA backend's KV cache type must be f32, f16, bf16, q8 or fp8");
  return OkStatus();
}

// A compiled kernel's resources (cudaFuncGetAttributes: the largest block its registers allow,
// registers per thread, static shared memory) and the device's per-block limits (cudaDeviceProp).
struct KernelResources {
  int max_threads_per_block = 0;
  int regs_per_thread = 0;
  size_t static_shared = 0;
};
struct DeviceLimits {
  int max_threads_per_block = 0;
  size_t shared_per_block = 0;  // without opting in to more
  int regs_per_block = 0;
};
// Whether `kernel` launches with `threads` threads and `dynamic_shared` bytes of dynamic shared
// memory per block. Errors: Unimplemented naming the kernel, the need and the limit (`what`: the
// graph node it is for).
inline Status CheckKernelLaunch(const std::string& what, const std::string& kernel, const KernelResources& k,
                                int threads, size_t dynamic_shared, const DeviceLimits& d) {
  const std::string head = what + ": the " + kernel + " kernel needs ";
  if (threads > d.max_threads_per_block)
    return Unimplemented(head + std::to_string(threads) + " threads per block > the device's " +
                         std::to_string(d.max_threads_per_block));
  if (threads > k.max_threads_per_block || static_cast<long long>(threads) * k.regs_per_thread > d.regs_per_block)
    return Unimplemented(head + std::to_string(threads) + " threads x " + std::to_string(k.regs_per_thread) +
                         " registers per block > the device's " + std::to_string(d.regs_per_block) + " (at most " +
                         std::to_string(k.max_threads_per_block) + " threads of this kernel)");
  if (k.static_shared + dynamic_shared > d.shared_per_block)
    return Unimplemented(head + std::to_string(k.static_shared) + " + " + std::to_string(dynamic_shared) +
                         " bytes of shared memory per block > the device's " + std::to_string(d.shared_per_block));
  return OkStatus();
}

}  // namespace g4::cuda
