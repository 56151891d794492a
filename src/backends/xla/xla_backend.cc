#include "backends/xla/xla_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>

#include "backends/device_kv_cache.h"
#include "backends/xla/compile_options.h"
#include "backends/xla/device_policy.h"
#include "backends/xla/lower.h"
#include "backends/xla/shard_plan.h"
#include "backends/xla/sharded_buffers.h"
#include "base/check.h"

namespace g4 {
namespace {

using xla::Buffer;
using xla::CacheLayer;
using xla::LoadedExecutable;
using xla::LoweredStep;
using xla::StepMode;

PJRT_Buffer_Type PjrtType(DType t) {
  switch (t) {
    case DType::kF16: return PJRT_Buffer_Type_F16;
    case DType::kBF16: return PJRT_Buffer_Type_BF16;
    case DType::kI32: return PJRT_Buffer_Type_S32;
    case DType::kI8: return PJRT_Buffer_Type_S8;
    case DType::kF8E4M3: return PJRT_Buffer_Type_F8E4M3FN;
    default: return PJRT_Buffer_Type_F32;
  }
}

int Bucket(int n) {
  int b = 1;
  while (b < n) b *= 2;
  return b;
}

class XlaBackend;

class XlaKvCache : public DeviceKvCache<XlaBackend> {
 public:
  using DeviceKvCache::DeviceKvCache;

  std::vector<CacheLayer> layers;  // every cache-owning layer, in layer order
  std::vector<std::vector<Buffer>> k, v;    // [layer][device]: shards of [max_seqs, slots, width]
  std::vector<std::vector<Buffer>> ks, vs;  // i8 and fp8 only: their scales, f32 [max_seqs, slots, heads], [layer][device]
  size_t device_bytes = 0;  // what one device of the mesh holds
  // Device d's buffers of layer i in the step's parameter order (xla::KvBuffersPerLayer).
  std::vector<Buffer*> Buffers(size_t i, int d) {
    if (ks.empty()) return {&k[i][d], &v[i][d]};
    return {&k[i][d], &v[i][d], &ks[i][d], &vs[i][d]};
  }
};

class XlaBackend : public Backend {
 public:
  XlaBackend(std::unique_ptr<xla::Client> client, XlaDeviceInfo info, int64_t memory_limit, std::string limit_source)
      : client_(std::move(client)), info_(std::move(info)), mesh_(info_.mesh) {
    plan_.limit = memory_limit;
    plan_.limit_source = std::move(limit_source);
    if (mesh_.size() > 1) plan_.where = "each device of the mesh " + mesh_.ToString();
  }
  std::string Name() const override { return "xla-" + info_.platform; }
  void set_fp8_cache_for_tests(bool on) { fp8_cache_for_tests_ = on; }
  bool CompilesPerShape() const override { return true; }
  int SlotGroups() const override { return mesh_.data; }
  Status PlanMemory(const Graph& graph, const KvCacheBase& cache) const override;
  StatusOr<std::unique_ptr<Executable>> Compile(const Graph& graph, int num_tokens, int num_output_rows) override;
  Status CheckKvCacheType(DType type) const override;
  StatusOr<std::unique_ptr<KvCacheBase>> CreateKvCache(const ModelConfig& config, int max_seqs, int max_context,
                                                       DType type) override;

