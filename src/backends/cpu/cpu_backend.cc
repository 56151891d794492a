#include "backends/cpu/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <vector>

#include "backends/cpu/attention.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels_bf16.h"
#include "backends/cpu/kernels_q8.h"
#include "base/check.h"
#include "base/thread_pool.h"

namespace g4 {
namespace {

template <class... Ts>
struct Overloaded : Ts... { using Ts::operator()...; };
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

// Memory shared by every executable of one backend. Steps run one at a time (an Engine runs one
// step after another), so all of them can use one node-output arena and one set of int8
// activation blocks, sized for the largest step compiled so far: a server that compiles a step
// per batch shape and prompt-chunk length holds one arena, not one per shape.
class CpuWorkspace {
 public:
  // The arena, at least `floats` floats (64-byte aligned, zero-filled when it grows). Growing
  // discards the contents: call at the start of a step only.
  float* Arena(size_t floats) {
    floats = std::max<size_t>(floats, 1);
    if (floats > arena_floats_) {
      arena_.reset();  // release before allocating: never both at once
      arena_.reset(static_cast<float*>(::operator new[](floats * sizeof(float), std::align_val_t(kAlignBytes))));
      std::memset(arena_.get(), 0, floats * sizeof(float));
      arena_floats_ = floats;
    }
    return arena_.get();
  }
  static constexpr size_t kAlignBytes = 64;

  std::vector<cpu::ActBlockQ8> act_q8;  // int8 activation blocks of the current matmul
  std::vector<float> act_sums;          // and their half sums
  std::vector<cpu::ActSuperblockQ8> act_sb;  // and, with group 256 where the CPU reads them, as superblocks
  std::vector<float> act_reordered;     // or its f32 activations in its kernel's order (BF16)
  std::vector<std::vector<float>> mlp;  // per pool task: a fused MLP's second matmul, [rows, kMlpCols]
  std::vector<float> rope_cs;           // the current step's RoPE tables (CpuExecutable::rope_offset_)
  std::vector<uint16_t> attn_kv_16;     // with an f16 or bf16 cache: the attention step's K then V rows in that type
  std::vector<int8_t> attn_kv_8;        // with an i8 cache: the step's K then V rows as i8
  std::vector<float> attn_kv_scales;    // and their scales, K's [tokens, Nkv] then V's
  std::vector<std::vector<float>> task_scratch;  // per pool task: one converted weight row (max K)
  cpu::AttentionScratch attn;           // split-K attention's units and chunk states
  // CpuBackendOptions::profile: the per-op table (Backend::Profile) and each entry's index by
  // (op, step tokens).
  std::vector<OpProfile> profile;
  std::map<std::pair<std::string, int>, int> profile_index;
  int ProfileSlot(const std::string& op, int step_tokens, double weight_bytes) {
    auto [it, added] = profile_index.try_emplace({op, step_tokens}, static_cast<int>(profile.size()));
    if (added) profile.push_back({op, step_tokens, 0, 0.0, weight_bytes});
    return it->second;
  }

 private:
  struct ArenaDelete {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t(kAlignBytes)); }
  };
  std::unique_ptr<float[], ArenaDelete> arena_;
  size_t arena_floats_ = 0;
};

class CpuExecutable : public Executable {
 public:
  CpuExecutable(const Graph& graph, int num_tokens, int num_output_rows, ThreadPool* pool, CpuWorkspace* ws,
                const CpuBackendOptions& opts)
      : graph_(graph), num_tokens_(num_tokens), num_out_(num_output_rows), pool_(pool), ws_(ws), opts_(opts) {
    Plan();
  }

  Status Run(const StepInput& in, KvCacheBase& cache) override;
  // The arena's floats plus the workspace this step needs besides (prepared activations, the
  // fused MLP's per-thread blocks, RoPE tables); not the scratch that grows during Run (the
  // attention's f16 step rows and split-K state, per-thread weight rows, MoE buffers).
  size_t StepBytes() const override { return step_bytes_; }

  OutputView Output(const std::string& name) const override {
    auto it = outputs_.find(name);
    if (it == outputs_.end()) return {};
    const Node& n = graph_.node(it->second);
    return OutputView{base_ + offset_of_[it->second], RowsOf(n), n.cols};
  }

