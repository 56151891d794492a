// The CPU backend: CpuExecutable::Run dispatches each node of a step to its kernels (matmuls
// split over the thread pool, fused MLPs, matmul groups, attention, MoE); cpu_plan.cc plans the
// step when it is compiled.
#include "backends/cpu/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "backends/cpu/attention.h"
#include "backends/cpu/cpu_executable.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels_bf16.h"
#include "backends/cpu/kernels_q8.h"
#include "base/check.h"
#include "base/overloaded.h"
#include "base/thread_pool.h"

namespace g4 {

namespace cpu_internal {

Status CpuExecutable::Run(const StepInput& in, KvCacheBase& base) {
  auto* host = dynamic_cast<KvCache*>(&base);
  G4_CHECK(host != nullptr);  // a cache of this backend (CreateKvCache)
  KvCache& cache = *host;
  G4_CHECK(static_cast<int>(in.tokens.size()) == num_tokens_ && in.positions.size() == in.tokens.size() &&
           in.seq_ids.size() == in.tokens.size() && static_cast<int>(in.output_rows.size()) == num_out_);
  for (int t = 0; t < num_tokens_; ++t) {
    const bool first = t == 0 || in.seq_ids[t] != in.seq_ids[t - 1];
    seq_first_[t] = first ? t : seq_first_[t - 1];
    if (first) G4_CHECK(in.positions[t] == cache.length(in.seq_ids[t]));
    else G4_CHECK(in.positions[t] == in.positions[t - 1] + 1);
    G4_CHECK(in.positions[t] < cache.max_context());
  }
  base_ = ws_->Arena(arena_floats_);
  std::fill(rope_ready_.begin(), rope_ready_.end(), 0);  // the tables hold the last step's positions
  const auto& nodes = graph_.nodes();
  using Clock = std::chrono::steady_clock;
  Clock::time_point t0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& node = nodes[i];
    const int rows = RowsOf(node);
    if (blocked_away_[i]) continue;  // run by its MLP's GeGlu node (RunMlpBlocks)
    if (profile_slot_[i] >= 0) t0 = Clock::now();
    double nested_seconds = 0;  // of another node's profile entry (RunMlpBlocks' down projections)
    float* out = node.cols > 0 ? Buf(static_cast<int>(i)) : nullptr;
    auto input = [&](int j) -> float* { return Buf(node.inputs[j]); };
    std::visit(Overloaded{
        [&](const EmbedOp& op) {
          const size_t row_bytes = DTypeRowBytes(op.table->dtype, node.cols);
          for (int t = 0; t < rows; ++t) {
            G4_CHECK(in.tokens[t] >= 0 && in.tokens[t] < op.table->shape[0]);
            float* o = out + static_cast<size_t>(t) * node.cols;
            ConvertToF32(op.table->dtype, op.table->data + in.tokens[t] * row_bytes, o, node.cols);
            for (int c = 0; c < node.cols; ++c) o[c] *= op.scale;
          }
        },
        [&](const MatMulOp& op) {
          if (fused_away_[i] || grouped_away_[i]) return;  // run by its GeGlu node / its group's leader
          if (!group_of_[i].empty()) return RunMatMulGroup(static_cast<int>(i), rows);
          if (row_blocked_[i]) {
            const float* x = input(0);
            const int K = graph_.node(node.inputs[0]).cols;
            for (int r0 = 0; r0 < rows; r0 += opts_.row_block) {
              const int nr = std::min(opts_.row_block, rows - r0);
              ParallelMatMul(x + static_cast<size_t>(r0) * K, nr, K, *op.w, op.out_scale, out + static_cast<size_t>(r0) * node.cols);
            }
            return;
          }
          ParallelMatMul(act_reuse_[i] ? nullptr : input(0), rows, graph_.node(node.inputs[0]).cols, *op.w, op.out_scale, out);
        },
        [&](const RmsNormOp& op) {
          cpu::RmsNorm(input(0), rows, node.cols, op.group, op.w ? op.w->data : nullptr, op.w ? op.w->dtype : DType::kF32,
                       op.eps, op.offset, out);
        },
        [&](const RopeOp& op) {
          if (out != input(0)) std::memcpy(out, input(0), sizeof(float) * rows * node.cols);
          const int t = rope_table_of_[i];
          float* cs = ws_->rope_cs.data() + rope_offset_[t];
          if (!rope_ready_[t]) {  // the first node of this step with these frequencies
            cpu::RopeTable(rows, op.head_dim, op.inv_freq.data(), in.positions.data(), cs);
            rope_ready_[t] = 1;
          }
          cpu::RopeApply(out, rows, node.cols, op.head_dim, op.inv_freq.data(), cs);
        },
        [&](const AttentionOp& op) { RunAttention(op, input(0), input(1), input(2), out, in, cache); },
        [&](const KvWriteOp& op) {
          const float* k = input(0);
          const float* v = input(1);
          const int layer = op.cache_layer;
          const int width = cache.kv_width(layer);
          const bool i8 = cache.type() == DType::kI8;
          const int heads = cache.kv_heads(layer);
          auto put = [&](void* dst, float* scales, const float* src) {
            if (i8) return cpu::QuantizeKvRow(src, heads, width / heads, static_cast<int8_t*>(dst), scales);
            cpu::ToKvType(cache.type(), src, width, dst);
          };
          for (int t = 0; t < rows; ++t) {
            const int seq = in.seq_ids[t], slot = cache.slot_of(layer, in.positions[t]);
            put(cache.k(layer, seq, slot), cache.k_scale(layer, seq, slot), k + static_cast<size_t>(t) * width);
            put(cache.v(layer, seq, slot), cache.v_scale(layer, seq, slot), v + static_cast<size_t>(t) * width);
          }
        },
        [&](const GeGluOp&) {
          if (mlp_down_of_[i] >= 0) {
            nested_seconds = RunMlpBlocks(static_cast<int>(i), rows);
          } else if (mlp_of_[i].first >= 0) {
            RunFusedMlp(static_cast<int>(i), act_reuse_[i] ? nullptr : Buf(graph_.node(mlp_of_[i].first).inputs[0]), rows,
                        out);
          } else {
            cpu::GeGlu(input(0), input(1), static_cast<int64_t>(rows) * node.cols, out);
          }
        },
        [&](const AddOp& op) {
          const float* a = input(0);
          const float* b = input(1);
          const int64_t n = static_cast<int64_t>(rows) * node.cols;
          if (op.scale == 1.0f) {
            for (int64_t j = 0; j < n; ++j) out[j] = a[j] + b[j];
          } else {
            for (int64_t j = 0; j < n; ++j) out[j] = (a[j] + b[j]) * op.scale;
          }
        },
        [&](const ScaleOp& op) {
          const float* a = input(0);
          const int64_t n = static_cast<int64_t>(rows) * node.cols;
          for (int64_t j = 0; j < n; ++j) out[j] = a[j] * op.scale;
        },
        [&](const SoftcapOp& op) {
          // The final logits (262144 per row on Gemma 4): split over the pool in 16384-value blocks.
          const int64_t n = static_cast<int64_t>(rows) * node.cols;
          constexpr int64_t kBlock = 16384;
          const float* a = input(0);
          pool_->ParallelFor((n + kBlock - 1) / kBlock, [&](int, int64_t b, int64_t e) {
            cpu::Softcap(a + b * kBlock, std::min(n, e * kBlock) - b * kBlock, op.cap, out + b * kBlock);
          });
        },
        [&](const SliceOp& op) {
          const int src_cols = graph_.node(node.inputs[0]).cols;
          const float* a = input(0);
          for (int t = 0; t < rows; ++t)
            std::memcpy(out + static_cast<size_t>(t) * node.cols, a + static_cast<size_t>(t) * src_cols + op.begin,
                        node.cols * sizeof(float));
        },
        [&](const SelectRowsOp&) {
          const float* a = input(0);
          for (int r = 0; r < rows; ++r) {
            G4_CHECK(in.output_rows[r] >= 0 && in.output_rows[r] < num_tokens_);
            std::memcpy(out + static_cast<size_t>(r) * node.cols, a + static_cast<size_t>(in.output_rows[r]) * node.cols,
                        node.cols * sizeof(float));
          }
        },
        [&](const MoEOp& op) { RunMoE(op, input(0), input(1), out, rows); },
    }, node.op);
    if (profile_slot_[i] >= 0) {
      OpProfile& p = ws_->profile[profile_slot_[i]];
      ++p.calls;
      p.seconds += std::chrono::duration<double>(Clock::now() - t0).count() - nested_seconds;
    }
    const Hint& h = hint_after_[i];
    if (h.a != nullptr) pool_->PrefetchHint(h.a, h.a_bytes, h.b, h.b_bytes);
  }
  return OkStatus();
}

void CpuExecutable::CheckWorkspace(DType wt, int K, int rows) const {  // sized by Plan
  if (UsesQ8(wt, K)) G4_CHECK(ws_->act_q8.size() >= static_cast<size_t>(K) / 32 * rows);
  if (UsesSuperblocks(wt, K)) G4_CHECK(ws_->act_sb.size() >= 2 * static_cast<size_t>(K) / 256 * rows);
  if (Reorders(wt, K)) G4_CHECK(ws_->act_reordered.size() >= static_cast<size_t>(K) * rows);
}

void CpuExecutable::ParallelMatMul(const float* x, int rows, int K, const Tensor& w, float scale, float* y) {
  CheckWorkspace(w.dtype, K, rows);
  ParallelMatMulRaw(x, rows, K, w.data, w.dtype, static_cast<int>(w.shape[0]), scale, y, static_cast<int>(w.shape[0]),
                    ws_->act_q8.data(), ws_->act_sums.data(), ws_->act_sb.data(), ws_->act_reordered.data());
}

template <class Fn>
void CpuExecutable::ForRows(int rows, Fn&& fn) {
  if (rows >= 2 * pool_->size()) {
    pool_->ParallelFor(rows, [&](int, int64_t rb, int64_t re) { fn(rb, re); });
  } else {
    fn(int64_t{0}, static_cast<int64_t>(rows));
  }
}

CpuExecutable::Activations CpuExecutable::Prepare(const float* x, int rows, int K, DType wt, cpu::ActBlockQ8* xq,
                                                  float* sums, cpu::ActSuperblockQ8* xs, float* xr) {
  // x == nullptr: already prepared (quantised with the same group, or reordered) by the previous
  // matmul of the same input in this Run (see Plan).
  Activations a;
  if (UsesQ8(wt, K)) {
    const size_t units = static_cast<size_t>(K) / 32;
    a.group = cpu::PreferredActGroup(wt, K);
    const bool superblocks = xs != nullptr && UsesSuperblocks(wt, K);
    if (x != nullptr) {
      ForRows(rows, [&](int64_t rb, int64_t re) {
        const int n = static_cast<int>(re - rb);
        cpu::QuantizeRowsQ8(x + rb * K, n, K, xq + rb * units, sums + rb * 2 * units, a.group);
        if (superblocks) cpu::PrepareActSuperblocks(xq + rb * units, n, K, xs + 2 * rb * (K / 256));
      });
    }
    a.xq = xq;
    a.sums = sums;
    if (superblocks) a.xs = xs;
  } else if (UsesBf16(wt)) {
    G4_CHECK(xr != nullptr);  // Plan and RunMoE size the buffer wherever Reorders
    auto* xb = reinterpret_cast<uint16_t*>(xr);
    if (x != nullptr) {
      ForRows(rows, [&](int64_t rb, int64_t re) {
        cpu::ConvertRowsToBf16(x + rb * K, static_cast<int>(re - rb), K, xb + rb * K);
      });
    }
    a.xb = xb;
  } else if (xr != nullptr && cpu::MatMulReordersActivations(wt, K)) {
    if (x != nullptr) {
      ForRows(rows, [&](int64_t rb, int64_t re) {
        cpu::ReorderActivations(wt, x + rb * K, static_cast<int>(re - rb), K, xr + rb * K);
      });
    }
    a.xr = xr;
  } else {
    G4_CHECK(x != nullptr);
    a.x = x;
  }
  return a;
}

void CpuExecutable::MatMulPart(const Activations& a, int rows, int K, const uint8_t* w, DType wt, int M, float scale,
                               float* y, int ldy, int task) {
  if (a.xq != nullptr) {
    cpu::MatMulQ8(a.xq, a.sums, rows, K, w, wt, M, scale, y, ldy, a.group, a.xs);
  } else if (a.xb != nullptr) {
    cpu::MatMulBf16Dot(a.xb, rows, K, w, M, scale, y, ldy);
  } else if (a.xr != nullptr) {
    cpu::MatMulReordered(a.xr, rows, K, w, wt, M, scale, y, ldy);
  } else {
    cpu::MatMul(a.x, rows, K, w, wt, M, scale, y, ldy, ws_->task_scratch[task].data());
  }
}

void CpuExecutable::ParallelMatMulRaw(const float* x, int rows, int K, const uint8_t* w, DType wt, int M, float scale,
                                      float* y, int ldy, cpu::ActBlockQ8* xq, float* sums, cpu::ActSuperblockQ8* xs,
                                      float* xr) {
  const size_t row_bytes = DTypeRowBytes(wt, K);
  const Activations a = Prepare(x, rows, K, wt, xq, sums, xs, xr);
  const int g = RowGrain(wt);
  pool_->ParallelFor(M / g, [&](int task, int64_t gb, int64_t ge) {
    const int64_t mb = gb * g, me = ge * g;
    MatMulPart(a, rows, K, w + mb * row_bytes, wt, static_cast<int>(me - mb), scale, y + mb, ldy, task);
  });
}

void CpuExecutable::RunFusedMlp(int node, const float* x, int rows, float* out) {
  const Node& first = graph_.node(mlp_of_[node].first);
  const Node& second = graph_.node(mlp_of_[node].second);
  const auto& op1 = std::get<MatMulOp>(first.op);
  const auto& op2 = std::get<MatMulOp>(second.op);
  const int K = graph_.node(first.inputs[0]).cols;
  const int M = static_cast<int>(op1.w->shape[0]);
  const DType wt = op1.w->dtype;
  const size_t row_bytes = DTypeRowBytes(wt, K);
  CheckWorkspace(wt, K, rows);
  const Activations a =
      Prepare(x, rows, K, wt, ws_->act_q8.data(), ws_->act_sums.data(), ws_->act_sb.data(), ws_->act_reordered.data());
  // Per block of columns: the first matmul straight into out, the second into the thread's
  // scratch, then GeGlu in place over out.
  const int g = RowGrain(wt);  // kMlpCols is a multiple of it
  pool_->ParallelFor(M / g, [&](int task, int64_t gb, int64_t ge) {
    const int64_t mb = gb * g, me = ge * g;
    float* y2 = ws_->mlp[task].data();
    for (int64_t c0 = mb; c0 < me; c0 += kMlpCols) {
      const int c = static_cast<int>(std::min<int64_t>(kMlpCols, me - c0));
      MatMulPart(a, rows, K, op1.w->data + c0 * row_bytes, wt, c, op1.out_scale, out + c0, M, task);
      MatMulPart(a, rows, K, op2.w->data + c0 * row_bytes, wt, c, op2.out_scale, y2, c, task);
      for (int r = 0; r < rows; ++r) {
        float* o = out + static_cast<size_t>(r) * M + c0;
        cpu::GeGlu(o, y2 + static_cast<size_t>(r) * c, c, o);
      }
    }
  });
}

double CpuExecutable::RunMlpBlocks(int node, int rows) {
  const int down = mlp_down_of_[node];
  const Node& dn = graph_.node(down);
  const auto& op = std::get<MatMulOp>(dn.op);
  const int x_node = graph_.node(mlp_of_[node].first).inputs[0];
  const int K = graph_.node(x_node).cols, width = graph_.node(node).cols;
  const float* x = Buf(x_node);
  float* mlp = Buf(node);  // [block rows, width]
  float* y = Buf(down);    // [rows, dn.cols], possibly over x: a block's rows are read before they are written
  const int slot = profile_slot_[down];
  using Clock = std::chrono::steady_clock;
  double seconds = 0;
  for (int r0 = 0; r0 < rows; r0 += opts_.row_block) {
    const int n = std::min(opts_.row_block, rows - r0);
    RunFusedMlp(node, x + static_cast<size_t>(r0) * K, n, mlp);
    const Clock::time_point t0 = slot >= 0 ? Clock::now() : Clock::time_point();
    ParallelMatMul(mlp, n, width, *op.w, op.out_scale, y + static_cast<size_t>(r0) * dn.cols);
    if (slot >= 0) seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  if (slot >= 0) {
    ++ws_->profile[slot].calls;
    ws_->profile[slot].seconds += seconds;
  }
  return seconds;
}

void CpuExecutable::RunMatMulGroup(int leader, int rows) {
  const std::vector<int>& members = group_of_[leader];
  const Node& first = graph_.node(leader);
  const Tensor& w0 = *std::get<MatMulOp>(first.op).w;
  const int K = graph_.node(first.inputs[0]).cols;
  const DType wt = w0.dtype;
  const size_t row_bytes = DTypeRowBytes(wt, K);
  CheckWorkspace(wt, K, rows);
  const Activations a = Prepare(act_reuse_[leader] ? nullptr : Buf(first.inputs[0]), rows, K, wt, ws_->act_q8.data(),
                                ws_->act_sums.data(), ws_->act_sb.data(), ws_->act_reordered.data());
  const int g = RowGrain(wt);
  int64_t units = 0;
  for (int m : members) units += std::get<MatMulOp>(graph_.node(m).op).w->shape[0] / g;
  pool_->ParallelFor(units, [&](int task, int64_t ub, int64_t ue) {
    int64_t base = 0;  // the first unit of member m in the loop
    for (int m : members) {
      const auto& op = std::get<MatMulOp>(graph_.node(m).op);
      const int M = static_cast<int>(op.w->shape[0]);
      const int64_t b = std::max(ub, base), e = std::min(ue, base + M / g);
      if (b < e) {
        const int64_t mb = (b - base) * g;
        MatMulPart(a, rows, K, op.w->data + mb * row_bytes, wt, static_cast<int>((e - b) * g), op.out_scale,
                   Buf(m) + mb, M, task);
      }
      base += M / g;
    }
  });
}

void CpuExecutable::RunAttention(const AttentionOp& op, const float* q, const float* k, const float* v, float* out,
                                 const StepInput& in, KvCache& cache) {
  const int layer = op.cache_layer;
  const void** kc = attn_cache_rows_.data();
  const void** vc = kc + num_tokens_;
  for (int t = 0; t < num_tokens_; ++t) {
    kc[t] = cache.k(layer, in.seq_ids[t], 0);
    vc[t] = cache.v(layer, in.seq_ids[t], 0);
  }
  const cpu::AttentionParams params{op.num_heads, op.num_kv_heads, op.head_dim, op.window, op.scale, op.softcap};
  const DType type = cache.type();
  const void* step_k = k;
  const void* step_v = v;
  const float* step_ks = nullptr;
  const float* step_vs = nullptr;
  const float** ksc = attn_scale_rows_.data();
  const float** vsc = ksc + num_tokens_;
  if (type == DType::kI8) {
    // The step's rows quantised as KvWrite stores them (the same bits), with their scales.
    const int heads = op.num_kv_heads, D = op.head_dim;
    const size_t n = static_cast<size_t>(num_tokens_) * heads * D, ns = static_cast<size_t>(num_tokens_) * heads;
    std::vector<int8_t>& kv = ws_->attn_kv_8;
    std::vector<float>& sc = ws_->attn_kv_scales;
    if (kv.size() < 2 * n) kv.resize(2 * n);
    if (sc.size() < 2 * ns) sc.resize(2 * ns);
    for (int t = 0; t < num_tokens_; ++t) {
      const size_t r = static_cast<size_t>(t) * heads;
      cpu::QuantizeKvRow(k + r * D, heads, D, kv.data() + r * D, sc.data() + r);
      cpu::QuantizeKvRow(v + r * D, heads, D, kv.data() + n + r * D, sc.data() + ns + r);
      ksc[t] = cache.k_scale(layer, in.seq_ids[t], 0);
      vsc[t] = cache.v_scale(layer, in.seq_ids[t], 0);
    }
    step_k = kv.data();
    step_v = kv.data() + n;
    step_ks = sc.data();
    step_vs = sc.data() + ns;
  } else if (type != DType::kF32) {
    // The step's keys and values as the cache holds them (attention.h: AttentionStep), in the
    // workspace (one buffer for every executable: steps run one at a time).
    const size_t n = static_cast<size_t>(num_tokens_) * cache.kv_width(layer);
    std::vector<uint16_t>& kv = ws_->attn_kv_16;
    if (kv.size() < 2 * n) {
      kv = {};
      kv.resize(2 * n);
    }
    cpu::ToKvType(type, k, static_cast<int64_t>(n), kv.data());
    cpu::ToKvType(type, v, static_cast<int64_t>(n), kv.data() + n);
    step_k = kv.data();
    step_v = kv.data() + n;
  }
  cpu::AttentionStep step{num_tokens_, q, step_k, step_v, out, in.positions.data(), seq_first_.data(), kc, vc,
                          cache.slots(layer), cache.window(layer) > 0, type, type, step_ks, step_vs, ksc, vsc};
  cpu::Attention(params, step, pool_, &ws_->attn);
}

// Mixture of experts (Gemma 4 26B-A4B), transformers' Gemma4 text MoE block: per token, a router
// (scale-free RMSNorm of r, times router_scale and H^-1/2, projection to E logits, softmax, top-k
// with ties to the lower index, weights renormalised and times per_expert_scale), then the chosen
// experts' GeGLU MLPs on y, added in expert order. Tokens are grouped by expert: each expert
// multiplies all the rows routed to it at once (its weights are read once per step, not once per
// token), split over the pool, with int8 activations when the backend uses them. Each token's
// outputs are added in increasing expert order, as transformers does.
void CpuExecutable::RunMoE(const MoEOp& op, const float* y, const float* r, float* out, int rows) {
  const int H = static_cast<int>(op.router_proj->shape[1]);
  const int E = op.num_experts, I = op.width, k = op.top_k;
  const DType wt_gu = op.gate_up->dtype, wt_dn = op.down->dtype;
  const size_t gu_expert_bytes = static_cast<size_t>(2 * I) * DTypeRowBytes(wt_gu, H);
  const size_t dn_expert_bytes = static_cast<size_t>(H) * DTypeRowBytes(wt_dn, I);
  const float root = 1.0f / std::sqrt(static_cast<float>(H));
  // Scratch: z [H] and probs [E] for the router; per expert, its rows' inputs [n, H], gate/up
  // [n, 2I], activations [n, I] and outputs [n, H], n <= rows.
  const size_t R = static_cast<size_t>(rows);
  const size_t need = static_cast<size_t>(H) + E + R * (static_cast<size_t>(H) + 2 * I + I + H);
  if (moe_scratch_.size() < need) moe_scratch_.resize(need);
  if (scratch_.size() < static_cast<size_t>(std::max(H, I))) scratch_.resize(std::max(H, I));
  for (auto& ts : ws_->task_scratch)
    if (ts.size() < static_cast<size_t>(std::max(H, I))) ts.resize(std::max(H, I));
  const size_t blocks = R * static_cast<size_t>(std::max(H, I)) / 32;
  if (moe_q8_.size() < blocks) {
    moe_q8_.resize(blocks);
    moe_sums_.resize(2 * blocks);
    moe_sb_.resize((blocks + 3) / 4);
  }
  if ((Reorders(wt_gu, H) || Reorders(wt_dn, I)) && moe_reordered_.size() < R * std::max(H, I))
    moe_reordered_.resize(R * std::max(H, I));
  float* z = moe_scratch_.data();
  float* probs = z + H;
  float* xin = probs + E;
  float* gu = xin + R * H;
  float* act = gu + R * 2 * I;
  float* eo = act + R * I;

  // Routing: chosen[t * k + i] = the i-th chosen expert of token t (increasing), weight[...] its weight.
  std::vector<int> order(E), chosen(R * k);
  std::vector<float> weight(R * k);
  for (int t = 0; t < rows; ++t) {
    const float* rt = r + static_cast<size_t>(t) * H;
    cpu::RmsNorm(rt, 1, H, H, nullptr, DType::kF32, op.eps, 0.0f, z);
    for (int j = 0; j < H; ++j) z[j] = z[j] * op.router_scale->GetF32(j) * root;
    cpu::MatMul(z, 1, H, op.router_proj->data, op.router_proj->dtype, E, 1.0f, probs, E, scratch_.data());
    float mx = -INFINITY;
    for (int e = 0; e < E; ++e) mx = std::max(mx, probs[e]);
    float sum = 0;
    for (int e = 0; e < E; ++e) sum += probs[e] = std::exp(probs[e] - mx);
    for (int e = 0; e < E; ++e) probs[e] /= sum;
    for (int e = 0; e < E; ++e) order[e] = e;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); });
    std::sort(order.begin(), order.begin() + k);  // accumulate in expert order, like transformers
    float wsum = 0;
    for (int i = 0; i < k; ++i) wsum += probs[order[i]];
    for (int i = 0; i < k; ++i) {
      chosen[t * k + i] = order[i];
      weight[t * k + i] = probs[order[i]] / wsum * op.per_expert_scale->GetF32(order[i]);
    }
  }

  std::fill(out, out + R * H, 0.0f);
  std::vector<int> members;  // (token, slot) pairs routed to the current expert, as t * k + i
  for (int e = 0; e < E; ++e) {
    members.clear();
    for (size_t j = 0; j < R * k; ++j)
      if (chosen[j] == e) members.push_back(static_cast<int>(j));
    if (members.empty()) continue;
    const int n = static_cast<int>(members.size());
    for (int m = 0; m < n; ++m)
      std::memcpy(xin + static_cast<size_t>(m) * H, y + static_cast<size_t>(members[m] / k) * H, H * sizeof(float));
    ParallelMatMulRaw(xin, n, H, op.gate_up->data + e * gu_expert_bytes, wt_gu, 2 * I, 1.0f, gu, 2 * I,
                      moe_q8_.data(), moe_sums_.data(), moe_sb_.data(),
                      moe_reordered_.empty() ? nullptr : moe_reordered_.data());
    for (int m = 0; m < n; ++m) {
      const float* g = gu + static_cast<size_t>(m) * 2 * I;
      cpu::GeGlu(g, g + I, I, act + static_cast<size_t>(m) * I);
    }
    ParallelMatMulRaw(act, n, I, op.down->data + e * dn_expert_bytes, wt_dn, H, 1.0f, eo, H, moe_q8_.data(),
                      moe_sums_.data(), moe_sb_.data(), moe_reordered_.empty() ? nullptr : moe_reordered_.data());
    // Experts run in increasing order, so every token still adds its experts' outputs in
    // increasing expert order.
    for (int m = 0; m < n; ++m) {
      float* ot = out + static_cast<size_t>(members[m] / k) * H;
      const float we = weight[members[m]];
      const float* em = eo + static_cast<size_t>(m) * H;
      for (int j = 0; j < H; ++j) ot[j] += em[j] * we;
    }
  }
}
}  // namespace cpu_internal

