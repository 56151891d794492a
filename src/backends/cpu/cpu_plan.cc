// CpuExecutable::Plan: which nodes fuse, group or run in row blocks, where each node's output
// lives in the arena, and the workspace, RoPE tables, read-ahead hints and profile entries a
// step needs.
#include <algorithm>
#include <string>
#include <variant>
#include <vector>

#include "backends/cpu/cpu_executable.h"

namespace g4::cpu_internal {

// Buffer planning: every node output with columns gets a range of one arena, live from the node
// that writes it to its last reader (exported outputs: to the end of the step). Ranges are placed
// greedily by size, largest first, each at the lowest offset that overlaps no range live at the
// same time (TFLite's "greedy by size"): the arena comes close to the largest set of values live
// at once, whatever the order of the graph, and long-lived small values never pin large blocks.
// A node's output shares bytes with an input only where the node allows it and the input dies
// there: element-wise ops, RmsNorm and Attention write in place (see value_of below), and a
// matmul that quantises or reorders its input first lets it die just before itself. With
// fuse_mlp (the default) the MLP's gate and up matmuls have no buffer at all: the GeGlu node runs
// them in blocks of columns (RunFusedMlp), and only its output [tokens, mlp_width] is in the
// arena. With row blocks (CpuBackendOptions::row_block) the MLP output holds a block's rows, and
// a blocked matmul's input lives through it (read block by block), its output over the input
// where the rows are no wider.
void CpuExecutable::Plan() {
  const auto& nodes = graph_.nodes();
  const int n = static_cast<int>(nodes.size());
  // Fused MLPs: a GeGlu whose two inputs are matmuls of one x, with the same weight type and
  // shape, read by nothing else and not exported.
  mlp_of_.assign(n, {});
  fused_away_.assign(n, false);
  std::vector<int> uses(n, 0);
  for (const Node& node : nodes)
    for (int in : node.inputs) ++uses[in];
  if (opts_.fuse_mlp) {
    for (int i = 0; i < n; ++i) {
      if (!std::holds_alternative<GeGluOp>(nodes[i].op) || nodes[i].inputs.size() != 2) continue;
      const int a = nodes[i].inputs[0], b = nodes[i].inputs[1];
      const auto* ma = std::get_if<MatMulOp>(&nodes[a].op);
      const auto* mb = std::get_if<MatMulOp>(&nodes[b].op);
      if (a == b || ma == nullptr || mb == nullptr || uses[a] != 1 || uses[b] != 1) continue;
      if (!nodes[a].name.empty() || !nodes[b].name.empty()) continue;  // exported: needs its buffer
      if (nodes[a].inputs[0] != nodes[b].inputs[0] || ma->w->dtype != mb->w->dtype || ma->w->shape != mb->w->shape)
        continue;
      if (nodes[a].rows != nodes[i].rows || nodes[b].rows != nodes[i].rows || nodes[a].cols != nodes[i].cols) continue;
      mlp_of_[i] = {a, b};
      fused_away_[a] = fused_away_[b] = true;
    }
  }
  // A fused MLP prepares its input where its GeGlu node runs: the trackers below see it there.
  auto matmul_at = [&](int i) -> const Node* {
    if (fused_away_[i]) return nullptr;
    if (mlp_of_[i].first >= 0) return &nodes[mlp_of_[i].first];
    return std::holds_alternative<MatMulOp>(nodes[i].op) ? &nodes[i] : nullptr;
  };
  // Matmuls with int8 (or reordered) activations that follow one of the same input reuse its
  // quantisation (reordering) and never read the f32 input (q, k, v of one norm; gate and up): it
  // may die before them.
  act_reuse_.assign(n, false);
  // Only matmuls whose weights want the same activation group (cpu::PreferredActGroup: 256 for
  // the K-quants, 32 for the rest) share a quantisation, so each weight type sees activations
  // quantised as llama.cpp quantises them for it (Q8_K or Q8_0). The two workspaces are separate:
  // a quantisation does not end a reordering's reuse, nor the other way round.
  for (int i = 0, quantised = -1, quantised_group = 0, reordered = -1, reordered_k = 0; i < n; ++i) {
    const Node* node = matmul_at(i);
    if (node == nullptr) continue;
    const auto* mm = std::get_if<MatMulOp>(&node->op);
    const int x = node->inputs[0], K = nodes[x].cols;
    if (UsesQ8(*mm->w, K)) {
      const int group = cpu::PreferredActGroup(mm->w->dtype, K);
      act_reuse_[i] = x == quantised && group == quantised_group;
      quantised = x;
      quantised_group = group;
    } else if (Reorders(mm->w->dtype, K)) {
      act_reuse_[i] = x == reordered && K == reordered_k;
      reordered = x;
      reordered_k = K;
    }
  }
  // Matmul groups: a plain matmul (not part of a fused MLP) that prepares its activations
  // (int8 blocks or reordered) leads the matmuls after it that reuse them (act_reuse_) with the
  // same weight type and rows, up to the next matmul that does not: q, k and v of one norm. The
  // nodes between (q's norm and RoPE) do not read the members' outputs, which come later in SSA
  // order.
  group_of_.assign(n, {});
  grouped_away_.assign(n, false);
  if (opts_.group_matmuls) {
    for (int i = 0; i < n; ++i) {
      const auto* mi = std::get_if<MatMulOp>(&nodes[i].op);
      if (mi == nullptr || fused_away_[i] || grouped_away_[i]) continue;
      const int K = nodes[nodes[i].inputs[0]].cols;
      if (!UsesQ8(*mi->w, K) && !Reorders(mi->w->dtype, K)) continue;
      std::vector<int> members{i};
      for (int j = i + 1; j < n; ++j) {
        const Node* mm = matmul_at(j);
        if (mm == nullptr) continue;
        const auto* mj = std::get_if<MatMulOp>(&nodes[j].op);
        if (mj == nullptr || mm != &nodes[j] || !act_reuse_[j] || mj->w->dtype != mi->w->dtype ||
            nodes[j].inputs[0] != nodes[i].inputs[0] || nodes[j].rows != nodes[i].rows)
          break;
        members.push_back(j);
      }
      if (members.size() < 2) continue;
      for (size_t m = 1; m < members.size(); ++m) grouped_away_[members[m]] = true;
      group_of_[i] = std::move(members);
    }
  }
  // Row blocks (CpuBackendOptions::row_block), for steps longer than the block. A fused MLP whose
  // output only the next node reads, a matmul of the same rows (the down projection), runs with
  // it block by block (mlp_down_of_); a plain matmul that prepares its input and is no wider than
  // it (the attention output projection) prepares and multiplies it block by block
  // (row_blocked_). No prepared input of theirs may be reused by a later matmul: the workspace
  // ends the step holding the last block's only.
  mlp_down_of_.assign(n, -1);
  blocked_away_.assign(n, false);
  row_blocked_.assign(n, false);
  auto reused_after = [&](int i, int a, int b) {  // a later matmul reuses the preparation of a or b
    for (int k = i + 1; k < n; ++k) {
      const Node* mk = matmul_at(k);
      if (mk != nullptr && act_reuse_[k] && (mk->inputs[0] == a || mk->inputs[0] == b)) return true;
    }
    return false;
  };
  for (int i = 0; opts_.row_block > 0 && i < n; ++i) {
    if (RowsOf(nodes[i]) <= opts_.row_block || act_reuse_[i] || blocked_away_[i]) continue;
    if (mlp_of_[i].first >= 0) {
      const int j = i + 1, x = nodes[mlp_of_[i].first].inputs[0];
      if (j == n || uses[i] != 1 || !nodes[i].name.empty() || !std::holds_alternative<MatMulOp>(nodes[j].op) ||
          nodes[j].inputs.size() != 1 || nodes[j].inputs[0] != i || nodes[j].rows != nodes[i].rows || act_reuse_[j] ||
          !group_of_[j].empty() || reused_after(j, x, i))
        continue;
      mlp_down_of_[i] = j;
      blocked_away_[j] = true;
      continue;
    }
    const auto* mm = std::get_if<MatMulOp>(&nodes[i].op);
    if (mm == nullptr || fused_away_[i] || grouped_away_[i] || !group_of_[i].empty()) continue;
    const int x = nodes[i].inputs[0], K = nodes[x].cols;
    if (nodes[x].rows != nodes[i].rows || nodes[i].cols > K || !(UsesQ8(*mm->w, K) || Reorders(mm->w->dtype, K)) ||
        reused_after(i, x, x))
      continue;
    row_blocked_[i] = true;
  }
  // The workspace's prepared activations and fused-MLP blocks, for the rows each matmul runs on.
  size_t q8_blocks = 0, superblocks = 0, reordered_floats = 0, mlp_scratch = 0;
  for (int i = 0; i < n; ++i) {
    const Node* node = matmul_at(i);
    if (node == nullptr) continue;
    const Tensor& w = *std::get<MatMulOp>(node->op).w;
    const int K = nodes[node->inputs[0]].cols;
    const size_t rows = PlannedRowsOf(i);
    if (UsesQ8(w, K)) {
      q8_blocks = std::max(q8_blocks, static_cast<size_t>(K / 32) * rows);
      if (UsesSuperblocks(w.dtype, K)) superblocks = std::max(superblocks, 2 * static_cast<size_t>(K / 256) * rows);
    } else if (Reorders(w.dtype, K)) {
      reordered_floats = std::max(reordered_floats, static_cast<size_t>(K) * rows);
    }
    if (mlp_of_[i].first >= 0) mlp_scratch = std::max(mlp_scratch, rows * kMlpCols);
  }
  if (mlp_scratch > 0) {  // in the workspace, shared by the executables (steps run one at a time)
    if (ws_->mlp.size() < static_cast<size_t>(pool_->size())) ws_->mlp.resize(pool_->size());
    for (auto& v : ws_->mlp)
      if (v.size() < mlp_scratch) {
        v = {};
        v.resize(mlp_scratch);
      }
  }
  if (ws_->act_q8.size() < q8_blocks) {  // sized here, never during a step; the old blocks go first
    ws_->act_q8 = {};
    ws_->act_sums = {};
    ws_->act_q8.resize(q8_blocks);
    ws_->act_sums.resize(2 * q8_blocks);
  }
  if (ws_->act_sb.size() < superblocks) {
    ws_->act_sb = {};
    ws_->act_sb.resize(superblocks);
  }
  if (ws_->act_reordered.size() < reordered_floats) {
    ws_->act_reordered = {};
    ws_->act_reordered.resize(reordered_floats);
  }
  // A matmul (or fused MLP) that quantises or reorders its input reads it only before it writes
  // anything: the input may die just before it, so its output can take the input's bytes.
  std::vector<int> last_use(n, -1);
  for (int i = 0; i < n; ++i) {
    if (fused_away_[i] || act_reuse_[i]) continue;
    if (const Node* mm = matmul_at(i)) {
      const int x = mm->inputs[0], K = nodes[x].cols;
      const Tensor& w = *std::get<MatMulOp>(mm->op).w;
      // In row blocks the input is read block by block to the end.
      const bool prepared_first = (UsesQ8(w, K) || Reorders(w.dtype, K)) && mlp_down_of_[i] < 0 && !row_blocked_[i];
      last_use[x] = std::max(last_use[x], prepared_first ? i - 1 : i);
      continue;
    }
    for (int in : nodes[i].inputs) last_use[in] = i;
  }
  for (int i = 0; i < n; ++i)
    if (!nodes[i].name.empty()) {
      last_use[i] = n;  // exported: never freed
      outputs_[nodes[i].name] = i;
    }
  // Values: a node's output, or (in place) the value of one of its inputs. Nodes that may write
  // over an input that dies there: the element-wise ones (Add over either input, Scale, Softcap,
  // GeGlu over its first, Rope, whose copy is then skipped), RmsNorm (cpu::RmsNorm allows x == y)
  // and Attention over its q (cpu::Attention allows out == q: each query row block is read only by
  // its own work item, which writes its output after its last read).
  std::vector<int> value_of(n, -1);
  for (int i = 0; i < n; ++i) {
    const Node& node = nodes[i];
    if (node.cols <= 0 || fused_away_[i]) continue;
    value_of[i] = i;
    auto over = [&](size_t k) {
      if (k >= node.inputs.size()) return false;
      const int a = node.inputs[k];
      for (size_t j = 0; j < node.inputs.size(); ++j)
        if (j != k && node.inputs[j] == a) return false;  // also read as another input
      if (last_use[a] != i || value_of[a] < 0 || nodes[a].rows != node.rows || nodes[a].cols != node.cols) return false;
      value_of[i] = value_of[a];
      return true;
    };
    if (blocked_away_[i] || row_blocked_[i]) {
      // A matmul in row blocks: over its (or its MLP's) input x where x dies there and rows are no
      // wider than x's: block b writes rows [r0, r0 + B), which lie within x's rows [0, r0 + B),
      // all read by then.
      const int at = blocked_away_[i] ? node.inputs[0] : i;
      const int x = blocked_away_[i] ? nodes[mlp_of_[at].first].inputs[0] : node.inputs[0];
      if (last_use[x] == at && value_of[x] >= 0 && nodes[x].rows == node.rows && node.cols <= nodes[x].cols)
        value_of[i] = value_of[x];
    } else if (std::holds_alternative<AddOp>(node.op)) {
      over(0) || over(1);
    } else if (std::holds_alternative<ScaleOp>(node.op) || std::holds_alternative<SoftcapOp>(node.op) ||
               std::holds_alternative<RmsNormOp>(node.op) || std::holds_alternative<RopeOp>(node.op) ||
               std::holds_alternative<AttentionOp>(node.op) ||
               (std::holds_alternative<GeGluOp>(node.op) && mlp_of_[i].first < 0)) {
      over(0);
    }
  }
  constexpr size_t kAlign = CpuWorkspace::kAlignBytes / sizeof(float);  // every range starts on a 64-byte boundary
  struct Range {
    int node, first, last;
    size_t size, offset;  // floats
  };
  std::vector<Range> ranges;
  std::vector<int> range_of(n, -1);
  // Where a node's output is first written: its group's leader, the GeGlu node of its MLP in row
  // blocks, or itself (in two passes: a member comes after its leader).
  std::vector<int> leader_of(n);
  for (int i = 0; i < n; ++i) leader_of[i] = i;
  for (int i = 0; i < n; ++i) {
    for (int m : group_of_[i]) leader_of[m] = i;
    if (mlp_down_of_[i] >= 0) leader_of[mlp_down_of_[i]] = i;
  }
  size_t max_k = 1;
  for (int i = 0; i < n; ++i) {
    const Node& node = nodes[i];
    for (int in : node.inputs) max_k = std::max<size_t>(max_k, nodes[in].cols);
    if (node.cols <= 0 || fused_away_[i]) continue;
    // Only an MLP in row blocks holds a block's rows; a blocked matmul writes all of its rows.
    const size_t need = static_cast<size_t>(mlp_down_of_[i] >= 0 ? PlannedRowsOf(i) : RowsOf(node)) * node.cols;
    const size_t size = (std::max<size_t>(need, 1) + kAlign - 1) / kAlign * kAlign;
    const int last = std::max(i, last_use[i]);
    if (value_of[i] != i) {  // in place: extend the value's range
      Range& r = ranges[range_of[value_of[i]]];
      r.last = std::max(r.last, last);
      r.size = std::max(r.size, size);
      range_of[i] = range_of[value_of[i]];
      continue;
    }
    range_of[i] = static_cast<int>(ranges.size());
    ranges.push_back({i, leader_of[i], last, size, 0});
  }
  std::vector<int> order(ranges.size());
  for (size_t r = 0; r < order.size(); ++r) order[r] = static_cast<int>(r);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return ranges[a].size > ranges[b].size; });
  std::vector<const Range*> placed, overlapping;
  size_t arena = 0;
  for (int r : order) {
    Range& cur = ranges[r];
    overlapping.clear();
    for (const Range* p : placed)
      if (p->first <= cur.last && cur.first <= p->last) overlapping.push_back(p);
    std::sort(overlapping.begin(), overlapping.end(), [](const Range* a, const Range* b) { return a->offset < b->offset; });
    size_t offset = 0;
    for (const Range* p : overlapping) {
      if (p->offset >= offset + cur.size) break;  // the gap before p fits
      offset = std::max(offset, p->offset + p->size);
    }
    cur.offset = offset;
    arena = std::max(arena, offset + cur.size);
    placed.push_back(&cur);
  }
  offset_of_.assign(n, kNoBuffer);
  for (int i = 0; i < n; ++i)
    if (range_of[i] >= 0) offset_of_[i] = ranges[range_of[i]].offset;
  arena_floats_ = arena;
  base_ = ws_->Arena(arena_floats_);  // allocated (and its pages touched) at compile time
  scratch_.assign(max_k, 0.0f);
  if (ws_->task_scratch.size() < static_cast<size_t>(pool_->size())) ws_->task_scratch.resize(pool_->size());
  for (auto& ts : ws_->task_scratch)
    if (ts.size() < static_cast<size_t>(max_k)) ts.resize(max_k);
  // RoPE tables: one per distinct (head_dim, inv_freq), num_tokens_ x head_dim floats each.
  rope_table_of_.assign(n, -1);
  rope_offset_.clear();
  size_t rope_floats = 0;
  std::vector<const RopeOp*> rope_keys;
  for (int i = 0; i < n; ++i) {
    const auto* op = std::get_if<RopeOp>(&nodes[i].op);
    if (op == nullptr) continue;
    size_t t = 0;
    while (t < rope_keys.size() && (rope_keys[t]->head_dim != op->head_dim || rope_keys[t]->inv_freq != op->inv_freq)) ++t;
    if (t == rope_keys.size()) {
      rope_keys.push_back(op);
      rope_offset_.push_back(rope_floats);
      rope_floats += static_cast<size_t>(num_tokens_) * op->head_dim;
    }
    rope_table_of_[i] = static_cast<int>(t);
  }
  if (ws_->rope_cs.size() < rope_floats) ws_->rope_cs.resize(rope_floats);  // grown only, as the arena
  step_bytes_ = sizeof(float) * (arena_floats_ + 2 * q8_blocks + reordered_floats + mlp_scratch * pool_->size() + rope_floats) +
                sizeof(cpu::ActBlockQ8) * q8_blocks + sizeof(cpu::ActSuperblockQ8) * superblocks;
  rope_ready_.assign(rope_offset_.size(), 0);
  // Hints: for each node that runs on the pool, the next matmul (or fused MLP) after it, unless
  // an MoE block (whose expert matmuls are chosen at run time) comes first.
  hint_after_.assign(n, {});
  if (num_tokens_ <= kHintMaxTokens && pool_->size() > 1) {
    Hint next;
    for (int i = n - 1; i >= 0; --i) {
      const auto& op = nodes[i].op;
      const bool on_pool = !fused_away_[i] && !grouped_away_[i] && !blocked_away_[i] && (std::holds_alternative<MatMulOp>(op) || mlp_of_[i].first >= 0 ||
                                               std::holds_alternative<AttentionOp>(op) ||
                                               std::holds_alternative<SoftcapOp>(op));
      if (on_pool) hint_after_[i] = next;
      if (std::holds_alternative<MoEOp>(nodes[i].op)) {
        next = {};
        continue;
      }
      const Node* mm = matmul_at(i);
      if (mm == nullptr || grouped_away_[i] || blocked_away_[i]) continue;
      // Worker 1's run starts at unit u0 of the loop: in a group, of the members' rows end to end.
      std::vector<const Tensor*> ws{std::get<MatMulOp>(mm->op).w};
      for (size_t m = 1; m < group_of_[i].size(); ++m) ws.push_back(std::get<MatMulOp>(nodes[group_of_[i][m]].op).w);
      const int g = RowGrain(ws[0]->dtype);
      int64_t units = 0;
      for (const Tensor* w : ws) units += w->shape[0] / g;
      const int64_t chunks = pool_->ChunksFor(units);
      int64_t u0 = units * pool_->FirstChunkOf(1, chunks) / chunks;
      int64_t u1 = units * pool_->FirstChunkOf(2, chunks) / chunks;
      size_t wi = 0;
      while (wi + 1 < ws.size() && u0 >= ws[wi]->shape[0] / g) u0 -= ws[wi]->shape[0] / g, u1 -= ws[wi++]->shape[0] / g;
      const Tensor& w = *ws[wi];
      u1 = std::min<int64_t>(u1, w.shape[0] / g);
      const size_t row_bytes = DTypeRowBytes(w.dtype, static_cast<int>(w.shape[1]));
      const size_t off = static_cast<size_t>(u0) * g * row_bytes;
      const size_t bytes = std::min(kHintBytes, static_cast<size_t>(u1 - u0) * g * row_bytes);
      next = {w.data + off, bytes, nullptr, 0};
      if (mlp_of_[i].first >= 0) {
        next.b = std::get<MatMulOp>(nodes[mlp_of_[i].second].op).w->data + off;
        next.b_bytes = bytes;
      }
    }
  }
  attn_cache_rows_.assign(2 * static_cast<size_t>(num_tokens_), nullptr);
  attn_scale_rows_.assign(2 * static_cast<size_t>(num_tokens_), nullptr);
  seq_first_.assign(num_tokens_, 0);
  profile_slot_.assign(n, -1);
  if (opts_.profile) {
    for (int i = 0; i < n; ++i) {
      if (fused_away_[i] || grouped_away_[i]) continue;  // timed with its GeGlu node / group leader
      std::string op = Graph::OpName(nodes[i].op);
      double bytes = 0;
      auto matmul_name = [&](const Node& mm, const char* what, int count) {
        const Tensor& w = *std::get<MatMulOp>(mm.op).w;
        bytes = static_cast<double>(count) * static_cast<double>(w.nbytes);
        return std::string(what) + " " + std::string(DTypeName(w.dtype)) + " " + (count > 1 ? std::to_string(count) + "x" : "") +
               std::to_string(w.shape[0]) + "x" + std::to_string(w.shape[1]);
      };
      if (mlp_of_[i].first >= 0) {
        op = matmul_name(nodes[mlp_of_[i].first], "fused MLP", 2);
      } else if (std::holds_alternative<MatMulOp>(nodes[i].op)) {
        op = matmul_name(nodes[i], "MatMul", 1);
        for (size_t m = 1; m < group_of_[i].size(); ++m) {  // "MatMul Q4_0x4 2048x1536+256x1536+256x1536"
          const Tensor& w = *std::get<MatMulOp>(nodes[group_of_[i][m]].op).w;
          op.append("+").append(std::to_string(w.shape[0])).append("x").append(std::to_string(w.shape[1]));
          bytes += static_cast<double>(w.nbytes);
        }
      } else if (const auto* at = std::get_if<AttentionOp>(&nodes[i].op)) {
        op.append(" D").append(std::to_string(at->head_dim)).append(at->window > 0 ? " sliding" : " full");
      } else if (std::holds_alternative<RmsNormOp>(nodes[i].op)) {
        op.append(" ").append(std::to_string(nodes[i].cols));
      } else if (const auto* em = std::get_if<EmbedOp>(&nodes[i].op)) {  // "Embed Q8_0 262144x8960"
        op.append(" ").append(DTypeName(em->table->dtype)).append(" ").append(std::to_string(em->table->shape[0]));
        op.append("x").append(std::to_string(em->table->shape[1]));
      }
      // In row blocks, the weights are read once per block.
      if (mlp_down_of_[i] >= 0 || blocked_away_[i] || row_blocked_[i])
        bytes *= (num_tokens_ + opts_.row_block - 1) / opts_.row_block;
      profile_slot_[i] = ws_->ProfileSlot(op, num_tokens_, bytes);
    }
  }
}

int CpuExecutable::PlannedRowsOf(int node) const {
  const int rows = RowsOf(graph_.node(node));
  return mlp_down_of_[node] >= 0 || blocked_away_[node] || row_blocked_[node] ? std::min(rows, opts_.row_block) : rows;
}

}  // namespace g4::cpu_internal
