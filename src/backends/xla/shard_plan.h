// How a step graph's weights and KV cache are laid out over a device mesh (mesh.h), from the
// graph's structure (never from tensor names):
//   model axis (M): q/k/v projections [heads*D, H] split by rows where their head count divides by
//   M, the attention output projection [H, Nq*D] by columns likewise; MLP gate/up [I, H] by rows
//   and down [H, I] by columns where I divides; the LM head (the matmul the logits come from) and
//   every embedding table by vocabulary rows; MoE experts [E, ...] by expert. A KV cache layer
//   [S, slots, Nkv*D] splits its width where Nkv divides by M. What does not divide (one KV head)
//   is replicated over M, and the plan's notes say so.
//   data axis (D): every KV cache layer splits its sequences S (D must divide S); a batched decode
//   step's rows split likewise (StepShape::data_groups, lower.h).
// Everything else (norm weights, routers, activations) is left to XLA's SPMD partitioner (sharding
// propagation).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "backends/xla/mesh.h"
#include "base/status.h"
#include "graph/graph.h"

namespace g4::xla {

struct ShardPlan {
  Mesh mesh;
  std::map<const Tensor*, TensorSplit> weights;  // over each weight's device shape (DeviceShape)
  std::map<int, TensorSplit> caches;             // by cache-owning layer, over [S, slots, width]
  std::vector<std::string> notes;                // what is replicated over the model axis and why

  TensorSplit Weight(const Tensor* t) const;
  TensorSplit Cache(int layer) const;
};

// A KV cache layer's split: sequences over data, width over model where the KV heads divide.
TensorSplit CacheSplit(const Mesh& mesh, int num_kv_heads);
// InvalidArgument where the data axis does not divide the cache's `max_seqs` sequence slots.
Status CheckDataAxis(const Mesh& mesh, int max_seqs);

// Errors (InvalidArgument): the data axis does not divide `max_seqs`; the model axis (> 1) splits
// no weight at all.
StatusOr<ShardPlan> PlanShards(const Graph& graph, const Mesh& mesh, int max_seqs);

// Bytes one device holds of `t` laid out as `split` (DeviceBytes divided by the split axes).
size_t ShardBytes(const Tensor& t, const Mesh& mesh, TensorSplit split);

}  // namespace g4::xla
