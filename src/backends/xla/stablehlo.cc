#include "backends/xla/stablehlo.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "base/check.h"

namespace g4::xla {
namespace {

std::string Join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}
std::string I64Array(const std::vector<int64_t>& v) { return v.empty() ? "array<i64>" : "array<i64: " + Join(v) + ">"; }
std::string List(const std::vector<int64_t>& v) { return "[" + Join(v) + "]"; }

// An f32 as MLIR's hexadecimal literal of its bits: exact, and covers infinities.
std::string F32Literal(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08" PRIX32, bits);
  return buf;
}

bool IsFloat(ElemType t) { return t == ElemType::kF32 || t == ElemType::kF16 || t == ElemType::kBF16; }

}  // namespace

const char* ElemTypeName(ElemType t) {
  switch (t) {
    case ElemType::kF32: return "f32";
    case ElemType::kF16: return "f16";
    case ElemType::kBF16: return "bf16";
    case ElemType::kI32: return "i32";
    case ElemType::kI8: return "i8";
    case ElemType::kU8: return "ui8";
    case ElemType::kPred: return "i1";
    case ElemType::kF8E4M3FN: return "f8E4M3FN";
  }
  return "?";
}

int64_t Value::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorType(const Shape& shape, ElemType type) {
  std::string s = "tensor<";
  for (int64_t d : shape) s += std::to_string(d) + "x";
  return s + ElemTypeName(type) + ">";
}

Value Builder::Param(Shape shape, ElemType type, int alias_output) {
  Value v{"%p" + std::to_string(params_.size()), std::move(shape), type};
  params_.push_back({v, alias_output, {}});
  return v;
}

void Builder::ShardParam(const Value& param, std::string sharding) {
  for (ParamInfo& p : params_)
    if (p.v.name == param.name) p.sharding = std::move(sharding);
}

std::string Builder::Module(const std::vector<Value>& results) const {
  std::string s = "module @g4_step";
  if (num_partitions_ > 1)
    s += " attributes {mhlo.num_partitions = " + std::to_string(num_partitions_) + " : i32, mhlo.num_replicas = 1 : i32}";
  s += " {\n  func.func public @main(";
  for (size_t i = 0; i < params_.size(); ++i) {
    s += (i ? ", " : "") + params_[i].v.name + ": " + TensorType(params_[i].v);
    std::string attrs;
    if (params_[i].alias_output >= 0) attrs = "tf.aliasing_output = " + std::to_string(params_[i].alias_output) + " : i32";
    if (!params_[i].sharding.empty()) attrs += (attrs.empty() ? "" : ", ") + std::string("mhlo.sharding = \"") + params_[i].sharding + "\"";
    if (!attrs.empty()) s += " {" + attrs + "}";
  }
  s += ") -> (";
  std::string names, types, result_types;
  for (size_t i = 0; i < results.size(); ++i) {
    types += (i ? ", " : "") + TensorType(results[i]);
    result_types += (i ? ", " : "") + TensorType(results[i]);
    if (i < result_shardings_.size() && !result_shardings_[i].empty())
      result_types += " {mhlo.sharding = \"" + result_shardings_[i] + "\"}";
    names += (i ? ", " : "") + results[i].name;
  }
  s += result_types + ") {\n" + body_;
  s += "    \"func.return\"(" + names + ") : (" + types + ") -> ()\n  }\n}\n";
  return s;
}

Value Builder::Emit(const std::string& op, const std::vector<Value>& operands, const std::string& attrs, Shape shape,
                    ElemType type, const std::string& region) {
  Value v{NewName(), std::move(shape), type};
  std::string names, types;
  for (size_t i = 0; i < operands.size(); ++i) {
    names += (i ? ", " : "") + operands[i].name;
    types += (i ? ", " : "") + TensorType(operands[i]);
  }
  body_ += "    " + v.name + " = \"" + op + "\"(" + names + ")" + (region.empty() ? "" : " (" + region + ")") +
           (attrs.empty() ? "" : " {" + attrs + "}") + " : (" + types + ") -> " + TensorType(v) + "\n";
  return v;
}

Value Builder::Splat(double v, Shape shape, ElemType type) {
  std::string lit;
  ElemType ct = type;
  if (IsFloat(type)) {
    lit = F32Literal(static_cast<float>(v));
    ct = ElemType::kF32;
  } else if (type == ElemType::kPred) {
    lit = v != 0 ? "true" : "false";
  } else {
    lit = std::to_string(static_cast<int64_t>(v));
  }
  Value c = Emit("stablehlo.constant", {}, "value = dense<" + lit + "> : " + TensorType(shape, ct), shape, ct);
  return ct == type ? c : Convert(c, type);
}

