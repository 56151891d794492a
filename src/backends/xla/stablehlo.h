// A small StableHLO text emitter (no MLIR libraries): SSA values with static shapes, each op
// printed in MLIR's generic form ("stablehlo.add"(%a, %b) : (types) -> type), which every
// StableHLO release parses the same way. Only the ops the lowering (lower.cc) needs. Shapes and
// element types are checked as ops are added (G4_CHECK: a lowering bug, never user input).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace g4::xla {

// kF8E4M3FN: fp8 e4m3 without infinities (the fp8 KV cache's elements, lower_kv.h).
enum class ElemType { kF32, kF16, kBF16, kI32, kI8, kU8, kPred, kF8E4M3FN };
// "f32", "f16", "bf16", "i32", "i8", "ui8", "i1", "f8E4M3FN".
const char* ElemTypeName(ElemType t);

using Shape = std::vector<int64_t>;

struct Value {
  std::string name;  // "%7", "%p3", "%9#1"
  Shape shape;
  ElemType type = ElemType::kF32;
  int64_t numel() const;
};

// "tensor<2x3xf32>", "tensor<f32>" for a scalar.
std::string TensorType(const Shape& shape, ElemType type);
inline std::string TensorType(const Value& v) { return TensorType(v.shape, v.type); }

enum class Cmp { kEq, kNe, kLt, kLe, kGt, kGe };

class Builder {
 public:
  // A parameter of @main, in order. alias_output >= 0: the parameter's buffer may be donated to
  // result `alias_output` (tf.aliasing_output), which must have its shape and type.
  Value Param(Shape shape, ElemType type, int alias_output = -1);
  // SPMD: the module is partitioned over `num_partitions` devices (mhlo.num_partitions); a
  // parameter's and a result's layout over them is an XLA HloSharding string ("{replicated}",
  // "{devices=[1,4]<=[4]}"), printed as its mhlo.sharding attribute. Unset: replicated.
  void SetNumPartitions(int n) { num_partitions_ = n; }
  void ShardParam(const Value& param, std::string sharding);
  void ShardResults(std::vector<std::string> shardings) { result_shardings_ = std::move(shardings); }
  // The module text: func.func public @main(params) -> (results) returning `results`.
  std::string Module(const std::vector<Value>& results) const;

  // Constants: a splat of `v` (f32 values printed as their exact bits) and an f32 vector.
  Value Splat(double v, Shape shape, ElemType type);
  Value Vector(const std::vector<float>& v);
  Value Iota(Shape shape, ElemType type, int dim);

  // Elementwise, equal shapes: add, subtract, multiply, divide, maximum, minimum, remainder, and, or.
  Value Binary(const char* op, const Value& a, const Value& b);
  Value Add(const Value& a, const Value& b) { return Binary("add", a, b); }
  Value Sub(const Value& a, const Value& b) { return Binary("subtract", a, b); }
  Value Mul(const Value& a, const Value& b) { return Binary("multiply", a, b); }
  Value Div(const Value& a, const Value& b) { return Binary("divide", a, b); }
  Value Max(const Value& a, const Value& b) { return Binary("maximum", a, b); }
  Value And(const Value& a, const Value& b) { return Binary("and", a, b); }
  Value Or(const Value& a, const Value& b) { return Binary("or", a, b); }
  // x op scalar constant (broadcast).
  Value MulScalar(const Value& a, double s) { return Mul(a, Splat(s, a.shape, a.type)); }
  Value AddScalar(const Value& a, double s) { return Add(a, Splat(s, a.shape, a.type)); }
  // Elementwise unary: exponential, tanh, rsqrt, sqrt, cosine, sine, negate.
  Value Unary(const char* op, const Value& a);
  Value Convert(const Value& a, ElemType type);
  // bitcast_convert to `type` with `shape` (a narrower operand has an extra last dim of the ratio).
  Value Bitcast(const Value& a, ElemType type, Shape shape);
  Value Compare(const Value& a, const Value& b, Cmp dir);
  Value Select(const Value& pred, const Value& a, const Value& b);

