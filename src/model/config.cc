#include "model/config.h"

#include <cmath>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/mapped_file.h"

namespace g4 {
namespace {

using json = nlohmann::json;

// Typed field access with errors that name the field ("text_config.hidden_size").
class Fields {
 public:
  Fields(const json& j, std::string prefix) : j_(j), prefix_(std::move(prefix)) {}

  bool Has(const char* k) const { return j_.contains(k) && !j_[k].is_null(); }
  std::string Name(const std::string& k) const { return prefix_ + k; }

  Status Int(const char* k, int* out, std::optional<int> dflt, int min_value) const {
    if (!Has(k)) {
      if (!dflt) return InvalidArgument("config: missing required field '" + Name(k) + "'");
      *out = *dflt;
      return OkStatus();
    }
    const json& v = j_[k];
    if (!v.is_number_integer()) return InvalidArgument("config: field '" + Name(k) + "' must be an integer, got " + v.dump());
    const int64_t x = v.get<int64_t>();
    if (x < min_value || x > (int64_t{1} << 30))
      return InvalidArgument("config: field '" + Name(k) + "' = " + std::to_string(x) + " is out of range (min " + std::to_string(min_value) + ")");
    *out = static_cast<int>(x);
    return OkStatus();
  }
  Status Float(const char* k, double* out, std::optional<double> dflt) const {
    if (!Has(k)) {
      if (!dflt) return InvalidArgument("config: missing required field '" + Name(k) + "'");
      *out = *dflt;
      return OkStatus();
    }
    const json& v = j_[k];
    if (!v.is_number()) return InvalidArgument("config: field '" + Name(k) + "' must be a number, got " + v.dump());
    *out = v.get<double>();
    if (!std::isfinite(*out)) return InvalidArgument("config: field '" + Name(k) + "' is not finite");
    return OkStatus();
  }
  Status Bool(const char* k, bool* out, bool dflt) const {
    if (!Has(k)) {
      *out = dflt;
      return OkStatus();
    }
    if (!j_[k].is_boolean()) return InvalidArgument("config: field '" + Name(k) + "' must be true/false, got " + j_[k].dump());
    *out = j_[k].get<bool>();
    return OkStatus();
  }
  const json& Get(const char* k) const { return j_[k]; }

 private:
  const json& j_;
  std::string prefix_;
};

Status ParseRopeSpec(const json& p, const std::string& field, RopeSpec* out) {
  if (!p.is_object()) return InvalidArgument("config: '" + field + "' must be an object");
  Fields f(p, field + ".");
  std::string type = "default";
  if (f.Has("rope_type")) {
    if (!p["rope_type"].is_string()) return InvalidArgument("config: '" + field + ".rope_type' must be a string");
    type = p["rope_type"].get<std::string>();
  }
  G4_RETURN_IF_ERROR(f.Float("rope_theta", &out->theta, std::nullopt));
  if (out->theta <= 1.0) return InvalidArgument("config: '" + field + ".rope_theta' must be > 1");
  out->factor = 1.0;
  out->partial_rotary_factor = 1.0;
  out->proportional = false;
  if (type == "default") {
  } else if (type == "linear") {
    G4_RETURN_IF_ERROR(f.Float("factor", &out->factor, std::nullopt));
  } else if (type == "proportional") {
    out->proportional = true;
    G4_RETURN_IF_ERROR(f.Float("factor", &out->factor, 1.0));
    G4_RETURN_IF_ERROR(f.Float("partial_rotary_factor", &out->partial_rotary_factor, 1.0));
    if (out->partial_rotary_factor <= 0 || out->partial_rotary_factor > 1)
      return InvalidArgument("config: '" + field + ".partial_rotary_factor' must be in (0, 1]");
  } else {
    return Unimplemented("config: '" + field + ".rope_type' = \"" + type + "\" is not supported (default, linear, proportional are)");
  }
  if (type != "proportional" && f.Has("partial_rotary_factor") && p["partial_rotary_factor"] != 1.0)
    return Unimplemented("config: '" + field + ".partial_rotary_factor' is only supported with rope_type proportional");
  if (out->factor <= 0) return InvalidArgument("config: '" + field + ".factor' must be > 0");
  return OkStatus();
}

Status ParseStopIds(const json& v, std::vector<int>* out) {
  if (v.is_number_integer()) {
    out->push_back(v.get<int>());
  } else if (v.is_array()) {
    for (const json& e : v) {
      if (!e.is_number_integer()) return InvalidArgument("config: 'eos_token_id' entries must be integers");
      out->push_back(e.get<int>());
    }
  } else if (!v.is_null()) {
    return InvalidArgument("config: 'eos_token_id' must be an integer or a list of integers");
  }
  return OkStatus();
}

}  // namespace

std::vector<float> RopeSpec::InvFreq(int head_dim) const {
  const int half = head_dim / 2;
  std::vector<float> inv(half, 0.0f);
  const int rotated = proportional ? static_cast<int>(partial_rotary_factor * head_dim / 2) : half;
  for (int j = 0; j < rotated && j < half; ++j) {
    // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), in f32.
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(head_dim);
    inv[j] = 1.0f / std::pow(static_cast<float>(theta), exponent);
    if (factor != 1.0) inv[j] = inv[j] / static_cast<float>(factor);
  }
  return inv;
}

int ModelConfig::NumCacheOwners() const {
  int n = 0;
  for (const LayerPlan& l : layers) n += l.kv_donor < 0;
  return n;
}

std::string ModelConfig::Describe() const {
  std::ostringstream s;
  s << "layer  type     head_dim  kv_heads  window  rope(theta,rotated_pairs)  kv_from  mlp" << (num_experts ? "  moe" : "") << "\n";
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerPlan& l = layers[i];
    const int rotated = l.rope.proportional ? static_cast<int>(l.rope.partial_rotary_factor * l.head_dim / 2) : l.head_dim / 2;
    s << i << "\t" << (l.type == LayerType::kSliding ? "sliding" : "full   ") << "  " << l.head_dim << "\t" << l.num_kv_heads
      << "\t" << l.window << "\t(" << l.rope.theta << "," << rotated << (l.rope.factor != 1.0 ? ",linear/" + std::to_string(l.rope.factor) : "")
      << ")\t" << (l.kv_donor < 0 ? std::string("self") : "layer " + std::to_string(l.kv_donor)) << "\t" << l.mlp_width
      << (l.k_eq_v ? "  k=v" : "") << (l.moe ? "  moe" : "") << "\n";
  }
  return s.str();
}

