#include "backends/xla/lower.h"

#include <cmath>
#include <set>
#include <variant>

#include "backends/xla/device_policy.h"
#include "backends/xla/lower_kv.h"
#include "base/check.h"
#include "base/overloaded.h"
#include "runtime/kv_cache.h"

namespace g4::xla {
namespace {

constexpr ElemType kF32 = ElemType::kF32;
constexpr ElemType kI32 = ElemType::kI32;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The tensors a node reads as weights, in a fixed order.
std::vector<const Tensor*> WeightsOf(const OpAttrs& op) {
  return std::visit(Overloaded{
                        [](const EmbedOp& o) { return std::vector<const Tensor*>{o.table}; },
                        [](const MatMulOp& o) { return std::vector<const Tensor*>{o.w}; },
                        [](const RmsNormOp& o) { return o.w ? std::vector<const Tensor*>{o.w} : std::vector<const Tensor*>{}; },
                        [](const MoEOp& o) {
                          return std::vector<const Tensor*>{o.router_proj, o.router_scale, o.per_expert_scale, o.gate_up,
                                                            o.down};
                        },
                        [](const auto&) { return std::vector<const Tensor*>{}; },
                    },
                    op);
}

// The ops, on a Builder, with the CPU backend's arithmetic order (backends/cpu/kernels.cc).
class Lowering {
 public:
  explicit Lowering(Builder& b) : b_(b) {}

  Value GeluTanh(const Value& x) {  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    Value cube = b_.Mul(b_.Mul(b_.MulScalar(x, 0.044715f), x), x);
    Value inner = b_.MulScalar(b_.Add(x, cube), 0.7978845608028654f);
    return b_.Mul(b_.MulScalar(x, 0.5f), b_.AddScalar(b_.Unary("tanh", inner), 1.0f));
  }

  // x [rows, cols] -> per group of `group` columns x * (mean(x^2) + eps)^-1/2 * (offset + w).
  Value RmsNorm(const Value& x, int group, float eps, float offset, const Value* w) {
    const int64_t rows = x.shape[0], cols = x.shape[1], groups = cols / group;
    Value x3 = b_.Reshape(x, {rows, groups, group});
    Value ss = b_.ReduceSum(b_.Mul(x3, x3), {2});
    Value mean = b_.Div(ss, b_.Splat(group, ss.shape, kF32));
    Value root = b_.Unary("sqrt", b_.AddScalar(mean, eps));
    Value inv = b_.Div(b_.Splat(1, root.shape, kF32), root);
    Value y = b_.Mul(x3, b_.Broadcast(inv, x3.shape, {0, 1}));
    if (w != nullptr) {
      Value scale = b_.AddScalar(*w, offset);
      y = b_.Mul(y, b_.Broadcast(scale, x3.shape, {2}));
    }
    return b_.Reshape(y, {rows, cols});
  }

  Value Softmax(const Value& s, int64_t dim) {
    std::vector<int64_t> keep;
    for (int64_t d = 0; d < static_cast<int64_t>(s.shape.size()); ++d)
      if (d != dim) keep.push_back(d);
    Value m = b_.ReduceMax(s, {dim});
    Value e = b_.Unary("exponential", b_.Sub(s, b_.Broadcast(m, s.shape, keep)));
    Value sum = b_.ReduceSum(e, {dim});
    return b_.Div(e, b_.Broadcast(sum, s.shape, keep));
  }

  Value ScalarI32(int64_t v) { return b_.Splat(static_cast<double>(v), {}, kI32); }

