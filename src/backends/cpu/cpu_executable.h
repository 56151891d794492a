// The CPU backend's executable (cpu_backend.cc runs it, cpu_plan.cc plans it) and the workspace
// its steps share. Internal to src/backends/cpu.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/attention.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels_bf16.h"
#include "backends/cpu/kernels_q8.h"
#include "base/thread_pool.h"
#include "graph/graph.h"
#include "runtime/kv_cache.h"

namespace g4::cpu_internal {

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
  // next matmul's weights (a fused MLP's two matrices), up to kHintBytes of each.
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
  // this step's is made: a model's Rope nodes share a few tables instead of each computing its
  // own cos/sin.
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

}  // namespace g4::cpu_internal