  const XlaDeviceInfo& info() const { return info_; }
  const xla::MemoryPlan& plan() const { return plan_; }
  int program_count() const { return static_cast<int>(programs_.size()); }
  xla::Client& client() { return *client_; }
  int device() const { return info_.device; }
  // The device to name in Execute: programs of a device other than the first are portable.
  PJRT_Device* execute_device() const {
    return mesh_.size() > 1 || info_.device == 0 ? nullptr : client_->device(info_.device);
  }
  // The client device of the mesh's first device: --device on one device, else 0.
  int first_device() const { return mesh_.size() > 1 ? 0 : info_.device; }
  // Bytes one device holds of weight `t` laid out as `split`, in its device type.
  int64_t WeightBytesPerDevice(const Tensor& t, xla::TensorSplit split) const;
  // Adds a compiled step's working memory (`bytes`, for `step`) to the plan; the plan's error
  // when it no longer fits.
  Status AdmitStep(int64_t bytes, const std::string& step, const KvCacheBase& cache);
  // The compiled program of a module (compiled on first request).
  StatusOr<LoadedExecutable*> Program(const std::string& module);
  // The device buffers of a weight (one shard per mesh device, laid out as `split`), uploaded on
  // first request as `type` (its own dtype or F32).
  StatusOr<std::vector<PJRT_Buffer*>> Weight(const Tensor* t, DType type, xla::TensorSplit split);
  const xla::Mesh& mesh() const { return mesh_; }
  int64_t memory_limit() const { return plan_.limit; }
  // The shard plan of `graph` for caches of `max_seqs` sequences (PlanShards).
  StatusOr<std::shared_ptr<const xla::ShardPlan>> Plan(const Graph& graph, int max_seqs) const;

 private:
  std::unique_ptr<xla::Client> client_;
  XlaDeviceInfo info_;
  std::map<std::string, std::unique_ptr<LoadedExecutable>> programs_;
  std::map<const Tensor*, std::vector<Buffer>> weights_;  // one buffer per mesh device
  xla::Mesh mesh_;
  bool fp8_cache_for_tests_ = false;  // XlaBackendOptions::fp8_cache_for_tests
  mutable xla::MemoryPlan plan_;  // per device; limit 0: unknown (no plan check)
};

std::string KvShape(const KvCacheBase& cache) {
  return "(" + std::to_string(cache.max_seqs()) + " sequences x " + std::to_string(cache.max_context()) + " tokens)";
}

class XlaExecutable : public Executable {
 public:
  XlaExecutable(XlaBackend* backend, const Graph& graph, int T, int R)
      : backend_(backend), graph_(graph), T_(T), R_(R), Tb_(Bucket(T)), Rb_(R == T ? Bucket(T) : Bucket(std::max(R, 1))) {}
  Status Run(const StepInput& in, KvCacheBase& cache) override;
  OutputView Output(const std::string& name) const override;

 private:
  struct Variant {
    LoweredStep lowered;
    LoadedExecutable* program = nullptr;
    std::shared_ptr<const xla::ShardPlan> plan;
  };
  // group_rows > 0: a batched decode step split over the data axis in groups of that many rows
  // (StepShape::data_groups).
  StatusOr<Variant*> GetVariant(StepMode mode, const XlaKvCache& cache, int group_rows);