Value Builder::Vector(const std::vector<float>& v) {
  std::string lit;
  for (size_t i = 0; i < v.size(); ++i) lit += (i ? ", " : "") + F32Literal(v[i]);
  const Shape shape{static_cast<int64_t>(v.size())};
  return Emit("stablehlo.constant", {}, "value = dense<[" + lit + "]> : " + TensorType(shape, ElemType::kF32), shape,
              ElemType::kF32);
}

Value Builder::Iota(Shape shape, ElemType type, int dim) {
  return Emit("stablehlo.iota", {}, "iota_dimension = " + std::to_string(dim) + " : i64", std::move(shape), type);
}

Value Builder::Binary(const char* op, const Value& a, const Value& b) {
  G4_CHECK(a.shape == b.shape && a.type == b.type);
  return Emit(std::string("stablehlo.") + op, {a, b}, "", a.shape, a.type);
}

Value Builder::Unary(const char* op, const Value& a) { return Emit(std::string("stablehlo.") + op, {a}, "", a.shape, a.type); }

Value Builder::Convert(const Value& a, ElemType type) {
  if (a.type == type) return a;
  return Emit("stablehlo.convert", {a}, "", a.shape, type);
}

Value Builder::Bitcast(const Value& a, ElemType type, Shape shape) {
  return Emit("stablehlo.bitcast_convert", {a}, "", std::move(shape), type);
}

Value Builder::Compare(const Value& a, const Value& b, Cmp dir) {
  G4_CHECK(a.shape == b.shape && a.type == b.type);
  static const char* kDir[] = {"EQ", "NE", "LT", "LE", "GT", "GE"};
  return Emit("stablehlo.compare", {a, b},
              std::string("comparison_direction = #stablehlo<comparison_direction ") + kDir[static_cast<int>(dir)] + ">",
              a.shape, ElemType::kPred);
}

Value Builder::Select(const Value& pred, const Value& a, const Value& b) {
  G4_CHECK(pred.shape == a.shape && a.shape == b.shape && a.type == b.type && pred.type == ElemType::kPred);
  return Emit("stablehlo.select", {pred, a, b}, "", a.shape, a.type);
}

Value Builder::Reshape(const Value& a, Shape shape) {
  Value probe{"", shape, a.type};
  G4_CHECK(probe.numel() == a.numel());
  if (shape == a.shape) return a;
  return Emit("stablehlo.reshape", {a}, "", std::move(shape), a.type);
}

Value Builder::Transpose(const Value& a, const std::vector<int64_t>& perm) {
  G4_CHECK(perm.size() == a.shape.size());
  Shape shape;
  for (int64_t p : perm) shape.push_back(a.shape[p]);
  return Emit("stablehlo.transpose", {a}, "permutation = " + I64Array(perm), shape, a.type);
}

Value Builder::Broadcast(const Value& a, Shape shape, const std::vector<int64_t>& dims) {
  G4_CHECK(dims.size() == a.shape.size());
  for (size_t i = 0; i < dims.size(); ++i) G4_CHECK(a.shape[i] == 1 || a.shape[i] == shape[dims[i]]);
  if (shape == a.shape) return a;
  return Emit("stablehlo.broadcast_in_dim", {a}, "broadcast_dimensions = " + I64Array(dims), std::move(shape), a.type);
}

Value Builder::Slice(const Value& a, const std::vector<int64_t>& start, const std::vector<int64_t>& limit) {
  G4_CHECK(start.size() == a.shape.size() && limit.size() == a.shape.size());
  Shape shape;
  for (size_t i = 0; i < start.size(); ++i) {
    G4_CHECK(0 <= start[i] && start[i] <= limit[i] && limit[i] <= a.shape[i]);
    shape.push_back(limit[i] - start[i]);
  }
  if (shape == a.shape) return a;
  return Emit("stablehlo.slice", {a},
              "start_indices = " + I64Array(start) + ", limit_indices = " + I64Array(limit) +
                  ", strides = " + I64Array(std::vector<int64_t>(start.size(), 1)),
              shape, a.type);
}

Value Builder::DynamicSlice(const Value& a, const std::vector<Value>& starts, const std::vector<int64_t>& sizes) {
  G4_CHECK(starts.size() == a.shape.size() && sizes.size() == a.shape.size());
  std::vector<Value> ops{a};
  for (const Value& s : starts) {
    G4_CHECK(s.shape.empty() && s.type == ElemType::kI32);
    ops.push_back(s);
  }
  return Emit("stablehlo.dynamic_slice", ops, "slice_sizes = " + I64Array(sizes), sizes, a.type);
}

