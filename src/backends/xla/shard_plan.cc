#include "backends/xla/shard_plan.h"

#include <variant>

#include "backends/xla/lower.h"

namespace g4::xla {

TensorSplit ShardPlan::Weight(const Tensor* t) const {
  auto it = weights.find(t);
  return it == weights.end() ? TensorSplit{} : it->second;
}

TensorSplit ShardPlan::Cache(int layer) const {
  auto it = caches.find(layer);
  return it == caches.end() ? TensorSplit{} : it->second;
}

size_t ShardBytes(const Tensor& t, const Mesh& mesh, TensorSplit s) {
  size_t b = DeviceBytes(t);
  if (s.data_dim >= 0) b /= mesh.data;
  if (s.model_dim >= 0) b /= mesh.model;
  return b;
}

TensorSplit CacheSplit(const Mesh& mesh, int num_kv_heads) {
  return TensorSplit{mesh.data > 1 ? 0 : -1, mesh.model > 1 && num_kv_heads % mesh.model == 0 ? 2 : -1};
}

Status CheckDataAxis(const Mesh& mesh, int max_seqs) {
  if (max_seqs % mesh.data == 0) return OkStatus();
  return InvalidArgument("--mesh " + mesh.ToString() + ": the data axis splits the sequence slots, and " +
                         std::to_string(max_seqs) + " slot(s) do not divide by data=" + std::to_string(mesh.data) +
                         " (serve --parallel N with N a multiple of " + std::to_string(mesh.data) + ")");
}

StatusOr<ShardPlan> PlanShards(const Graph& graph, const Mesh& mesh, int max_seqs) {
  ShardPlan plan;
  plan.mesh = mesh;
  G4_RETURN_IF_ERROR(CheckDataAxis(mesh, max_seqs));
  const int M = mesh.model;
  const auto& nodes = graph.nodes();
  // Splits weight `t` along device-shape dim `dim` over the model axis where that dim divides
  // (a weight read by several nodes keeps its first split).
  auto split_model = [&](const Tensor* t, int dim) {
    if (M == 1 || plan.weights.count(t)) return false;
    const Shape ds = DeviceShape(*t);
    if (dim >= static_cast<int>(ds.size()) || ds[dim] % M != 0) return false;
    plan.weights[t] = TensorSplit{-1, dim};
    return true;
  };
  // The matmul a value comes from through per-row ops (RoPE, per-head norms, scales).
  auto producer_matmul = [&](int id) -> const MatMulOp* {
    while (id >= 0) {
      const Node& n = nodes[id];
      if (const auto* mm = std::get_if<MatMulOp>(&n.op)) return mm;
      if (std::holds_alternative<RopeOp>(n.op) || std::holds_alternative<RmsNormOp>(n.op) ||
          std::holds_alternative<ScaleOp>(n.op))
        id = n.inputs.empty() ? -1 : n.inputs[0];
      else
        return nullptr;
    }
    return nullptr;
  };
  // The logits' matmul: the exported node, through a soft-cap.
  int logits = -1;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].name == "logits") logits = static_cast<int>(i);
  if (logits >= 0 && std::holds_alternative<SoftcapOp>(nodes[logits].op)) logits = nodes[logits].inputs[0];
  if (logits >= 0) {
    if (const auto* mm = std::get_if<MatMulOp>(&nodes[logits].op)) {
      if (!split_model(mm->w, 0) && M > 1)
        plan.notes.push_back("LM head: " + std::to_string(mm->w->shape[0]) + " vocabulary rows do not divide by model=" +
                             std::to_string(M) + ": replicated");
    }
  }
  int kv_replicated = 0, heads_replicated = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (const auto* a = std::get_if<AttentionOp>(&n.op)) {
      const bool q_div = a->num_heads % M == 0, kv_div = a->num_kv_heads % M == 0;
      if (const MatMulOp* q = producer_matmul(n.inputs[0]); q && q_div) split_model(q->w, 0);
      if (!q_div) ++heads_replicated;
      if (n.inputs[1] >= 0 && kv_div) {
        for (int j : {1, 2})
          if (const MatMulOp* kv = producer_matmul(n.inputs[j])) split_model(kv->w, 0);
      }
      if (!plan.caches.count(a->cache_layer)) {
        plan.caches[a->cache_layer] = CacheSplit(mesh, a->num_kv_heads);
        if (!kv_div) ++kv_replicated;
      }
    } else if (const auto* mm = std::get_if<MatMulOp>(&n.op)) {
      const Node& in = nodes[n.inputs[0]];
      if (const auto* a = std::get_if<AttentionOp>(&in.op)) {
        if (a->num_heads % M == 0) split_model(mm->w, 1);
      } else if (std::holds_alternative<GeGluOp>(in.op)) {
        split_model(mm->w, 1);
      }
    } else if (std::holds_alternative<GeGluOp>(n.op)) {
      for (int j : n.inputs)
        if (const auto* mm = std::get_if<MatMulOp>(&nodes[j].op)) split_model(mm->w, 0);
    } else if (const auto* e = std::get_if<EmbedOp>(&n.op)) {
      split_model(e->table, 0);
    } else if (const auto* moe = std::get_if<MoEOp>(&n.op)) {
      const bool div = moe->num_experts % M == 0;
      split_model(moe->gate_up, 0);
      split_model(moe->down, 0);
      if (!div && M > 1)
        plan.notes.push_back(std::to_string(moe->num_experts) + " experts do not divide by model=" + std::to_string(M) +
                             ": expert weights replicated");
    }
  }
  if (M > 1 && kv_replicated > 0)
    plan.notes.push_back(std::to_string(kv_replicated) + " KV cache layer(s) have a KV head count that does not divide by model=" +
                         std::to_string(M) + ": their K/V projections and cache are replicated over the model axis");
  if (M > 1 && heads_replicated > 0)
    plan.notes.push_back(std::to_string(heads_replicated) + " layer(s) have an attention head count that does not divide by model=" +
                         std::to_string(M) + ": their query and output projections are replicated");
  if (M > 1 && plan.weights.empty())
    return InvalidArgument("--mesh " + mesh.ToString() + ": the model axis divides no weight of this model (heads, MLP width, "
                           "vocabulary, experts): use a model axis that divides them");
  return plan;
}

}  // namespace g4::xla