  // Blocks [..., NB, bytes] of Q8_0 (f16 d, i8 q[32]: d q), Q4_0 (f16 d, nibbles: d (nib - 8)) or
  // W4G32 (bf16 s, nibbles as Q4_0: s (nib - 8)) -> f32 [..., NB * 32], as tensor/dequant.cc.
  // Byte j of a 4-bit block holds element j (low nibble) and j + 16 (high nibble).
  Value Dequant(const Value& raw, DType t) {
    Shape lead(raw.shape.begin(), raw.shape.end() - 2);
    const int64_t nb = raw.shape[raw.shape.size() - 2], bytes = raw.shape.back();
    const size_t r = raw.shape.size();
    auto at = [&](int64_t from, int64_t to) {
      std::vector<int64_t> s(r, 0), l = raw.shape;
      s[r - 1] = from;
      l[r - 1] = to;
      return b_.Slice(raw, s, l);
    };
    Shape scale_shape = lead;
    scale_shape.push_back(nb);
    Value scale;
    if (t == DType::kW4G32) {  // bf16 bytes (lo, hi) are the f32 with bytes (0, 0, lo, hi): no bf16 type on the device
      std::vector<int64_t> zl = raw.shape;
      zl[r - 1] = 2;
      scale = b_.Bitcast(b_.Concat({b_.Splat(0, zl, ElemType::kU8), at(0, 2)}, static_cast<int>(r) - 1), kF32, scale_shape);
    } else {
      scale = b_.Convert(b_.Bitcast(at(0, 2), ElemType::kF16, scale_shape), kF32);
    }
    Value qs = at(2, bytes);
    Value q;
    if (t == DType::kQ8_0) {
      q = b_.Convert(b_.Bitcast(qs, ElemType::kI8, qs.shape), kF32);
    } else {
      Value lo = b_.And(qs, b_.Splat(15, qs.shape, ElemType::kU8));
      Value hi = b_.Binary("shift_right_logical", qs, b_.Splat(4, qs.shape, ElemType::kU8));
      q = b_.AddScalar(b_.Convert(b_.Concat({lo, hi}, static_cast<int>(r) - 1), kF32), -8.0);
    }
    std::vector<int64_t> dims(r - 1);
    for (size_t i = 0; i < r - 1; ++i) dims[i] = static_cast<int64_t>(i);
    Value x = b_.Mul(q, b_.Broadcast(scale, q.shape, dims));
    Shape out = lead;
    out.push_back(nb * 32);
    return b_.Reshape(x, out);
  }

