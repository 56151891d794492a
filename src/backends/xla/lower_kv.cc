#include "backends/xla/lower_kv.h"

#include <cfloat>
#include <cmath>

#include "base/check.h"

namespace g4::xla {

namespace {

// amax / 127 correctly rounded, as the CPU's f32 division, for finite amax >= 0. XLA may turn a
// division by a constant into a multiplication by its reciprocal, one ulp off, so the quotient q
// is replaced by whichever of q and its two neighbours c leaves the smallest |amax - 127 c|,
// computed exactly as (amax - 128 c) + c: 128 c is exact, and both subtractions are of values
// within a factor 2 of each other (Sterbenz), unless 128 c overflows (amax within 1% of FLT_MAX:
// q is kept). No quotient is halfway between two floats (amax has 24 bits), so the nearest is one.
Value DivideBy127(Builder& b, const Value& amax) {
  constexpr ElemType kF32 = ElemType::kF32, kI32 = ElemType::kI32;
  Value q = b.Div(amax, b.Splat(127, amax.shape, kF32));
  // Behind a select on the values (amax >= 0: always q), so that XLA does not fold q * 128 below
  // into amax * (128 / 127), which is not exact.
  q = b.Select(b.Compare(amax, b.Splat(0, amax.shape, kF32), Cmp::kGe), q, b.Splat(0, amax.shape, kF32));
  Value bits = b.Bitcast(q, kI32, q.shape);
  Value one = b.Splat(1, q.shape, kI32);
  auto residual = [&](const Value& c) { return b.Unary("abs", b.Add(b.Sub(amax, b.MulScalar(c, 128)), c)); };
  Value best = q, best_r = residual(q);
  // The next float up and down (bits + 1, bits - 1; at q = 0 the one down is a NaN, never nearer).
  for (const Value& c : {b.Bitcast(b.Add(bits, one), kF32, q.shape), b.Bitcast(b.Sub(bits, one), kF32, q.shape)}) {
    Value r = residual(c);
    Value nearer = b.Compare(r, best_r, Cmp::kLt);
    best = b.Select(nearer, c, best);
    best_r = b.Select(nearer, r, best_r);
  }
  return best;
}

}  // namespace

QuantizedKvRows QuantizeKvRows(Builder& b, const Value& x, int64_t heads, int64_t D, ElemType type) {
  constexpr ElemType kF32 = ElemType::kF32;
  G4_CHECK(x.type == kF32 && x.shape.size() == 2 && x.shape[1] == heads * D);
  G4_CHECK(type == ElemType::kI8 || type == ElemType::kF8E4M3FN);
  const bool fp8 = type == ElemType::kF8E4M3FN;
  const double qmax = fp8 ? 448 : 127;  // the largest stored magnitude
  const int64_t T = x.shape[0];
  const Shape rows{T, heads, D}, per_head{T, heads};
  Value x3 = b.Reshape(x, rows);
  Value ax = b.Unary("abs", x3);
  // |x| <= FLT_MAX is false for NaN and infinities alone: a head with one of them is not finite.
  Value ok = b.Compare(ax, b.Splat(FLT_MAX, rows, kF32), Cmp::kLe);
  Value bad = b.ReduceMax(b.Select(ok, b.Splat(0, rows, kF32), b.Splat(1, rows, kF32)), {2});
  Value finite = b.Compare(bad, b.Splat(0, per_head, kF32), Cmp::kEq);
  Value amax = b.ReduceMax(b.Select(ok, ax, b.Splat(0, rows, kF32)), {2});  // [T, heads], finite
  Value nonzero = b.Compare(amax, b.Splat(0, per_head, kF32), Cmp::kGt);
  // fp8 matches no other backend's bits: a plain division.
  Value quotient = fp8 ? b.Div(amax, b.Splat(qmax, per_head, kF32)) : DivideBy127(b, amax);
  Value scale = b.Select(finite, quotient, b.Splat(NAN, per_head, kF32));
  // inv = qmax / amax where amax > 0 (1 elsewhere: those heads' q are zeroed below).
  Value inv = b.Div(b.Splat(qmax, per_head, kF32), b.Select(nonzero, amax, b.Splat(1, per_head, kF32)));
  Value r = b.Mul(x3, b.Broadcast(inv, rows, {0, 1}));
  if (!fp8) r = b.Unary("round_nearest_even", r);  // fp8: the convert rounds (to nearest even)
  // A product one rounding above qmax is clamped (an f8E4M3FN convert would make it NaN).
  r = b.Binary("minimum", b.Max(r, b.Splat(-qmax, rows, kF32)), b.Splat(qmax, rows, kF32));
  Value keep = b.Broadcast(b.And(finite, nonzero), rows, {0, 1});
  r = b.Select(keep, r, b.Splat(0, rows, kF32));
  return {b.Reshape(b.Convert(r, type), {T, heads * D}), scale};
}

}  // namespace g4::xla
