// The CUDA backend: the step graph run by our own kernels (kernels.h) and cuBLAS on one NVIDIA
// GPU, with the model's state on the device.
//
// Device state: each weight is uploaded once, on first use by a Compile, and shared by every
// executable: F16 as stored; BF16 as stored where the compute dtype is bf16, else converted to
// F16; F32 matrices converted to the compute dtype; Q8_0, Q4_0, Q4_K, Q6_K and W4G32 as their
// blocks' bytes (dequantised in the kernels' registers); norm and router vectors as f32. Other
// block types are refused at Compile. The KV cache (CreateKvCache) is two device arrays per
// cache-owning layer in KvCache's layout ([max_seqs, slots, Nkv*D], f32/f16/bf16).
//
// Step: every node's output an f32 device array at an offset of one arena that the backend's
// executables share (arena_plan.h: offsets reused once a value's last reader has run; the arena
// grown at Compile to the largest plan); the token arrays go up and the exported outputs (the
// logits) come back per Run. MatMul: the matrix-vector kernel for steps of
// up to 8 rows (decode, batched decode), else cuBLAS (GemmEx, 16-bit inputs, f32 accumulation and
// output) on weights dequantised to the compute dtype 4096 rows at a time (prefill).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/backend.h"

namespace g4 {

struct CudaBackendOptions {
  int device = 0;                       // --device
  std::string compute_dtype = "auto";   // --compute-dtype (cuda/cuda_policy.h)
};

// What the device policy line and `gemma4rt info` say about a CUDA backend.
struct CudaDeviceInfo {
  int device = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  size_t total_memory = 0, free_memory = 0;  // bytes, at creation
  int sm_count = 0;
  size_t shared_per_block = 0;  // bytes a block may use without opting in
  int max_threads_per_block = 0;
  int regs_per_block = 0;
  std::string compute_dtype, compute_reason;
};

// These four load the backend's module on first call (cuda_module.h, cuda_loader.cc).
// Errors: FailedPrecondition when the module or the CUDA libraries cannot be loaded, there is no
// CUDA device (or no driver) or `device` is out of range; InvalidArgument for a compute dtype the
// device cannot honour.
StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options);
// The device information of a backend MakeCudaBackend made (nullptr for another backend).
const CudaDeviceInfo* CudaInfo(const Backend& backend);
// Bytes of the weights a CUDA backend holds on the device, and of those the MatMul ops read in
// full each step (the decode's bandwidth floor, for benchmarks); zeros for another backend.
struct CudaWeightBytes {
  size_t on_device = 0, matmul = 0;
};
CudaWeightBytes CudaWeights(const Backend& backend);
// The number of CUDA devices (0 where there is no driver or device, or the module cannot load).
int CudaDeviceCount();

}  // namespace g4
