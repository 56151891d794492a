// Weights kept in owned memory instead of the mapped checkpoint: compressed-tensors W4A16
// checkpoints repacked at load, and float checkpoints quantised at load (`--quantize`).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "model/weights.h"
#include "tensor/tensor.h"

namespace g4 {

// A TensorStore over another one (which it owns): tensors put here replace or add to the base's,
// hidden names disappear. Put tensors own their bytes.
class OverlayStore : public TensorStore {
 public:
  explicit OverlayStore(std::unique_ptr<TensorStore> base) : base_(std::move(base)) {}
  const Tensor* Find(std::string_view name) const override;
  std::vector<std::string> Names() const override;
  // Adds `t` (its data pointer is replaced by `bytes`, which the store keeps).
  void Put(Tensor t, std::vector<uint8_t> bytes);
  // A tensor put here is packed in its own bytes; any other goes to the base store.
  bool PackQ4_0x4(const Tensor& t) override;
  void Hide(const std::string& name) { hidden_.insert(name); }
  const TensorStore& base() const { return *base_; }

 private:
  struct Owned {
    Tensor tensor;
    std::vector<uint8_t> bytes;
  };
  std::unique_ptr<TensorStore> base_;
  std::map<std::string, Owned, std::less<>> owned_;
  std::set<std::string, std::less<>> hidden_;
};

// compressed-tensors `pack-quantized` checkpoints (Google's *-qat-w4a16-ct; spec section 7).
//
// `qconfig` is config.json's "quantization_config". Supported: quant_method "compressed-tensors",
// format "pack-quantized", every config group with weights {num_bits 4, type int, symmetric,
// strategy "group" with group_size a multiple of 32, or "channel"}, no actorder, no input/output
// activation quantisation, no sparsity or KV-cache scheme. Each quantised linear X has
// X.weight_packed (I32 [out, in/8], element 8c + i in bits 4i..4i+3 of word c, stored as q + 8),
// X.weight_scale (BF16 [out, in/G]) and X.weight_shape ([2] = out, in); it is presented as
// X.weight of dtype kW4G32 [out, in] (repacked once at load into owned memory; the scale repeats
// for every 32-element block of its group). Errors: Unimplemented naming the field or tensor for
// other variants (asymmetric/zero points, other bit widths, g_idx/actorder, fp16 scales, ...),
// DataLoss for inconsistent shapes or non-finite scales.
StatusOr<std::unique_ptr<TensorStore>> WrapCompressedTensors(std::unique_ptr<TensorStore> store,
                                                             const std::string& qconfig_json,
                                                             const std::string& where);

// Quantisation at load (`--quantize`). Matmul weights (attention and MLP projections, experts, an
// untied LM head; for q8_0/q4_0 also the PLE projections) whose rows are a multiple of 32 become
// `target` (kQ8_0, kQ4_0 or kW4G32); the token embedding and the PLE table become Q8_0 when
// ple_bits == 8 and stay as stored when 16. With kW4G32 (w4a16, like Google's W4A16 checkpoints)
// the PLE projections go with the PLE table: Q8_0 at ple_bits 8, as stored at 16; norms, scalars, the MoE router and rows that are not a multiple of 32 stay as
// stored. Only F32/F16/BF16 tensors are converted (InvalidArgument otherwise). Tensor by tensor:
// each source tensor's mapped pages are released (madvise MADV_DONTNEED) once converted, so the
// resident set does not hold both copies. Rebinds `weights` against the returned store.
struct QuantizeStats {
  int tensors = 0;        // converted
  size_t bytes_in = 0;    // their stored bytes
  size_t bytes_out = 0;   // their converted bytes
};
StatusOr<std::unique_ptr<TensorStore>> QuantizeWeights(std::unique_ptr<TensorStore> store, const ModelConfig& config,
                                                       DType target, int ple_bits, ModelWeights* weights,
                                                       QuantizeStats* stats);

}  // namespace g4