StatusOr<ModelConfig> ParseHfConfig(const json& root) {
  if (!root.is_object()) return InvalidArgument("config: top level must be a JSON object");
  ModelConfig c;
  std::string model_type = root.contains("model_type") && root["model_type"].is_string() ? root["model_type"].get<std::string>() : "";
  if (root.contains("architectures") && root["architectures"].is_array() && !root["architectures"].empty() &&
      root["architectures"][0].is_string())
    c.architecture = root["architectures"][0].get<std::string>();
  const bool nested = root.contains("text_config") && !root["text_config"].is_null();
  if (model_type == "gemma3" || model_type == "gemma3_text" || c.architecture.rfind("Gemma3", 0) == 0) {
    c.family = ModelFamily::kGemma3;
  } else if (model_type == "gemma4" || model_type == "gemma4_text" || c.architecture.rfind("Gemma4", 0) == 0) {
    c.family = ModelFamily::kGemma4;
  } else {
    return Unimplemented("config: 'model_type' = \"" + model_type + "\" / 'architectures' = \"" + c.architecture +
                         "\" is not a Gemma 3 or Gemma 4 text model");
  }
  if (nested && !root["text_config"].is_object()) return InvalidArgument("config: 'text_config' must be an object");
  const json& tc = nested ? root["text_config"] : root;
  const std::string prefix = nested ? "text_config." : "";
  Fields f(tc, prefix);
  const bool g4 = c.family == ModelFamily::kGemma4;

  int head_dim = 0, num_kv = 0, inter = 0;
  G4_RETURN_IF_ERROR(f.Int("hidden_size", &c.hidden, std::nullopt, 1));
  G4_RETURN_IF_ERROR(f.Int("num_hidden_layers", &c.num_layers, std::nullopt, 1));
  G4_RETURN_IF_ERROR(f.Int("num_attention_heads", &c.num_heads, std::nullopt, 1));
  G4_RETURN_IF_ERROR(f.Int("num_key_value_heads", &num_kv, 4, 1));
  G4_RETURN_IF_ERROR(f.Int("head_dim", &head_dim, 256, 2));
  G4_RETURN_IF_ERROR(f.Int("intermediate_size", &inter, std::nullopt, 1));
  G4_RETURN_IF_ERROR(f.Int("vocab_size", &c.vocab, std::nullopt, 1));
  G4_RETURN_IF_ERROR(f.Int("sliding_window", &c.sliding_window, g4 ? 512 : 4096, 1));
  G4_RETURN_IF_ERROR(f.Int("max_position_embeddings", &c.max_position, 131072, 1));
  G4_RETURN_IF_ERROR(f.Int("bos_token_id", &c.bos_id, 2, 0));
  double eps = 1e-6;
  G4_RETURN_IF_ERROR(f.Float("rms_norm_eps", &eps, 1e-6));
  if (eps <= 0) return InvalidArgument("config: '" + f.Name("rms_norm_eps") + "' must be > 0");
  c.rms_eps = static_cast<float>(eps);
  if (head_dim % 2) return InvalidArgument("config: '" + f.Name("head_dim") + "' must be even (RoPE pairs)");

  std::string act = "gelu_pytorch_tanh";
  for (const char* k : {"hidden_activation", "hidden_act"}) {
    if (f.Has(k)) {
      if (!tc[k].is_string()) return InvalidArgument("config: '" + f.Name(k) + "' must be a string");
      act = tc[k].get<std::string>();
      break;
    }
  }
  if (act != "gelu_pytorch_tanh" && act != "gelu_tanh")
    return Unimplemented("config: activation '" + act + "' is not supported (Gemma uses gelu_pytorch_tanh)");
  bool attention_bias = false;
  G4_RETURN_IF_ERROR(f.Bool("attention_bias", &attention_bias, false));
  if (attention_bias) return Unimplemented("config: '" + f.Name("attention_bias") + "' = true is not supported");
  if (f.Has("use_bidirectional_attention")) {
    const json& b = tc["use_bidirectional_attention"];
    if ((b.is_boolean() && b.get<bool>()) || (b.is_string() && b.get<std::string>() == "all"))
      return Unimplemented("config: '" + f.Name("use_bidirectional_attention") + "' = " + b.dump() + " (bidirectional text attention) is not supported");
  }

  // Stop ids: top-level eos_token_id wins over the text config's.
  if (root.contains("eos_token_id")) {
    G4_RETURN_IF_ERROR(ParseStopIds(root["eos_token_id"], &c.stop_ids));
  } else if (tc.contains("eos_token_id")) {
    G4_RETURN_IF_ERROR(ParseStopIds(tc["eos_token_id"], &c.stop_ids));
  }
  if (!c.stop_ids.empty()) c.eos_id = c.stop_ids[0];
  if (c.stop_ids.empty()) c.stop_ids.push_back(c.eos_id);
  bool tie = true;
  G4_RETURN_IF_ERROR(f.Bool("tie_word_embeddings", &tie, true));
  if (nested && root.contains("tie_word_embeddings") && root["tie_word_embeddings"].is_boolean())
    tie = root["tie_word_embeddings"].get<bool>();
  c.tie_embeddings = tie;

  double final_cap = 0, attn_cap = 0;
  G4_RETURN_IF_ERROR(f.Float("final_logit_softcapping", &final_cap, 0.0));
  G4_RETURN_IF_ERROR(f.Float("attn_logit_softcapping", &attn_cap, 0.0));
  if (final_cap < 0 || attn_cap < 0) return InvalidArgument("config: soft-cap values must be >= 0");
  c.final_softcap = static_cast<float>(final_cap);
  c.attn_softcap = static_cast<float>(attn_cap);

  // Layer types (transformers default: 5 sliding then 1 full, repeating).
  std::vector<LayerType> types(c.num_layers);
  if (f.Has("layer_types")) {
    const json& lt = tc["layer_types"];
    if (!lt.is_array() || static_cast<int>(lt.size()) != c.num_layers)
      return InvalidArgument("config: '" + f.Name("layer_types") + "' must be a list of num_hidden_layers (" + std::to_string(c.num_layers) + ") strings");
    for (int i = 0; i < c.num_layers; ++i) {
      const std::string t = lt[i].is_string() ? lt[i].get<std::string>() : "";
      if (t == "sliding_attention") types[i] = LayerType::kSliding;
      else if (t == "full_attention") types[i] = LayerType::kFull;
      else return InvalidArgument("config: '" + f.Name("layer_types") + "[" + std::to_string(i) + "]' = " + lt[i].dump() + " (expected sliding_attention or full_attention)");
    }
  } else {
    int pattern = 6;
    if (!g4) G4_RETURN_IF_ERROR(f.Int("sliding_window_pattern", &pattern, 6, 1));
    for (int i = 0; i < c.num_layers; ++i) types[i] = ((i + 1) % pattern) ? LayerType::kSliding : LayerType::kFull;
  }
  // Gemma 4 forces the last layer to full attention (Gemma4TextConfig.__post_init__).
  if (g4) types.back() = LayerType::kFull;

  // RoPE per layer type.
  RopeSpec rope_sliding, rope_full;
  if (f.Has("rope_parameters") && tc["rope_parameters"].is_object() &&
      (tc["rope_parameters"].contains("sliding_attention") || tc["rope_parameters"].contains("full_attention"))) {
    const json& rp = tc["rope_parameters"];
    for (auto [key, spec] : {std::pair{"sliding_attention", &rope_sliding}, std::pair{"full_attention", &rope_full}}) {
      if (!rp.contains(key) || rp[key].is_null()) {
        *spec = RopeSpec{};
        spec->theta = std::string(key) == "sliding_attention" ? 10000.0 : 1e6;
        if (g4 && spec == &rope_full) { spec->proportional = true; spec->partial_rotary_factor = 0.25; }
        continue;
      }
      G4_RETURN_IF_ERROR(ParseRopeSpec(rp[key], prefix + "rope_parameters." + key, spec));
    }
  } else if (g4 && !f.Has("rope_parameters")) {
    rope_sliding.theta = 10000.0;
    rope_full.theta = 1e6;
    rope_full.proportional = true;
    rope_full.partial_rotary_factor = 0.25;
  } else if (!g4) {
    // Older Gemma 3 schema: rope_theta (global), rope_local_base_freq, rope_scaling (global only).
    G4_RETURN_IF_ERROR(f.Float("rope_theta", &rope_full.theta, 1e6));
    G4_RETURN_IF_ERROR(f.Float("rope_local_base_freq", &rope_sliding.theta, 10000.0));
    const char* scaling_key = f.Has("rope_scaling") ? "rope_scaling" : (f.Has("rope_parameters") ? "rope_parameters" : nullptr);
    if (scaling_key) {
      json s = tc[scaling_key];
      if (!s.is_object()) return InvalidArgument("config: '" + f.Name(scaling_key) + "' must be an object");
      if (!s.contains("rope_theta")) s["rope_theta"] = rope_full.theta;
      G4_RETURN_IF_ERROR(ParseRopeSpec(s, prefix + scaling_key, &rope_full));
    }
  } else {
    return InvalidArgument("config: '" + f.Name("rope_parameters") + "' must map sliding_attention/full_attention to RoPE parameters");
  }

  // Head geometry of full layers.
  std::vector<int> dims(c.num_layers, head_dim), kvs(c.num_layers, num_kv);
  bool k_eq_v = false;
  if (g4) {
    G4_RETURN_IF_ERROR(f.Bool("attention_k_eq_v", &k_eq_v, false));
    if (f.Has("per_layer_config")) {
      const json& plc = tc["per_layer_config"];
      if (!plc.is_object()) return InvalidArgument("config: '" + f.Name("per_layer_config") + "' must be an object");
      for (auto it = plc.begin(); it != plc.end(); ++it) {
        const std::string field = prefix + "per_layer_config." + it.key();
        std::vector<int> targets;
        if (it.key() == "sliding_attention" || it.key() == "full_attention") {
          const LayerType t = it.key() == "sliding_attention" ? LayerType::kSliding : LayerType::kFull;
          for (int i = 0; i < c.num_layers; ++i) if (types[i] == t) targets.push_back(i);
        } else {
          size_t pos = 0;
          int idx = -1;
          try { idx = std::stoi(it.key(), &pos); } catch (...) { pos = 0; }
          if (pos != it.key().size() || idx < 0 || idx >= c.num_layers)
            return InvalidArgument("config: '" + field + "': key must be a layer index in [0, " + std::to_string(c.num_layers) + ")");
          targets.push_back(idx);
        }
        if (!it.value().is_object()) return InvalidArgument("config: '" + field + "' must be an object");
        Fields lf(it.value(), field + ".");
        for (auto kv = it.value().begin(); kv != it.value().end(); ++kv) {
          if (kv.key() != "head_dim" && kv.key() != "num_key_value_heads")
            return Unimplemented("config: '" + field + "." + kv.key() + "': per-layer override of this field is not supported");
        }
        for (int t : targets) {
          G4_RETURN_IF_ERROR(lf.Int("head_dim", &dims[t], dims[t], 2));
          G4_RETURN_IF_ERROR(lf.Int("num_key_value_heads", &kvs[t], kvs[t], 1));
        }
      }
    } else {
      int global_head_dim = 512, global_kv = 0;
      G4_RETURN_IF_ERROR(f.Int("global_head_dim", &global_head_dim, 512, 2));
      G4_RETURN_IF_ERROR(f.Int("num_global_key_value_heads", &global_kv, 0, 0));
      for (int i = 0; i < c.num_layers; ++i) {
        if (types[i] != LayerType::kFull) continue;
        dims[i] = global_head_dim;
        // transformers applies num_global_key_value_heads only when attention_k_eq_v is set.
        if (k_eq_v && global_kv > 0) kvs[i] = global_kv;
      }
    }
  }

  // KV sharing: layers >= L - n read the cache of the last non-shared layer of the same type.
  bool double_wide = false;
  if (g4) {
    G4_RETURN_IF_ERROR(f.Int("num_kv_shared_layers", &c.num_kv_shared_layers, 0, 0));
    G4_RETURN_IF_ERROR(f.Bool("use_double_wide_mlp", &double_wide, false));
    G4_RETURN_IF_ERROR(f.Int("hidden_size_per_layer_input", &c.ple_dim, 256, 0));
    G4_RETURN_IF_ERROR(f.Int("vocab_size_per_layer_input", &c.ple_vocab, 262144, 1));
    bool moe = false;
    G4_RETURN_IF_ERROR(f.Bool("enable_moe_block", &moe, false));
    if (moe) {
      G4_RETURN_IF_ERROR(f.Int("num_experts", &c.num_experts, std::nullopt, 1));
      G4_RETURN_IF_ERROR(f.Int("top_k_experts", &c.top_k_experts, std::nullopt, 1));
      G4_RETURN_IF_ERROR(f.Int("moe_intermediate_size", &c.moe_width, std::nullopt, 1));
      if (c.top_k_experts > c.num_experts)
        return InvalidArgument("config: '" + f.Name("top_k_experts") + "' (" + std::to_string(c.top_k_experts) + ") exceeds num_experts (" + std::to_string(c.num_experts) + ")");
    }
  }
  if (c.num_kv_shared_layers >= c.num_layers)
    return InvalidArgument("config: '" + f.Name("num_kv_shared_layers") + "' must be smaller than num_hidden_layers (some layer must own a KV cache)");
  const int first_shared = c.num_layers - c.num_kv_shared_layers;

  c.layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    LayerPlan& l = c.layers[i];
    l.type = types[i];
    l.head_dim = dims[i];
    l.num_kv_heads = kvs[i];
    if (l.head_dim % 2) return InvalidArgument("config: head_dim of layer " + std::to_string(i) + " must be even");
    if (c.num_heads % l.num_kv_heads)
      return InvalidArgument("config: num_attention_heads (" + std::to_string(c.num_heads) + ") is not a multiple of the KV heads of layer " + std::to_string(i) + " (" + std::to_string(l.num_kv_heads) + ")");
    l.window = l.type == LayerType::kSliding ? c.sliding_window : 0;
    l.rope = l.type == LayerType::kSliding ? rope_sliding : rope_full;
    l.k_eq_v = k_eq_v && l.type == LayerType::kFull;
    l.moe = c.num_experts > 0;
    const bool shared = i >= first_shared;
    l.mlp_width = inter * (double_wide && shared ? 2 : 1);
    if (shared) {
      for (int d = first_shared - 1; d >= 0; --d) {
        if (types[d] == l.type) { l.kv_donor = d; break; }
      }
      if (l.kv_donor < 0)
        return InvalidArgument("config: layer " + std::to_string(i) + " shares KV ('num_kv_shared_layers') but no earlier non-shared layer has its type");
      const LayerPlan& d = c.layers[l.kv_donor];
      if (d.head_dim != l.head_dim || d.num_kv_heads != l.num_kv_heads)
        return InvalidArgument("config: layer " + std::to_string(i) + " and its KV donor " + std::to_string(l.kv_donor) + " disagree on head_dim/KV heads");
    }
  }

  if (g4) {
    c.norm_offset = 0.0f;
    c.v_norm = true;
    c.attn_scale = 1.0f;
  } else {
    int qpas = head_dim;
    G4_RETURN_IF_ERROR(f.Int("query_pre_attn_scalar", &qpas, head_dim, 1));
    c.norm_offset = 1.0f;
    c.v_norm = false;
    c.attn_scale = static_cast<float>(std::pow(static_cast<double>(qpas), -0.5));
    c.ple_dim = 0;
  }
  return c;
}

StatusOr<ModelConfig> ParseHfConfigFile(const std::string& path) {
  G4_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(path + ": not valid JSON");
  StatusOr<ModelConfig> c = ParseHfConfig(j);
  if (!c.ok()) return Status(c.status().code(), path + ": " + c.status().message());
  return c;
}

}  // namespace g4
