// ModelWeights: the tensors of one Gemma text decoder, bound by name from a TensorStore and
// checked against the ModelConfig's shapes. Views only; the store owns the memory.
// Names: transformers' (model.layers.N.self_attn.q_proj.weight, ...), under the prefix
// "model." (ForCausalLM), "model.language_model." (Gemma 4 / new Gemma 3 ForConditionalGeneration)
// or "language_model.model." (older Gemma 3 ForConditionalGeneration). Vision/audio tower tensors
// and the unused k/v tensors of KV-shared layers are ignored.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "tensor/tensor.h"

namespace g4 {

struct LayerWeights {
  const Tensor* input_norm = nullptr;            // [H]
  const Tensor* q_proj = nullptr;                // [Nq*D, H]
  const Tensor* k_proj = nullptr;                // [Nkv*D, H]   (null on KV-shared layers)
  const Tensor* v_proj = nullptr;                // [Nkv*D, H]   (null on k_eq_v and KV-shared layers)
  const Tensor* q_norm = nullptr;                // [D]
  const Tensor* k_norm = nullptr;                // [D]          (null on KV-shared layers)
  const Tensor* o_proj = nullptr;                // [H, Nq*D]
  const Tensor* post_attn_norm = nullptr;        // [H]
  const Tensor* pre_ffn_norm = nullptr;          // [H]
  const Tensor* gate_proj = nullptr;             // [I, H]
  const Tensor* up_proj = nullptr;               // [I, H]
  const Tensor* down_proj = nullptr;             // [H, I]
  const Tensor* post_ffn_norm = nullptr;         // [H]
  // PLE (Gemma 4 E models)
  const Tensor* ple_gate = nullptr;              // [P, H]
  const Tensor* ple_proj = nullptr;              // [H, P]
  const Tensor* ple_post_norm = nullptr;         // [H]
  float layer_scalar = 1.0f;                     // Gemma 4 layer_scalar buffer [1]
  // MoE (26B-A4B)
  const Tensor* router_proj = nullptr;           // [E, H]
  const Tensor* router_scale = nullptr;          // [H]
  const Tensor* per_expert_scale = nullptr;      // [E]
  const Tensor* experts_gate_up = nullptr;       // [E, 2*Iexp, H]
  const Tensor* experts_down = nullptr;          // [E, H, Iexp]
  const Tensor* pre_ffn_norm_2 = nullptr;        // [H]
  const Tensor* post_ffn_norm_1 = nullptr;       // [H]
  const Tensor* post_ffn_norm_2 = nullptr;       // [H]
};

struct ModelWeights {
  std::string prefix;                            // the name prefix found, e.g. "model.language_model."
  const Tensor* embed = nullptr;                 // [V, H]
  const Tensor* lm_head = nullptr;               // [V, H] (== embed when tied)
  const Tensor* final_norm = nullptr;            // [H]
  const Tensor* ple_embed = nullptr;             // [V_ple, L*P]
  const Tensor* ple_model_proj = nullptr;        // [L*P, H]
  const Tensor* ple_proj_norm = nullptr;         // [P]
  std::vector<LayerWeights> layers;
  size_t total_bytes = 0;                        // bytes of all bound tensors (tied head counted once)
};

// Binds and checks every tensor the config needs. Errors: NotFound naming the tensor (and the
// prefix tried) when one is missing; InvalidArgument naming tensor, file, expected and actual
// shape on a shape mismatch, or a non-float dtype.
StatusOr<ModelWeights> BindWeights(const ModelConfig& config, const TensorStore& store);

}  // namespace g4
