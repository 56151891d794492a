// ModelConfig: a Gemma 3 / Gemma 4 text decoder described as a per-layer plan.
//
// Everything the model definition (model/gemma.h) branches on is a field here, so model
// differences are configuration, not code paths. Parsed from a Hugging Face config.json
// (ParseHfConfig); GGUF metadata maps onto the same struct.
// Sources: transformers configuration_gemma3.py / configuration_gemma4.py (v5.24) and
// ../shared/spec/gemma-architecture.md sections 1, 2, 8.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"

namespace g4 {

enum class ModelFamily { kGemma3, kGemma4 };
enum class LayerType { kSliding, kFull };

// RoPE for one layer type. NeoX (rotate_half) pairing: dims (j, j + head_dim/2) rotate by
// pos * inv_freq[j]. inv_freq has head_dim/2 entries:
//   inv_freq[j] = theta^(-2j/head_dim) / factor   for j < rotated_pairs, else 0 (identity).
// Default RoPE rotates all pairs; "proportional" (Gemma 4 full layers) rotates
// int(partial_rotary_factor * head_dim / 2) pairs with the exponent over the FULL head_dim
// (transformers modeling_rope_utils._compute_proportional_rope_parameters).
struct RopeSpec {
  double theta = 10000.0;
  double factor = 1.0;                // linear scaling ("rope_type": "linear"): positions / factor
  double partial_rotary_factor = 1.0; // only for "proportional"
  bool proportional = false;
  // Inverse frequencies for `head_dim` (head_dim/2 entries), in f32 like transformers.
  std::vector<float> InvFreq(int head_dim) const;
};

struct LayerPlan {
  LayerType type = LayerType::kSliding;
  int head_dim = 0;        // D for q, k and v of this layer
  int num_kv_heads = 0;    // Nkv; query head h reads kv head h / (num_heads / Nkv)
  int window = 0;          // sliding window W (keys q-W+1..q) or 0 for full causal attention
  RopeSpec rope;
  int kv_donor = -1;       // -1: computes and caches its own K/V; else the layer whose K/V it reads
  bool k_eq_v = false;     // V is the raw k_proj output (before k_norm/RoPE); no v_proj
  int mlp_width = 0;       // intermediate size of the dense GeGLU MLP
  bool moe = false;        // 26B-A4B: dense MLP + MoE branch in parallel
};

struct ModelConfig {
  ModelFamily family = ModelFamily::kGemma4;
  std::string architecture;    // e.g. "Gemma4ForConditionalGeneration"
  int hidden = 0;              // H
  int vocab = 0;               // V (rows of embed_tokens and of the tied LM head)
  int num_layers = 0;          // L
  int num_heads = 0;           // Nq (same on every layer)
  float rms_eps = 1e-6f;
  float norm_offset = 0.0f;    // RMSNorm multiplies by (offset + w): Gemma 3 HF 1.0, Gemma 4 0.0
  bool v_norm = true;          // Gemma 4: scale-free RMSNorm on V; Gemma 3: none
  float attn_scale = 1.0f;     // multiplies q.k: Gemma 4 1.0; Gemma 3 query_pre_attn_scalar^-1/2
  float attn_softcap = 0.0f;   // 0 = none
  float final_softcap = 0.0f;  // 0 = none; Gemma 4 30.0
  int sliding_window = 0;
  int max_position = 0;        // max_position_embeddings
  // Per-layer embeddings (Gemma 4 E2B/E4B): P = ple_dim (0 = none), table rows ple_vocab.
  int ple_dim = 0;
  int ple_vocab = 0;
  // MoE (26B-A4B).
  int num_experts = 0;
  int top_k_experts = 0;
  int moe_width = 0;           // moe_intermediate_size
  int num_kv_shared_layers = 0;
  bool tie_embeddings = true;
  int bos_id = 2, eos_id = 1, pad_id = 0;
  std::vector<int> stop_ids;   // eos_token_id (int or list)
  std::vector<LayerPlan> layers;

  // Number of layers that own a KV cache (kv_donor == -1).
  int NumCacheOwners() const;
  // One line per layer: "l  type  D  Nkv  window  rope  donor  mlp", for `gemma4rt info`.
  std::string Describe() const;
};

// Parses a Hugging Face config.json (text decoders of Gemma3ForCausalLM,
// Gemma3ForConditionalGeneration, Gemma4ForCausalLM, Gemma4ForConditionalGeneration; the
// ConditionalGeneration forms keep the decoder under "text_config"). Accepts both Gemma 4
// schemas: Google's (global_head_dim, num_global_key_value_heads) and transformers >= 5.15's
// (per_layer_config). Errors: InvalidArgument naming the field for missing, mistyped,
// out-of-range or contradictory fields; Unimplemented for valid configs we do not support.
StatusOr<ModelConfig> ParseHfConfig(const nlohmann::json& config);
StatusOr<ModelConfig> ParseHfConfigFile(const std::string& path);

}  // namespace g4