  Value Reshape(const Value& a, Shape shape);
  Value Transpose(const Value& a, const std::vector<int64_t>& perm);
  // broadcast_in_dim: operand dim i becomes result dim dims[i].
  Value Broadcast(const Value& a, Shape shape, const std::vector<int64_t>& dims);
  Value Slice(const Value& a, const std::vector<int64_t>& start, const std::vector<int64_t>& limit);
  // dynamic_slice at scalar i32 start indices.
  Value DynamicSlice(const Value& a, const std::vector<Value>& starts, const std::vector<int64_t>& sizes);
  Value Concat(const std::vector<Value>& parts, int dim);
  // Sum or maximum over `dims` (removed from the shape).
  Value ReduceSum(const Value& a, const std::vector<int64_t>& dims) { return Reduce(a, dims, "add", 0.0); }
  Value ReduceMax(const Value& a, const std::vector<int64_t>& dims) { return Reduce(a, dims, "maximum", -std::numeric_limits<double>::infinity()); }
  // dot_general; result dims: batch, lhs free, rhs free (in order). `result`: the result's element
  // type (f32 from bf16/f16 operands: accumulated in f32); default the operands'. f32 operands ask
  // for precision HIGHEST (true f32, never TF32 or bf16 passes).
  Value Dot(const Value& lhs, const Value& rhs, const std::vector<int64_t>& lhs_batch, const std::vector<int64_t>& rhs_batch,
            const std::vector<int64_t>& lhs_contract, const std::vector<int64_t>& rhs_contract);
  Value Dot(const Value& lhs, const Value& rhs, const std::vector<int64_t>& lhs_batch, const std::vector<int64_t>& rhs_batch,
            const std::vector<int64_t>& lhs_contract, const std::vector<int64_t>& rhs_contract, ElemType result);
  // Rows of `table` [N, ...] at i32 `indices` [M] -> [M, ...] (indices clamped into range).
  Value TakeRows(const Value& table, const Value& indices);
  // Writes update rows [M, W] into `operand` [A, B, W] at (i0[m], i1[m]); rows whose index is out
  // of bounds are dropped (XLA's scatter skips out-of-bounds windows).
  Value ScatterRows2(const Value& operand, const Value& i0, const Value& i1, const Value& updates);
  // Batched forms, batch dim 0 of every operand (the gather's and scatter's batching dims): batch
  // b reads and writes only its own rows, so an SPMD partition of dim 0 stays on its device.
  // Rows of `table` [B, N, ...] at i32 `indices` [B, M] -> [B, M, ...] (clamped into range).
  Value TakeRowsBatched(const Value& table, const Value& indices);
  // Writes `updates` [B, M, W] into `operand` [B, A, C, W] at (b, i0[b, m], i1[b, m]); out-of-bounds
  // rows are dropped.
  Value ScatterRows2Batched(const Value& operand, const Value& i0, const Value& i1, const Value& updates);
  // chlo.top_k over the last dim: values and i32 indices, largest first.
  std::pair<Value, Value> TopK(const Value& a, int k);

 private:
  Value Reduce(const Value& a, const std::vector<int64_t>& dims, const char* op, double init);
  std::string NewName() { return "%" + std::to_string(next_++); }
  // A scatter's update region over scalars of `type` that keeps the update (overwrites).
  std::string OverwriteRegion(ElemType type);
  Value Emit(const std::string& op, const std::vector<Value>& operands, const std::string& attrs, Shape shape,
             ElemType type, const std::string& region = "");

  struct ParamInfo {
    Value v;
    int alias_output;
    std::string sharding;
  };
  int num_partitions_ = 1;
  std::vector<std::string> result_shardings_;
  std::vector<ParamInfo> params_;
  std::string body_;
  int next_ = 0;
};

}  // namespace g4::xla
