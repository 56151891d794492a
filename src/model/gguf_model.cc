#include "model/gguf_model.h"

#include <cmath>
#include <map>
#include <regex>

namespace g4 {
namespace {

// Per-layer integer that GGUF stores as a scalar or as an array with one entry per layer
// (feed_forward_length with a double-wide MLP, head_count_kv with global KV heads).
Status PerLayerInt(const GgufFile& f, const std::string& key, int layers, std::vector<int>* out, std::optional<int> dflt) {
  const GgufValue* v = f.FindMeta(key);
  out->assign(layers, dflt.value_or(0));
  if (v == nullptr) {
    if (!dflt) return NotFound(f.path() + ": no metadata key '" + key + "'");
    return OkStatus();
  }
  if (v->type == GgufValue::Type::kArray) {
    if (static_cast<int>(v->size()) != layers)
      return InvalidArgument(f.path() + ": metadata key '" + key + "' has " + std::to_string(v->size()) +
                             " entries; block_count is " + std::to_string(layers));
    if (!IsGgufIntegerType(v->array_type))
      return InvalidArgument(f.path() + ": metadata key '" + key + "' is an array of GGUF type " +
                             std::to_string(v->array_type) + ", not of integers");
    for (int i = 0; i < layers; ++i) {
      const int64_t x = v->IntAt(i);
      if (x < 0 || x > (1 << 30)) return InvalidArgument(f.path() + ": metadata key '" + key + "' entry out of range");
      (*out)[i] = static_cast<int>(x);
    }
    return OkStatus();
  }
  G4_ASSIGN_OR_RETURN(int64_t x, f.GetInt(key));
  if (x < 0 || x > (1 << 30)) return InvalidArgument(f.path() + ": metadata key '" + key + "' out of range");
  out->assign(layers, static_cast<int>(x));
  return OkStatus();
}

Status PositiveInt(const GgufFile& f, const std::string& key, int* out, std::optional<int> dflt = std::nullopt) {
  if (f.FindMeta(key) == nullptr && dflt) {
    *out = *dflt;
    return OkStatus();
  }
  G4_ASSIGN_OR_RETURN(int64_t x, f.GetInt(key));
  if (x <= 0 || x > (1 << 30)) return InvalidArgument(f.path() + ": metadata key '" + key + "' = " + std::to_string(x) + " is out of range");
  *out = static_cast<int>(x);
  return OkStatus();
}

}  // namespace

StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& f) {
  G4_ASSIGN_OR_RETURN(std::string arch, f.GetString("general.architecture"));
  if (arch != "gemma3" && arch != "gemma4")
    return Unimplemented(f.path() + ": general.architecture '" + arch + "' is not supported (gemma3, gemma4 are)");
  const bool g4 = arch == "gemma4";
  const std::string a = arch + ".";
  ModelConfig c;
  c.family = g4 ? ModelFamily::kGemma4 : ModelFamily::kGemma3;
  c.architecture = "gguf:" + arch;
  G4_RETURN_IF_ERROR(PositiveInt(f, a + "embedding_length", &c.hidden));
  G4_RETURN_IF_ERROR(PositiveInt(f, a + "block_count", &c.num_layers));
  G4_RETURN_IF_ERROR(PositiveInt(f, a + "attention.head_count", &c.num_heads));
  G4_RETURN_IF_ERROR(PositiveInt(f, a + "context_length", &c.max_position, 131072));
  const Tensor* embd = f.Find("token_embd.weight");
  if (embd == nullptr || embd->shape.size() != 2) return NotFound(f.path() + ": no 2-D tensor 'token_embd.weight'");
  c.vocab = static_cast<int>(embd->shape[0]);
  c.rms_eps = static_cast<float>(f.GetFloat(a + "attention.layer_norm_rms_epsilon", 1e-6));
  c.final_softcap = static_cast<float>(f.GetFloat(a + "final_logit_softcapping", 0.0));
  c.attn_softcap = static_cast<float>(f.GetFloat(a + "attn_logit_softcapping", 0.0));
  c.tie_embeddings = f.Find("output.weight") == nullptr;
  c.bos_id = static_cast<int>(f.GetInt("tokenizer.ggml.bos_token_id", 2));
  c.eos_id = static_cast<int>(f.GetInt("tokenizer.ggml.eos_token_id", 1));
  c.pad_id = static_cast<int>(f.GetInt("tokenizer.ggml.padding_token_id", 0));
  c.stop_ids = {c.eos_id};
  if (const GgufValue* eot = f.FindMeta("tokenizer.ggml.eot_token_id"))
    c.stop_ids.push_back(static_cast<int>(eot->type == GgufValue::Type::kInt ? eot->i : eot->u));
  G4_RETURN_IF_ERROR(PositiveInt(f, a + "attention.sliding_window", &c.sliding_window, 4096));

  const int L = c.num_layers;
  std::vector<int> ffn, kv;
  G4_RETURN_IF_ERROR(PerLayerInt(f, a + "feed_forward_length", L, &ffn, std::nullopt));
  G4_RETURN_IF_ERROR(PerLayerInt(f, a + "attention.head_count_kv", L, &kv, c.num_heads));
  int head_dim = 0, head_dim_swa = 0;
  G4_RETURN_IF_ERROR(PositiveInt(f, a + "attention.key_length", &head_dim, c.hidden / c.num_heads));
  G4_RETURN_IF_ERROR(PositiveInt(f, a + "attention.key_length_swa", &head_dim_swa, head_dim));

  // Layer types: gemma4 stores a bool per layer (true = sliding); llama.cpp hard-codes a period
  // of 6 for gemma3 (every 6th layer full) unless sliding_window_pattern is given.
  std::vector<LayerType> types(L, LayerType::kSliding);
  const GgufValue* pattern = f.FindMeta(a + "attention.sliding_window_pattern");
  if (pattern != nullptr && pattern->type == GgufValue::Type::kArray) {
    if (static_cast<int>(pattern->size()) != L)
      return InvalidArgument(f.path() + ": '" + a + "attention.sliding_window_pattern' has " + std::to_string(pattern->size()) + " entries, expected " + std::to_string(L));
    for (int i = 0; i < L; ++i) types[i] = pattern->BoolAt(i) ? LayerType::kSliding : LayerType::kFull;
  } else {
    const int period = pattern != nullptr ? static_cast<int>(f.GetInt(a + "attention.sliding_window_pattern", 6)) : 6;
    if (period <= 0) return InvalidArgument(f.path() + ": '" + a + "attention.sliding_window_pattern' must be > 0");
    for (int i = 0; i < L; ++i) types[i] = ((i + 1) % period) ? LayerType::kSliding : LayerType::kFull;
  }

  RopeSpec rope_full, rope_swa;
  rope_full.theta = f.GetFloat(a + "rope.freq_base", 1e6);
  rope_swa.theta = f.GetFloat(a + "rope.freq_base_swa", 10000.0);
  if (const GgufValue* st = f.FindMeta(a + "rope.scaling.type"); st != nullptr && st->type == GgufValue::Type::kString) {
    if (st->s == "linear") {
      rope_full.factor = f.GetFloat(a + "rope.scaling.factor", 1.0);
      if (rope_full.factor <= 0) return InvalidArgument(f.path() + ": rope.scaling.factor must be > 0");
    } else if (st->s != "none") {
      return Unimplemented(f.path() + ": rope.scaling.type '" + st->s + "' is not supported");
    }
  }
  // Proportional RoPE is stored as rope_freqs: 1.0 for rotated pairs, 1e30 (identity) after.
  if (const Tensor* rf = f.Find("rope_freqs.weight")) {
    if (rf->dtype != DType::kF32 || rf->shape.size() != 1 || rf->shape[0] != head_dim / 2)
      return InvalidArgument(f.path() + ": rope_freqs.weight must be F32 [" + std::to_string(head_dim / 2) + "]");
    int rotated = 0;
    while (rotated < rf->shape[0] && rf->GetF32(rotated) == 1.0f) ++rotated;
    for (int64_t j = rotated; j < rf->shape[0]; ++j)
      if (rf->GetF32(j) < 1e20f) return Unimplemented(f.path() + ": rope_freqs with factors other than 1 and 1e30 are not supported");
    rope_full.proportional = true;
    rope_full.partial_rotary_factor = static_cast<double>(rotated) / (head_dim / 2);
  }

  c.num_kv_shared_layers = g4 ? static_cast<int>(f.GetInt(a + "attention.shared_kv_layers", 0)) : 0;
  if (c.num_kv_shared_layers < 0 || c.num_kv_shared_layers >= L)
    return InvalidArgument(f.path() + ": '" + a + "attention.shared_kv_layers' must be in [0, block_count)");
  c.ple_dim = g4 ? static_cast<int>(f.GetInt(a + "embedding_length_per_layer_input", 0)) : 0;
  if (c.ple_dim > 0) {
    const Tensor* ple = f.Find("per_layer_token_embd.weight");
    if (ple == nullptr) return NotFound(f.path() + ": PLE is configured but 'per_layer_token_embd.weight' is missing");
    c.ple_vocab = static_cast<int>(ple->shape[0]);
  }
  c.num_experts = static_cast<int>(f.GetInt(a + "expert_count", 0));
  if (c.num_experts > 0) {
    G4_RETURN_IF_ERROR(PositiveInt(f, a + "expert_used_count", &c.top_k_experts));
    G4_RETURN_IF_ERROR(PositiveInt(f, a + "expert_feed_forward_length", &c.moe_width));
    if (c.top_k_experts > c.num_experts) return InvalidArgument(f.path() + ": expert_used_count exceeds expert_count");
  }

  const int first_shared = L - c.num_kv_shared_layers;
  c.layers.resize(L);
  for (int i = 0; i < L; ++i) {
    LayerPlan& l = c.layers[i];
    l.type = types[i];
    const bool full = l.type == LayerType::kFull;
    l.head_dim = g4 && !full ? head_dim_swa : head_dim;
    l.num_kv_heads = kv[i];
    if (l.num_kv_heads <= 0 || c.num_heads % l.num_kv_heads)
      return InvalidArgument(f.path() + ": head_count_kv of layer " + std::to_string(i) + " does not divide head_count");
    l.window = full ? 0 : c.sliding_window;
    l.rope = full ? rope_full : rope_swa;
    l.mlp_width = ffn[i];
    l.moe = c.num_experts > 0;
    const std::string blk = "blk." + std::to_string(i) + ".";
    l.k_eq_v = g4 && full && i < first_shared && f.Find(blk + "attn_v.weight") == nullptr;
    if (i >= first_shared) {
      for (int d = first_shared - 1; d >= 0; --d)
        if (types[d] == l.type) { l.kv_donor = d; break; }
      if (l.kv_donor < 0) return InvalidArgument(f.path() + ": KV-shared layer " + std::to_string(i) + " has no donor of its type");
    }
  }
  c.norm_offset = 0.0f;  // gemma3 GGUFs fold the +1; gemma4 has none
  c.v_norm = g4;
  if (g4) {
    c.attn_scale = 1.0f;
  } else {
    // llama.cpp: 1/sqrt(head_dim), except Gemma 3 27B (62 layers) which uses 1/sqrt(n_embd/n_head).
    const double scalar = c.num_layers == 62 ? static_cast<double>(c.hidden) / c.num_heads : head_dim;
    c.attn_scale = static_cast<float>(f.GetFloat(a + "attention.scale", 1.0 / std::sqrt(scalar)));
  }
  return c;
}

