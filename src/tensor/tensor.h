// Tensor: a typed, shaped, read-only view of bytes owned elsewhere (usually an mmap'd file).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.h"

namespace g4 {

struct Tensor {
  std::string name;            // name in its file, e.g. "model.layers.0.self_attn.q_proj.weight"
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // outermost first (PyTorch order): nn.Linear weights are [out, in]
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::string file;            // the file it came from, for error messages

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  // "[a, b, c]" for messages.
  std::string ShapeString() const;
  // Reads element `i` (flat index) of a float tensor as f32.
  float GetF32(int64_t i) const;
};

std::string ShapeToString(const std::vector<int64_t>& shape);

// A set of named tensors (one checkpoint: safetensors files, later GGUF). Implementations keep the
// backing memory alive for as long as the store lives.
class TensorStore {
 public:
  virtual ~TensorStore() = default;
  // nullptr when absent.
  virtual const Tensor* Find(std::string_view name) const = 0;
  // All tensor names, sorted.
  virtual std::vector<std::string> Names() const = 0;
  // Rewrites `t`, a 2-D Q4_0 tensor of this store with a multiple of 4 rows, in place as kQ4_0x4
  // (PackQ4_0x4InPlace) and changes its dtype; every pointer to it sees the new layout. false
  // (nothing changed) where its bytes cannot be written: mapped from a file (not copied into
  // memory), or a store that does not own them. For the loader (LoadOptions::pack_q4_0) only.
  virtual bool PackQ4_0x4(const Tensor& t) {
    (void)t;
    return false;
  }
};

}  // namespace g4
