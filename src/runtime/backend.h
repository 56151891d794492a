// Backend interface: compile a step graph for one step shape, then run it many times.
//
// A CPU backend plans host buffers and calls kernels; later backends (CUDA, XLA/PJRT) compile the
// same Graph without any change to the model definition.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "graph/graph.h"
#include "runtime/kv_cache.h"

namespace g4 {

// The inputs of one step. Sizes: tokens, positions and seq_ids [num_tokens]; output_rows
// [num_output_rows] (indices into the step's tokens). Each sequence's tokens are contiguous in
// the step, in increasing position order, and start at that sequence's cache length.
struct StepInput {
  std::span<const int32_t> tokens;
  std::span<const int32_t> positions;
  std::span<const int32_t> seq_ids;
  std::span<const int32_t> output_rows;
};

// A view of an exported output after Run: data [rows, cols] row-major f32 in the backend's step
// memory, valid until the next Run or Compile of any executable of the same backend (a backend
// may share step memory between its executables, since steps run one at a time). The caller may
// overwrite it (the scheduler samples logits in place); the next Run does not read it.
struct OutputView {
  float* data = nullptr;
  int rows = 0;
  int cols = 0;
};

class Executable {
 public:
  virtual ~Executable() = default;
  // Runs the step: reads and writes `cache`, which this executable's backend created
  // (Backend::CreateKvCache; sequence lengths are advanced by the caller). The step must satisfy
  // the StepInput contract and the compiled shape (internal checks). Errors: a device's (e.g. out
  // of memory); the CPU backend has none.
  virtual Status Run(const StepInput& input, KvCacheBase& cache) = 0;
  // Exported output by name; rows == 0 if the graph has no such output.
  virtual OutputView Output(const std::string& name) const = 0;
  // Bytes of host memory the step's node outputs and prepared activations take (the CPU backend:
  // the workspace arena and activation buffers it needs, which executables of one backend share;
  // not the attention's and kernels' own scratch); 0 where a backend does not say.
  virtual size_t StepBytes() const { return 0; }
};

// Time a backend spent in one kind of op, summed over the steps it ran (where it was built to
// profile, e.g. CpuBackendOptions::profile). `op` names the op and, for a matmul, its weights
// ("MatMul Q4_0x4 2048x1536"; "fused MLP" for a gated MLP run as one op; members joined by "+"
// for matmuls run as one loop); `step_tokens` the step's token count (1 for a one-sequence decode
// step).
struct OpProfile {
  std::string op;
  int step_tokens = 0;
  int64_t calls = 0;
  double seconds = 0;        // wall time on the thread that ran the step, summed over calls
  double weight_bytes = 0;   // weight bytes the op reads per call (0 where it reads none)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string Name() const = 0;
  // The per-op times of every step run so far, in no particular order (subtract an earlier
  // snapshot for an interval); empty where the backend does not profile.
  virtual std::vector<OpProfile> Profile() const { return {}; }
  // Compiles `graph` for steps of exactly `num_tokens` tokens and `num_output_rows` output rows.
  // Executables must not outlive their backend, and must not Run concurrently with each other.
  virtual StatusOr<std::unique_ptr<Executable>> Compile(const Graph& graph, int num_tokens, int num_output_rows) = 0;
  // A KV cache for `config` where this backend's executables read and write it (KvCache's layout
  // and limits; type kF32, kF16, kBF16 or another CheckKvCacheType allows). The CPU backend: a host KvCache. Errors: the device's
  // (the cache does not fit).
  // Checks, before the first step, that the weights `graph` reads and `cache` fit in the memory
  // the backend runs in. Errors: ResourceExhausted with the arithmetic (what needs how many bytes,
  // against which limit). The CPU backend checks nothing (the KV cache is allocated already). A
  // backend that compiles per shape adds each compiled step's working memory to the same plan
  // before the step first runs (that Run fails with the same error when it no longer fits).
  virtual Status PlanMemory(const Graph& graph, const KvCacheBase& cache) const { return OkStatus(); }
  // Whether the first run of each step shape compiles a program for it (seconds on a real model):
  // a server then runs every shape it will use before it answers /health (Engine::Warmup).
  virtual bool CompilesPerShape() const { return false; }
  // The groups the sequence slots are split into, each on its own devices (slot s in group
  // s / (max_seqs / groups)): a mesh's data axis. A batched decode step computes each group's rows
  // on its devices, so a scheduler spreads its sequences over the groups.
  virtual int SlotGroups() const { return 1; }
  virtual StatusOr<std::unique_ptr<KvCacheBase>> CreateKvCache(const ModelConfig& config, int max_seqs, int max_context,
                                                               DType type) {
    G4_RETURN_IF_ERROR(CheckKvCacheType(type));
    return std::unique_ptr<KvCacheBase>(new KvCache(config, max_seqs, max_context, type));
  }
  // OK when this backend's KV cache can hold elements of `type`; InvalidArgument with the reason
  // otherwise. The CPU backend: f32, f16, bf16 and i8 (q8); fp8 is refused (no fp8 arithmetic on
  // CPUs: each element would be widened to f32 for every use, for no fewer bytes than q8).
  virtual Status CheckKvCacheType(DType type) const {
    if (type == DType::kF8E4M3)
      return InvalidArgument("--cache-type fp8: the " + Name() + " backend has no fp8 arithmetic (each element would be "
                             "widened to f32 for every use, for no fewer bytes than q8): use --cache-type q8, or fp8 on a "
                             "TPU (--backend xla) or a CUDA GPU of compute capability 8.9 or newer (--backend xla or cuda)");
    if (!IsHostKvCacheType(type)) return InvalidArgument("KV cache type must be f32, f16, bf16 or q8");
    return OkStatus();
  }
};

}  // namespace g4
