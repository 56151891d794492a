#include "model/quantized_store.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include <nlohmann/json.hpp>

#include "tensor/quantize.h"

namespace g4 {

const Tensor* OverlayStore::Find(std::string_view name) const {
  if (auto it = owned_.find(name); it != owned_.end()) return &it->second.tensor;
  if (hidden_.find(name) != hidden_.end()) return nullptr;
  return base_->Find(name);
}

std::vector<std::string> OverlayStore::Names() const {
  std::set<std::string> names;
  for (const std::string& n : base_->Names())
    if (!hidden_.count(n)) names.insert(n);
  for (const auto& [n, o] : owned_) names.insert(n);
  return {names.begin(), names.end()};
}

bool OverlayStore::PackQ4_0x4(const Tensor& t) {
  auto it = owned_.find(t.name);
  if (it == owned_.end() || &it->second.tensor != &t) return base_->PackQ4_0x4(t);
  Tensor& mine = it->second.tensor;
  if (!Q4_0x4Packable(mine.dtype, mine.shape)) return false;
  PackQ4_0x4InPlace(it->second.bytes.data(), mine.shape[0], mine.shape[1]);
  mine.dtype = DType::kQ4_0x4;
  return true;
}

void OverlayStore::Put(Tensor t, std::vector<uint8_t> bytes) {
  const std::string name = t.name;
  Owned& o = owned_[name];
  o.bytes = std::move(bytes);
  o.tensor = std::move(t);
  o.tensor.data = o.bytes.data();
  o.tensor.nbytes = o.bytes.size();
}

namespace {

using json = nlohmann::json;

// Drops the resident pages that lie wholly inside [p, p + n) of a read-only mapping; the kernel
// re-reads them from the file if they are touched again.
void ReleasePages(const void* p, size_t n) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (e > b) madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

std::string Dump(const json& j) { return j.dump(); }

// One config group's "weights" entry: supported or Unimplemented naming the field.
Status CheckWeightsScheme(const json& w, const std::string& where) {
  auto get = [&](const char* k) { return w.contains(k) ? w[k] : json(); };
  if (get("num_bits") != json(4))
    return Unimplemented(where + ".num_bits = " + Dump(get("num_bits")) + ": only 4-bit weights are supported");
  if (!get("type").is_null() && get("type") != json("int"))
    return Unimplemented(where + ".type = " + Dump(get("type")) + ": only integer weights are supported");
  if (get("symmetric") != json(true))
    return Unimplemented(where + ".symmetric = " + Dump(get("symmetric")) +
                         ": asymmetric weights (zero points) are not supported");
  const json st = get("strategy");
  if (st == json("group")) {
    const json g = get("group_size");
    if (!g.is_number_integer() || g.get<int64_t>() <= 0 || g.get<int64_t>() % 32 != 0)
      return Unimplemented(where + ".group_size = " + Dump(g) + ": only group sizes that are multiples of 32 are supported");
  } else if (st != json("channel")) {
    return Unimplemented(where + ".strategy = " + Dump(st) + ": only \"group\" and \"channel\" are supported");
  }
  const json ao = get("actorder");
  if (!ao.is_null() && ao != json(false))
    return Unimplemented(where + ".actorder = " + Dump(ao) + ": activation ordering (g_idx) is not supported");
  const json dyn = get("dynamic");
  if (!dyn.is_null() && dyn != json(false))
    return Unimplemented(where + ".dynamic = " + Dump(dyn) + ": dynamic weight quantisation is not supported");
  if (!get("block_structure").is_null())
    return Unimplemented(where + ".block_structure is not supported");
  return OkStatus();
}

Status CheckQuantizationConfig(const json& q, const std::string& where) {
  const std::string f = where + ": quantization_config";
  if (!q.is_object()) return InvalidArgument(f + " is not a JSON object");
  const json method = q.value("quant_method", json());
  if (method != json("compressed-tensors"))
    return Unimplemented(f + ".quant_method = " + Dump(method) + ": only \"compressed-tensors\" is supported");
  const json fmt = q.value("format", json());
  if (fmt != json("pack-quantized"))
    return Unimplemented(f + ".format = " + Dump(fmt) + ": only \"pack-quantized\" (int4 W4A16) is supported");
  for (const char* k : {"sparsity_config", "kv_cache_scheme"})
    if (q.contains(k) && !q[k].is_null() && !(q[k].is_object() && q[k].empty()))
      return Unimplemented(f + "." + k + " is not supported");
  const json groups = q.value("config_groups", json());
  if (!groups.is_object() || groups.empty()) return InvalidArgument(f + ".config_groups is missing or empty");
  for (auto it = groups.begin(); it != groups.end(); ++it) {
    const std::string g = f + ".config_groups." + it.key();
    const json& grp = it.value();
    if (!grp.is_object()) return InvalidArgument(g + " is not a JSON object");
    if (grp.contains("format") && !grp["format"].is_null() && grp["format"] != json("pack-quantized"))
      return Unimplemented(g + ".format = " + Dump(grp["format"]) + ": only \"pack-quantized\" is supported");
    for (const char* k : {"input_activations", "output_activations"})
      if (grp.contains(k) && !grp[k].is_null())
        return Unimplemented(g + "." + k + " is set: activation quantisation (e.g. W4A8) is not supported, only W4A16");
    if (!grp.contains("weights") || !grp["weights"].is_object()) return InvalidArgument(g + ".weights is missing");
    G4_RETURN_IF_ERROR(CheckWeightsScheme(grp["weights"], g + ".weights"));
  }
  return OkStatus();
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// X.weight_packed + X.weight_scale (+ X.weight_shape) -> kW4G32 [out, in] bytes.
StatusOr<Tensor> RepackOne(const TensorStore& s, const std::string& x, std::vector<uint8_t>* out) {
  const Tensor* packed = s.Find(x + ".weight_packed");
  const Tensor* scale = s.Find(x + ".weight_scale");
  const Tensor* shape = s.Find(x + ".weight_shape");
  const std::string where = "tensor '" + x + ".weight_packed'" + (packed ? " in " + packed->file : "");
  if (s.Find(x + ".weight_zero_point"))
    return Unimplemented(where + ": has a weight_zero_point (asymmetric int4), which is not supported");
  if (s.Find(x + ".weight_g_idx"))
    return Unimplemented(where + ": has a weight_g_idx (activation ordering), which is not supported");
  if (!scale) return DataLoss(where + ": no matching '" + x + ".weight_scale'");
  if (packed->dtype != DType::kI32 || packed->shape.size() != 2)
    return DataLoss(where + ": expected an I32 [out, in/8] tensor, got " + std::string(DTypeName(packed->dtype)) + " " +
                    packed->ShapeString());
  if (scale->dtype != DType::kBF16)
    return Unimplemented(where + ": weight_scale is " + std::string(DTypeName(scale->dtype)) +
                         "; only BF16 scales are supported");
  const int64_t out_f = packed->shape[0];
  int64_t in_f = packed->shape[1] * 8;
  if (shape) {
    if (shape->numel() != 2) return DataLoss(where + ": weight_shape " + shape->ShapeString() + " is not [2]");
    if (static_cast<int64_t>(shape->GetF32(0)) != out_f || static_cast<int64_t>(std::llround(shape->GetF32(1))) > in_f ||
        std::llround(shape->GetF32(1)) <= in_f - 8)
      return DataLoss(where + ": weight_shape disagrees with the packed shape " + packed->ShapeString());
    in_f = std::llround(shape->GetF32(1));
  }
  if (in_f % 32 != 0)
    return Unimplemented(where + ": in_features " + std::to_string(in_f) + " is not a multiple of 32");
  if (scale->shape.size() != 2 || scale->shape[0] != out_f || scale->shape[1] <= 0 || in_f % scale->shape[1] != 0 ||
      (in_f / scale->shape[1]) % 32 != 0)
    return DataLoss(where + ": weight_scale shape " + scale->ShapeString() + " does not give groups of a multiple of 32 over [" +
                    std::to_string(out_f) + ", " + std::to_string(in_f) + "]");
  const int64_t groups = scale->shape[1], G = in_f / groups;
  const int64_t nb = in_f / 32;
  out->assign(static_cast<size_t>(out_f * nb) * 18, 0);
  const uint8_t* pk = packed->data;
  const size_t packed_row = static_cast<size_t>(packed->shape[1]) * 4;
  for (int64_t o = 0; o < out_f; ++o) {
    const uint8_t* pr = pk + o * packed_row;  // byte k: element 2k (low nibble), 2k + 1 (high)
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = out->data() + (o * nb + b) * 18;
      const int64_t g = b * 32 / G;
      uint16_t sb;
      std::memcpy(&sb, scale->data + 2 * (o * groups + g), 2);
      if (!std::isfinite(Bf16ToF32(sb)))
        return DataLoss("tensor '" + x + ".weight_scale': non-finite scale at row " + std::to_string(o));
      blk[0] = static_cast<uint8_t>(sb & 0xff);
      blk[1] = static_cast<uint8_t>(sb >> 8);
      auto nib = [&](int64_t e) {  // element e of the row, as stored (q + 8)
        return (pr[e / 2] >> (4 * (e % 2))) & 0x0f;
      };
      for (int j = 0; j < 16; ++j)
        blk[2 + j] = static_cast<uint8_t>(nib(32 * b + j) | (nib(32 * b + j + 16) << 4));
    }
  }
  Tensor t;
  t.name = x + ".weight";
  t.dtype = DType::kW4G32;
  t.shape = {out_f, in_f};
  t.file = packed->file;
  ReleasePages(packed->data, packed->nbytes);
  return t;
}

}  // namespace

StatusOr<std::unique_ptr<TensorStore>> WrapCompressedTensors(std::unique_ptr<TensorStore> store,
                                                             const std::string& qconfig_json, const std::string& where) {
  const json q = json::parse(qconfig_json, nullptr, false);
  if (q.is_discarded()) return InvalidArgument(where + ": quantization_config is not valid JSON");
  G4_RETURN_IF_ERROR(CheckQuantizationConfig(q, where));
  auto overlay = std::make_unique<OverlayStore>(std::move(store));
  const TensorStore& base = overlay->base();
  int n = 0;
  for (const std::string& name : base.Names()) {
    for (const char* suffix : {".weight_zero_point", ".weight_g_idx"})
      if (EndsWith(name, suffix) && !base.Find(name.substr(0, name.size() - std::strlen(suffix)) + ".weight_packed"))
        return Unimplemented(where + ": tensor '" + name + "' is not supported (asymmetric or act-order int4)");
    if (!EndsWith(name, ".weight_packed")) continue;
    const std::string x = name.substr(0, name.size() - std::strlen(".weight_packed"));
    if (base.Find(x + ".weight"))
      return DataLoss(where + ": both '" + x + ".weight' and '" + name + "' are present");
    std::vector<uint8_t> bytes;
    G4_ASSIGN_OR_RETURN(Tensor t, RepackOne(base, x, &bytes));
    for (const char* suffix : {".weight_packed", ".weight_scale", ".weight_shape"}) overlay->Hide(x + suffix);
    overlay->Put(std::move(t), std::move(bytes));
    ++n;
  }
  if (n == 0) return DataLoss(where + ": quantization_config is compressed-tensors but no tensor has a weight_packed");
  return StatusOr<std::unique_ptr<TensorStore>>(std::move(overlay));
}

StatusOr<std::unique_ptr<TensorStore>> QuantizeWeights(std::unique_ptr<TensorStore> store, const ModelConfig& config,
                                                       DType target, int ple_bits, ModelWeights* weights,
                                                       QuantizeStats* stats) {
  if (target != DType::kQ8_0 && target != DType::kQ4_0 && target != DType::kW4G32)
    return InvalidArgument("--quantize: unsupported target " + std::string(DTypeName(target)));
  if (ple_bits != 8 && ple_bits != 16) return InvalidArgument("--ple-bits must be 8 or 16");
  std::map<const Tensor*, DType> plan;  // std::map: one entry for a tied head
  const ModelWeights& w = *weights;
  auto want = [&](const Tensor* t, DType d) {
    if (t && !t->shape.empty() && t->shape.back() % 32 == 0) plan[t] = d;
  };
  if (ple_bits == 8) {
    want(w.embed, DType::kQ8_0);
    want(w.ple_embed, DType::kQ8_0);
  }
  if (w.lm_head != w.embed) want(w.lm_head, target);
  // w4a16 follows Google's W4A16 checkpoints: only attention and MLP projections are int4; the PLE
  // projections go with the PLE table (Q8_0 at ple_bits 8, as stored at 16).
  const bool ple_with_table = target == DType::kW4G32;
  const DType ple_proj_type = ple_with_table ? DType::kQ8_0 : target;
  auto want_ple = [&](const Tensor* t) {
    if (!ple_with_table || ple_bits == 8) want(t, ple_proj_type);
  };
  want_ple(w.ple_model_proj);
  for (const LayerWeights& l : w.layers) {
    for (const Tensor* t : {l.q_proj, l.k_proj, l.v_proj, l.o_proj, l.gate_proj, l.up_proj, l.down_proj,
                            l.experts_gate_up, l.experts_down})
      want(t, target);
    want_ple(l.ple_gate);
    want_ple(l.ple_proj);
  }
  auto overlay = std::make_unique<OverlayStore>(std::move(store));
  // The names the store presents (a GGUF store presents HF names for tensors named otherwise).
  std::map<const Tensor*, std::string> store_name;
  for (const std::string& n : overlay->base().Names()) store_name[overlay->base().Find(n)] = n;
  for (const auto& [t, d] : plan) {
    if (t->dtype != DType::kF32 && t->dtype != DType::kF16 && t->dtype != DType::kBF16)
      return InvalidArgument("--quantize needs an F32, F16 or BF16 checkpoint; tensor '" + t->name + "' in " + t->file +
                             " is " + std::string(DTypeName(t->dtype)));
    const int64_t K = t->shape.back(), rows = t->numel() / K;
    std::vector<uint8_t> bytes(DTypeRowBytes(d, K) * static_cast<size_t>(rows));
    const size_t in_row = static_cast<size_t>(K) * DTypeSize(t->dtype), out_row = DTypeRowBytes(d, K);
    // In slices of rows (~32 MiB of source), split over the cores; each slice's source pages are
    // released as soon as it is converted. Rows are independent, so the bytes do not depend on the
    // number of threads.
    const int64_t slice = std::max<int64_t>(1, (int64_t{32} << 20) / static_cast<int64_t>(in_row));
    const int nthreads = static_cast<int>(std::max(1u, std::min(16u, std::thread::hardware_concurrency())));
    auto convert = [&](int64_t a, int64_t b) {
      std::vector<float> row(K);
      for (int64_t r = a; r < b; ++r) {
        ConvertToF32(t->dtype, t->data + r * in_row, row.data(), K);
        QuantizeRow(d, row.data(), bytes.data() + r * out_row, K);
      }
    };
    for (int64_t r0 = 0; r0 < rows; r0 += slice) {
      const int64_t r1 = std::min(rows, r0 + slice);
      const int n = static_cast<int>(std::min<int64_t>(nthreads, (r1 - r0 + 63) / 64));
      if (n <= 1) {
        convert(r0, r1);
      } else {
        std::vector<std::thread> pool;
        const int64_t per = (r1 - r0 + n - 1) / n;
        for (int i = 1; i < n; ++i)
          pool.emplace_back(convert, std::min(r1, r0 + i * per), std::min(r1, r0 + (i + 1) * per));
        convert(r0, std::min(r1, r0 + per));
        for (std::thread& th : pool) th.join();
      }
      ReleasePages(t->data + r0 * in_row, (r1 - r0) * in_row);
    }
    if (stats) {
      ++stats->tensors;
      stats->bytes_in += t->nbytes;
      stats->bytes_out += bytes.size();
    }
    Tensor q;
    q.name = store_name.count(t) ? store_name[t] : t->name;
    q.dtype = d;
    q.shape = t->shape;
    q.file = t->file;
    overlay->Put(std::move(q), std::move(bytes));
  }
  StatusOr<ModelWeights> rebound = BindWeights(config, *overlay);
  if (!rebound.ok()) return rebound.status();
  *weights = std::move(rebound).value();
  return StatusOr<std::unique_ptr<TensorStore>>(std::move(overlay));
}

}  // namespace g4
