#include "model/weights.h"

namespace g4 {
namespace {

class Binder {
 public:
  Binder(const TensorStore& store, std::string prefix, ModelWeights* w) : store_(store), prefix_(std::move(prefix)), w_(w) {}

  // Binds prefix+name with the expected shape.
  Status Bind(const std::string& name, std::vector<int64_t> shape, const Tensor** out, bool use_prefix = true) {
    const std::string full = (use_prefix ? prefix_ : "") + name;
    const Tensor* t = store_.Find(full);
    if (t == nullptr) return NotFound("checkpoint is missing tensor '" + full + "'");
    if (!IsFloatDType(t->dtype))
      return InvalidArgument("tensor '" + full + "' in " + t->file + " has dtype " + std::string(DTypeName(t->dtype)) + "; expected F32, F16 or BF16");
    if (t->shape != shape)
      return InvalidArgument("tensor '" + full + "' in " + t->file + " has shape " + t->ShapeString() + "; the config implies " + ShapeToString(shape));
    *out = t;
    w_->total_bytes += t->nbytes;
    return OkStatus();
  }

 private:
  const TensorStore& store_;
  std::string prefix_;
  ModelWeights* w_;
};

}  // namespace

StatusOr<ModelWeights> BindWeights(const ModelConfig& c, const TensorStore& store) {
  ModelWeights w;
  for (const char* p : {"model.language_model.", "model.", "language_model.model.", ""}) {
    if (store.Find(std::string(p) + "embed_tokens.weight") != nullptr) {
      w.prefix = p;
      break;
    }
  }
  if (store.Find(w.prefix + "embed_tokens.weight") == nullptr)
    return NotFound("checkpoint has no token embedding (looked for 'model.language_model.embed_tokens.weight', 'model.embed_tokens.weight' and 'language_model.model.embed_tokens.weight')");
  Binder b(store, w.prefix, &w);
  const int64_t H = c.hidden;
  G4_RETURN_IF_ERROR(b.Bind("embed_tokens.weight", {c.vocab, H}, &w.embed));
  G4_RETURN_IF_ERROR(b.Bind("norm.weight", {H}, &w.final_norm));
  if (c.tie_embeddings) {
    w.lm_head = w.embed;
  } else {
    G4_RETURN_IF_ERROR(b.Bind("lm_head.weight", {c.vocab, H}, &w.lm_head, /*use_prefix=*/false));
  }
  const int64_t L = c.num_layers, P = c.ple_dim;
  if (P > 0) {
    G4_RETURN_IF_ERROR(b.Bind("embed_tokens_per_layer.weight", {c.ple_vocab, L * P}, &w.ple_embed));
    G4_RETURN_IF_ERROR(b.Bind("per_layer_model_projection.weight", {L * P, H}, &w.ple_model_proj));
    G4_RETURN_IF_ERROR(b.Bind("per_layer_projection_norm.weight", {P}, &w.ple_proj_norm));
  }
  w.layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    const LayerPlan& lp = c.layers[i];
    LayerWeights& lw = w.layers[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    const int64_t D = lp.head_dim, Nq = c.num_heads, Nkv = lp.num_kv_heads, I = lp.mlp_width;
    G4_RETURN_IF_ERROR(b.Bind(p + "input_layernorm.weight", {H}, &lw.input_norm));
    G4_RETURN_IF_ERROR(b.Bind(p + "self_attn.q_proj.weight", {Nq * D, H}, &lw.q_proj));
    G4_RETURN_IF_ERROR(b.Bind(p + "self_attn.q_norm.weight", {D}, &lw.q_norm));
    if (lp.kv_donor < 0) {
      G4_RETURN_IF_ERROR(b.Bind(p + "self_attn.k_proj.weight", {Nkv * D, H}, &lw.k_proj));
      G4_RETURN_IF_ERROR(b.Bind(p + "self_attn.k_norm.weight", {D}, &lw.k_norm));
      if (!lp.k_eq_v) G4_RETURN_IF_ERROR(b.Bind(p + "self_attn.v_proj.weight", {Nkv * D, H}, &lw.v_proj));
    }
    G4_RETURN_IF_ERROR(b.Bind(p + "self_attn.o_proj.weight", {H, Nq * D}, &lw.o_proj));
    G4_RETURN_IF_ERROR(b.Bind(p + "post_attention_layernorm.weight", {H}, &lw.post_attn_norm));
    G4_RETURN_IF_ERROR(b.Bind(p + "pre_feedforward_layernorm.weight", {H}, &lw.pre_ffn_norm));
    G4_RETURN_IF_ERROR(b.Bind(p + "post_feedforward_layernorm.weight", {H}, &lw.post_ffn_norm));
    G4_RETURN_IF_ERROR(b.Bind(p + "mlp.gate_proj.weight", {I, H}, &lw.gate_proj));
    G4_RETURN_IF_ERROR(b.Bind(p + "mlp.up_proj.weight", {I, H}, &lw.up_proj));
    G4_RETURN_IF_ERROR(b.Bind(p + "mlp.down_proj.weight", {H, I}, &lw.down_proj));
    if (P > 0) {
      G4_RETURN_IF_ERROR(b.Bind(p + "per_layer_input_gate.weight", {P, H}, &lw.ple_gate));
      G4_RETURN_IF_ERROR(b.Bind(p + "per_layer_projection.weight", {H, P}, &lw.ple_proj));
      G4_RETURN_IF_ERROR(b.Bind(p + "post_per_layer_input_norm.weight", {H}, &lw.ple_post_norm));
    }
    if (c.family == ModelFamily::kGemma4) {
      const Tensor* s = nullptr;
      G4_RETURN_IF_ERROR(b.Bind(p + "layer_scalar", {1}, &s));
      lw.layer_scalar = s->GetF32(0);
    }
    if (lp.moe) {
      const int64_t E = c.num_experts, Ie = c.moe_width;
      G4_RETURN_IF_ERROR(b.Bind(p + "router.proj.weight", {E, H}, &lw.router_proj));
      G4_RETURN_IF_ERROR(b.Bind(p + "router.scale", {H}, &lw.router_scale));
      G4_RETURN_IF_ERROR(b.Bind(p + "router.per_expert_scale", {E}, &lw.per_expert_scale));
      G4_RETURN_IF_ERROR(b.Bind(p + "experts.gate_up_proj", {E, 2 * Ie, H}, &lw.experts_gate_up));
      G4_RETURN_IF_ERROR(b.Bind(p + "experts.down_proj", {E, H, Ie}, &lw.experts_down));
      G4_RETURN_IF_ERROR(b.Bind(p + "pre_feedforward_layernorm_2.weight", {H}, &lw.pre_ffn_norm_2));
      G4_RETURN_IF_ERROR(b.Bind(p + "post_feedforward_layernorm_1.weight", {H}, &lw.post_ffn_norm_1));
      G4_RETURN_IF_ERROR(b.Bind(p + "post_feedforward_layernorm_2.weight", {H}, &lw.post_ffn_norm_2));
    }
  }
  return w;
}

}  // namespace g4
