#include "tensor/tensor.h"

#include "base/check.h"

namespace g4 {

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string Tensor::ShapeString() const { return ShapeToString(shape); }

float Tensor::GetF32(int64_t i) const {
  G4_CHECK(i >= 0 && i < numel());
  switch (dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, data + 4 * i, 4);
      return f;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, data + 2 * i, 2);
      return Bf16ToF32(h);
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, data + 2 * i, 2);
      return F16ToF32(h);
    }
    case DType::kI32: {
      int32_t v;
      std::memcpy(&v, data + 4 * i, 4);
      return static_cast<float>(v);
    }
    case DType::kI64: {
      int64_t v;
      std::memcpy(&v, data + 8 * i, 8);
      return static_cast<float>(v);
    }
    default: {  // block-quantised: decode the block that holds element i
      const int64_t be = DTypeBlockElems(dtype);
      G4_CHECK(be > 0 && be <= 256);
      float block[256];
      ConvertToF32(dtype, data + DTypeRowBytes(dtype, i / be * be), block, static_cast<size_t>(be));
      return block[i % be];
    }
  }
}

}  // namespace g4
