// Per-device buffers of a tensor laid out over a mesh (mesh.h): device i holds only its shard,
// sliced on the host and uploaded to that device (the whole tensor is never on one device).
#pragma once

#include <cstdint>
#include <vector>

#include "backends/xla/mesh.h"
#include "backends/xla/pjrt.h"

namespace g4::xla {

// Shard i of `data` (dense row-major `dims`, `elem_bytes` per element) on client device
// first_device + i, for every device of `mesh`. A tensor split along its first dim only, or not at all, is uploaded
// from `data` in place (no host copy).
StatusOr<std::vector<Buffer>> UploadShards(Client& client, const Mesh& mesh, const void* data, PJRT_Buffer_Type type,
                                           size_t elem_bytes, const std::vector<int64_t>& dims, TensorSplit split,
                                           int first_device = 0);
// A zero-filled shard of a `dims` tensor on every device of `mesh` (from first_device on).
StatusOr<std::vector<Buffer>> ZeroShards(Client& client, const Mesh& mesh, PJRT_Buffer_Type type, size_t elem_bytes,
                                         const std::vector<int64_t>& dims, TensorSplit split, int first_device = 0);

}  // namespace g4::xla
