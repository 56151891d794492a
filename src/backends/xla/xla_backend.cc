#include "backends/xla/xla_backend.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "backends/xla/compile_options.h"
#include "backends/xla/lower.h"
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
    default: return PJRT_Buffer_Type_F32;
  }
}

int Bucket(int n) {
  int b = 1;
  while (b < n) b *= 2;
  return b;
}

class XlaBackend;

class XlaKvCache : public KvCacheBase {
 public:
  XlaKvCache(const XlaBackend* owner, int max_seqs, int max_context, DType type)
      : KvCacheBase(max_seqs, max_context, type), owner(owner) {}
  size_t bytes() const override { return bytes_; }

  const XlaBackend* owner;
  std::vector<CacheLayer> layers;  // every cache-owning layer, in layer order
  std::vector<Buffer> k, v;        // [max_seqs, slots, width] each
  std::vector<Buffer> ks, vs;      // i8 only: their scales, f32 [max_seqs, slots, heads] each
  size_t bytes_ = 0;
  // The device buffers of layer i in the step's parameter order (xla::KvBuffersPerLayer).
  std::vector<Buffer*> Buffers(size_t i) {
    if (ks.empty()) return {&k[i], &v[i]};
    return {&k[i], &v[i], &ks[i], &vs[i]};
  }
};

class XlaBackend : public Backend {
 public:
  XlaBackend(std::unique_ptr<xla::Client> client, XlaDeviceInfo info, int64_t memory_limit)
      : client_(std::move(client)), info_(std::move(info)), memory_limit_(memory_limit) {}
  std::string Name() const override { return "xla-" + info_.platform; }
  bool CompilesPerShape() const override { return true; }
  Status PlanMemory(const Graph& graph, const KvCacheBase& cache) const override;
  StatusOr<std::unique_ptr<Executable>> Compile(const Graph& graph, int num_tokens, int num_output_rows) override;
  StatusOr<std::unique_ptr<KvCacheBase>> CreateKvCache(const ModelConfig& config, int max_seqs, int max_context,
                                                       DType type) override;

  const XlaDeviceInfo& info() const { return info_; }
  xla::Client& client() { return *client_; }
  // The compiled program of a module (compiled on first request).
  StatusOr<LoadedExecutable*> Program(const std::string& module);
  // The device buffer of a weight, uploaded on first request as `type` (its own dtype or F32).
  StatusOr<PJRT_Buffer*> Weight(const Tensor* t, DType type);

 private:
  std::unique_ptr<xla::Client> client_;
  XlaDeviceInfo info_;
  std::map<std::string, std::unique_ptr<LoadedExecutable>> programs_;
  std::map<const Tensor*, Buffer> weights_;
  int64_t memory_limit_;  // bytes; 0: unknown (no plan check)
};

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
  };
  StatusOr<Variant*> GetVariant(StepMode mode, const XlaKvCache& cache);

  XlaBackend* backend_;
  const Graph& graph_;
  const int T_, R_, Tb_, Rb_;
  std::map<StepMode, Variant> variants_;
  std::map<std::string, std::vector<float>> outputs_;  // [rows_b, cols] of the last Run
};

StatusOr<LoadedExecutable*> XlaBackend::Program(const std::string& module) {
  auto it = programs_.find(module);
  if (it != programs_.end()) return it->second.get();
  G4_ASSIGN_OR_RETURN(auto exe, client_->Compile(module, xla::SerializeCompileOptions()));
  LoadedExecutable* raw = exe.get();
  programs_.emplace(module, std::move(exe));
  return raw;
}

StatusOr<PJRT_Buffer*> XlaBackend::Weight(const Tensor* t, DType type) {
  auto it = weights_.find(t);
  if (it != weights_.end()) return it->second.get();
  if (t->dtype == DType::kQ4_0x4)
    return Unimplemented("weight '" + t->name + "' is packed for the CPU's kernels (Q4_0x4): load it unpacked for XLA");
  StatusOr<Buffer> b = InvalidArgument("");
  if (xla::IsDeviceQuantised(type)) {  // the blocks' bytes, as stored
    b = client_->Upload(t->data, PJRT_Buffer_Type_U8, xla::DeviceShape(*t));
  } else if (type == t->dtype) {
    b = client_->Upload(t->data, PjrtType(type), t->shape);
  } else {
    G4_CHECK(type == DType::kF32 && !t->shape.empty());
    const int64_t K = t->shape.back(), rows = t->numel() / K;
    std::vector<float> f(static_cast<size_t>(t->numel()));
    const size_t row_bytes = DTypeRowBytes(t->dtype, K);
    for (int64_t r = 0; r < rows; ++r) ConvertToF32(t->dtype, t->data + r * row_bytes, f.data() + r * K, K);
    b = client_->Upload(f.data(), PJRT_Buffer_Type_F32, t->shape);
  }
  if (!b.ok()) return Status(b.status().code(), "uploading weight '" + t->name + "': " + b.status().message());
  PJRT_Buffer* raw = b->get();
  weights_.emplace(t, std::move(*b));
  return raw;
}

