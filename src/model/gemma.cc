#include "model/gemma.h"

#include <cmath>

namespace g4 {

Graph BuildGemmaGraph(const ModelConfig& c, const ModelWeights& w, const GraphOptions& opt) {
  Graph g;
  const int H = c.hidden;
  auto norm = [&](int x, const Tensor* weight, int group) {
    return g.Add(RmsNormOp{weight, group, c.rms_eps, weight ? c.norm_offset : 0.0f}, {x}, g.node(x).cols);
  };
  auto linear = [&](int x, const Tensor* weight, float scale = 1.0f) {
    return g.Add(MatMulOp{weight, scale}, {x}, static_cast<int>(weight->shape[0]));
  };

  // Embedding scale is cast to the weight dtype first (Gemma4TextScaledWordEmbedding).
  const bool export_all = opt.export_intermediates;
  int x = g.Add(EmbedOp{w.embed, RoundToDType(std::sqrt(static_cast<float>(H)), w.embed->dtype)}, {}, H,
                export_all ? "embeddings" : "");

  int ple = -1;
  const int P = c.ple_dim;
  if (P > 0) {
    const int LP = c.num_layers * P;
    int tok = g.Add(EmbedOp{w.ple_embed, RoundToDType(std::sqrt(static_cast<float>(P)), w.ple_embed->dtype)}, {}, LP);
    int proj = linear(x, w.ple_model_proj, 1.0f / std::sqrt(static_cast<float>(H)));
    proj = norm(proj, w.ple_proj_norm, P);
    ple = g.Add(AddOp{1.0f / std::sqrt(2.0f)}, {proj, tok}, LP, export_all ? "ple" : "");
  }

  std::vector<int> layer_k(c.num_layers, -1), layer_v(c.num_layers, -1);
  // The last layer whose attention reads each owner's cache: its KvWrite goes right after it.
  std::vector<int> last_reader(c.num_layers, -1);
  for (int l = 0; l < c.num_layers; ++l) last_reader[c.layers[l].kv_donor < 0 ? l : c.layers[l].kv_donor] = l;
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerPlan& lp = c.layers[l];
    const LayerWeights& lw = w.layers[l];
    const int D = lp.head_dim;
    const std::vector<float> inv_freq = lp.rope.InvFreq(D);

    // ---- attention block ----
    int h = norm(x, lw.input_norm, H);
    int q = norm(linear(h, lw.q_proj), lw.q_norm, D);
    q = g.Add(RopeOp{D, inv_freq}, {q}, g.node(q).cols);
    int owner = l;
    if (lp.kv_donor < 0) {
      int k_raw = linear(h, lw.k_proj);
      int v_raw = lp.k_eq_v ? k_raw : linear(h, lw.v_proj);  // K=V: raw k_proj output, before k_norm/RoPE
      int k = norm(k_raw, lw.k_norm, D);
      layer_k[l] = g.Add(RopeOp{D, inv_freq}, {k}, g.node(k).cols);
      layer_v[l] = c.v_norm ? norm(v_raw, nullptr, D) : v_raw;
    } else {
      owner = lp.kv_donor;
    }
    int a = g.Add(AttentionOp{owner, c.num_heads, lp.num_kv_heads, D, lp.window, c.attn_scale, c.attn_softcap},
                  {q, layer_k[owner], layer_v[owner]}, c.num_heads * D);
    // Caches are written after every layer that reads them (KV-shared readers see the pre-step
    // cache plus the step's own k/v, exactly like the owner); then k/v are dead.
    for (int o = 0; o <= l; ++o)
      if (last_reader[o] == l && layer_k[o] >= 0) g.Add(KvWriteOp{o}, {layer_k[o], layer_v[o]}, 0);
    a = norm(linear(a, lw.o_proj), lw.post_attn_norm, H);
    x = g.Add(AddOp{}, {x, a}, H);

    // ---- feed-forward block ----
    const int r = x;
    int y = norm(r, lw.pre_ffn_norm, H);
    int f = g.Add(GeGluOp{}, {linear(y, lw.gate_proj), linear(y, lw.up_proj)}, lp.mlp_width);
    f = linear(f, lw.down_proj);
    if (lp.moe) {
      int f1 = norm(f, lw.post_ffn_norm_1, H);
      int y2 = norm(r, lw.pre_ffn_norm_2, H);
      int f2 = g.Add(MoEOp{lw.router_proj, lw.router_scale, lw.per_expert_scale, lw.experts_gate_up, lw.experts_down,
                           c.num_experts, c.top_k_experts, c.moe_width, c.rms_eps},
                     {y2, r}, H);
      f2 = norm(f2, lw.post_ffn_norm_2, H);
      f = g.Add(AddOp{}, {f1, f2}, H);
    }
    f = norm(f, lw.post_ffn_norm, H);
    x = g.Add(AddOp{}, {r, f}, H);

    // ---- per-layer embedding injection ----
    if (P > 0) {
      int gate = linear(x, lw.ple_gate);
      int slice = g.Add(SliceOp{l * P}, {ple}, P);
      int inj = linear(g.Add(GeGluOp{}, {gate, slice}, P), lw.ple_proj);
      x = g.Add(AddOp{}, {x, norm(inj, lw.ple_post_norm, H)}, H);
    }
    if (c.family == ModelFamily::kGemma4) x = g.Add(ScaleOp{lw.layer_scalar}, {x}, H);
    if (export_all) g.Export(x, "hidden." + std::to_string(l));
  }

  if (!opt.all_logits) x = g.Add(SelectRowsOp{}, {x}, H);
  int logits = linear(norm(x, w.final_norm, H), w.lm_head);
  if (c.final_softcap > 0) logits = g.Add(SoftcapOp{c.final_softcap}, {logits}, c.vocab);
  g.Export(logits, "logits");
  return g;
}

}  // namespace g4