Value Builder::Concat(const std::vector<Value>& parts, int dim) {
  G4_CHECK(!parts.empty());
  Shape shape = parts[0].shape;
  shape[dim] = 0;
  for (const Value& p : parts) {
    G4_CHECK(p.shape.size() == shape.size() && p.type == parts[0].type);
    shape[dim] += p.shape[dim];
  }
  if (parts.size() == 1) return parts[0];
  return Emit("stablehlo.concatenate", parts, "dimension = " + std::to_string(dim) + " : i64", shape, parts[0].type);
}

Value Builder::Reduce(const Value& a, const std::vector<int64_t>& dims, const char* op, double init) {
  const Value init_v = Splat(init, {}, a.type);
  Shape shape;
  for (size_t i = 0; i < a.shape.size(); ++i) {
    bool reduced = false;
    for (int64_t d : dims) reduced |= d == static_cast<int64_t>(i);
    if (!reduced) shape.push_back(a.shape[i]);
  }
  const std::string st = TensorType({}, a.type);
  const std::string x = NewName(), y = NewName(), r = NewName();
  const std::string region = "{\n    ^bb0(" + x + ": " + st + ", " + y + ": " + st + "):\n      " + r + " = \"stablehlo." + op +
                             "\"(" + x + ", " + y + ") : (" + st + ", " + st + ") -> " + st + "\n      \"stablehlo.return\"(" +
                             r + ") : (" + st + ") -> ()\n    }";
  return Emit("stablehlo.reduce", {a, init_v}, "dimensions = " + I64Array(dims), shape, a.type, region);
}

Value Builder::Dot(const Value& lhs, const Value& rhs, const std::vector<int64_t>& lb, const std::vector<int64_t>& rb,
                   const std::vector<int64_t>& lc, const std::vector<int64_t>& rc) {
  return Dot(lhs, rhs, lb, rb, lc, rc, lhs.type);
}

Value Builder::Dot(const Value& lhs, const Value& rhs, const std::vector<int64_t>& lb, const std::vector<int64_t>& rb,
                   const std::vector<int64_t>& lc, const std::vector<int64_t>& rc, ElemType result) {
  G4_CHECK(lb.size() == rb.size() && lc.size() == rc.size() && lhs.type == rhs.type && IsFloat(result));
  auto in = [](const std::vector<int64_t>& v, int64_t d) {
    for (int64_t x : v)
      if (x == d) return true;
    return false;
  };
  Shape shape;
  for (size_t i = 0; i < lb.size(); ++i) {
    G4_CHECK(lhs.shape[lb[i]] == rhs.shape[rb[i]]);
    shape.push_back(lhs.shape[lb[i]]);
  }
  for (size_t i = 0; i < lc.size(); ++i) G4_CHECK(lhs.shape[lc[i]] == rhs.shape[rc[i]]);
  for (int64_t d = 0; d < static_cast<int64_t>(lhs.shape.size()); ++d)
    if (!in(lb, d) && !in(lc, d)) shape.push_back(lhs.shape[d]);
  for (int64_t d = 0; d < static_cast<int64_t>(rhs.shape.size()); ++d)
    if (!in(rb, d) && !in(rc, d)) shape.push_back(rhs.shape[d]);
  std::string dn = "dot_dimension_numbers = #stablehlo.dot<";
  std::vector<std::string> parts;
  if (!lb.empty()) parts.push_back("lhs_batching_dimensions = " + List(lb));
  if (!rb.empty()) parts.push_back("rhs_batching_dimensions = " + List(rb));
  parts.push_back("lhs_contracting_dimensions = " + List(lc));
  parts.push_back("rhs_contracting_dimensions = " + List(rc));
  for (size_t i = 0; i < parts.size(); ++i) dn += (i ? ", " : "") + parts[i];
  dn += ">";
  if (lhs.type == ElemType::kF32)
    dn += ", precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]";
  return Emit("stablehlo.dot_general", {lhs, rhs}, dn, shape, result);
}

