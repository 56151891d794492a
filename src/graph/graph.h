// The step graph: the model's forward pass as a list of coarse ops in SSA form.
//
// Every value is a row-major f32 matrix [rows, cols]. `rows` is the number of tokens in the step
// (kTokens) or, after SelectRows, the number of output rows (kOutputRows); `cols` is fixed by the
// graph. The graph does not depend on the token count, so a model builds it once and a backend
// compiles it once per step shape (tokens, output rows) and runs it many times.
//
// Step inputs (not nodes): token ids [tokens], absolute positions [tokens], sequence ids
// [tokens] (which KV cache sequence each token belongs to; a sequence's tokens are contiguous
// and in increasing position order), output row indices [output_rows].
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "tensor/tensor.h"

namespace g4 {

enum class Rows { kTokens, kOutputRows };

// out[t] = table[token[t]] * scale.   table [V, cols]
struct EmbedOp { const Tensor* table; float scale; };
// out = (x . Wᵀ) * out_scale.   x [rows, K], W [cols, K] (nn.Linear layout), f32 accumulation.
struct MatMulOp { const Tensor* w; float out_scale = 1.0f; };
// Per row, per group of `group` columns: y = x * (mean(x²) + eps)^-1/2 * (offset + w).
// w [group] or nullptr (scale-free norm). transformers Gemma4RMSNorm / Gemma3RMSNorm (offset 1).
struct RmsNormOp { const Tensor* w; int group; float eps; float offset; };
// NeoX RoPE per head of `head_dim` at each token's position; inv_freq [head_dim/2].
struct RopeOp { int head_dim; std::vector<float> inv_freq; };
// Causal attention of q [rows, Nq*D] over keys/values of the same sequence: the KV cache of
// `cache_layer` for positions before the step, and k/v inputs [rows, Nkv*D] for positions in
// the step. Sliding: only keys q-window+1..q. scores = q.k * scale, optional soft-cap, f32
// softmax. Reads the cache only; KvWriteOp writes it.
struct AttentionOp { int cache_layer; int num_heads; int num_kv_heads; int head_dim; int window; float scale; float softcap; };
// Writes k, v [rows, Nkv*D] of every step token into the KV cache of `cache_layer`.
struct KvWriteOp { int cache_layer; };
// out = gelu_tanh(a) * b.
struct GeGluOp {};
// out = (a + b) * scale.
struct AddOp { float scale = 1.0f; };
// out = x * scale.
struct ScaleOp { float scale; };
// out = cap * tanh(x / cap).
struct SoftcapOp { float cap; };
// out = x[:, begin : begin + cols].
struct SliceOp { int begin; };
// out = x[output_rows].  (rows kTokens -> kOutputRows)
struct SelectRowsOp {};
// Gemma 4 MoE block (transformers Gemma4TextRouter + Gemma4TextExperts). Inputs: y [rows, H]
// (pre_feedforward_layernorm_2 output, fed to the experts) and r [rows, H] (router input).
// router: z = rms(r) * scale * H^-1/2; p = softmax(z . projᵀ); top-k; renormalise; times
// per_expert_scale. out = sum_e w_e * down_e(gelu_tanh(gate_e y) * up_e y).
struct MoEOp {
  const Tensor* router_proj;       // [E, H]
  const Tensor* router_scale;      // [H]
  const Tensor* per_expert_scale;  // [E]
  const Tensor* gate_up;           // [E, 2*I, H]: rows 0..I-1 gate, I..2I-1 up
  const Tensor* down;              // [E, H, I]
  int num_experts, top_k, width;   // E, k, I
  float eps;
};

using OpAttrs = std::variant<EmbedOp, MatMulOp, RmsNormOp, RopeOp, AttentionOp, KvWriteOp, GeGluOp,
                             AddOp, ScaleOp, SoftcapOp, SliceOp, SelectRowsOp, MoEOp>;

struct Node {
  OpAttrs op;
  std::vector<int> inputs;  // ids of earlier nodes
  int cols = 0;             // 0 for KvWrite (no output)
  Rows rows = Rows::kTokens;
  std::string name;         // non-empty: an exported output ("logits", "hidden.3", ...)
};

class Graph {
 public:
  // Appends a node and returns its id. Checks (G4_CHECK) that inputs exist and that row kinds
  // and column counts agree with the op.
  int Add(OpAttrs op, std::vector<int> inputs, int cols, std::string name = "");
  // Marks an existing node as an exported output.
  void Export(int id, std::string name) { nodes_[id].name = std::move(name); }
  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(int id) const { return nodes_[id]; }
  // Short op name for dumps ("MatMul").
  static const char* OpName(const OpAttrs& op);
  // One line per node: "%12 = MatMul(%11) [tokens x 2048] q_proj".
  std::string Dump() const;

 private:
  std::vector<Node> nodes_;
};

}  // namespace g4
