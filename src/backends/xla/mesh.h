// A device mesh for SPMD runs of the XLA backend: `data` x `model` devices, partition (and
// device) index d * model + m for the device at data coordinate d and model coordinate m.
//
// The model axis splits weights (attention heads, MLP columns/rows, vocabulary, experts) and the
// KV cache's heads; the data axis splits the KV cache's sequences and a batched decode step's rows
// (shard_plan.h, lower.h). A tensor's
// layout is a TensorSplit: the tensor dimension each axis splits (or none: replicated over that
// axis), written into the StableHLO module as an XLA HloSharding string.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace g4::xla {

// The most devices a mesh may have (--mesh and --devices alike).
inline constexpr int kMaxMeshDevices = 4096;

struct Mesh {
  int data = 1, model = 1;
  int size() const { return data * model; }
  // "data=2,model=4"
  std::string ToString() const;
};

// "data=D,model=M" (either order, either omitted: 1), D, M >= 1. InvalidArgument with the text
// and what was wrong otherwise.
StatusOr<Mesh> ParseMesh(std::string_view text);
// `--devices N`: model=N. InvalidArgument for N < 1 or N > kMaxMeshDevices.
StatusOr<Mesh> MeshOfDevices(int n);
// The most devices the backend asks XLA's CPU plugin to expose for a mesh.
inline constexpr int kMaxCpuPluginDevices = 1024;
// InvalidArgument where the mesh needs more devices than the client has.
Status CheckMeshFits(const Mesh& mesh, int num_devices, const std::string& platform);

// Which dimension of a tensor each mesh axis splits; -1: replicated over that axis.
struct TensorSplit {
  int data_dim = -1, model_dim = -1;
  bool operator==(const TensorSplit&) const = default;
};

// The HloSharding of a rank-`rank` tensor split as `split` ("{replicated}", "{devices=[1,4]0,1,2,3}",
// "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}").
std::string HloSharding(const Mesh& mesh, int rank, TensorSplit split);
// The dims of one device's shard: the split dims divided by their axis (which must divide them).
std::vector<int64_t> ShardDims(const Mesh& mesh, const std::vector<int64_t>& dims, TensorSplit split);
// Copies the shard of device `device` (d * model + m) of a dense row-major tensor of `dims`, each
// element `elem_bytes` bytes, to `dst` (ShardDims' size).
void CopyShard(const Mesh& mesh, const uint8_t* src, const std::vector<int64_t>& dims, size_t elem_bytes,
               TensorSplit split, int device, uint8_t* dst);

}  // namespace g4::xla