Value Builder::TakeRows(const Value& table, const Value& indices) {
  G4_CHECK(indices.shape.size() == 1 && indices.type == ElemType::kI32 && !table.shape.empty());
  const int64_t m = indices.shape[0];
  Value idx = Reshape(indices, {m, 1});
  Shape shape{m};
  std::vector<int64_t> offset_dims, sizes{1};
  for (size_t i = 1; i < table.shape.size(); ++i) {
    shape.push_back(table.shape[i]);
    offset_dims.push_back(static_cast<int64_t>(i));
    sizes.push_back(table.shape[i]);
  }
  return Emit("stablehlo.gather", {table, idx},
              "dimension_numbers = #stablehlo.gather<offset_dims = " + List(offset_dims) +
                  ", collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = " +
                  I64Array(sizes) + ", indices_are_sorted = false",
              shape, table.type);
}

std::string Builder::OverwriteRegion(ElemType type) {
  const std::string st = TensorType({}, type);
  const std::string x = NewName(), y = NewName();
  return "{\n    ^bb0(" + x + ": " + st + ", " + y + ": " + st + "):\n      \"stablehlo.return\"(" + y + ") : (" + st +
         ") -> ()\n    }";
}

Value Builder::ScatterRows2(const Value& operand, const Value& i0, const Value& i1, const Value& updates) {
  G4_CHECK(operand.shape.size() == 3 && updates.shape.size() == 2 && updates.shape[1] == operand.shape[2] &&
           updates.type == operand.type && i0.shape == Shape{updates.shape[0]} && i1.shape == i0.shape);
  const int64_t m = updates.shape[0];
  Value idx = Concat({Reshape(i0, {m, 1}), Reshape(i1, {m, 1})}, 1);
  return Emit("stablehlo.scatter", {operand, idx, updates},
              "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0, 1], "
              "scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 1>, indices_are_sorted = false, "
              "unique_indices = false",
              operand.shape, operand.type, OverwriteRegion(operand.type));
}

Value Builder::TakeRowsBatched(const Value& table, const Value& indices) {
  G4_CHECK(indices.shape.size() == 2 && indices.type == ElemType::kI32 && table.shape.size() >= 2 &&
           table.shape[0] == indices.shape[0]);
  const int64_t B = indices.shape[0], m = indices.shape[1];
  Value idx = Reshape(indices, {B, m, 1});
  Shape shape{B, m};
  std::vector<int64_t> offset_dims, sizes{1, 1};
  for (size_t i = 2; i < table.shape.size(); ++i) {
    shape.push_back(table.shape[i]);
    offset_dims.push_back(static_cast<int64_t>(i));
    sizes.push_back(table.shape[i]);
  }
  return Emit("stablehlo.gather", {table, idx},
              "dimension_numbers = #stablehlo.gather<offset_dims = " + List(offset_dims) +
                  ", collapsed_slice_dims = [1], operand_batching_dims = [0], start_indices_batching_dims = [0], "
                  "start_index_map = [1], index_vector_dim = 2>, slice_sizes = " +
                  I64Array(sizes) + ", indices_are_sorted = false",
              shape, table.type);
}

Value Builder::ScatterRows2Batched(const Value& operand, const Value& i0, const Value& i1, const Value& updates) {
  G4_CHECK(operand.shape.size() == 4 && updates.shape.size() == 3 && updates.shape[0] == operand.shape[0] &&
           updates.shape[2] == operand.shape[3] && updates.type == operand.type &&
           i0.shape == (Shape{updates.shape[0], updates.shape[1]}) && i1.shape == i0.shape);
  const int64_t B = updates.shape[0], m = updates.shape[1];
  Value idx = Concat({Reshape(i0, {B, m, 1}), Reshape(i1, {B, m, 1})}, 2);
  return Emit("stablehlo.scatter", {operand, idx, updates},
              "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [2], inserted_window_dims = [1, 2], "
              "input_batching_dims = [0], scatter_indices_batching_dims = [0], scatter_dims_to_operand_dims = [1, 2], "
              "index_vector_dim = 2>, indices_are_sorted = false, unique_indices = false",
              operand.shape, operand.type, OverwriteRegion(operand.type));
}

std::pair<Value, Value> Builder::TopK(const Value& a, int k) {
  Shape shape = a.shape;
  shape.back() = k;
  const std::string name = NewName();
  body_ += "    " + name + ":2 = \"chlo.top_k\"(" + a.name + ") {k = " + std::to_string(k) + " : i64} : (" + TensorType(a) +
           ") -> (" + TensorType(shape, a.type) + ", " + TensorType(shape, ElemType::kI32) + ")\n";
  return {Value{name + "#0", shape, a.type}, Value{name + "#1", shape, ElemType::kI32}};
}

}  // namespace g4::xla