 private:
  int RowsOf(const Node& n) const { return n.rows == Rows::kTokens ? num_tokens_ : num_out_; }
  // Rows a node's buffers are sized for: RowsOf, or, in an MLP run in row blocks (mlp_down_of_),
  // the block.
  int PlannedRowsOf(int node) const;
  float* Buf(int node) { return base_ + offset_of_[node]; }
  void Plan();
  void RunAttention(const AttentionOp& op, const float* q, const float* k, const float* v, float* out,
                    const StepInput& in, KvCache& cache);
  void RunMoE(const MoEOp& op, const float* y, const float* r, float* out, int rows);
  // True when a matmul with weights `w` and inner size K runs on int8 activation blocks.
  bool UsesQ8(const Tensor& w, int K) const { return UsesQ8(w.dtype, K); }
  // kQ4_0x4 weights (packed at load, LoadOptions::pack_q4_0) have no f32-activation kernel: they
  // always take int8 activations (the commands pack only when int8 activations are on).
  bool UsesQ8(DType wt, int K) const {
    return (opts_.int8_activations || wt == DType::kQ4_0x4) && K % 32 == 0 && cpu::MatMulQ8Supports(wt);
  }
  // True when Prepare also rearranges the int8 activations of a matmul with weights wt at K into
  // superblocks (cpu::ActSuperblockQ8): activation group 256 (Q4_K, Q5_K, Q6_K at K % 256 == 0)
  // on a CPU whose Q4_K/Q6_K kernels read them (for Q5_K too, so that the Q4_K or Q6_K matmul
  // that reuses the quantisation finds them).
  bool UsesSuperblocks(DType wt, int K) const {
    return UsesQ8(wt, K) && cpu::MatMulQ8UsesSuperblocks(DType::kQ4_K, K, cpu::PreferredActGroup(wt, K));
  }
  // True when a matmul with weights of type wt and inner size K reads f32 activations reordered
  // for its kernel (cpu::MatMulReordersActivations: BF16), prepared once into act_reordered.
  // Also where the activations are rounded to bf16 for the bf16 dot product (UsesBf16), which
  // the same buffer holds (rows x K bf16 in rows x K floats' room).
  bool Reorders(DType wt, int K) const {
    return UsesBf16(wt) || (!UsesQ8(wt, K) && cpu::MatMulReordersActivations(wt, K));
  }
  // True when a matmul with weights of type wt runs on bf16 activations (cpu::MatMulBf16Dot).
  bool UsesBf16(DType wt) const { return opts_.bf16_activations && wt == DType::kBF16 && cpu::HasBf16Dot(); }
  // Weight rows a thread's range must start at a multiple of: 4 for kQ4_0x4 (groups of four rows,
  // whose row counts are multiples of 4), else 1.
  static int RowGrain(DType wt) { return wt == DType::kQ4_0x4 ? 4 : 1; }
  // A matmul's input as its kernels read it: int8 blocks (xq, sums, group), reordered floats (xr),
  // or the f32 rows as they are (x).
  struct Activations {
    const float* x = nullptr;
    const cpu::ActBlockQ8* xq = nullptr;
    const float* sums = nullptr;
    const cpu::ActSuperblockQ8* xs = nullptr;
    const float* xr = nullptr;
    const uint16_t* xb = nullptr;
    int group = 0;
  };
  // Prepares x [rows, K] for weights of type wt once for every thread: quantised into xq/sums
  // (UsesQ8) and, where the activation group is 256 and the CPU's kernels read superblocks
  // (cpu::MatMulQ8UsesSuperblocks for Q4_K: whatever wt is, so that a matmul reusing the
  // quantisation finds them) and xs != nullptr, rearranged into xs (2 rows * K / 256); reordered
  // into xr (Reorders and xr != nullptr), else read as it is. x == nullptr: xq/sums/xs or xr
  // already hold it (the plan's act_reuse_).
  Activations Prepare(const float* x, int rows, int K, DType wt, cpu::ActBlockQ8* xq, float* sums,
                      cpu::ActSuperblockQ8* xs, float* xr);
  // One thread's part of a matmul: y[r * ldy + m] for weight rows m < M at w, from prepared
  // activations; `task` picks the thread's scratch row.
  void MatMulPart(const Activations& a, int rows, int K, const uint8_t* w, DType wt, int M, float scale, float* y,
                  int ldy, int task);
  // The fused gated MLP of GeGlu node `node` (see Plan, CpuBackendOptions::fuse_mlp): out [rows,
  // mlp_width] = GeGlu(gate, up), in blocks of kMlpCols output columns per thread.
  // x: its input's first row (nullptr: prepared by the previous matmul, the plan's act_reuse_).
  void RunFusedMlp(int node, const float* x, int rows, float* out);
  // The fused MLP `node` and its down projection mlp_down_of_[node] over the step's rows, in
  // blocks of CpuBackendOptions::row_block rows: per block, the fused MLP into its output
  // (block rows), then the down projection of those into its own output's rows. Returns the
  // seconds the down projections took where the plan profiles it (else 0).
  double RunMlpBlocks(int node, int rows);
  // The matmul group led by node `leader` (see Plan, CpuBackendOptions::group_matmuls): one pool
  // loop over the weight rows of every member, end to end, each member's output at its own
  // buffer.
  void RunMatMulGroup(int leader, int rows);
  static constexpr int kMlpCols = 64;
  static_assert(kMlpCols % 4 == 0, "fused MLP blocks must hold whole kQ4_0x4 groups");
  // Splits the output columns (weight rows) of a matmul across the pool. The activations are
  // prepared once for all threads (int8 blocks, or reordered floats for BF16) in the workspace;
  // x == nullptr (int8 or reordered activations only): reuse what the previous matmul of the same
  // input prepared (the plan's act_reuse_: q/k/v of one norm, gate/up).
  void ParallelMatMul(const float* x, int rows, int K, const Tensor& w, float scale, float* y);
  // The same for a weight matrix [M, K] of type wt at w (an expert's slice of a 3-D tensor), output
  // row stride ldy. With int8 activations (UsesQ8 for wt) x is quantised into xq/sums (rows * K / 32
  // blocks, rows * K / 16 sums; activation group cpu::PreferredActGroup(wt, K)), or taken from
  // them as they are when x == nullptr; xs (2 rows * K / 256 superblocks, or nullptr: each thread
  // rearranges its own) as Prepare. Where Reorders(wt, K) and xr != nullptr, x is reordered
  // into xr (rows * K floats) or, x == nullptr, taken from it; with xr == nullptr every thread
  // reorders its own copy inside cpu::MatMul.
  void ParallelMatMulRaw(const float* x, int rows, int K, const uint8_t* w, DType wt, int M, float scale, float* y,
                         int ldy, cpu::ActBlockQ8* xq, float* sums, cpu::ActSuperblockQ8* xs, float* xr);
  // Aborts unless the workspace holds int8 blocks / reordered floats for rows x K (Plan sizes it).
  void CheckWorkspace(DType wt, int K, int rows) const;
  // Runs fn(row_begin, row_end) over [0, rows), split across the pool when there are rows enough.
  template <class Fn>
  void ForRows(int rows, Fn&& fn);

