// Runtime weight format -> kernel template instance (blocks.h's WeightFormat), for the .cu files.
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>

#include "backends/cuda/blocks.h"

namespace g4::cuda {

// Calls fn(std::integral_constant<int, F>()) for the runtime format f (its launch), then returns
// the launch's error; cudaErrorInvalidValue for a format with no kernel.
template <typename Fn>
cudaError_t WithFormat(int f, Fn&& fn) {
  switch (f) {
    case kWF32: fn(std::integral_constant<int, kWF32>()); break;
    case kWF16: fn(std::integral_constant<int, kWF16>()); break;
    case kWBF16: fn(std::integral_constant<int, kWBF16>()); break;
    case kWQ8_0: fn(std::integral_constant<int, kWQ8_0>()); break;
    case kWQ4_0: fn(std::integral_constant<int, kWQ4_0>()); break;
    case kWQ4_K: fn(std::integral_constant<int, kWQ4_K>()); break;
    case kWQ6_K: fn(std::integral_constant<int, kWQ6_K>()); break;
    case kWW4G32: fn(std::integral_constant<int, kWW4G32>()); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

// Calls fn(std::integral_constant<int, F>()) for every weight format F.
template <typename Fn>
void ForEachFormat(Fn&& fn) {
  for (int f = 0; f < kWNumFormats; ++f) WithFormat(f, fn);
}

}  // namespace g4::cuda
