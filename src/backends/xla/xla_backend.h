// The XLA backend: each step graph lowered to StableHLO (lower.h) and run by a PJRT plugin
// (pjrt.h), with the model's state on the device.
//
// Device state: every weight is uploaded once, on first use by a compile (the engine's warm-up),
// and shared by every executable: F32, F16, BF16 as stored; Q8_0, Q4_0, W4G32 as their blocks'
// bytes, dequantised in the step (lower.h); other block types dequantised to F32 at upload; under a
// bf16/f16 compute dtype (device_policy.h) matrices in that dtype, vectors in F32. The KV cache
// (CreateKvCache) is two device buffers per cache-owning layer, [max_seqs, slots, Nkv*D] of the
// cache type (q8: int8, fp8: f8E4M3FN, each with two more buffers of their f32 scales
// [max_seqs, slots, Nkv], lower_kv.h; fp8 only where device_policy.h's CheckFp8KvCache allows),
// each split over a mesh as shard_plan.h says, which every step takes as
// arguments aliased to its results (donated: updated in place, no second copy) and replaces by
// those results. Only the step's inputs (ids, positions, lengths: a few KB) go to the device and
// only its exported outputs (the logits) come back.
//
// Static shapes: a step of T tokens and R output rows runs the program of the bucket T_b = the
// next power of two >= T (R_b likewise, or T_b when R == T), padding rows marked by sequence -1
// (never written to the cache). On a mesh's data axis of D, a batched decode step runs as D groups
// of rows, one per cache shard, each padded to the bucket of the largest group (lower.h's
// data_groups). Programs are compiled once per (graph, bucket, mode) and shared by every
// executable of the backend (keyed by their StableHLO text).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/xla/mesh.h"
#include "backends/xla/memory_plan.h"
#include "backends/xla/pjrt.h"
#include "runtime/backend.h"

namespace g4 {

struct XlaBackendOptions {
  std::string plugin_path;                   // a PJRT plugin (GetPjrtApi)
  std::vector<xla::NamedOption> client_options;  // PJRT_Client_Create options (e.g. cpu_device_count)
  // The device memory the memory plan checks against; 0: the device's own limit where the plugin
  // reports one (PJRT_Device_MemoryStats), else no check.
  int64_t device_memory_bytes = 0;
  // The compute dtype: "auto" (the device policy, device_policy.h), "f32", "bf16" or "f16".
  std::string compute_dtype = "auto";
  // Index into the plugin's addressable devices (one device; a mesh runs on devices 0 .. N-1).
  int device = 0;
  // SPMD over data x model devices (mesh.h, shard_plan.h); 1x1: one device. On the CPU plugin
  // without a cpu_device_count client option, the client exposes the mesh's device count.
  xla::Mesh mesh;
  // Tests only (no flag sets it): an fp8 KV cache on any device, XLA's CPU plugin included, which
  // converts f8E4M3FN but has no fp8 arithmetic (the device policy refuses fp8 there otherwise).
  bool fp8_cache_for_tests = false;
};

// What the device policy line and `gemma4rt info` say about an XLA backend.
struct XlaDeviceInfo {
  std::string plugin_path, api_version, platform, platform_version, device_kind;
  int64_t memory_bytes = 0;     // the device's memory limit where the plugin reports it, else 0
  std::string compute_capability;  // the device's "compute_capability" attribute ("9.0"), "" where unreported
  int device = 0, num_devices = 1;  // the device used, of the client's addressable devices
  xla::Mesh mesh;               // the mesh steps run on
  DType compute = DType::kF32;
  std::string compute_dtype;    // "f32", "bf16" or "f16"
  std::string compute_reason;   // why (ChooseComputeDtype)
};

// Errors: Plugin::Load's and Client::Create's (a missing file, not a plugin, another major
// version, the plugin's own); InvalidArgument for a mesh of more devices than the client has, a
// device index out of range or a compute dtype the device cannot honour (with the reason).
StatusOr<std::unique_ptr<Backend>> MakeXlaBackend(const XlaBackendOptions& options);
// The device information of a backend MakeXlaBackend made (nullptr for another backend).
const XlaDeviceInfo* XlaInfo(const Backend& backend);
// The per-device memory plan of `graph` with a KV cache of `max_seqs` x `max_context` of
// `kv_type` on an XLA backend's mesh, without allocating anything: one line per term (weights,
// KV cache, total per device against the device's memory and whether it fits, what is replicated).
// PlanShards' errors.
StatusOr<std::vector<std::string>> XlaMeshPlan(const Backend& backend, const Graph& graph, const ModelConfig& config,
                                               int max_seqs, int max_context, DType kv_type);
// The programs compiled so far (one per distinct step module), 0 for another backend.
int XlaProgramCount(const Backend& backend);
// The memory plan so far: weights and KV cache from Engine::Create (Backend::PlanMemory), the
// largest step over the programs compiled so far (nullptr for another backend).
const xla::MemoryPlan* XlaPlan(const Backend& backend);

}  // namespace g4
