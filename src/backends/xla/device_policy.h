// The XLA device policy: the dtype a device computes its matmuls in, and the device type of each
// weight under it.
//
// Compute dtype (auto): TPU and CUDA compute capability >= 8.0: bf16; CUDA below 8.0: f16 (no bf16
// arithmetic there: no bf16 buffer reaches the device, bf16 weights are converted at load); XLA's
// CPU plugin, a CUDA device that does not report its compute capability and other platforms: f32.
// An explicit f32/bf16/f16 is honoured where the device has that arithmetic and refused with the
// reason where it has not (bf16 below compute capability 8.0; f16 on TPU; bf16/f16 on platforms
// gemma4rt has no policy for).
//
// What the compute dtype changes (lower.h): the operands of every dot (matmuls, the MoE experts',
// attention's scores and values) are of the compute dtype, accumulated and returned in f32; rank
// >= 2 weights are on the device in the compute dtype (Q8_0, Q4_0, W4G32 as their blocks,
// dequantised into it); everything else (the residual stream, norms, softmax, RoPE, GELU, the
// MoE router, rank-1 weights) stays f32.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace g4::xla {

inline const std::vector<std::string> kComputeDtypeNames = {"auto", "f32", "bf16", "f16"};

struct ComputePolicy {
  DType dtype = DType::kF32;  // kF32, kBF16 or kF16
  std::string reason;         // why: "auto: cuda compute capability 9.0 >= 8.0"
};

// platform: PJRT's platform name ("cpu", "cuda", "tpu", ...); compute_capability: the device's
// "compute_capability" attribute ("9.0"; "" where unreported); requested: one of
// kComputeDtypeNames. Errors: InvalidArgument naming the reason for a dtype the device cannot
// honour, or an unknown name.
StatusOr<ComputePolicy> ChooseComputeDtype(const std::string& platform, const std::string& compute_capability,
                                           const std::string& requested);

// The fp8 (e4m3) KV cache, `--cache-type fp8` (lower_kv.h): OK on TPUs and on CUDA devices of
// compute capability 8.9 or newer (Ada, Hopper and later: fp8 tensor cores); InvalidArgument with
// the reason elsewhere (XLA's CPU plugin, older or unreporting CUDA devices, other platforms).
// Only chosen by that flag: the commands' default stays f16 (fp8 keeps 3 mantissa bits to f16's
// 10, for half the bytes q8 also saves on every device).
Status CheckFp8KvCache(const std::string& platform, const std::string& compute_capability);

// The type weight `t` has on the device under `compute`: Q8_0, Q4_0 and W4G32 as stored (their
// blocks); with compute f32, F32/F16/BF16 as stored and other block types F32; otherwise rank >= 2
// weights in the compute dtype and rank-1 weights in F32.
DType WeightDeviceType(const Tensor& t, DType compute);
// Bytes `t` takes on the device as `type` (WeightDeviceType).
size_t WeightDeviceBytes(const Tensor& t, DType type);
// The policy line's weights field: "f32/f16/bf16/q8_0/q4_0/w4g32-as-stored,other-quantised-as-f32".
std::string WeightsOnDevice(DType compute);

}  // namespace g4::xla