 private:
  Builder& b_;
};

}  // namespace

std::vector<const Tensor*> GraphWeights(const Graph& graph) {
  std::vector<const Tensor*> out;
  std::set<const Tensor*> seen;
  for (const Node& n : graph.nodes())
    for (const Tensor* t : WeightsOf(n.op))
      if (seen.insert(t).second) out.push_back(t);
  return out;
}

size_t DeviceBytes(const Tensor& t) {
  if (IsDeviceQuantised(t.dtype) || t.dtype == DType::kF32 || t.dtype == DType::kF16 || t.dtype == DType::kBF16)
    return t.nbytes;
  return static_cast<size_t>(t.numel()) * 4;
}

Shape DeviceShape(const Tensor& t) {
  Shape s(t.shape.begin(), t.shape.end());
  if (!IsDeviceQuantised(t.dtype)) return s;
  const int64_t K = s.back();
  s.back() = K / DTypeBlockElems(t.dtype);
  s.push_back(static_cast<int64_t>(DTypeBlockBytes(t.dtype)));
  return s;
}

StatusOr<ElemType> ElemTypeOf(DType t) {
  switch (t) {
    case DType::kF32: return ElemType::kF32;
    case DType::kF16: return ElemType::kF16;
    case DType::kBF16: return ElemType::kBF16;
    case DType::kI32: return ElemType::kI32;
    default: return Unimplemented("the XLA backend has no device type for " + std::string(DTypeName(t)));
  }
}

StatusOr<LoweredStep> LowerGraph(const Graph& graph, const StepShape& sh) {
  Builder b;
  Lowering lo(b);
  LoweredStep out;
  const int64_t T = sh.tokens, R = sh.output_rows, S = sh.max_seqs;
  const int64_t DG = sh.data_groups;  // row groups over the data axis (lower.h)
  if (DG > 1 && (sh.mode != StepMode::kOneTokenPerSequence || T % DG != 0 || S % DG != 0 || R != T ||
                 sh.shards == nullptr || sh.shards->mesh.data != DG))
    return InvalidArgument("data_groups needs a batched decode step of equal groups on a data axis of that size");
  // int8 or fp8 K/V with f32 scales per (slot, KV head): lower_kv.h
  const bool quant = IsScaledKvCacheType(sh.kv_type);
  G4_ASSIGN_OR_RETURN(ElemType kv_type, sh.kv_type == DType::kI8       ? StatusOr<ElemType>(ElemType::kI8)
                                        : sh.kv_type == DType::kF8E4M3 ? StatusOr<ElemType>(ElemType::kF8E4M3FN)
                                                                       : ElemTypeOf(sh.kv_type));
  if (kv_type == kI32) return InvalidArgument("KV cache type must be f32, f16, bf16, i8 or f8_e4m3");
  G4_ASSIGN_OR_RETURN(const ElemType compute, ElemTypeOf(sh.compute));
  if (compute == kI32) return InvalidArgument("the compute dtype must be f32, bf16 or f16");

  const Value tokens = b.Param({T}, kI32);
  const Value positions = b.Param({T}, kI32);
  const Value seq_ids = b.Param({T}, kI32);
  const Value out_rows = b.Param({R}, kI32);
  const Value kv_len = b.Param({S}, kI32);
  const Value kv_end = b.Param({S}, kI32);

  // Weights, in the order nodes first read them.
  const auto& nodes = graph.nodes();
  std::map<const Tensor*, Value> weight;
  for (const Node& n : nodes) {
    for (const Tensor* t : WeightsOf(n.op)) {
      if (weight.count(t)) continue;
      DType dt = t->dtype;
      if (IsDeviceQuantised(dt)) {
        weight.emplace(t, b.Param(DeviceShape(*t), ElemType::kU8));
        out.weights.push_back(t);
        out.weight_types.push_back(dt);
        continue;
      }
      if (sh.quantised_as_f32 || dt == DType::kF32 || dt == DType::kF16 || dt == DType::kBF16)
        dt = WeightDeviceType(*t, sh.compute);
      auto et = ElemTypeOf(dt);
      if (!et.ok() || *et == kI32)
        return Unimplemented("weight '" + t->name + "' is " + std::string(DTypeName(dt)) +
                             ": the XLA lowering takes F32, F16, BF16, Q8_0, Q4_0 and W4G32 weights");
      weight.emplace(t, b.Param(Shape(t->shape.begin(), t->shape.end()), *et));
      out.weights.push_back(t);
      out.weight_types.push_back(dt);
    }
  }
  auto W32 = [&](const Tensor* t) {
    return IsDeviceQuantised(t->dtype) ? lo.Dequant(weight.at(t), t->dtype) : b.Convert(weight.at(t), kF32);
  };
  // A weight as a dot operand: of the compute dtype.
  auto Wc = [&](const Tensor* t) {
    return IsDeviceQuantised(t->dtype) ? b.Convert(lo.Dequant(weight.at(t), t->dtype), compute) : b.Convert(weight.at(t), compute);
  };
  // dot_general of operands in the compute dtype, accumulated and returned in f32.
  auto CDot = [&](const Value& x, const Value& y, const std::vector<int64_t>& lb, const std::vector<int64_t>& rb,
                  const std::vector<int64_t>& lc, const std::vector<int64_t>& rc) {
    return b.Dot(b.Convert(x, compute), b.Convert(y, compute), lb, rb, lc, rc, kF32);
  };

  // Exported outputs come first among the results; the caches follow, each aliased.
  for (size_t i = 0; i < nodes.size(); ++i)
    if (!nodes[i].name.empty()) out.outputs.emplace_back(nodes[i].name, static_cast<int>(i));
  std::map<int, size_t> cache_index;
  std::vector<Value> cache_k, cache_v, cache_ks, cache_vs;  // the scales: quant only
  out.caches = sh.caches;
  out.kv_buffers = KvBuffersPerLayer(sh.kv_type);
  const int num_out = static_cast<int>(out.outputs.size());
  for (size_t i = 0; i < sh.caches.size(); ++i) {
    const CacheLayer& c = sh.caches[i];
    if (quant && c.heads <= 0) return InvalidArgument("an 8-bit KV cache needs the KV head count of layer " + std::to_string(c.layer));
    cache_index[c.layer] = i;
    const int first = num_out + out.kv_buffers * static_cast<int>(i);
    cache_k.push_back(b.Param({S, c.slots, c.width}, kv_type, first));
    cache_v.push_back(b.Param({S, c.slots, c.width}, kv_type, first + 1));
    if (!quant) continue;
    cache_ks.push_back(b.Param({S, c.slots, c.heads}, kF32, first + 2));
    cache_vs.push_back(b.Param({S, c.slots, c.heads}, kF32, first + 3));
  }
  if (sh.shards != nullptr && sh.shards->mesh.size() > 1) {  // SPMD (shard_plan.h)
    const ShardPlan& plan = *sh.shards;
    b.SetNumPartitions(plan.mesh.size());
    const std::string rows_split = DG > 1 ? HloSharding(plan.mesh, 1, TensorSplit{0, -1}) : "{replicated}";
    for (const Value* p : {&tokens, &positions, &seq_ids, &out_rows, &kv_len, &kv_end}) b.ShardParam(*p, rows_split);
    for (const Tensor* t : out.weights) {
      const Value& p = weight.at(t);
      b.ShardParam(p, HloSharding(plan.mesh, static_cast<int>(p.shape.size()), plan.Weight(t)));
    }
    std::vector<std::string> result_shardings(out.outputs.size(),
                                              DG > 1 ? HloSharding(plan.mesh, 2, TensorSplit{0, -1}) : "{replicated}");
    // K, V and an 8-bit cache's scales [S, slots, Nkv] alike: slots over data, the last dim (KV
    // heads, or their D elements each) over model where the heads divide.
    for (size_t i = 0; i < sh.caches.size(); ++i) {
      const std::string s = HloSharding(plan.mesh, 3, plan.Cache(sh.caches[i].layer));
      std::vector<const Value*> bufs{&cache_k[i], &cache_v[i]};
      if (quant) bufs.insert(bufs.end(), {&cache_ks[i], &cache_vs[i]});
      for (const Value* v : bufs) {
        b.ShardParam(*v, s);
        result_shardings.push_back(s);
      }
    }
    b.ShardResults(std::move(result_shardings));
  }
  auto cache_of = [&](int layer) -> StatusOr<size_t> {
    auto it = cache_index.find(layer);
    if (it == cache_index.end()) return InvalidArgument("the step shape lists no KV cache for layer " + std::to_string(layer));
    return it->second;
  };

  // Per-row values used by several ops.
  const Value zeros_t = b.Splat(0, {T}, kI32);
  const Value real = b.Compare(seq_ids, zeros_t, Cmp::kGe);           // [T] pred
  const Value seq_clamped = b.Max(seq_ids, zeros_t);                   // [T] a valid index on padding rows
  const Value pos_f = b.Convert(positions, kF32);                      // [T]
  // data_groups > 1: each row's sequence within its group's cache shard of S/DG sequences.
  const Value seq_local = DG > 1 ? b.Binary("remainder", seq_clamped, b.Splat(S / DG, {T}, kI32)) : seq_clamped;
  // The rows of x [S, ...] of each row's sequence -> [T, ...]; with row groups, each group from its shard.
  auto seq_rows = [&](const Value& x) {
    if (DG == 1) return b.TakeRows(x, seq_clamped);
    Shape grouped{DG, S / DG}, out_shape{T};
    grouped.insert(grouped.end(), x.shape.begin() + 1, x.shape.end());
    out_shape.insert(out_shape.end(), x.shape.begin() + 1, x.shape.end());
    return b.Reshape(b.TakeRowsBatched(b.Reshape(x, grouped), b.Reshape(seq_local, {DG, T / DG})), out_shape);
  };
  // Writes rows x [T, W] into cache [S, slots, W] at (their sequence, slot) where `keep`.
  auto write_rows = [&](const Value& cache, const Value& keep, const Value& slot, const Value& x) {
    if (DG == 1) return b.ScatterRows2(cache, b.Select(keep, seq_ids, b.Splat(S, {T}, kI32)), slot, x);  // S: dropped
    const int64_t G = T / DG, C = cache.shape[1], W = cache.shape[2];
    Value row = b.Select(keep, seq_local, b.Splat(S / DG, {T}, kI32));  // S/DG: out of the shard, dropped
    Value y = b.ScatterRows2Batched(b.Reshape(cache, {DG, S / DG, C, W}), b.Reshape(row, {DG, G}),
                                    b.Reshape(slot, {DG, G}), b.Reshape(x, {DG, G, W}));
    return b.Reshape(y, cache.shape);
  };
  // The step's keys/values as the cache holds them, in f32: rounded to its type, or with an
  // 8-bit cache the stored values (integers or fp8), their scales [T, Nkv] in *scale.
  auto as_cached = [&](const Value& x, int64_t heads, int64_t D, Value* scale) {
    if (!quant) return b.Convert(b.Convert(x, kv_type), kF32);
    QuantizedKvRows q = QuantizeKvRows(b, x, heads, D, kv_type);
    *scale = q.scale;
    return b.Convert(q.q, kF32);
  };

  std::vector<Value> vals(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    const int64_t rows = n.rows == Rows::kTokens ? T : R;
    auto in = [&](int j) { return vals[n.inputs[j]]; };
    Status st = OkStatus();
    std::visit(
        Overloaded{
            [&](const EmbedOp& op) {
              G4_CHECK(op.table->shape.size() == 2 && op.table->shape[1] == n.cols);
              Value rows_of = b.TakeRows(weight.at(op.table), tokens);  // only the step's rows are dequantised
              rows_of = IsDeviceQuantised(op.table->dtype) ? lo.Dequant(rows_of, op.table->dtype) : b.Convert(rows_of, kF32);
              vals[i] = b.MulScalar(rows_of, op.scale);
            },
            [&](const MatMulOp& op) {
              Value y = b.Dot(b.Convert(in(0), compute), Wc(op.w), {}, {}, {1}, {1}, kF32);
              vals[i] = op.out_scale == 1.0f ? y : b.MulScalar(y, op.out_scale);
            },
            [&](const RmsNormOp& op) {
              Value w;
              if (op.w) w = W32(op.w);
              vals[i] = lo.RmsNorm(in(0), op.group, op.eps, op.offset, op.w ? &w : nullptr);
            },
            [&](const RopeOp& op) {
              const int64_t D = op.head_dim, half = D / 2, H = n.cols / D;
              Value ang = b.Mul(b.Broadcast(pos_f, {T, half}, {0}), b.Broadcast(b.Vector(op.inv_freq), {T, half}, {1}));
              Value c = b.Broadcast(b.Unary("cosine", ang), {T, H, half}, {0, 2});
              Value s = b.Broadcast(b.Unary("sine", ang), {T, H, half}, {0, 2});
              Value x = b.Reshape(in(0), {T, H, D});
              Value lo_ = b.Slice(x, {0, 0, 0}, {T, H, half});
              Value hi = b.Slice(x, {0, 0, half}, {T, H, D});
              Value nlo = b.Sub(b.Mul(lo_, c), b.Mul(hi, s));
              Value nhi = b.Add(b.Mul(hi, c), b.Mul(lo_, s));
              vals[i] = b.Reshape(b.Concat({nlo, nhi}, 2), {T, n.cols});
            },
            [&](const AttentionOp& op) {
              auto ci = cache_of(op.cache_layer);
              if (!ci.ok()) {
                st = ci.status();
                return;
              }
              const CacheLayer& cl = sh.caches[*ci];
              const int64_t Nq = op.num_heads, Nkv = op.num_kv_heads, D = op.head_dim, G = Nq / Nkv, C = cl.slots;
              G4_CHECK(cl.width == Nkv * D && (!quant || cl.heads == Nkv));
              Value q4 = b.Reshape(in(0), {T, Nkv, G, D});
              Value ks3, vs3;  // quant: the step rows' scales [T, Nkv]
              Value k3 = b.Reshape(as_cached(in(1), Nkv, D, &ks3), {T, Nkv, D});
              Value v3 = b.Reshape(as_cached(in(2), Nkv, D, &vs3), {T, Nkv, D});
              // quant: x * scale broadcast, the scale's dims at `dims` of x (the integers' products
              // scaled as the CPU kernels do: (q . k_int) k_scale and (p v_scale) v_int).
              auto scaled = [&](const Value& x, const Value& scale, const std::vector<int64_t>& dims) {
                return quant ? b.Mul(x, b.Broadcast(scale, x.shape, dims)) : x;
              };
              // quant: the softmax weights times V's scales, zero at masked keys (a stale slot's scale may
              // be NaN, from a row that was not finite: 0 * NaN would reach the output).
              auto weighted = [&](const Value& p, const Value& mask, const Value& scale, const std::vector<int64_t>& dims) {
                return quant ? b.Select(mask, scaled(p, scale, dims), b.Splat(0, p.shape, kF32)) : p;
              };
              auto scores = [&](Value s) {
                s = b.MulScalar(s, op.scale);
                if (op.softcap > 0) s = b.MulScalar(b.Unary("tanh", b.MulScalar(s, 1.0 / op.softcap)), op.softcap);
                return s;
              };
              // Which slots of a sequence of length L hold which position: p = L-1 - ((L-1-c) mod C).
              auto slot_mask = [&](const Value& L, const Value& c, const Value& pos_q) {  // all of one shape
                Value Lm1 = b.Sub(L, b.Splat(1, L.shape, kI32));
                Value d = b.Sub(Lm1, c);
                Value zero = b.Splat(0, L.shape, kI32);
                Value valid = b.Compare(d, zero, Cmp::kGe);
                Value p = b.Sub(Lm1, b.Binary("remainder", b.Max(d, zero), b.Splat(C, L.shape, kI32)));
                if (op.window > 0)
                  valid = b.And(valid, b.Compare(p, b.Sub(pos_q, b.Splat(op.window, L.shape, kI32)), Cmp::kGt));
                return valid;
              };
              if (sh.mode == StepMode::kOneSequence) {
                Value s0 = b.Max(b.Reshape(b.Slice(seq_ids, {0}, {1}), {}), lo.ScalarI32(0));
                Value z = lo.ScalarI32(0);
                Value kc = b.Convert(b.Reshape(b.DynamicSlice(cache_k[*ci], {s0, z, z}, {1, C, cl.width}), {C, Nkv, D}), kF32);
                Value vc = b.Convert(b.Reshape(b.DynamicSlice(cache_v[*ci], {s0, z, z}, {1, C, cl.width}), {C, Nkv, D}), kF32);
                Value L = b.Reshape(b.DynamicSlice(kv_len, {s0}, {1}), {});
                Value cmask = slot_mask(b.Broadcast(L, {T, C}, {}), b.Iota({T, C}, kI32, 1),
                                        b.Broadcast(positions, {T, C}, {0}));
                Value pj = b.Broadcast(positions, {T, T}, {1}), pt = b.Broadcast(positions, {T, T}, {0});
                Value smask = b.Compare(pj, pt, Cmp::kLe);
                if (op.window > 0) smask = b.And(smask, b.Compare(pj, b.Sub(pt, b.Splat(op.window, {T, T}, kI32)), Cmp::kGt));
                Value self = b.Compare(b.Iota({T, T}, kI32, 0), b.Iota({T, T}, kI32, 1), Cmp::kEq);
                smask = b.And(smask, b.Or(b.Broadcast(real, {T, T}, {1}), self));
                Value ksc, vsc;  // quant: [Nkv, C] and [Nkv, C+T] (the cache's and the step's)
                if (quant) {
                  auto scales = [&](const Value& cache) {
                    return b.Transpose(b.Reshape(b.DynamicSlice(cache, {s0, z, z}, {1, C, Nkv}), {C, Nkv}), {1, 0});
                  };
                  ksc = scales(cache_ks[*ci]);
                  vsc = b.Concat({scales(cache_vs[*ci]), b.Transpose(vs3, {1, 0})}, 1);
                  ks3 = b.Transpose(ks3, {1, 0});
                }
                Value s = b.Concat({scores(scaled(CDot(q4, kc, {1}, {1}, {3}, {2}), ksc, {0, 3})),
                                    scores(scaled(CDot(q4, k3, {1}, {1}, {3}, {2}), ks3, {0, 3}))},
                                   3);
                Value mask = b.Broadcast(b.Concat({cmask, smask}, 1), s.shape, {1, 3});
                Value p = lo.Softmax(b.Select(mask, s, b.Splat(kNegInf, s.shape, kF32)), 3);  // [Nkv, T, G, C+T]
                Value o = CDot(weighted(p, mask, vsc, {0, 3}), b.Concat({vc, v3}, 0), {0}, {1}, {3}, {0});  // [Nkv, T, G, D]
                vals[i] = b.Reshape(b.Transpose(o, {1, 0, 2, 3}), {T, Nq * D});
              } else {
                Value kc = b.Convert(b.Reshape(seq_rows(cache_k[*ci]), {T, C, Nkv, D}), kF32);
                Value vc = b.Convert(b.Reshape(seq_rows(cache_v[*ci]), {T, C, Nkv, D}), kF32);
                Value L = seq_rows(kv_len);  // [T]
                Value cmask = slot_mask(b.Broadcast(L, {T, C}, {0}), b.Iota({T, C}, kI32, 1),
                                        b.Broadcast(positions, {T, C}, {0}));
                Value ksc, vsc;  // quant: [T, Nkv, C] each
                if (quant) {
                  ksc = b.Transpose(seq_rows(cache_ks[*ci]), {0, 2, 1});
                  vsc = b.Transpose(seq_rows(cache_vs[*ci]), {0, 2, 1});
                }
                Value sc = scores(scaled(CDot(q4, kc, {0, 1}, {0, 2}, {3}, {3}), ksc, {0, 1, 3}));  // [T, Nkv, G, C]
                Value ss = b.Reshape(scores(scaled(CDot(q4, k3, {0, 1}, {0, 1}, {3}, {2}), ks3, {0, 1})), {T, Nkv, G, 1});
                Value s = b.Concat({sc, ss}, 3);
                Value mask = b.Broadcast(b.Concat({cmask, b.Splat(1, {T, 1}, ElemType::kPred)}, 1), s.shape, {0, 3});
                Value p = lo.Softmax(b.Select(mask, s, b.Splat(kNegInf, s.shape, kF32)), 3);
                if (quant) p = weighted(p, mask, b.Concat({vsc, b.Reshape(vs3, {T, Nkv, 1})}, 2), {0, 1, 3});
                Value pc = b.Slice(p, {0, 0, 0, 0}, {T, Nkv, G, C});
                Value ps = b.Reshape(b.Slice(p, {0, 0, 0, C}, {T, Nkv, G, C + 1}), {T, Nkv, G});
                Value o = CDot(pc, vc, {0, 1}, {0, 2}, {3}, {1});  // [T, Nkv, G, D]
                o = b.Add(o, b.Mul(b.Broadcast(ps, {T, Nkv, G, D}, {0, 1, 2}), b.Broadcast(v3, {T, Nkv, G, D}, {0, 1, 3})));
                vals[i] = b.Reshape(o, {T, Nq * D});
              }
            },
            [&](const KvWriteOp& op) {
              auto ci = cache_of(op.cache_layer);
              if (!ci.ok()) {
                st = ci.status();
                return;
              }
              const CacheLayer& cl = sh.caches[*ci];
              Value slot = cl.window > 0 ? b.Binary("remainder", positions, b.Splat(cl.slots, {T}, kI32)) : positions;
              Value end = seq_rows(kv_end);
              Value keep = b.And(real, b.Compare(positions, b.Sub(end, b.Splat(cl.slots, {T}, kI32)), Cmp::kGe));
              if (quant) {
                const int64_t D = cl.width / cl.heads;
                QuantizedKvRows k = QuantizeKvRows(b, in(0), cl.heads, D, kv_type), v = QuantizeKvRows(b, in(1), cl.heads, D, kv_type);
                cache_k[*ci] = write_rows(cache_k[*ci], keep, slot, k.q);
                cache_v[*ci] = write_rows(cache_v[*ci], keep, slot, v.q);
                cache_ks[*ci] = write_rows(cache_ks[*ci], keep, slot, k.scale);
                cache_vs[*ci] = write_rows(cache_vs[*ci], keep, slot, v.scale);
                return;
              }
              cache_k[*ci] = write_rows(cache_k[*ci], keep, slot, b.Convert(in(0), kv_type));
              cache_v[*ci] = write_rows(cache_v[*ci], keep, slot, b.Convert(in(1), kv_type));
            },
            [&](const GeGluOp&) { vals[i] = b.Mul(lo.GeluTanh(in(0)), in(1)); },
            [&](const AddOp& op) {
              Value y = b.Add(in(0), in(1));
              vals[i] = op.scale == 1.0f ? y : b.MulScalar(y, op.scale);
            },
            [&](const ScaleOp& op) { vals[i] = b.MulScalar(in(0), op.scale); },
            [&](const SoftcapOp& op) {
              vals[i] = b.MulScalar(b.Unary("tanh", b.Div(in(0), b.Splat(op.cap, in(0).shape, kF32))), op.cap);
            },
            [&](const SliceOp& op) { vals[i] = b.Slice(in(0), {0, op.begin}, {rows, op.begin + n.cols}); },
            [&](const SelectRowsOp&) { vals[i] = DG > 1 ? in(0) : b.TakeRows(in(0), out_rows); },
            [&](const MoEOp& op) {
              const int64_t H = n.cols, E = op.num_experts, I = op.width, k = op.top_k;
              const Value& y = in(0);
              // Router: z = rms(r) * scale * H^-1/2; probabilities over experts; top-k renormalised.
              Value z = lo.RmsNorm(in(1), static_cast<int>(H), op.eps, 0.0f, nullptr);
              z = b.Mul(z, b.Broadcast(W32(op.router_scale), {rows, H}, {1}));
              z = b.MulScalar(z, 1.0f / std::sqrt(static_cast<float>(H)));
              Value probs = lo.Softmax(b.Dot(z, W32(op.router_proj), {}, {}, {1}, {1}), 1);  // [rows, E]
              auto [top, idx] = b.TopK(probs, static_cast<int>(k));                          // [rows, k]
              Value wsum = b.ReduceSum(top, {1});
              Value pes = b.Reshape(b.TakeRows(W32(op.per_expert_scale), b.Reshape(idx, {rows * k})), {rows, k});
              Value wk = b.Mul(b.Div(top, b.Broadcast(wsum, {rows, k}, {0})), pes);
              Value hit = b.Compare(b.Broadcast(idx, {rows, k, E}, {0, 1}), b.Iota({rows, k, E}, kI32, 2), Cmp::kEq);
              Value dense = b.ReduceSum(b.Select(hit, b.Broadcast(wk, {rows, k, E}, {0, 1}), b.Splat(0, {rows, k, E}, kF32)), {1});
              // Every expert on every row (dense), weighted by the routing (zero where not chosen).
              Value gu = b.Dot(b.Convert(y, compute), Wc(op.gate_up), {}, {}, {1}, {2}, kF32);  // [rows, E, 2I]
              Value act = b.Mul(lo.GeluTanh(b.Slice(gu, {0, 0, 0}, {rows, E, I})), b.Slice(gu, {0, 0, I}, {rows, E, 2 * I}));
              Value eo = b.Dot(b.Convert(act, compute), Wc(op.down), {1}, {0}, {2}, {2}, kF32);  // [E, rows, H]
              vals[i] = b.Dot(dense, eo, {0}, {1}, {1}, {0});                                   // [rows, H]
            },
        },
        n.op);
    G4_RETURN_IF_ERROR(st);
    if (n.cols > 0) G4_CHECK(vals[i].shape == (Shape{rows, n.cols}));
  }

  std::vector<Value> results;
  for (const auto& [name, id] : out.outputs) results.push_back(vals[id]);
  for (size_t i = 0; i < sh.caches.size(); ++i) {
    results.push_back(cache_k[i]);
    results.push_back(cache_v[i]);
    if (!quant) continue;
    results.push_back(cache_ks[i]);
    results.push_back(cache_vs[i]);
  }
  out.module = b.Module(results);
  return out;
}

}  // namespace g4::xla