  const Graph graph_;
  const int num_tokens_, num_out_;
  ThreadPool* pool_;
  CpuWorkspace* ws_;                              // the backend's: arena, int8 activation blocks
  const CpuBackendOptions opts_;
  std::vector<bool> act_reuse_;  // per node: a matmul reusing the activations the previous one prepared
  // Fused gated MLPs: mlp_of_[GeGlu node] = its two matmul nodes (first, second input), which are
  // fused_away_: never run on their own and given no buffer.
  struct FusedMlp {
    int first = -1, second = -1;
  };
  std::vector<FusedMlp> mlp_of_;
  std::vector<bool> fused_away_;
  // MLPs run in row blocks (CpuBackendOptions::row_block): mlp_down_of_[fused GeGlu node] =
  // the down projection that alone reads it (-1: none), which is blocked_away_: run by the GeGlu
  // node, its output live from there.
  std::vector<int> mlp_down_of_;
  std::vector<bool> blocked_away_;
  // Plain matmuls run in row blocks (see Plan): prepared and multiplied block by block.
  std::vector<bool> row_blocked_;
  size_t step_bytes_ = 0;
  // Matmul groups (CpuBackendOptions::group_matmuls): group_of_[leader] = the group's matmul
  // nodes in graph order, the leader first (empty: not a leader); the other members are
  // grouped_away_: run by the leader, their outputs live from the leader on.
  std::vector<std::vector<int>> group_of_;
  std::vector<bool> grouped_away_;
  // Read-ahead hints (ThreadPool::PrefetchHint), posted after each matmul, fused MLP (GeGlu),
  // attention and soft-cap node (those that run on the pool; not MoE blocks), for steps
  // of at most kHintMaxTokens tokens (decode: memory-bound; the pool's worker would
  // otherwise wait through the serial nodes that follow): the start of worker 1's run of the
  // next matmul's weights (a fused MLP's two matrices), up to kHintBytes of each. E2B decode, 2
  // threads, hints on every other token in one process (128 tokens each, median time per
  // token), as fast as without them by: Q4_0 1.007x and 1.016x at 256 KiB (1.006x at 64 KiB,
  // 1.014x at 1 MiB), Q4_K_M 1.006x and 1.016x.
  struct Hint {
    const void* a = nullptr;
    size_t a_bytes = 0;
    const void* b = nullptr;
    size_t b_bytes = 0;
  };
  std::vector<Hint> hint_after_;  // per node; a == nullptr: none (also every node off the pool)
  static constexpr int kHintMaxTokens = 8;
  static constexpr size_t kHintBytes = 256 << 10;
  // RoPE's cos/sin (cpu::RopeTable) per distinct (head_dim, inv_freq) among the Rope nodes, made
  // by the first such node of each step and reused by the rest: rope_table_of_[node] (-1: not a
  // Rope node), table t at ws_->rope_cs + rope_offset_[t] ([num_tokens_, head_dim] floats; the
  // workspace's, shared by all executables, as steps run one at a time), rope_ready_[t] whether
  // this step's is made. Gemma 4 E2B Q4_0 decode, 2 threads: 2 tables per step (decode: per
  // token) instead of cos/sin in each of the 50 Rope nodes; the Rope nodes took 0.077 ms per
  // token instead of 0.117 (a temporary per-node timer, one run each).
  std::vector<int> rope_table_of_;
  std::vector<size_t> rope_offset_;
  std::vector<char> rope_ready_;
  // CpuBackendOptions::profile: each node's entry in ws_->profile (-1: not timed).
  std::vector<int> profile_slot_;
  // Every node output lives in the workspace arena (see Plan) at offset_of_[node] floats
  // (kNoBuffer: none); base_ is the arena as of the last Run.
  static constexpr size_t kNoBuffer = ~size_t{0};
  std::vector<size_t> offset_of_;
  size_t arena_floats_ = 0;
  float* base_ = nullptr;
  std::map<std::string, int> outputs_;
  // Scratch, sized at plan time or grown on first use only.
  std::vector<float> scratch_;       // one converted weight row (max K)
  std::vector<int32_t> seq_first_;   // per token: index of its sequence's first step token
  std::vector<const void*> attn_cache_rows_;  // per token: K, then V cache row of slot 0 of its sequence
  std::vector<const float*> attn_scale_rows_;  // i8 cache: per token, K's then V's scale row of slot 0
  std::vector<float> moe_scratch_;
  std::vector<cpu::ActBlockQ8> moe_q8_;  // int8 blocks of the experts' inputs
  std::vector<float> moe_sums_;
  std::vector<cpu::ActSuperblockQ8> moe_sb_;  // and as superblocks (2 K / 256 per row; see Prepare)
  std::vector<float> moe_reordered_;     // or their f32 inputs reordered (BF16 experts)
};

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
// arena. Gemma 3 270M, a 452-token prefill chunk: arena 8.17 -> 4.63 MiB, the MLP output next to
// the residual (GreedyLlamaCppTest.Gemma3_270mFusedMlpStepHoldsOneMlpOutputLess; generate's peak
// RSS in docs/PERFORMANCE.md). With row blocks (CpuBackendOptions::row_block) the MLP output
// holds a block's rows, and a blocked matmul's input lives through it (read block by block), its
// output over the input where the rows are no wider.
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
  // Q4_K/Q5_K, 32 for the rest) share a quantisation, so each weight type sees activations
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
  base_ = ws_->Arena(arena_floats_);  // allocated (and its pages touched) at compile time, as before
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
