// The CPU backend: compiles a step graph into a buffer plan (liveness-based reuse, allocated
// once per step shape) and runs it with the kernels in kernels.h and kernels_q8.h. Weights are
// read in their stored dtype; activations are f32 except as CpuBackendOptions says.
#pragma once

#include <memory>

#include "runtime/backend.h"

namespace g4 {

struct CpuBackendOptions {
  // Block-quantised weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) are multiplied with
  // activations quantised to int8 blocks of 32 (backends/cpu/kernels_q8.h), as llama.cpp does:
  // several times fewer instructions per weight, logits close to the f32 path's
  // (docs/NUMERICS.md). false: f32 activations for every weight type
  // (what transformers computes; the parity tests use it). Float weights always use f32.
  bool int8_activations = true;
  // BF16 weights are multiplied with activations rounded to bf16 on the CPU's bf16 dot-product
  // instruction where it has one (cpu::HasBf16Dot: x86 AVX512_BF16), as llama.cpp does there:
  // about twice the multiply-adds per cycle of widening the weights to f32. The activations of
  // one input are rounded once for every thread and for the matmuls that share it (q/k/v,
  // gate/up). false, or a CPU without the instruction: f32 activations (cpu::MatMul).
  bool bf16_activations = true;
  // A gated MLP -- GeGlu(x W_gate^T, x W_up^T) where both matmuls read one x and feed only the
  // GeGlu -- runs as one op over blocks of 64 output columns: each thread writes a block's gate
  // outputs into the op's output, its up outputs into its own scratch [tokens, 64], then the
  // GeGlu over the gate's, so the step never holds the two [tokens, mlp_width] outputs (2 x 8 KB
  // per token on Gemma 3 270M, 2 x 48 KB on Gemma 4 E2B's wide layers). The same kernels on the
  // same rows: the same bits as unfused. false: three ops.
  bool fuse_mlp = true;
  // Steps of more than this many tokens (prefill chunks) run two kinds of matmul block of rows by
  // block of rows: a fused MLP (fuse_mlp) together with the down projection that alone reads it,
  // and a matmul that prepares its input (int8 blocks, bf16) and is no wider than it (the
  // attention output projection; Gemma 4's per-layer-input gate). Their outputs, for the MLP, and prepared inputs are then held
  // for this many tokens, not the whole step, and the narrower output is written over the input
  // rows already read; the weights of those matmuls are read once per block instead of once per
  // step. Every row goes through the same kernels as unblocked: the same bits. 0: no blocks.
  int row_block = 128;
  // Matmuls of one input that take the same prepared activations and weight type -- q, k and v
  // of one norm -- run as one pool loop over their weight rows end to end, each output written
  // where its own node would write it: one hand-off instead of three, and the 256-row k/v
  // matrices (Gemma 4 E2B) are read as part of one longer stream per thread instead of two
  // short ones. The same kernels on the same rows: the same bits as separate loops. false: one
  // loop per matmul.
  bool group_matmuls = true;
  // Times every node of every step (two steady_clock reads around each op, on the calling
  // thread) into the table Backend::Profile() returns (`gemma4rt bench --profile`). A pool loop's
  // time includes the wait for its last chunk. false: no clock reads.
  bool profile = false;
};

// The options behind the CLI's --f32-activations: f32 activations for every weight type (what
// transformers computes) when true, the defaults otherwise.
CpuBackendOptions CpuBackendOptionsFor(bool f32_activations);
// The activation policy the options give on this CPU, for the device-policy line: "f32",
// "int8-for-quantised-weights", "bf16-for-bf16-weights" or both joined by a comma.
const char* ActivationPolicy(const CpuBackendOptions& options);

// Whether a command should load with LoadOptions::pack_q4_0: the CPU kernel for kQ4_0x4 exists here
// (cpu::Q4_0x4KernelAvailable), the run uses int8 activations (f32_activations false) and the user
// did not pass --no-repack.
bool PackQ4_0ForCpu(bool f32_activations, bool no_repack);

// threads: worker threads for matmuls and attention (>= 1; the caller's thread is one of them).
std::unique_ptr<Backend> MakeCpuBackend(int threads = 1, const CpuBackendOptions& options = {});

}  // namespace g4