namespace {

// GGUF name -> HF name (without the "model." prefix). Source: gguf-py constants.py TENSOR_NAMES
// and llama.cpp's Gemma converters.
std::string HfName(const std::string& g) {
  static const std::map<std::string, std::string> kGlobal = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
      {"per_layer_token_embd.weight", "model.embed_tokens_per_layer.weight"},
      {"per_layer_model_proj.weight", "model.per_layer_model_projection.weight"},
      {"per_layer_proj_norm.weight", "model.per_layer_projection_norm.weight"},
  };
  static const std::map<std::string, std::string> kLayer = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"},
      {"post_attention_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_norm.weight", "pre_feedforward_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
      {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
      {"pre_ffw_norm_2.weight", "pre_feedforward_layernorm_2.weight"},
      {"post_ffw_norm_1.weight", "post_feedforward_layernorm_1.weight"},
      {"post_ffw_norm_2.weight", "post_feedforward_layernorm_2.weight"},
      {"ffn_gate_inp.weight", "router.proj.weight"},
      {"ffn_gate_inp.scale", "router.scale"},
      {"ffn_down_exps.scale", "router.per_expert_scale"},
      {"ffn_gate_up_exps.weight", "experts.gate_up_proj"},
      {"ffn_down_exps.weight", "experts.down_proj"},
      {"inp_gate.weight", "per_layer_input_gate.weight"},
      {"proj.weight", "per_layer_projection.weight"},
      {"post_norm.weight", "post_per_layer_input_norm.weight"},
      {"layer_output_scale.weight", "layer_scalar"},
  };
  if (auto it = kGlobal.find(g); it != kGlobal.end()) return it->second;
  static const std::regex kBlk(R"(blk\.(\d+)\.(.+))");
  std::smatch m;
  if (std::regex_match(g, m, kBlk)) {
    if (auto it = kLayer.find(m[2].str()); it != kLayer.end()) return "model.layers." + m[1].str() + "." + it->second;
  }
  return "";
}

class HfNamedGgufStore : public TensorStore {
 public:
  explicit HfNamedGgufStore(std::unique_ptr<GgufFile> f) : file_(std::move(f)) {
    for (const std::string& name : file_->Names()) {
      const std::string hf = HfName(name);
      if (!hf.empty()) by_hf_[hf] = file_->Find(name);
    }
  }
  const Tensor* Find(std::string_view name) const override {
    auto it = by_hf_.find(name);
    return it == by_hf_.end() ? nullptr : it->second;
  }
  std::vector<std::string> Names() const override {
    std::vector<std::string> out;
    for (const auto& [k, v] : by_hf_) out.push_back(k);
    return out;
  }
  bool PackQ4_0x4(const Tensor& t) override { return file_->PackQ4_0x4(t); }

 private:
  std::unique_ptr<GgufFile> file_;
  std::map<std::string, const Tensor*, std::less<>> by_hf_;
};

}  // namespace

std::unique_ptr<TensorStore> MakeHfNamedGgufStore(std::unique_ptr<GgufFile> file) {
  return std::make_unique<HfNamedGgufStore>(std::move(file));
}

}  // namespace g4
