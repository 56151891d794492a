// ggml block formats -> f32. (Placeholder until the GGUF work lands: no block type yet.)
#include <cstddef>

#include "tensor/dtype.h"

namespace g4 {

bool DequantizeRow(DType t, const void* src, float* dst, size_t n) { return false; }

}  // namespace g4
