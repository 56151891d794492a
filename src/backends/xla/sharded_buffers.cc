#include "backends/xla/sharded_buffers.h"

namespace g4::xla {

StatusOr<std::vector<Buffer>> UploadShards(Client& client, const Mesh& mesh, const void* data, PJRT_Buffer_Type type,
                                           size_t elem_bytes, const std::vector<int64_t>& dims, TensorSplit split,
                                           int first_device) {
  const std::vector<int64_t> sd = ShardDims(mesh, dims, split);
  int64_t n = 1;
  for (int64_t x : sd) n *= x;
  const size_t shard_bytes = static_cast<size_t>(n) * elem_bytes;
  // In place: only the first dim split (by one axis), so each shard is one contiguous run.
  const bool in_place = (split.model_dim <= 0 && split.data_dim <= 0) && !(split.model_dim == 0 && split.data_dim == 0);
  std::vector<uint8_t> host;
  std::vector<Buffer> out;
  for (int i = 0; i < mesh.size(); ++i) {
    const uint8_t* src = static_cast<const uint8_t*>(data);
    if (in_place) {
      const int index = split.model_dim == 0 ? i % mesh.model : split.data_dim == 0 ? i / mesh.model : 0;
      src += static_cast<size_t>(index) * shard_bytes;
    } else {
      host.resize(shard_bytes);
      CopyShard(mesh, src, dims, elem_bytes, split, i, host.data());
      src = host.data();
    }
    G4_ASSIGN_OR_RETURN(Buffer b, client.Upload(src, type, sd, first_device + i));
    out.push_back(std::move(b));
  }
  return out;
}

StatusOr<std::vector<Buffer>> ZeroShards(Client& client, const Mesh& mesh, PJRT_Buffer_Type type, size_t elem_bytes,
                                         const std::vector<int64_t>& dims, TensorSplit split, int first_device) {
  const std::vector<int64_t> sd = ShardDims(mesh, dims, split);
  int64_t n = 1;
  for (int64_t x : sd) n *= x;
  const std::vector<uint8_t> zeros(static_cast<size_t>(n) * elem_bytes, 0);
  std::vector<Buffer> out;
  for (int i = 0; i < mesh.size(); ++i) {
    G4_ASSIGN_OR_RETURN(Buffer b, client.Upload(zeros.data(), type, sd, first_device + i));
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace g4::xla