Status XlaBackend::PlanMemory(const Graph& graph, const KvCacheBase& cache) const {
  if (memory_limit_ <= 0) return OkStatus();
  size_t weights = 0;
  for (const Tensor* t : xla::GraphWeights(graph)) weights += xla::DeviceBytes(*t);
  const size_t kv = cache.bytes(), need = weights + kv;
  if (need <= static_cast<size_t>(memory_limit_)) return OkStatus();
  return ResourceExhausted("the model does not fit on the device: weights " + std::to_string(weights) + " bytes + KV cache " +
                           std::to_string(kv) + " bytes (" + std::to_string(cache.max_seqs()) + " sequences x " +
                           std::to_string(cache.max_context()) + " tokens) = " + std::to_string(need) + " bytes > " +
                           std::to_string(memory_limit_) + " bytes of device memory, before the steps' working memory");
}

StatusOr<std::unique_ptr<Executable>> XlaBackend::Compile(const Graph& graph, int num_tokens, int num_output_rows) {
  if (num_tokens < 1 || num_output_rows < 0) return InvalidArgument("a step needs at least one token");
  return std::unique_ptr<Executable>(new XlaExecutable(this, graph, num_tokens, num_output_rows));
}

StatusOr<std::unique_ptr<KvCacheBase>> XlaBackend::CreateKvCache(const ModelConfig& config, int max_seqs, int max_context,
                                                                 DType type) {
  if (!IsHostKvCacheType(type)) return InvalidArgument("KV cache type must be f32, f16, bf16 or q8");
  auto cache = std::make_unique<XlaKvCache>(this, max_seqs, max_context, type);
  std::vector<uint8_t> zeros;
  for (int l = 0; l < config.num_layers; ++l) {
    const LayerPlan& lp = config.layers[l];
    if (lp.kv_donor >= 0) continue;
    CacheLayer c{l, lp.window ? std::min(lp.window, max_context) : max_context, lp.window, lp.num_kv_heads * lp.head_dim,
                 lp.num_kv_heads};
    // K and V; an i8 cache's scales (f32, one per slot and KV head) after them.
    const int64_t rows = static_cast<int64_t>(max_seqs) * c.slots;
    struct Part {
      std::vector<Buffer>* list;
      DType type;
      int64_t width;
    };
    std::vector<Part> parts{{&cache->k, type, c.width}, {&cache->v, type, c.width}};
    if (type == DType::kI8) parts.insert(parts.end(), {{&cache->ks, DType::kF32, c.heads}, {&cache->vs, DType::kF32, c.heads}});
    for (const Part& part : parts) {
      const std::vector<int64_t> dims{max_seqs, c.slots, part.width};
      const size_t bytes = static_cast<size_t>(rows * part.width) * DTypeSize(part.type);
      if (zeros.size() < bytes) zeros.assign(bytes, 0);
      auto b = client_->Upload(zeros.data(), PjrtType(part.type), dims);
      if (!b.ok())
        return Status(b.status().code(), "allocating the KV cache of layer " + std::to_string(l) + " (" +
                                             std::to_string(bytes) + " bytes) on the device: " + b.status().message());
      part.list->push_back(std::move(*b));
      cache->bytes_ += bytes;
    }
    cache->layers.push_back(c);
  }
  return std::unique_ptr<KvCacheBase>(std::move(cache));
}

