#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_module.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <map>
#include <set>
#include <variant>
#include <vector>

#include "backends/cuda/arena_plan.h"
#include "backends/cuda/blocks.h"
#include "backends/cuda/cuda_policy.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/step_graph.h"
#include "backends/device_kv_cache.h"
#include "base/check.h"
#include "base/overloaded.h"

namespace g4 {
namespace {

using cuda::ArenaPlan;
using cuda::kGemmTileRows;
using cuda::kMatVecMaxRows;
using cuda::PlanArena;
using cuda::RowsOf;

Status CudaStatus(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return OkStatus();
  if (e == cudaErrorMemoryAllocation) return ResourceExhausted(what + ": " + cudaGetErrorString(e));
  return Internal(what + ": " + cudaGetErrorString(e));
}
#define G4_CUDA(expr, what) G4_RETURN_IF_ERROR(CudaStatus((expr), (what)))

std::string GiB(size_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2fGiB", b / 1073741824.0);
  return s;
}

// Owned device memory.
struct DeviceMem {
  void* p = nullptr;
  size_t bytes = 0;
  DeviceMem() = default;
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  DeviceMem(DeviceMem&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; o.bytes = 0; }
  DeviceMem& operator=(DeviceMem&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  ~DeviceMem() { if (p) cudaFree(p); }
  Status Alloc(size_t n, const std::string& what) {
    G4_CUDA(cudaMalloc(&p, std::max<size_t>(n, 1)), "allocating " + what + " (" + std::to_string(n) + " bytes) on the device");
    bytes = n;
    return OkStatus();
  }
};

// The WeightFormat a tensor of `t` is uploaded as for matrices (MatMul, Embed, MoE), or -1.
int DeviceFormat(DType t, bool bf16_compute) {
  switch (t) {
    case DType::kF32: return bf16_compute ? cuda::kWBF16 : cuda::kWF16;
    case DType::kF16: return cuda::kWF16;
    case DType::kBF16: return bf16_compute ? cuda::kWBF16 : cuda::kWF16;
    case DType::kQ8_0: return cuda::kWQ8_0;
    case DType::kQ4_0: return cuda::kWQ4_0;
    case DType::kQ4_K: return cuda::kWQ4_K;
    case DType::kQ6_K: return cuda::kWQ6_K;
    case DType::kW4G32: return cuda::kWW4G32;
    default: return -1;
  }
}

size_t FormatRowBytes(int f, int64_t K) {
  return static_cast<size_t>(K / cuda::FormatBlockElems(f)) * cuda::FormatBlockBytes(f);
}

struct DeviceWeight {
  DeviceMem mem;
  int format = 0;
  size_t row_bytes = 0;  // of a row of the last dimension
  const uint8_t* data() const { return static_cast<const uint8_t*>(mem.p); }
};

class CudaBackend;

class CudaKvCache : public DeviceKvCache<CudaBackend> {
 public:
  using DeviceKvCache::DeviceKvCache;
  struct Layer {
    int slots = 0, window = 0, width = 0, heads = 0;  // slots 0: not an owner
    DeviceMem k, v;
    DeviceMem ks, vs;  // int8 and fp8 caches: the f32 scales [max_seqs, slots, heads]
  };
  std::vector<Layer> layers;  // by layer index
};

class CudaBackend : public Backend {
 public:
  CudaBackend(CudaDeviceInfo info, cudaStream_t stream, cublasHandle_t blas)
      : info_(std::move(info)), stream_(stream), blas_(blas) {}
  ~CudaBackend() override {
    weights_.clear();
    vectors_.clear();
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }
  std::string Name() const override { return "cuda"; }
  Status PlanMemory(const Graph& graph, const KvCacheBase& cache) const override;
  StatusOr<std::unique_ptr<Executable>> Compile(const Graph& graph, int num_tokens, int num_output_rows) override;
  // f32, f16, bf16 and q8 on every device; fp8 from compute capability 8.9 (cuda_policy.h).
  Status CheckKvCacheType(DType type) const override {
    return cuda::CheckKvCacheTypeFor(info_.cc_major, info_.cc_minor, type);
  }
  StatusOr<std::unique_ptr<KvCacheBase>> CreateKvCache(const ModelConfig& config, int max_seqs, int max_context,
                                                       DType type) override;