  XlaBackend* backend_;
  const Graph& graph_;
  const int T_, R_, Tb_, Rb_;
  std::map<std::pair<StepMode, int>, Variant> variants_;  // by (mode, group rows)
  std::map<std::string, std::vector<float>> outputs_;  // [rows_b, cols] of the last Run
};

StatusOr<LoadedExecutable*> XlaBackend::Program(const std::string& module) {
  auto it = programs_.find(module);
  if (it != programs_.end()) return it->second.get();
  xla::CompileOptions co;
  co.portable = mesh_.size() == 1 && info_.device != 0;
  if (mesh_.size() > 1) {
    co.num_partitions = mesh_.size();
    co.use_spmd_partitioning = true;
  }
  G4_ASSIGN_OR_RETURN(auto exe, client_->Compile(module, xla::SerializeCompileOptions(co)));
  if (mesh_.size() > 1) {  // argument list i goes to client device i (XLA's default assignment)
    G4_ASSIGN_OR_RETURN(auto devices, exe->AddressableDevices());
    for (size_t i = 0; i < devices.size(); ++i)
      if (client_->DeviceIndex(devices[i]) != static_cast<int>(i) || devices.size() != static_cast<size_t>(mesh_.size()))
        return Internal("the SPMD program was assigned to devices other than the mesh's first " +
                        std::to_string(mesh_.size()));
  }
  LoadedExecutable* raw = exe.get();
  programs_.emplace(module, std::move(exe));
  return raw;
}

StatusOr<std::shared_ptr<const xla::ShardPlan>> XlaBackend::Plan(const Graph& graph, int max_seqs) const {
  G4_ASSIGN_OR_RETURN(xla::ShardPlan plan, xla::PlanShards(graph, mesh_, max_seqs));
  return std::make_shared<const xla::ShardPlan>(std::move(plan));
}

StatusOr<std::vector<PJRT_Buffer*>> XlaBackend::Weight(const Tensor* t, DType type, xla::TensorSplit split) {
  auto raw_of = [](const std::vector<Buffer>& shards) {
    std::vector<PJRT_Buffer*> raw;
    for (const Buffer& b : shards) raw.push_back(b.get());
    return raw;
  };
  auto it = weights_.find(t);
  if (it != weights_.end()) return raw_of(it->second);
  if (t->dtype == DType::kQ4_0x4)
    return Unimplemented("weight '" + t->name + "' is packed for the CPU's kernels (Q4_0x4): load it unpacked for XLA");
  StatusOr<std::vector<Buffer>> b = InvalidArgument("");
  if (xla::IsDeviceQuantised(type)) {  // the blocks' bytes, as stored
    b = xla::UploadShards(*client_, mesh_, t->data, PJRT_Buffer_Type_U8, 1, xla::DeviceShape(*t), split,
                          first_device());
  } else if (type == t->dtype) {
    b = xla::UploadShards(*client_, mesh_, t->data, PjrtType(type), DTypeSize(type), t->shape, split,
                          first_device());
  } else {  // converted at load: to F32, or (a bf16/f16 compute dtype) to BF16/F16, rounded to nearest even
    G4_CHECK((type == DType::kF32 || type == DType::kF16 || type == DType::kBF16) && !t->shape.empty());
    const int64_t K = t->shape.back(), rows = t->numel() / K;
    std::vector<float> f(static_cast<size_t>(t->numel()));
    const size_t row_bytes = DTypeRowBytes(t->dtype, K);
    for (int64_t r = 0; r < rows; ++r) ConvertToF32(t->dtype, t->data + r * row_bytes, f.data() + r * K, K);
    if (type == DType::kF32) {
      b = xla::UploadShards(*client_, mesh_, f.data(), PJRT_Buffer_Type_F32, 4, t->shape, split, first_device());
    } else {
      std::vector<uint16_t> h(f.size());
      for (size_t i = 0; i < f.size(); ++i) h[i] = type == DType::kBF16 ? F32ToBf16(f[i]) : F32ToF16(f[i]);
      b = xla::UploadShards(*client_, mesh_, h.data(), PjrtType(type), 2, t->shape, split, first_device());
    }
  }
  if (!b.ok()) return Status(b.status().code(), "uploading weight '" + t->name + "': " + b.status().message());
  std::vector<PJRT_Buffer*> raw = raw_of(*b);
  weights_.emplace(t, std::move(*b));
  return raw;
}

Status XlaBackend::PlanMemory(const Graph& graph, const KvCacheBase& cache) const {
  G4_ASSIGN_OR_RETURN(auto shards, Plan(graph, cache.max_seqs()));
  int64_t weights = 0;
  for (const Tensor* t : xla::GraphWeights(graph)) weights += WeightBytesPerDevice(*t, shards->Weight(t));
  const auto* xc = dynamic_cast<const XlaKvCache*>(&cache);
  plan_.weights = weights;
  plan_.kv = static_cast<int64_t>(xc ? xc->device_bytes : cache.bytes());
  return xla::CheckMemoryPlan(plan_, KvShape(cache));
}

int64_t XlaBackend::WeightBytesPerDevice(const Tensor& t, xla::TensorSplit split) const {
  const size_t whole = xla::DeviceBytes(t);
  const size_t bytes = xla::WeightDeviceBytes(t, xla::WeightDeviceType(t, info_.compute));
  return whole == 0 ? 0 : static_cast<int64_t>(bytes / whole * xla::ShardBytes(t, mesh_, split) +
                                               bytes % whole * xla::ShardBytes(t, mesh_, split) / whole);
}

Status XlaBackend::AdmitStep(int64_t bytes, const std::string& step, const KvCacheBase& cache) {
  if (bytes <= plan_.step) return OkStatus();
  xla::MemoryPlan next = plan_;
  next.step = bytes;
  next.step_name = step;
  G4_RETURN_IF_ERROR(xla::CheckMemoryPlan(next, KvShape(cache)));
  plan_ = next;
  return OkStatus();
}

StatusOr<std::unique_ptr<Executable>> XlaBackend::Compile(const Graph& graph, int num_tokens, int num_output_rows) {
  if (num_tokens < 1 || num_output_rows < 0) return InvalidArgument("a step needs at least one token");
  return std::unique_ptr<Executable>(new XlaExecutable(this, graph, num_tokens, num_output_rows));
}

Status XlaBackend::CheckKvCacheType(DType type) const {
  if (!IsAnyKvCacheType(type)) return InvalidArgument("KV cache type must be f32, f16, bf16, q8 or fp8");
  if (type == DType::kF8E4M3 && !fp8_cache_for_tests_)
    G4_RETURN_IF_ERROR(xla::CheckFp8KvCache(info_.platform, info_.compute_capability));
  if (type == DType::kF8E4M3 && mesh_.size() > 1)
    return InvalidArgument("--cache-type fp8 on a device mesh is not supported yet: use q8, f16 or bf16");
  if (type == DType::kBF16 && info_.compute == DType::kF16)
    return InvalidArgument("--cache-type bf16: this device computes in f16 (" + info_.compute_reason +
                           "); no bf16 buffer goes to it: use --cache-type f16 or f32");
  return OkStatus();
}

StatusOr<std::unique_ptr<KvCacheBase>> XlaBackend::CreateKvCache(const ModelConfig& config, int max_seqs, int max_context,
                                                                 DType type) {
  G4_RETURN_IF_ERROR(CheckKvCacheType(type));
  G4_RETURN_IF_ERROR(xla::CheckDataAxis(mesh_, max_seqs));
  auto cache = std::make_unique<XlaKvCache>(this, max_seqs, max_context, type);
  for (int l = 0; l < config.num_layers; ++l) {
    const LayerPlan& lp = config.layers[l];
    if (lp.kv_donor >= 0) continue;
    CacheLayer c{l, lp.window ? std::min(lp.window, max_context) : max_context, lp.window, lp.num_kv_heads * lp.head_dim,
                 lp.num_kv_heads};
    const xla::TensorSplit split = xla::CacheSplit(mesh_, lp.num_kv_heads);
    // K and V; an i8 or fp8 cache's scales (f32, one per slot and KV head) after them.
    struct Part {
      std::vector<std::vector<Buffer>>* list;
      DType type;
      int64_t width;
    };
    std::vector<Part> parts{{&cache->k, type, c.width}, {&cache->v, type, c.width}};
    if (IsScaledKvCacheType(type)) parts.insert(parts.end(), {{&cache->ks, DType::kF32, c.heads}, {&cache->vs, DType::kF32, c.heads}});
    for (const Part& part : parts) {
      const std::vector<int64_t> dims{max_seqs, c.slots, part.width};
      const size_t bytes = static_cast<size_t>(max_seqs) * c.slots * part.width * DTypeSize(part.type);
      auto b = xla::ZeroShards(*client_, mesh_, PjrtType(part.type), DTypeSize(part.type), dims, split, first_device());
      if (!b.ok())
        return Status(b.status().code(), "allocating the KV cache of layer " + std::to_string(l) + " (" +
                                             std::to_string(bytes) + " bytes) on the device: " + b.status().message());
      part.list->push_back(std::move(*b));
      cache->bytes_ += bytes;
      cache->device_bytes += bytes / (split.data_dim >= 0 ? mesh_.data : 1) / (split.model_dim >= 0 ? mesh_.model : 1);
    }
    cache->layers.push_back(c);
  }
  return std::unique_ptr<KvCacheBase>(std::move(cache));
}

StatusOr<XlaExecutable::Variant*> XlaExecutable::GetVariant(StepMode mode, const XlaKvCache& cache, int group_rows) {
  auto it = variants_.find({mode, group_rows});
  if (it != variants_.end()) return &it->second;
  xla::StepShape sh;
  sh.tokens = Tb_;
  sh.output_rows = Rb_;
  if (group_rows > 0) {
    sh.data_groups = backend_->mesh().data;
    sh.tokens = sh.output_rows = sh.data_groups * group_rows;
  }
  sh.max_seqs = cache.max_seqs();
  sh.mode = mode;
  sh.kv_type = cache.type();
  sh.caches = cache.layers;
  sh.quantised_as_f32 = true;
  G4_ASSIGN_OR_RETURN(auto plan, backend_->Plan(graph_, cache.max_seqs()));
  sh.shards = plan.get();
  sh.compute = backend_->info().compute;
  Variant v;
  G4_ASSIGN_OR_RETURN(v.lowered, xla::LowerGraph(graph_, sh));
  G4_ASSIGN_OR_RETURN(v.program, backend_->Program(v.lowered.module));
  // The memory plan with this step's working memory, before its weights go to the device or it runs.
  if (auto stats = v.program->MemoryStats(); stats.ok()) {
    int64_t resident = static_cast<int64_t>(cache.device_bytes);  // what one device holds
    for (const Tensor* w : v.lowered.weights) resident += backend_->WeightBytesPerDevice(*w, plan->Weight(w));
    const std::string step = mode == StepMode::kOneSequence
                                 ? "prefill step of " + std::to_string(Tb_) + " tokens"
                                 : "decode step of " + std::to_string(sh.tokens) + " sequences";
    G4_RETURN_IF_ERROR(backend_->AdmitStep(xla::StepWorkingBytes(*stats, resident), step, cache));
  }
  for (size_t i = 0; i < v.lowered.weights.size(); ++i)
    G4_RETURN_IF_ERROR(
        backend_->Weight(v.lowered.weights[i], v.lowered.weight_types[i], plan->Weight(v.lowered.weights[i])).status());
  v.plan = plan;
  return &variants_.emplace(std::make_pair(mode, group_rows), std::move(v)).first->second;
}

Status XlaExecutable::Run(const StepInput& in, KvCacheBase& base) {
  auto* cache = dynamic_cast<XlaKvCache*>(&base);
  G4_CHECK(cache != nullptr && cache->owner == backend_);  // a cache of this backend (CreateKvCache)
  G4_CHECK(static_cast<int>(in.tokens.size()) == T_ && in.positions.size() == in.tokens.size() &&
           in.seq_ids.size() == in.tokens.size() && static_cast<int>(in.output_rows.size()) == R_);
  // One sequence (a prefill chunk) or one token per sequence (batched decode).
  bool one = true;
  for (int t = 1; t < T_; ++t) one &= in.seq_ids[t] == in.seq_ids[0];
  if (!one) G4_CHECK(std::set<int32_t>(in.seq_ids.begin(), in.seq_ids.end()).size() == in.seq_ids.size());
  const int S = cache->max_seqs();
  for (int t = 0; t < T_; ++t) G4_CHECK(in.seq_ids[t] >= 0 && in.seq_ids[t] < S);
  const xla::Mesh& mesh = backend_->mesh();
  // Batched decode on a data axis: each row goes to the group of its sequence's cache shard,
  // groups padded to one bucket, at[t] its place (StepShape::data_groups).
  const bool grouped = !one && mesh.data > 1;
  std::vector<int> at(T_);
  int group_rows = 0;
  if (grouped) {
    std::vector<int> count(mesh.data, 0);
    for (int t = 0; t < T_; ++t) ++count[in.seq_ids[t] / (S / mesh.data)];
    group_rows = Bucket(*std::max_element(count.begin(), count.end()));
    std::fill(count.begin(), count.end(), 0);
    for (int t = 0; t < T_; ++t) {
      const int d = in.seq_ids[t] / (S / mesh.data);
      at[t] = d * group_rows + count[d]++;
    }
  } else {
    for (int t = 0; t < T_; ++t) at[t] = t;
  }
  G4_ASSIGN_OR_RETURN(Variant * v, GetVariant(one ? StepMode::kOneSequence : StepMode::kOneTokenPerSequence, *cache,
                                              group_rows));
  const int rows_b = grouped ? mesh.data * group_rows : Tb_, out_b = grouped ? rows_b : Rb_;
  std::vector<int32_t> tokens(rows_b, 0), positions(rows_b, 0), seqs(rows_b, -1), rows(out_b, 0), kv_len(S), kv_end(S);
  for (int t = 0; t < T_; ++t) {
    tokens[at[t]] = in.tokens[t];
    positions[at[t]] = in.positions[t];
    seqs[at[t]] = in.seq_ids[t];
  }
  if (!grouped) std::copy(in.output_rows.begin(), in.output_rows.end(), rows.begin());
  for (int s = 0; s < S; ++s) kv_len[s] = kv_end[s] = cache->length(s);
  for (int t = 0; t < T_; ++t) ++kv_end[in.seq_ids[t]];
  xla::Client& client = backend_->client();
  const int devices = mesh.size();
  // The step inputs: replicated, or grouped: split over the data axis (each device its group's rows).
  const xla::TensorSplit input_split{grouped ? 0 : -1, -1};
  std::vector<Buffer> inputs;
  std::vector<std::vector<PJRT_Buffer*>> args(devices);
  for (const std::vector<int32_t>* data : {&tokens, &positions, &seqs, &rows, &kv_len, &kv_end}) {
    G4_ASSIGN_OR_RETURN(std::vector<Buffer> shards,
                        xla::UploadShards(client, mesh, data->data(), PJRT_Buffer_Type_S32, sizeof(int32_t),
                                          {static_cast<int64_t>(data->size())}, input_split, backend_->first_device()));
    for (int d = 0; d < devices; ++d) {
      args[d].push_back(shards[d].get());
      inputs.push_back(std::move(shards[d]));
    }
  }
  for (size_t i = 0; i < v->lowered.weights.size(); ++i) {
    const Tensor* t = v->lowered.weights[i];
    G4_ASSIGN_OR_RETURN(auto w, backend_->Weight(t, v->lowered.weight_types[i], v->plan->Weight(t)));
    for (int d = 0; d < devices; ++d) args[d].push_back(w[d]);
  }
  std::vector<int64_t> keep(args[0].size());
  for (size_t i = 0; i < keep.size(); ++i) keep[i] = static_cast<int64_t>(i);
  for (size_t i = 0; i < cache->layers.size(); ++i)  // donated
    for (int d = 0; d < devices; ++d)
      for (Buffer* b : cache->Buffers(i, d)) args[d].push_back(b->get());
  G4_ASSIGN_OR_RETURN(std::vector<std::vector<Buffer>> per_device,
                      v->program->ExecuteSharded(args, keep, backend_->execute_device()));
  const size_t num_out = v->lowered.outputs.size(), per = static_cast<size_t>(v->lowered.kv_buffers);
  for (const auto& outs : per_device) G4_CHECK(outs.size() == num_out + per * cache->layers.size());
  // The donated cache buffers are invalid now: their storage is the new caches'.
  for (size_t i = 0; i < cache->layers.size(); ++i) {
    for (int d = 0; d < devices; ++d) {
      std::vector<Buffer*> bufs = cache->Buffers(i, d);
      G4_CHECK(bufs.size() == per);
      for (size_t j = 0; j < per; ++j) *bufs[j] = std::move(per_device[d][num_out + per * i + j]);
    }
  }
  // Exported outputs: replicated (device 0's), or grouped: device d * model holds group d's rows.
  const auto& nodes = graph_.nodes();
  std::vector<float> step_rows;
  for (size_t j = 0; j < num_out; ++j) {
    const Node& n = nodes[v->lowered.outputs[j].second];
    std::vector<float>& host = outputs_[v->lowered.outputs[j].first];
    host.resize(static_cast<size_t>(n.rows == Rows::kTokens ? Tb_ : Rb_) * n.cols);
    if (!grouped) {
      G4_RETURN_IF_ERROR(per_device[0][j].ToHost(host.data(), host.size() * sizeof(float)));
      continue;
    }
    const size_t group = static_cast<size_t>(group_rows) * n.cols;
    step_rows.resize(group * mesh.data);
    for (int d = 0; d < mesh.data; ++d)
      G4_RETURN_IF_ERROR(per_device[d * mesh.model][j].ToHost(step_rows.data() + d * group, group * sizeof(float)));
    const int out_rows = n.rows == Rows::kTokens ? T_ : R_;
    for (int r = 0; r < out_rows; ++r) {
      const int src = at[n.rows == Rows::kTokens ? r : in.output_rows[r]];
      std::copy_n(step_rows.begin() + static_cast<size_t>(src) * n.cols, n.cols, host.begin() + static_cast<size_t>(r) * n.cols);
    }
  }
  return OkStatus();
}

OutputView XlaExecutable::Output(const std::string& name) const {
  auto it = outputs_.find(name);
  if (it == outputs_.end()) return {};
  for (const Node& n : graph_.nodes()) {
    if (n.name != name) continue;
    return OutputView{const_cast<float*>(it->second.data()), n.rows == Rows::kTokens ? T_ : R_, n.cols};
  }
  return {};
}

}  // namespace

StatusOr<std::unique_ptr<Backend>> MakeXlaBackend(const XlaBackendOptions& options) {
  G4_ASSIGN_OR_RETURN(auto plugin, xla::Plugin::Load(options.plugin_path));
  G4_ASSIGN_OR_RETURN(auto client, xla::Client::Create(plugin, options.client_options));
  const xla::Mesh& mesh = options.mesh;
  bool count_given = false;
  for (const auto& o : options.client_options) count_given |= o.name == "cpu_device_count";
  if (mesh.size() > client->num_devices() && client->platform_name() == "cpu" && !count_given) {
    // XLA's CPU plugin exposes as many devices as asked for: one per mesh position. Its client
    // start-up grows faster than linearly in the count, so a mistyped size is refused, not awaited.
    if (mesh.size() > xla::kMaxCpuPluginDevices)
      return InvalidArgument("--mesh " + mesh.ToString() + " needs " + std::to_string(mesh.size()) +
                             " devices; XLA's CPU plugin is given at most " +
                             std::to_string(xla::kMaxCpuPluginDevices));
    std::vector<xla::NamedOption> with_count = options.client_options;
    with_count.push_back({"cpu_device_count", int64_t{mesh.size()}});
    client.reset();
    G4_ASSIGN_OR_RETURN(client, xla::Client::Create(plugin, with_count));
  }
  G4_RETURN_IF_ERROR(xla::CheckMeshFits(mesh, client->num_devices(), client->platform_name()));
  XlaDeviceInfo info;
  info.plugin_path = plugin->path();
  info.api_version = plugin->VersionString();
  info.platform = client->platform_name();
  info.platform_version = client->platform_version();
  info.num_devices = client->num_devices();
  if (options.device < 0 || options.device >= info.num_devices)
    return InvalidArgument("--device " + std::to_string(options.device) + ": the " + info.platform + " plugin has " +
                           std::to_string(info.num_devices) + " addressable device(s), 0 to " +
                           std::to_string(info.num_devices - 1));
  info.device = options.device;
  info.mesh = mesh;
  G4_ASSIGN_OR_RETURN(info.device_kind, client->DeviceKind(info.device));
  info.memory_bytes = client->DeviceMemoryLimit(info.device);
  if (auto attrs = client->DeviceAttributes(info.device); attrs.ok())  // a plugin without attributes: none
    for (const auto& [name, value] : *attrs)
      if (name == "compute_capability") info.compute_capability = value;
  G4_ASSIGN_OR_RETURN(xla::ComputePolicy policy,
                      xla::ChooseComputeDtype(info.platform, info.compute_capability, options.compute_dtype));
  info.compute = policy.dtype;
  info.compute_dtype = info.compute == DType::kF32 ? "f32" : info.compute == DType::kBF16 ? "bf16" : "f16";
  info.compute_reason = policy.reason;
  const bool given = options.device_memory_bytes > 0;
  const int64_t limit = given ? options.device_memory_bytes : info.memory_bytes;
  auto backend = std::make_unique<XlaBackend>(std::move(client), std::move(info), limit,
                                              given ? "the limit given, --device-memory" : "the device's");
  backend->set_fp8_cache_for_tests(options.fp8_cache_for_tests);
  return std::unique_ptr<Backend>(std::move(backend));
}

const XlaDeviceInfo* XlaInfo(const Backend& backend) {
  const auto* x = dynamic_cast<const XlaBackend*>(&backend);
  return x ? &x->info() : nullptr;
}

StatusOr<std::vector<std::string>> XlaMeshPlan(const Backend& backend, const Graph& graph, const ModelConfig& config,
                                               int max_seqs, int max_context, DType kv_type) {
  const auto* x = dynamic_cast<const XlaBackend*>(&backend);
  if (x == nullptr) return InvalidArgument("the mesh plan is the XLA backend's");
  G4_ASSIGN_OR_RETURN(auto plan, x->Plan(graph, max_seqs));
  const xla::Mesh& mesh = x->mesh();
  size_t split = 0, replicated = 0, whole = 0;
  int num_split = 0, num_replicated = 0;
  for (const Tensor* t : xla::GraphWeights(graph)) {
    const xla::TensorSplit s = plan->Weight(t);
    whole += xla::DeviceBytes(*t);
    if (s.model_dim >= 0 || s.data_dim >= 0) {
      split += xla::ShardBytes(*t, mesh, s);
      ++num_split;
    } else {
      replicated += xla::DeviceBytes(*t);
      ++num_replicated;
    }
  }
  size_t kv = 0, kv_device = 0;
  for (int l = 0; l < config.num_layers; ++l) {
    const LayerPlan& lp = config.layers[l];
    if (lp.kv_donor >= 0) continue;
    const int slots = lp.window ? std::min(lp.window, max_context) : max_context;
    const size_t bytes = 2 * static_cast<size_t>(max_seqs) * slots * lp.num_kv_heads * KvHeadRowBytes(kv_type, lp.head_dim);
    const xla::TensorSplit s = xla::CacheSplit(mesh, lp.num_kv_heads);
    kv += bytes;
    kv_device += bytes / (s.data_dim >= 0 ? mesh.data : 1) / (s.model_dim >= 0 ? mesh.model : 1);
  }
  const auto mib = [](size_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / 1048576.0);
    return std::string(buf);
  };
  const size_t total = split + replicated + kv_device;
  const int64_t limit = x->memory_limit();
  std::vector<std::string> lines;
  lines.push_back("mesh " + mesh.ToString() + ": " + std::to_string(mesh.size()) + " of " +
                  std::to_string(x->info().num_devices) + " " + x->info().platform + " device(s)");
  lines.push_back("weights per device: " + mib(split + replicated) + " = " + std::to_string(num_split) + " split tensors " +
                  mib(split) + " + " + std::to_string(num_replicated) + " replicated " + mib(replicated) +
                  " (whole model " + mib(whole) + ")");
  lines.push_back("KV cache per device: " + mib(kv_device) + " of " + mib(kv) + " (" + std::to_string(max_seqs) +
                  " sequences x " + std::to_string(max_context) + " tokens)");
  lines.push_back("total per device: " + mib(total) + " (" + std::to_string(total) + " bytes) of " +
                  (limit > 0 ? std::to_string(limit) + " bytes" : std::string("unreported")) +
                  " device memory, before the steps' working memory" +
                  (limit > 0 && total > static_cast<size_t>(limit) ? ": does NOT fit" : ""));
  for (const std::string& n : plan->notes) lines.push_back("replicated: " + n);
  return lines;
}

int XlaProgramCount(const Backend& backend) {
  const auto* x = dynamic_cast<const XlaBackend*>(&backend);
  return x ? x->program_count() : 0;
}

const xla::MemoryPlan* XlaPlan(const Backend& backend) {
  const auto* x = dynamic_cast<const XlaBackend*>(&backend);
  return x ? &x->plan() : nullptr;
}

}  // namespace g4