StatusOr<XlaExecutable::Variant*> XlaExecutable::GetVariant(StepMode mode, const XlaKvCache& cache) {
  auto it = variants_.find(mode);
  if (it != variants_.end()) return &it->second;
  xla::StepShape sh;
  sh.tokens = Tb_;
  sh.output_rows = Rb_;
  sh.max_seqs = cache.max_seqs();
  sh.mode = mode;
  sh.kv_type = cache.type();
  sh.caches = cache.layers;
  sh.quantised_as_f32 = true;
  Variant v;
  G4_ASSIGN_OR_RETURN(v.lowered, xla::LowerGraph(graph_, sh));
  G4_ASSIGN_OR_RETURN(v.program, backend_->Program(v.lowered.module));
  for (size_t i = 0; i < v.lowered.weights.size(); ++i)
    G4_RETURN_IF_ERROR(backend_->Weight(v.lowered.weights[i], v.lowered.weight_types[i]).status());
  return &variants_.emplace(mode, std::move(v)).first->second;
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
  G4_ASSIGN_OR_RETURN(Variant * v, GetVariant(one ? StepMode::kOneSequence : StepMode::kOneTokenPerSequence, *cache));

  const int S = cache->max_seqs();
  std::vector<int32_t> tokens(Tb_, 0), positions(Tb_, 0), seqs(Tb_, -1), rows(Rb_, 0), kv_len(S), kv_end(S);
  std::copy(in.tokens.begin(), in.tokens.end(), tokens.begin());
  std::copy(in.positions.begin(), in.positions.end(), positions.begin());
  std::copy(in.seq_ids.begin(), in.seq_ids.end(), seqs.begin());
  std::copy(in.output_rows.begin(), in.output_rows.end(), rows.begin());
  for (int s = 0; s < S; ++s) kv_len[s] = kv_end[s] = cache->length(s);
  for (int t = 0; t < T_; ++t) {
    G4_CHECK(in.seq_ids[t] >= 0 && in.seq_ids[t] < S);
    ++kv_end[in.seq_ids[t]];
  }
  xla::Client& client = backend_->client();
  std::vector<Buffer> inputs;
  for (const std::vector<int32_t>* data : {&tokens, &positions, &seqs, &rows, &kv_len, &kv_end}) {
    const int64_t dims[1] = {static_cast<int64_t>(data->size())};
    G4_ASSIGN_OR_RETURN(Buffer b, client.Upload(data->data(), PJRT_Buffer_Type_S32, dims));
    inputs.push_back(std::move(b));
  }
  std::vector<PJRT_Buffer*> args;
  for (const Buffer& b : inputs) args.push_back(b.get());
  for (size_t i = 0; i < v->lowered.weights.size(); ++i) {
    G4_ASSIGN_OR_RETURN(PJRT_Buffer * w, backend_->Weight(v->lowered.weights[i], v->lowered.weight_types[i]));
    args.push_back(w);
  }
  std::vector<int64_t> keep(args.size());
  for (size_t i = 0; i < keep.size(); ++i) keep[i] = static_cast<int64_t>(i);
  for (size_t i = 0; i < cache->layers.size(); ++i)  // donated
    for (Buffer* b : cache->Buffers(i)) args.push_back(b->get());
  G4_ASSIGN_OR_RETURN(std::vector<Buffer> outs, v->program->Execute(args, keep));
  const size_t num_out = v->lowered.outputs.size(), per = static_cast<size_t>(v->lowered.kv_buffers);
  G4_CHECK(outs.size() == num_out + per * cache->layers.size());
  // The donated cache buffers are invalid now: their storage is the new caches'.
  for (size_t i = 0; i < cache->layers.size(); ++i) {
    std::vector<Buffer*> bufs = cache->Buffers(i);
    G4_CHECK(bufs.size() == per);
    for (size_t j = 0; j < per; ++j) *bufs[j] = std::move(outs[num_out + per * i + j]);
  }
  const auto& nodes = graph_.nodes();
  for (size_t j = 0; j < num_out; ++j) {
    const Node& n = nodes[v->lowered.outputs[j].second];
    std::vector<float>& host = outputs_[v->lowered.outputs[j].first];
    host.resize(static_cast<size_t>(n.rows == Rows::kTokens ? Tb_ : Rb_) * n.cols);
    G4_RETURN_IF_ERROR(outs[j].ToHost(host.data(), host.size() * sizeof(float)));
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
  XlaDeviceInfo info;
  info.plugin_path = plugin->path();
  info.api_version = plugin->VersionString();
  info.platform = client->platform_name();
  info.platform_version = client->platform_version();
  G4_ASSIGN_OR_RETURN(info.device_kind, client->DeviceKind(0));
  info.memory_bytes = client->DeviceMemoryLimit(0);
  info.compute_dtype = "f32";
  const int64_t limit = options.device_memory_bytes > 0 ? options.device_memory_bytes : info.memory_bytes;
  return std::unique_ptr<Backend>(new XlaBackend(std::move(client), std::move(info), limit));
}

const XlaDeviceInfo* XlaInfo(const Backend& backend) {
  const auto* x = dynamic_cast<const XlaBackend*>(&backend);
  return x ? &x->info() : nullptr;
}

}  // namespace g4
