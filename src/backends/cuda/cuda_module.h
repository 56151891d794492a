// The boundary between the engine and the CUDA backend's shared module (libgemma4rt_cuda.so).
//
// The module holds the backend and its kernels and links the CUDA runtime and cuBLAS; the engine
// loads it with dlopen only when --backend cuda asks for it (cuda_loader.cc), so a build with the
// CUDA backend starts, runs the CPU backend and stays small (no cuBLAS mapped) on a machine with
// no GPU or no CUDA libraries. The module exports one C symbol, g4_cuda_backend_api, returning a
// table of its entry points; both sides are compiled from the same headers by the same build.
#pragma once

#include "backends/cuda/cuda_backend.h"

namespace g4::cuda {

inline constexpr int kModuleApiVersion = 1;

struct ModuleApi {
  int version;  // kModuleApiVersion
  StatusOr<std::unique_ptr<Backend>> (*make)(const CudaBackendOptions& options);
  const CudaDeviceInfo* (*info)(const Backend& backend);
  CudaWeightBytes (*weights)(const Backend& backend);
  int (*device_count)();
};

}  // namespace g4::cuda

extern "C" const g4::cuda::ModuleApi* g4_cuda_backend_api();
