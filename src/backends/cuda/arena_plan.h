// The CUDA backend's step memory plan (pure C++, no CUDA: tested on the host): one device arena
// per executable holding every node's f32 output at an offset reused once the value is dead, then
// the cuBLAS scratch (activations and a weight tile in 16 bits), the MoE scratch, the attention
// scratch (flash decoding's partial states; the step's K and V quantised for an 8-bit cache) and
// the step's token arrays.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <variant>
#include <vector>

#include "backends/cuda/attention_plan.h"
#include "graph/graph.h"

namespace g4::cuda {

inline constexpr int kMatVecMaxRows = 8;        // steps of more rows multiply with cuBLAS
inline constexpr int64_t kGemmTileRows = 4096;  // weight rows dequantised per cuBLAS call
inline constexpr size_t kArenaAlign = 256;      // bytes; every region starts aligned

inline size_t AlignUp(size_t n) { return (n + kArenaAlign - 1) / kArenaAlign * kArenaAlign; }
inline int RowsOf(const Node& n, int T, int R) { return n.rows == Rows::kTokens ? T : R; }

// The index of the last node that reads each node's output: the node itself where none does, the
// node count for exported outputs (live to the end of the step, when they are copied out).
inline std::vector<int> LastUse(const Graph& g) {
  const auto& nodes = g.nodes();
  const int n = static_cast<int>(nodes.size());
  std::vector<int> last(n);
  for (int i = 0; i < n; ++i) {
    last[i] = nodes[i].name.empty() ? i : n;
    for (int in : nodes[i].inputs) last[in] = std::max(last[in], i);
  }
  return last;
}

struct ArenaPlan {
  std::vector<size_t> offset;     // per node (bytes from the arena's start); 0 for nodes without output
  std::vector<size_t> bytes;      // per node: its output's bytes, aligned (0 without output)
  size_t values = 0;              // bytes of the node outputs' region
  size_t half_x = 0, half_w = 0;  // cuBLAS path: the activations and a weight tile in 16 bits
  size_t moe = 0;                 // MoE scratch
  size_t attn = 0;                // attention scratch: decode partials, then the 8-bit step rows
  size_t attn_partials = 0;       // of which the decode partials (0 for steps the prefill kernel runs)
  size_t ints = 0;                // the step's token arrays
  size_t total() const { return values + half_x + half_w + moe + attn + ints; }
};

// Offsets by liveness for steps of T tokens and R output rows: node i's output lives from node i
// to LastUse(i) inclusive, so it never shares bytes with its own inputs; a freed range goes to the
// first later output that fits (split, no coalescing).
inline ArenaPlan PlanArena(const Graph& g, int T, int R) {
  const auto& nodes = g.nodes();
  const int n = static_cast<int>(nodes.size());
  const std::vector<int> last = LastUse(g);
  ArenaPlan p;
  p.offset.assign(n, 0);
  p.bytes.assign(n, 0);
  std::vector<std::pair<size_t, size_t>> free_list;  // (offset, bytes)
  std::vector<std::vector<int>> dies(n);
  int64_t max_k = 32, max_moe = 0;
  size_t max_q8 = 0;
  for (int i = 0; i < n; ++i) {
    const Node& node = nodes[i];
    if (const auto* mm = std::get_if<MatMulOp>(&node.op)) {
      max_k = std::max(max_k, mm->w->shape.back());
      p.half_w = std::max(p.half_w, AlignUp(2 * static_cast<size_t>(std::min<int64_t>(kGemmTileRows, mm->w->shape[0])) *
                                            static_cast<size_t>(mm->w->shape.back())));
    }
    if (const auto* moe = std::get_if<MoEOp>(&node.op)) {  // chosen, weight, gate/up, act, out per job
      const int64_t H = moe->router_proj->shape[1], jobs = static_cast<int64_t>(RowsOf(node, T, R)) * moe->top_k;
      max_moe = std::max<int64_t>(max_moe, jobs * (2 + 3 * static_cast<int64_t>(moe->width) + H));
    }
    if (const auto* at = std::get_if<AttentionOp>(&node.op)) {
      // Partials (m, l, acc per token-split and query head) where the decode kernel runs; the
      // step's K and V as 8-bit [T, Nkv*D] with f32 scales [T, Nkv] (an int8 or fp8 cache; any cache
      // type may come with a Compile, so always counted).
      if (T <= kDecodeMaxTokens)
        p.attn_partials = std::max(p.attn_partials, AlignUp(DecodePartialBytes(at->num_heads, at->head_dim)));
      const size_t rows = static_cast<size_t>(T) * at->num_kv_heads;
      max_q8 = std::max(max_q8, 2 * AlignUp(rows * at->head_dim) + 2 * AlignUp(rows * sizeof(float)));
    }
    if (node.cols > 0) {
      const size_t bytes = AlignUp(static_cast<size_t>(RowsOf(node, T, R)) * node.cols * sizeof(float));
      p.bytes[i] = bytes;
      auto it = std::find_if(free_list.begin(), free_list.end(), [&](const auto& f) { return f.second >= bytes; });
      if (it != free_list.end()) {
        p.offset[i] = it->first;
        if (it->second > bytes) *it = {it->first + bytes, it->second - bytes};
        else free_list.erase(it);
      } else {
        p.offset[i] = p.values;
        p.values += bytes;
      }
      if (last[i] < n) dies[last[i]].push_back(i);
    }
    for (int d : dies[i]) free_list.push_back({p.offset[d], p.bytes[d]});  // after node i's own output
  }
  p.half_x = T <= kMatVecMaxRows ? 0 : AlignUp(2 * static_cast<size_t>(T) * static_cast<size_t>(max_k));
  if (T <= kMatVecMaxRows) p.half_w = 0;
  p.moe = AlignUp(static_cast<size_t>(max_moe) * sizeof(float));
  p.attn = p.attn_partials + max_q8;
  p.ints = AlignUp((4 * static_cast<size_t>(T) + R + 1) * sizeof(int32_t));
  return p;
}

}  // namespace g4::cuda
