// Lowering of a step graph (src/graph/graph.h) to one StableHLO module for one step shape.
//
// @main's parameters, in order:
//   0 tokens    i32[T]   (padding rows: any valid id)
//   1 positions i32[T]   (padding rows: any value >= 0)
//   2 seq_ids   i32[T]   (padding rows: -1; they never write the KV cache)
//   3 out_rows  i32[R]   indices into the step's rows
//   4 kv_len    i32[S]   each sequence's cache length before the step
//   5 kv_end    i32[S]   each sequence's cache length after the step (kv_len + its real rows)
//   then every weight tensor the graph reads (LoweredStep::weights), in its device type
//   (WeightDeviceType of StepShape::compute)
//   then K and V of every cache-owning layer (LoweredStep::caches), [S, slots, Nkv*D] of kv_type,
//   with an i8 cache followed by their scales f32 [S, slots, Nkv] (lower_kv.h), each aliased to
//   its result (donated: updated in place).
// Results: the graph's exported outputs (LoweredStep::outputs) as f32 [rows, cols], then the new
// cache buffers of every cache layer in the parameter order (KvBuffersPerLayer per layer).
//
// Attention layout (mode): StepMode::kOneSequence -- every real row belongs to seq_ids[0] (a
// prefill chunk): the sequence's cache is sliced once; StepMode::kOneTokenPerSequence -- each row
// is its own sequence (batched decode): each row gathers its sequence's cache. The cache slot of
// position p is p % slots on sliding layers (a ring) and p otherwise, and slot c of a sequence of
// length L holds position L-1 - ((L-1-c) mod slots) when c < L. A row is written only where its
// position is among the last `slots` positions of its sequence after the step (a chunk longer than
// the ring writes each slot once); padding rows write nothing (out-of-bounds scatter rows, which
// XLA drops).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "backends/xla/shard_plan.h"
#include "backends/xla/stablehlo.h"
#include "base/status.h"
#include "graph/graph.h"
#include "tensor/dtype.h"

namespace g4::xla {

enum class StepMode { kOneSequence, kOneTokenPerSequence };

struct CacheLayer {
  int layer = 0;   // the owning layer (AttentionOp/KvWriteOp::cache_layer)
  int slots = 0;   // rows per sequence
  int window = 0;  // > 0: sliding (a ring of `slots`)
  int width = 0;   // Nkv * D
  int heads = 0;   // Nkv (needed by an i8 cache: one scale per KV head)
};

struct StepShape {
  int tokens = 1;        // T, padding rows included
  int output_rows = 1;   // R
  int max_seqs = 1;      // S
  StepMode mode = StepMode::kOneSequence;
  DType kv_type = DType::kF32;      // kF32, kF16, kBF16, kI8 or kF8E4M3 (those two with scales: lower_kv.h)
  std::vector<CacheLayer> caches;   // every cache-owning layer the graph reads or writes
  // Weights are parameters in their own dtype: F32, F16 and BF16 as such, Q8_0, Q4_0 and W4G32 as
  // their blocks' bytes (ui8 [..., K/32, block bytes], dequantised inside the step where they are
  // read: IsDeviceQuantised). true: weights of other dtypes (other GGUF block types) are
  // parameters of WeightDeviceType (F32, or the compute dtype for matrices; the backend
  // dequantises them at upload); false: such a weight is an Unimplemented error.
  bool quantised_as_f32 = false;
  // SPMD over a mesh of more than one device: the module is partitioned over plan->mesh, weights
  // and caches carry the plan's shardings; the step inputs and exported outputs are replicated,
  // unless data_groups > 1.
  const ShardPlan* shards = nullptr;
  // > 1 (kOneTokenPerSequence on a data axis of this size): the T rows are data_groups equal groups,
  // group d holding only rows of sequences of cache shard d (d * S/data_groups and on) or padding.
  // Row inputs (tokens, positions, seq_ids, out_rows), kv_len/kv_end and exported outputs are split
  // over the data axis, each row reads and writes its cache shard locally (batched gather/scatter),
  // so each data shard computes only its group's rows. out_rows is ignored: R == T, every row out.
  int data_groups = 1;
  // The dtype of every dot's operands (device_policy.h): kF32, kBF16 or kF16; dots accumulate and
  // return f32. Weights are parameters of WeightDeviceType(t, compute).
  DType compute = DType::kF32;
};

struct LoweredStep {
  std::string module;                          // StableHLO text
  std::vector<const Tensor*> weights;          // parameter order after the 6 step inputs
  std::vector<DType> weight_types;             // their device types
  std::vector<CacheLayer> caches;              // K, V (i8: and their scales) parameters and results in this order
  int kv_buffers = 2;                          // cache buffers per layer (KvBuffersPerLayer)
  std::vector<std::pair<std::string, int>> outputs;  // exported (name, node id), results first
  int num_params() const { return 6 + static_cast<int>(weights.size() + kv_buffers * caches.size()); }
};

// Device buffers per cache-owning layer: K and V, and for an i8 or fp8 cache their scales (K's, V's).
inline int KvBuffersPerLayer(DType kv_type) { return kv_type == DType::kI8 || kv_type == DType::kF8E4M3 ? 4 : 2; }

// The weight tensors `graph` reads, each once, in the order nodes first read them.
std::vector<const Tensor*> GraphWeights(const Graph& graph);
// Bytes a weight takes on the device: as stored for F32/F16/BF16 and IsDeviceQuantised types, 4
// per element for the other block types (dequantised to F32 at upload).
size_t DeviceBytes(const Tensor& t);

// ElemType of a device dtype (F32, F16, BF16, I32); Unimplemented otherwise.
StatusOr<ElemType> ElemTypeOf(DType t);
// The block types the device keeps as stored and the step dequantises: Q8_0, Q4_0, W4G32.
inline bool IsDeviceQuantised(DType t) { return t == DType::kQ8_0 || t == DType::kQ4_0 || t == DType::kW4G32; }
// The device shape of a weight: its shape, or for IsDeviceQuantised types [..., K/32, block bytes].
Shape DeviceShape(const Tensor& t);

// Errors: Unimplemented for a weight dtype the lowering does not take (quantised types unless
// quantised_as_f32), InvalidArgument for a cache layer the shape does not list.
StatusOr<LoweredStep> LowerGraph(const Graph& graph, const StepShape& shape);

}  // namespace g4::xla