  const CudaDeviceInfo& info() const { return info_; }
  bool bf16() const { return info_.compute_dtype == "bf16"; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t blas() const { return blas_; }
  Status Select() const { return CudaStatus(cudaSetDevice(info_.device), "selecting CUDA device " + std::to_string(info_.device)); }
  // A matrix weight on the device (uploaded on first request). Errors: a type with no kernel.
  StatusOr<const DeviceWeight*> Matrix(const Tensor* t);
  // A vector weight as f32 on the device.
  StatusOr<const float*> Vector(const Tensor* t);
  // Bytes a weight takes on the device (as Matrix or Vector would upload it).
  size_t DeviceBytes(const Tensor* t, bool matrix) const;
  CudaWeightBytes weight_bytes() const { return bytes_; }
  // The step memory every executable of this backend shares (steps run one at a time; Executable
  // contract): grown at Compile to the largest plan, so memory follows the largest step shape, not
  // the number of shapes. Errors: ResourceExhausted with the plan's terms against free memory.
  Status ReserveArena(const ArenaPlan& plan, int tokens);
  void* arena() const { return arena_.p; }
  void CountMatMul(const Tensor* t) {
    if (matmul_.insert(t).second) bytes_.matmul += weights_.at(t).mem.bytes;
  }

 private:
  CudaWeightBytes bytes_;
  std::set<const Tensor*> matmul_;
  DeviceMem arena_;
  CudaDeviceInfo info_;
  cudaStream_t stream_;
  cublasHandle_t blas_;
  std::map<const Tensor*, DeviceWeight> weights_;
  std::map<const Tensor*, DeviceMem> vectors_;
};

size_t CudaBackend::DeviceBytes(const Tensor* t, bool matrix) const {
  if (!matrix) return static_cast<size_t>(t->numel()) * sizeof(float);
  const int f = DeviceFormat(t->dtype, bf16());
  if (f < 0 || t->shape.empty()) return t->nbytes;
  return static_cast<size_t>(t->numel() / t->shape.back()) * FormatRowBytes(f, t->shape.back());
}

StatusOr<const DeviceWeight*> CudaBackend::Matrix(const Tensor* t) {
  auto it = weights_.find(t);
  if (it != weights_.end()) return &it->second;
  const int f = DeviceFormat(t->dtype, bf16());
  if (f < 0 || t->shape.empty())
    return Unimplemented("weight '" + t->name + "' is " + std::string(DTypeName(t->dtype)) +
                         ": the CUDA backend has kernels for F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K and W4G32 weights");
  const int64_t K = t->shape.back(), rows = t->numel() / K;
  if (K % 32 != 0) return Unimplemented("weight '" + t->name + "': rows of " + std::to_string(K) + " elements (the CUDA kernels read 32 at a time)");
  DeviceWeight w;
  w.format = f;
  w.row_bytes = FormatRowBytes(f, K);
  const size_t bytes = static_cast<size_t>(rows) * w.row_bytes;
  G4_RETURN_IF_ERROR(w.mem.Alloc(bytes, "weight '" + t->name + "'"));
  std::vector<uint16_t> conv;
  const void* src = t->data;
  if (f == cuda::kWF16 && t->dtype != DType::kF16) {  // F32 or BF16 -> F16
    conv.resize(static_cast<size_t>(t->numel()));
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t r = 0; r < rows; ++r) {
      ConvertToF32(t->dtype, t->data + r * DTypeRowBytes(t->dtype, K), row.data(), K);
      for (int64_t j = 0; j < K; ++j) conv[r * K + j] = F32ToF16(row[j]);
    }
    src = conv.data();
  } else if (f == cuda::kWBF16 && t->dtype == DType::kF32) {
    conv.resize(static_cast<size_t>(t->numel()));
    const float* x = reinterpret_cast<const float*>(t->data);
    for (size_t j = 0; j < conv.size(); ++j) conv[j] = F32ToBf16(x[j]);
    src = conv.data();
  }
  G4_CUDA(cudaMemcpy(w.mem.p, src, bytes, cudaMemcpyHostToDevice), "uploading weight '" + t->name + "'");
  bytes_.on_device += bytes;
  return &weights_.emplace(t, std::move(w)).first->second;
}

StatusOr<const float*> CudaBackend::Vector(const Tensor* t) {
  auto it = vectors_.find(t);
  if (it != vectors_.end()) return static_cast<const float*>(it->second.p);
  std::vector<float> f(static_cast<size_t>(t->numel()));
  for (int64_t i = 0; i < t->numel(); ++i) f[i] = t->GetF32(i);
  DeviceMem m;
  G4_RETURN_IF_ERROR(m.Alloc(f.size() * sizeof(float), "weight '" + t->name + "'"));
  G4_CUDA(cudaMemcpy(m.p, f.data(), f.size() * sizeof(float), cudaMemcpyHostToDevice), "uploading weight '" + t->name + "'");
  bytes_.on_device += m.bytes;
  return static_cast<const float*>(vectors_.emplace(t, std::move(m)).first->second.p);
}

// The weights a graph reads: (tensor, read as a matrix).
std::vector<std::pair<const Tensor*, bool>> GraphWeights(const Graph& g) {
  std::vector<std::pair<const Tensor*, bool>> out;
  for (const Node& n : g.nodes()) {
    std::visit(Overloaded{
        [&](const EmbedOp& op) { out.push_back({op.table, true}); },
        [&](const MatMulOp& op) { out.push_back({op.w, true}); },
        [&](const RmsNormOp& op) { if (op.w) out.push_back({op.w, false}); },
        [&](const MoEOp& op) {
          out.push_back({op.router_proj, true});
          out.push_back({op.router_scale, false});
          out.push_back({op.per_expert_scale, false});
          out.push_back({op.gate_up, true});
          out.push_back({op.down, true});
        },
        [&](const auto&) {},
    }, n.op);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

StatusOr<std::unique_ptr<KvCacheBase>> CudaBackend::CreateKvCache(const ModelConfig& config, int max_seqs, int max_context,
                                                                  DType type) {
  G4_RETURN_IF_ERROR(CheckKvCacheType(type));
  G4_RETURN_IF_ERROR(Select());
  auto cache = std::make_unique<CudaKvCache>(this, max_seqs, max_context, type);
  cache->layers.resize(config.num_layers);
  for (int l = 0; l < config.num_layers; ++l) {
    const LayerPlan& lp = config.layers[l];
    if (lp.kv_donor >= 0) continue;
    CudaKvCache::Layer& c = cache->layers[l];
    c.window = lp.window;
    c.slots = lp.window ? std::min(lp.window, max_context) : max_context;
    c.width = lp.num_kv_heads * lp.head_dim;
    c.heads = lp.num_kv_heads;
    const size_t rows = static_cast<size_t>(max_seqs) * c.slots;
    const size_t bytes = rows * c.width * DTypeSize(type);
    const std::string what = "the KV cache of layer " + std::to_string(l);
    for (DeviceMem* m : {&c.k, &c.v}) {
      G4_RETURN_IF_ERROR(m->Alloc(bytes, what));
      G4_CUDA(cudaMemset(m->p, 0, bytes), what);
    }
    cache->bytes_ += 2 * bytes;
    if (IsScaledKvCacheType(type)) {  // scales: 4 bytes per (slot, KV head) beside each 8-bit head row
      const size_t sbytes = rows * c.heads * sizeof(float);
      for (DeviceMem* m : {&c.ks, &c.vs}) {
        G4_RETURN_IF_ERROR(m->Alloc(sbytes, what + "'s scales"));
        G4_CUDA(cudaMemset(m->p, 0, sbytes), what);
      }
      cache->bytes_ += 2 * sbytes;
    }
  }
  return std::unique_ptr<KvCacheBase>(std::move(cache));
}

class CudaExecutable;

Status CudaBackend::ReserveArena(const ArenaPlan& plan, int tokens) {
  if (plan.total() <= arena_.bytes) return OkStatus();
  size_t free = 0, total = 0;
  G4_CUDA(cudaMemGetInfo(&free, &total), "reading the device's free memory");
  if (plan.total() > free + arena_.bytes)
    return ResourceExhausted("a step of " + std::to_string(tokens) + " tokens needs " + std::to_string(plan.total()) +
                             " bytes of device memory (values " + std::to_string(plan.values) + " + matmul scratch " +
                             std::to_string(plan.half_x + plan.half_w) + " + MoE " + std::to_string(plan.moe) +
                             " + attention " + std::to_string(plan.attn) + " + tokens " + std::to_string(plan.ints) + ") > " + std::to_string(free) + " bytes free + " +
                             std::to_string(arena_.bytes) + " of the current step memory");
  arena_ = DeviceMem();
  return arena_.Alloc(plan.total(), "the step memory of a " + std::to_string(tokens) + "-token step");
}

// Every attention kernel instance a step of this op may launch (any KV cache type: the cache comes
// with Run) against the device's limits on threads, registers and shared memory per block.
Status CheckAttentionLaunch(const std::string& at, const AttentionOp& op, bool decode, const CudaDeviceInfo& dev) {
  const cuda::DeviceLimits limits{dev.max_threads_per_block, dev.shared_per_block, dev.regs_per_block};
  const size_t shared = cuda::AttentionSharedBytes(op.head_dim);
  for (int kv : {cuda::kKvF32, cuda::kKvF16, cuda::kKvBF16, cuda::kKvI8, cuda::kKvF8}) {
    cudaFuncAttributes attr{};
    const int threads = decode ? cuda::DecodeAttentionThreads(op.num_heads, op.num_kv_heads)
                               : 32 * (op.num_heads / op.num_kv_heads);
    G4_CUDA(decode ? cuda::DecodeAttentionAttributes(op.head_dim, kv, &attr)
                   : cuda::AttentionAttributes(op.head_dim, kv, &attr),
            "reading the attention kernel's attributes");
    G4_RETURN_IF_ERROR(cuda::CheckKernelLaunch(
        at, decode ? "decode attention" : "attention",
        cuda::KernelResources{attr.maxThreadsPerBlock, attr.numRegs, attr.sharedSizeBytes}, threads, shared, limits));
  }
  return OkStatus();
}

class CudaExecutable : public Executable {
 public:
  CudaExecutable(CudaBackend* b, const Graph& g, int T, int R) : backend_(b), graph_(g), T_(T), R_(R) {
    const char* env = std::getenv("GEMMA4RT_CUDA_GRAPHS");
    graphs_ = T <= kMatVecMaxRows && !(env != nullptr && std::string(env) == "0");
  }
  Status Prepare();
  Status Run(const StepInput& input, KvCacheBase& cache) override;
  OutputView Output(const std::string& name) const override;

 private:
  char* Arena() const { return static_cast<char*>(backend_->arena()); }
  float* Value(int node) const { return reinterpret_cast<float*>(Arena() + plan_.offset[node]); }
  Status RunMatMul(const Node& node, const MatMulOp& op, const float* x, float* out, int rows);
  Status RunMoE(const Node& node, const MoEOp& op, const float* y, const float* r, float* out, int rows);
  Status RunAttention(const std::string& what, const AttentionOp& op, const CudaKvCache::Layer& L, int plan_keys,
                      int kv_type, const float* q, const float* k, const float* v, float* out, const cuda::StepArrays& sa);
  // Every node's launches on the backend's stream (Run: directly, or captured into step_graph_).
  Status Enqueue(CudaKvCache& cache, int kv_type, const cuda::StepArrays& sa);

  CudaBackend* backend_;
  const Graph& graph_;
  const int T_, R_;
  ArenaPlan plan_;
  std::vector<DeviceMem> rope_freqs_;  // per node (RopeOp), else empty
  int vocab_ = INT_MAX;                 // the smallest embedding table's rows (token ids are checked)
  std::vector<int> plan_keys_;          // per node (AttentionOp): the key count its split plan is for
  // Decode steps (<= kMatVecMaxRows tokens: no cuBLAS) replay a CUDA graph; GEMMA4RT_CUDA_GRAPHS=0
  // launches every kernel each step instead.
  bool graphs_ = false;
  cuda::StepGraph step_graph_;
  std::map<std::string, std::vector<float>> outputs_;
};

Status CudaExecutable::Prepare() {
  const CudaDeviceInfo& dev = backend_->info();
  const auto& nodes = graph_.nodes();
  rope_freqs_.resize(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    const std::string at = "node %" + std::to_string(i) + " (" + Graph::OpName(n.op) + ")";
    Status s = std::visit(Overloaded{
        [&](const EmbedOp& op) -> Status {
          if (n.cols % 32) return Unimplemented(at + ": embeddings of " + std::to_string(n.cols) + " columns (the CUDA kernel reads 32 at a time)");
          vocab_ = std::min<int64_t>(vocab_, op.table->shape[0]);
          return backend_->Matrix(op.table).status();
        },
        [&](const MatMulOp& op) -> Status {
          G4_RETURN_IF_ERROR(backend_->Matrix(op.w).status());
          backend_->CountMatMul(op.w);
          return OkStatus();
        },
        [&](const RmsNormOp& op) -> Status {
          if (op.group < 1 || n.cols % op.group) return InvalidArgument(at + ": group does not divide the columns");
          return op.w ? backend_->Vector(op.w).status() : OkStatus();
        },
        [&](const RopeOp& op) -> Status {
          if (op.head_dim % 2 || n.cols % op.head_dim || static_cast<int>(op.inv_freq.size()) != op.head_dim / 2)
            return InvalidArgument(at + ": head_dim does not fit the columns or the frequencies");
          G4_RETURN_IF_ERROR(rope_freqs_[i].Alloc(op.inv_freq.size() * sizeof(float), "RoPE frequencies"));
          return CudaStatus(cudaMemcpy(rope_freqs_[i].p, op.inv_freq.data(), op.inv_freq.size() * sizeof(float),
                                       cudaMemcpyHostToDevice), "uploading RoPE frequencies");
        },
        [&](const AttentionOp& op) -> Status {
          if (!cuda::AttentionHeadDimSupported(op.head_dim))
            return Unimplemented(at + ": head_dim " + std::to_string(op.head_dim) + " (the CUDA attention kernel has 32, 64, 128, 256 and 512)");
          if (op.num_kv_heads < 1 || op.num_heads % op.num_kv_heads)
            return InvalidArgument(at + ": query heads not a multiple of KV heads");
          return CheckAttentionLaunch(at, op, T_ <= cuda::kDecodeMaxTokens, dev);
        },
        [&](const MoEOp& op) -> Status {
          const int64_t H = op.router_proj->shape[1];
          if (H % 32 || op.width % 32) return Unimplemented(at + ": MoE widths must be multiples of 32");
          if (static_cast<int64_t>(T_) * op.top_k > 65535)  // the expert kernels' grid.y: one (token, expert) each
            return Unimplemented(at + ": " + std::to_string(T_) + " tokens x top-" + std::to_string(op.top_k) +
                                 " experts > 65535 (grid y limit); use smaller prefill chunks");
          const size_t shared = cuda::MoeRouteSharedBytes(static_cast<int>(H), op.num_experts);
          if (shared > dev.shared_per_block)
            return Unimplemented(at + ": the router needs " + std::to_string(shared) + " bytes of shared memory per block > the device's " +
                                 std::to_string(dev.shared_per_block));
          for (const Tensor* t : {op.router_proj, op.gate_up, op.down}) G4_RETURN_IF_ERROR(backend_->Matrix(t).status());
          G4_RETURN_IF_ERROR(backend_->Vector(op.router_scale).status());
          return backend_->Vector(op.per_expert_scale).status();
        },
        [&](const auto&) -> Status { return OkStatus(); },
    }, n.op);
    if (!s.ok()) return s;
  }
  plan_ = PlanArena(graph_, T_, R_);
  return backend_->ReserveArena(plan_, T_);
}

Status CudaExecutable::RunMatMul(const Node& node, const MatMulOp& op, const float* x, float* out, int rows) {
  G4_ASSIGN_OR_RETURN(const DeviceWeight* w, backend_->Matrix(op.w));
  const int N = static_cast<int>(op.w->shape[0]), K = static_cast<int>(op.w->shape.back());
  cudaStream_t st = backend_->stream();
  if (rows <= kMatVecMaxRows)
    return CudaStatus(cuda::MatVec(w->data(), w->format, w->row_bytes, N, K, x, rows, op.out_scale, out, st), node.name);
  // cuBLAS: C[rows, N] = X16[rows, K] . W16[N, K]^T, in the weight's 16-bit type (dense) or the
  // compute dtype (blocks, dequantised a tile of rows at a time).
  const bool dense = w->format == cuda::kWF16 || w->format == cuda::kWBF16;
  const bool half16 = dense ? w->format == cuda::kWF16 : !backend_->bf16();
  char* base = Arena() + plan_.values;
  void* x16 = base;
  void* w16 = base + plan_.half_x;
  G4_CUDA(cuda::ToHalf16(x, static_cast<size_t>(rows) * K, half16, x16, st), "converting activations");
  const cudaDataType type = half16 ? CUDA_R_16F : CUDA_R_16BF;
  const float alpha = op.out_scale, beta = 0;
  for (int64_t n0 = 0; n0 < N; n0 += kGemmTileRows) {
    const int nt = static_cast<int>(std::min<int64_t>(kGemmTileRows, N - n0));
    const void* a = w->data() + n0 * w->row_bytes;
    if (!dense) {
      G4_CUDA(cuda::DequantRows(w->data(), w->format, w->row_bytes, static_cast<int>(n0), nt, K, half16, w16, st),
              "dequantising weight '" + op.w->name + "'");
      a = w16;
    }
    const cublasStatus_t s = cublasGemmEx(backend_->blas(), CUBLAS_OP_T, CUBLAS_OP_N, nt, rows, K, &alpha, a, type, K,
                                          x16, type, K, &beta, out + n0, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
      return Internal("cublasGemmEx for weight '" + op.w->name + "': " + cublasGetStatusString(s));
  }
  return OkStatus();
}

Status CudaExecutable::RunMoE(const Node& node, const MoEOp& op, const float* y, const float* r, float* out, int rows) {
  const int H = static_cast<int>(op.router_proj->shape[1]), E = op.num_experts, k = op.top_k, I = op.width;
  G4_ASSIGN_OR_RETURN(const DeviceWeight* proj, backend_->Matrix(op.router_proj));
  G4_ASSIGN_OR_RETURN(const DeviceWeight* gate_up, backend_->Matrix(op.gate_up));
  G4_ASSIGN_OR_RETURN(const DeviceWeight* down, backend_->Matrix(op.down));
  G4_ASSIGN_OR_RETURN(const float* rscale, backend_->Vector(op.router_scale));
  G4_ASSIGN_OR_RETURN(const float* escale, backend_->Vector(op.per_expert_scale));
  const int jobs = rows * k;
  float* base = reinterpret_cast<float*>(Arena() + plan_.values + plan_.half_x + plan_.half_w);
  int32_t* chosen = reinterpret_cast<int32_t*>(base);
  float* weight = base + jobs;
  float* gu = weight + jobs;
  float* act = gu + static_cast<size_t>(jobs) * 2 * I;
  float* eo = act + static_cast<size_t>(jobs) * I;
  cudaStream_t st = backend_->stream();
  const std::string& at = node.name;
  G4_CUDA(cuda::MoeRoute(r, rows, H, rscale, proj->data(), proj->format, proj->row_bytes, escale, E, k, op.eps, chosen,
                         weight, st), "MoE routing " + at);
  G4_CUDA(cuda::ExpertMatVec(gate_up->data(), gate_up->format, gate_up->row_bytes, 2 * I * gate_up->row_bytes, 2 * I, H,
                             y, k, chosen, jobs, gu, st), "MoE gate/up " + at);
  G4_CUDA(cuda::MoeGeGlu(gu, jobs, I, act, st), "MoE GeGLU " + at);
  G4_CUDA(cuda::ExpertMatVec(down->data(), down->format, down->row_bytes, H * down->row_bytes, H, I, act, 1, chosen, jobs,
                             eo, st), "MoE down " + at);
  return CudaStatus(cuda::MoeCombine(eo, weight, rows, k, H, out, st), "MoE combine " + at);
}

// Flash decoding for steps of up to kDecodeMaxTokens tokens (splits from the longest key range
// and the device's multiprocessors), the prefill kernel for longer ones; with an 8-bit cache the
// step's K and V are quantised first (into the arena's attention scratch) as KvWrite stores them.
Status CudaExecutable::RunAttention(const std::string& what, const AttentionOp& op, const CudaKvCache::Layer& L,
                                    int plan_keys, int kv_type, const float* q, const float* k, const float* v,
                                    float* out, const cuda::StepArrays& sa) {
  cudaStream_t st = backend_->stream();
  cuda::AttentionArgs a{};
  a.q = q, a.k = k, a.v = v, a.out = out;
  a.k_cache = L.k.p, a.v_cache = L.v.p;
  a.kv_type = kv_type, a.slots = L.slots, a.window = L.window;
  a.num_heads = op.num_heads, a.num_kv_heads = op.num_kv_heads, a.head_dim = op.head_dim;
  a.scale = op.scale, a.softcap = op.softcap;
  char* scratch = Arena() + plan_.values + plan_.half_x + plan_.half_w + plan_.moe;
  if (cuda::KvScaled(kv_type)) {
    const size_t rows = static_cast<size_t>(T_) * op.num_kv_heads;
    char* p = scratch + plan_.attn_partials;
    auto* kq = reinterpret_cast<int8_t*>(p);
    auto* vq = reinterpret_cast<int8_t*>(p + cuda::AlignUp(rows * op.head_dim));
    auto* ks = reinterpret_cast<float*>(p + 2 * cuda::AlignUp(rows * op.head_dim));
    auto* vs = reinterpret_cast<float*>(p + 2 * cuda::AlignUp(rows * op.head_dim) + cuda::AlignUp(rows * sizeof(float)));
    G4_CUDA(cuda::QuantizeKvRows(k, v, T_, op.num_kv_heads, op.head_dim, kv_type, kq, vq, ks, vs, st),
            what + " quantising K/V");
    a.k_q = kq, a.v_q = vq, a.k_qscale = ks, a.v_qscale = vs;
    a.k_scale_cache = static_cast<const float*>(L.ks.p), a.v_scale_cache = static_cast<const float*>(L.vs.p);
  }
  if (T_ > cuda::kDecodeMaxTokens) return CudaStatus(cuda::Attention(a, sa, st), what);
  const cuda::DecodeSplit plan = cuda::PlanDecodeSplit(T_, op.num_kv_heads, plan_keys, backend_->info().sm_count);
  return CudaStatus(cuda::DecodeAttention(a, sa, plan, reinterpret_cast<float*>(scratch), st), what);
}

Status CudaExecutable::Enqueue(CudaKvCache& c, int kv_type, const cuda::StepArrays& sa) {
  CudaKvCache* cache = &c;
  cudaStream_t st = backend_->stream();
  const auto& nodes = graph_.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& node = nodes[i];
    const int rows = RowsOf(node, T_, R_);
    if (rows == 0) continue;  // a step without output rows: nothing to compute (no empty launches)
    float* out = node.cols > 0 ? Value(static_cast<int>(i)) : nullptr;
    auto input = [&](int j) { return Value(node.inputs[j]); };
    const size_t n = static_cast<size_t>(rows) * node.cols;
    const std::string what = "node %" + std::to_string(i) + " (" + Graph::OpName(node.op) + ")";
    auto layer = [&](int l) -> StatusOr<CudaKvCache::Layer*> {
      if (l < 0 || l >= static_cast<int>(cache->layers.size()) || cache->layers[l].slots == 0)
        return InvalidArgument(what + ": layer " + std::to_string(l) + " has no KV cache");
      return &cache->layers[l];
    };
    Status s = std::visit(Overloaded{
        [&](const EmbedOp& op) -> Status {
          G4_ASSIGN_OR_RETURN(const DeviceWeight* w, backend_->Matrix(op.table));
          return CudaStatus(cuda::Embed(w->data(), w->format, w->row_bytes, node.cols, op.scale, sa, out, st), what);
        },
        [&](const MatMulOp& op) { return RunMatMul(node, op, input(0), out, rows); },
        [&](const RmsNormOp& op) -> Status {
          const float* w = nullptr;
          if (op.w) {
            G4_ASSIGN_OR_RETURN(w, backend_->Vector(op.w));
          }
          return CudaStatus(cuda::RmsNorm(input(0), rows, node.cols, op.group, w, op.eps, op.offset, out, st), what);
        },
        [&](const RopeOp& op) {
          return CudaStatus(cuda::Rope(input(0), rows, node.cols, op.head_dim, static_cast<const float*>(rope_freqs_[i].p),
                                       sa, out, st), what);
        },
        [&](const AttentionOp& op) -> Status {
          G4_ASSIGN_OR_RETURN(CudaKvCache::Layer * L, layer(op.cache_layer));
          return RunAttention(what, op, *L, plan_keys_[i], kv_type, input(0), input(1), input(2), out, sa);
        },
        [&](const KvWriteOp& op) -> Status {
          G4_ASSIGN_OR_RETURN(CudaKvCache::Layer * L, layer(op.cache_layer));
          if (cuda::KvScaled(kv_type))
            return CudaStatus(cuda::KvWrite8(input(0), input(1), L->heads, L->width / L->heads, kv_type, L->k.p, L->v.p,
                                             static_cast<float*>(L->ks.p), static_cast<float*>(L->vs.p), L->slots,
                                             L->window, sa, st), what);
          return CudaStatus(cuda::KvWrite(input(0), input(1), L->width, L->k.p, L->v.p, kv_type, L->slots, L->window, sa, st), what);
        },
        [&](const GeGluOp&) { return CudaStatus(cuda::GeGlu(input(0), input(1), n, out, st), what); },
        [&](const AddOp& op) { return CudaStatus(cuda::Add(input(0), input(1), n, op.scale, out, st), what); },
        [&](const ScaleOp& op) { return CudaStatus(cuda::Scale(input(0), n, op.scale, out, st), what); },
        [&](const SoftcapOp& op) { return CudaStatus(cuda::Softcap(input(0), n, op.cap, out, st), what); },
        [&](const SliceOp& op) {
          return CudaStatus(cuda::Slice(input(0), rows, graph_.node(node.inputs[0]).cols, op.begin, node.cols, out, st), what);
        },
        [&](const SelectRowsOp&) { return CudaStatus(cuda::SelectRows(input(0), rows, node.cols, sa.output_rows, out, st), what); },
        [&](const MoEOp& op) { return RunMoE(node, op, input(0), input(1), out, rows); },
    }, node.op);
    if (!s.ok()) return s;
  }
  return OkStatus();
}

Status CudaExecutable::Run(const StepInput& in, KvCacheBase& base) {
  auto* cache = dynamic_cast<CudaKvCache*>(&base);
  G4_CHECK(cache != nullptr && cache->owner == backend_);  // a cache of this backend (CreateKvCache)
  G4_CHECK(static_cast<int>(in.tokens.size()) == T_ && in.positions.size() == in.tokens.size() &&
           in.seq_ids.size() == in.tokens.size() && static_cast<int>(in.output_rows.size()) == R_);
  G4_RETURN_IF_ERROR(backend_->Select());
  for (int t = 0; t < T_; ++t)
    if (in.tokens[t] < 0 || in.tokens[t] >= vocab_)
      return InvalidArgument("token id " + std::to_string(in.tokens[t]) + " outside the vocabulary");
  // Token arrays: tokens, positions, seq_ids, seq_first [T] and output rows [R].
  std::vector<int32_t> host(4 * static_cast<size_t>(T_) + R_);
  for (int t = 0; t < T_; ++t) {
    const bool first = t == 0 || in.seq_ids[t] != in.seq_ids[t - 1];
    G4_CHECK(in.seq_ids[t] >= 0 && in.seq_ids[t] < cache->max_seqs());
    if (first) G4_CHECK(in.positions[t] == cache->length(in.seq_ids[t]));
    else G4_CHECK(in.positions[t] == in.positions[t - 1] + 1);
    G4_CHECK(in.positions[t] < cache->max_context());
    host[t] = in.tokens[t];
    host[T_ + t] = in.positions[t];
    host[2 * T_ + t] = in.seq_ids[t];
    host[3 * T_ + t] = first ? t : host[3 * T_ + t - 1];
  }
  for (int r = 0; r < R_; ++r) {
    G4_CHECK(in.output_rows[r] >= 0 && in.output_rows[r] < T_);
    host[4 * T_ + r] = in.output_rows[r];
  }
  cudaStream_t st = backend_->stream();
  auto* ints = reinterpret_cast<int32_t*>(Arena() + plan_.total() - plan_.ints);
  G4_CUDA(cudaMemcpyAsync(ints, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice, st), "uploading the step's tokens");
  const cuda::StepArrays sa{ints, ints + T_, ints + 2 * T_, ints + 3 * T_, ints + 4 * T_, T_};
  const DType ct = cache->type();
  const int kv_type = ct == DType::kF32    ? cuda::kKvF32
                      : ct == DType::kF16  ? cuda::kKvF16
                      : ct == DType::kBF16 ? cuda::kKvBF16
                      : ct == DType::kI8   ? cuda::kKvI8
                                           : cuda::kKvF8;
  // The key count each attention's split plan is made for (decode steps; DecodePlanKeys). The
  // graph's key: what its launches hold besides the weights (fixed for the backend's life).
  const auto& nodes = graph_.nodes();
  plan_keys_.assign(nodes.size(), 0);
  std::vector<uintptr_t> key{reinterpret_cast<uintptr_t>(Arena()), static_cast<uintptr_t>(kv_type)};
  for (const CudaKvCache::Layer& L : cache->layers) {
    for (const void* p : {L.k.p, L.v.p, L.ks.p, L.vs.p}) key.push_back(reinterpret_cast<uintptr_t>(p));
    key.push_back(static_cast<uintptr_t>(L.slots));
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto* op = std::get_if<AttentionOp>(&nodes[i].op);
    if (op == nullptr || op->cache_layer < 0 || op->cache_layer >= static_cast<int>(cache->layers.size())) continue;
    const CudaKvCache::Layer& L = cache->layers[op->cache_layer];
    int max_keys = 1;
    for (int t = 0; t < T_; ++t)
      max_keys = std::max(max_keys, in.positions[t] - cuda::FirstKey(in.positions[t], L.window) + 1);
    plan_keys_[i] = cuda::DecodePlanKeys(max_keys, std::max(L.slots, 1));
    key.push_back(static_cast<uintptr_t>(plan_keys_[i]));
  }
  if (graphs_) {
    G4_RETURN_IF_ERROR(step_graph_.Launch(key, st, [&] { return Enqueue(*cache, kv_type, sa); }));
  } else {
    G4_RETURN_IF_ERROR(Enqueue(*cache, kv_type, sa));
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& node = nodes[i];
    if (node.name.empty() || node.cols == 0) continue;
    std::vector<float>& h = outputs_[node.name];
    h.resize(static_cast<size_t>(RowsOf(node, T_, R_)) * node.cols);
    G4_CUDA(cudaMemcpyAsync(h.data(), Value(static_cast<int>(i)), h.size() * sizeof(float), cudaMemcpyDeviceToHost, st),
            "copying '" + node.name + "' to the host");
  }
  return CudaStatus(cudaStreamSynchronize(st), "running the step");
}

OutputView CudaExecutable::Output(const std::string& name) const {
  auto it = outputs_.find(name);
  if (it == outputs_.end()) return {};
  for (const Node& n : graph_.nodes())
    if (n.name == name) return OutputView{const_cast<float*>(it->second.data()), RowsOf(n, T_, R_), n.cols};
  return {};
}

StatusOr<std::unique_ptr<Executable>> CudaBackend::Compile(const Graph& graph, int num_tokens, int num_output_rows) {
  if (num_tokens <= 0) return InvalidArgument("a step needs at least one token");
  if (num_output_rows < 0 || num_output_rows > num_tokens) return InvalidArgument("output rows must be in [0, tokens]");
  G4_RETURN_IF_ERROR(Select());
  auto exe = std::make_unique<CudaExecutable>(this, graph, num_tokens, num_output_rows);
  G4_RETURN_IF_ERROR(exe->Prepare());
  return std::unique_ptr<Executable>(std::move(exe));
}

Status CudaBackend::PlanMemory(const Graph& graph, const KvCacheBase& cache) const {
  G4_RETURN_IF_ERROR(Select());
  size_t weights = 0, uploaded = 0;
  for (const auto& [t, matrix] : GraphWeights(graph)) {
    const size_t b = DeviceBytes(t, matrix);
    weights += b;
    if ((matrix && weights_.count(t)) || (!matrix && vectors_.count(t))) uploaded += b;
  }
  const size_t step = PlanArena(graph, 1, 1).total();
  size_t free = 0, total = 0;
  G4_CUDA(cudaMemGetInfo(&free, &total), "reading the device's free memory");
  const size_t need = weights - uploaded + step;
  if (need <= free) return OkStatus();
  return ResourceExhausted("the model does not fit on CUDA device " + std::to_string(info_.device) + ": weights " +
                           std::to_string(weights - uploaded) + " bytes + a decode step's memory " + std::to_string(step) +
                           " bytes = " + std::to_string(need) + " bytes > " + std::to_string(free) +
                           " bytes free after the KV cache's " + std::to_string(cache.bytes()) + " bytes (" +
                           std::to_string(cache.max_seqs()) + " sequences x " + std::to_string(cache.max_context()) +
                           " tokens; device total " + std::to_string(total) + ")");
}

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// Every kernel of a fixed block size against the device's limits (cuda_policy.h), before any
// runs. Errors: FailedPrecondition where the module has no code for the device, Unimplemented
// naming the kernel and the limit.
Status CheckFixedKernels(const CudaDeviceInfo& dev) {
  std::vector<cuda::KernelLaunchInfo> ks;
  for (cudaError_t e : {cuda::AppendFixedKernelLaunches(&ks), cuda::AppendMatMulKernelLaunches(&ks),
                        cuda::AppendAttentionAuxKernelLaunches(&ks)})
    if (e != cudaSuccess)
      return FailedPrecondition("CUDA device " + std::to_string(dev.device) + " (" + dev.name + ", compute capability " +
                                std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor) +
                                "): reading the kernels' attributes: " + cudaGetErrorString(e) +
                                " (the module is built for sm_75, sm_80, sm_86, sm_89 and sm_90 unless "
                                "CMAKE_CUDA_ARCHITECTURES said otherwise)");
  const cuda::DeviceLimits limits{dev.max_threads_per_block, dev.shared_per_block, dev.regs_per_block};
  for (const cuda::KernelLaunchInfo& k : ks)
    G4_RETURN_IF_ERROR(cuda::CheckKernelLaunch(
        "CUDA device " + std::to_string(dev.device), k.name,
        cuda::KernelResources{k.attr.maxThreadsPerBlock, k.attr.numRegs, k.attr.sharedSizeBytes}, k.threads,
        k.dynamic_shared, limits));
  return OkStatus();
}

StatusOr<std::unique_ptr<Backend>> Make(const CudaBackendOptions& o) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    return FailedPrecondition(std::string("--backend cuda: no CUDA device (") +
                              (e != cudaSuccess ? std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e) : "0 devices") + ")");
  if (o.device < 0 || o.device >= count)
    return FailedPrecondition("--device " + std::to_string(o.device) + ": this machine has " + std::to_string(count) +
                              " CUDA device(s), 0.." + std::to_string(count - 1));
  cudaDeviceProp prop{};
  G4_CUDA(cudaGetDeviceProperties(&prop, o.device), "reading CUDA device " + std::to_string(o.device));
  CudaDeviceInfo info;
  info.device = o.device;
  info.name = prop.name;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.total_memory = prop.totalGlobalMem;
  info.sm_count = prop.multiProcessorCount;
  info.shared_per_block = prop.sharedMemPerBlock;
  info.max_threads_per_block = prop.maxThreadsPerBlock;
  info.regs_per_block = prop.regsPerBlock;
  G4_ASSIGN_OR_RETURN(cuda::ComputeChoice choice, cuda::ChooseComputeDtype(prop.major, prop.minor, o.compute_dtype));
  info.compute_dtype = choice.dtype;
  info.compute_reason = choice.reason;
  G4_CUDA(cudaSetDevice(o.device), "selecting CUDA device " + std::to_string(o.device));
  G4_RETURN_IF_ERROR(CheckFixedKernels(info));
  size_t free = 0, total = 0;
  G4_CUDA(cudaMemGetInfo(&free, &total), "reading the device's free memory");
  info.free_memory = free;
  cudaStream_t stream = nullptr;
  G4_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "creating a CUDA stream");
  cublasHandle_t blas = nullptr;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
    cudaStreamDestroy(stream);
    return Internal("creating the cuBLAS handle failed");
  }
  cublasSetStream(blas, stream);
  return std::unique_ptr<Backend>(new CudaBackend(std::move(info), stream, blas));
}

CudaWeightBytes Weights(const Backend& backend) {
  const auto* c = dynamic_cast<const CudaBackend*>(&backend);
  return c ? c->weight_bytes() : CudaWeightBytes{};
}

const CudaDeviceInfo* Info(const Backend& backend) {
  const auto* c = dynamic_cast<const CudaBackend*>(&backend);
  return c ? &c->info() : nullptr;
}

}  // namespace
}  // namespace g4

extern "C" __attribute__((visibility("default"))) const g4::cuda::ModuleApi* g4_cuda_backend_api() {
  static const g4::cuda::ModuleApi api{g4::cuda::kModuleApiVersion, g4::Make, g4::Info, g4::Weights, g4::DeviceCount};
  return &api;
}
