#include "backends/xla/mesh.h"

#include <charconv>
#include <cstring>

#include "base/check.h"

namespace g4::xla {

std::string Mesh::ToString() const { return "data=" + std::to_string(data) + ",model=" + std::to_string(model); }

namespace {
std::string Quote(std::string_view s) {
  std::string q(1, '\'');
  q.append(s.data(), s.size());
  q += '\'';
  return q;
}
}  // namespace

StatusOr<Mesh> ParseMesh(std::string_view text) {
  auto bad = [&](const std::string& why) {
    std::string m = "--mesh '";
    m.append(text.data(), text.size());
    m += "': ";
    m += why;
    m += " (expected data=D,model=M, e.g. data=2,model=4)";
    return InvalidArgument(std::move(m));
  };
  if (text.empty()) return bad("empty");
  Mesh mesh;
  bool seen_data = false, seen_model = false;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    const std::string_view item = text.substr(begin, comma - begin);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return bad(Quote(item) + " is not AXIS=SIZE");
    const std::string_view axis = item.substr(0, eq), size = item.substr(eq + 1);
    int n = 0;
    auto [end, ec] = std::from_chars(size.data(), size.data() + size.size(), n);
    if (ec != std::errc() || end != size.data() + size.size() || size.empty())
      return bad("the size of " + Quote(axis) + " is not a number");
    if (n < 1) return bad("the size of " + Quote(axis) + " must be at least 1");
    if (axis == "data") {
      if (seen_data) return bad("data given twice");
      seen_data = true;
      mesh.data = n;
    } else if (axis == "model") {
      if (seen_model) return bad("model given twice");
      seen_model = true;
      mesh.model = n;
    } else {
      return bad("unknown axis " + Quote(axis) + " (the axes are data and model)");
    }
    begin = comma + 1;
  }
  if (static_cast<int64_t>(mesh.data) * mesh.model > kMaxMeshDevices)
    return bad("more than " + std::to_string(kMaxMeshDevices) + " devices");
  return mesh;
}

StatusOr<Mesh> MeshOfDevices(int n) {
  if (n < 1) return InvalidArgument("--devices must be at least 1, got " + std::to_string(n));
  if (n > kMaxMeshDevices)
    return InvalidArgument("--devices must be at most " + std::to_string(kMaxMeshDevices) + ", got " + std::to_string(n));
  return Mesh{1, n};
}

Status CheckMeshFits(const Mesh& mesh, int num_devices, const std::string& platform) {
  if (mesh.size() <= num_devices) return OkStatus();
  return InvalidArgument("--mesh " + mesh.ToString() + " needs " + std::to_string(mesh.size()) + " devices; the " +
                         platform + " PJRT client has " + std::to_string(num_devices));
}

namespace {

// The tile grid of a split: one entry per tensor dim, then a replication dim where an axis of
// size > 1 splits nothing.
struct Tiling {
  std::vector<int64_t> tiles;
  bool replicate_dim = false;
};

Tiling TilingOf(const Mesh& mesh, int rank, TensorSplit s) {
  Tiling t;
  t.tiles.assign(rank, 1);
  int64_t rep = 1;
  if (s.data_dim >= 0) t.tiles[s.data_dim] = mesh.data;
  else rep *= mesh.data;
  if (s.model_dim >= 0) t.tiles[s.model_dim] = mesh.model;
  else rep *= mesh.model;
  if (rep > 1) {
    t.tiles.push_back(rep);
    t.replicate_dim = true;
  }
  return t;
}

// The coordinate of device (d, m) in the tile grid, flattened row-major.
int64_t TileIndex(const Mesh& mesh, int rank, TensorSplit s, const Tiling& t, int d, int m) {
  std::vector<int64_t> coord(t.tiles.size(), 0);
  if (s.data_dim >= 0) coord[s.data_dim] = d;
  if (s.model_dim >= 0) coord[s.model_dim] = m;
  if (t.replicate_dim) {
    int64_t r = 0;
    if (s.data_dim < 0) r = d;
    if (s.model_dim < 0) r = r * mesh.model + m;
    coord[rank] = r;
  }
  int64_t flat = 0;
  for (size_t i = 0; i < coord.size(); ++i) flat = flat * t.tiles[i] + coord[i];
  return flat;
}

}  // namespace

std::string HloSharding(const Mesh& mesh, int rank, TensorSplit s) {
  const bool splits = (s.data_dim >= 0 && mesh.data > 1) || (s.model_dim >= 0 && mesh.model > 1);
  if (!splits) return "{replicated}";
  const Tiling t = TilingOf(mesh, rank, s);
  std::vector<int> devices(mesh.size());
  for (int d = 0; d < mesh.data; ++d)
    for (int m = 0; m < mesh.model; ++m) devices[TileIndex(mesh, rank, s, t, d, m)] = d * mesh.model + m;
  std::string out = "{devices=[";
  for (size_t i = 0; i < t.tiles.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(t.tiles[i]);
  }
  out += ']';
  for (size_t i = 0; i < devices.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(devices[i]);
  }
  if (t.replicate_dim) out += " last_tile_dim_replicate";
  return out + "}";
}

std::vector<int64_t> ShardDims(const Mesh& mesh, const std::vector<int64_t>& dims, TensorSplit s) {
  std::vector<int64_t> out = dims;
  if (s.data_dim >= 0) {
    G4_CHECK(out[s.data_dim] % mesh.data == 0);
    out[s.data_dim] /= mesh.data;
  }
  if (s.model_dim >= 0) {
    G4_CHECK(out[s.model_dim] % mesh.model == 0);
    out[s.model_dim] /= mesh.model;
  }
  return out;
}

void CopyShard(const Mesh& mesh, const uint8_t* src, const std::vector<int64_t>& dims, size_t elem_bytes,
               TensorSplit s, int device, uint8_t* dst) {
  const int d = device / mesh.model, m = device % mesh.model;
  const std::vector<int64_t> sd = ShardDims(mesh, dims, s);
  const int rank = static_cast<int>(dims.size());
  std::vector<int64_t> offset(rank, 0);
  if (s.data_dim >= 0) offset[s.data_dim] = d * sd[s.data_dim];
  if (s.model_dim >= 0) offset[s.model_dim] = m * sd[s.model_dim];
  // Copy runs of the innermost dim; walk the outer shard coordinates row-major.
  const size_t run = static_cast<size_t>(rank ? sd[rank - 1] : 1) * elem_bytes;
  int64_t outer = 1;
  for (int i = 0; i + 1 < rank; ++i) outer *= sd[i];
  std::vector<int64_t> c(rank > 0 ? rank - 1 : 0, 0);
  for (int64_t o = 0; o < outer; ++o) {
    int64_t flat = 0;
    for (int i = 0; i < rank; ++i) flat = flat * dims[i] + (i + 1 < rank ? c[i] : 0) + offset[i];
    std::memcpy(dst + o * run, src + flat * elem_bytes, run);
    for (int i = rank - 2; i >= 0; --i) {
      if (++c[i] < sd[i]) break;
      c[i] = 0;
    }
  }
}

}  // namespace g4::xla
