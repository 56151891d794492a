// The CPU backend: compiles a step graph into a buffer plan (liveness-based reuse, allocated
// once per step shape) and runs it with the kernels in kernels.h. f32 activations, weights read
// in their stored dtype.
#pragma once

#include <memory>

#include "runtime/backend.h"

namespace g4 {

// threads: worker threads for matmuls and attention (>= 1; the caller's thread is one of them).
std::unique_ptr<Backend> MakeCpuBackend(int threads = 1);

}  // namespace g4
