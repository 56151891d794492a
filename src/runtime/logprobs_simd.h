// SIMD passes over one row of logits for ComputeLogprobs (runtime/sampler.h), written once with
// Google Highway and dispatched to the best target the CPU has (logprobs_simd.cc): a request with
// logprobs costs three passes over the vocabulary per generated token (262144 logits for Gemma),
// on the scheduler thread that every other request's step waits on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace g4 {

// The largest of x[0, n) into *max (n >= 1). Returns false, with *max unspecified, when a NaN or
// +inf is among them.
bool LogitsMax(const float* x, size_t n, float* max);

// sum_i exp(x[i] - shift) for x[i] <= shift, each term as f32 (Highway's Exp, ~1 ulp; a
// difference below -87 counts as exp(-87) = 1.6e-38, so -inf adds nothing a sum >= 1 holds),
// summed in f32 vectors over blocks of 256 vectors and the blocks in double.
double SumExpShifted(const float* x, size_t n, float shift);

// The k best of x[0, n) as (value, index), value descending, equal values by index ascending;
// k <= n, NaN-free input. A block of lanes none above the k-th best so far is skipped with one
// vector compare.
std::vector<std::pair<float, int32_t>> TopLogits(const float* x, size_t n, size_t k);

}  // namespace g4