namespace {

using cpu_internal::CpuExecutable;
using cpu_internal::CpuWorkspace;

class CpuBackend : public Backend {
 public:
  CpuBackend(int threads, const CpuBackendOptions& opts) : pool_(threads), opts_(opts) {}
  std::string Name() const override { return "cpu"; }
  std::vector<OpProfile> Profile() const override { return workspace_.profile; }
  StatusOr<std::unique_ptr<Executable>> Compile(const Graph& graph, int num_tokens, int num_output_rows) override {
    if (num_tokens <= 0) return InvalidArgument("a step needs at least one token");
    if (num_output_rows < 0 || num_output_rows > num_tokens) return InvalidArgument("output rows must be in [0, tokens]");
    return std::unique_ptr<Executable>(new CpuExecutable(graph, num_tokens, num_output_rows, &pool_, &workspace_, opts_));
  }

 private:
  ThreadPool pool_;
  CpuWorkspace workspace_;
  const CpuBackendOptions opts_;
};

}  // namespace

CpuBackendOptions CpuBackendOptionsFor(bool f32_activations) {
  CpuBackendOptions o;
  o.int8_activations = o.bf16_activations = !f32_activations;
  return o;
}

const char* ActivationPolicy(const CpuBackendOptions& options) {
  const bool int8 = options.int8_activations, bf16 = options.bf16_activations && cpu::HasBf16Dot();
  if (int8) return bf16 ? "int8-for-quantised-weights,bf16-for-bf16-weights" : "int8-for-quantised-weights";
  return bf16 ? "bf16-for-bf16-weights" : "f32";
}

bool PackQ4_0ForCpu(bool f32_activations, bool no_repack) {
  return !f32_activations && !no_repack && cpu::Q4_0x4KernelAvailable();
}

std::unique_ptr<Backend> MakeCpuBackend(int threads, const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(std::max(1, threads), options);
}

}  // namespace g4
