// The bf16 KV cache's attention on the CPU's bf16 dot-product instruction (x86: AVX512_BF16
// `vdpbf16ps`, Zen 4 and Cooper Lake / Sapphire Rapids on): pieces of attention_hwy.cc's kernel
// (AttentionPartial) for a KV cache of DType::kBF16, which it calls per tile where
// HasBf16Attention() and D is a multiple of 32.
//
// Arithmetic (the instruction's, from Intel's SDM): each instruction multiplies 32 pairs of bf16
// (exact in f32) and adds them into 16 f32 lanes, lane i += a[2i+1] b[2i+1] then += a[2i] b[2i]
// (each add rounded to nearest even; bf16 inputs and f32 results below 2^-126 taken as zero).
// That is twice the multiply-adds of an f32 FMA per instruction, and the K and V rows need no
// widening: about half the time of the f16 cache's f32 kernel for a tile's score pass and V sums
// from cache (docs/PERFORMANCE.md). The queries
// and the softmax weights are rounded to bf16 first (as transformers' attention in bf16 does; it also
// rounds the scores and the output);
// the running maximum, the sums and the rescaling stay f32.
//
// Score pass: per key, 16 lanes of pair sums per 32 elements of D, summed across lanes by a
// fixed tree (16 scores of a register block at once). V sums: two keys per instruction (the V
// rows of keys 2i and 2i+1 of a tile interleaved element by element, the weights as bf16 pairs),
// into accumulators whose lanes hold a fixed permutation of each 32 elements of D (the
// interleave's order); Bf16AccToNatural restores it at the end of a call. A tile pairs its keys
// by their index in the tile, whatever runs (cache, ring wrap, step rows) they come from, so the
// bits do not depend on where the cache ends (attention.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace g4::cpu {

// The rows after a KV run's current tile, prefetched into L2 one 64-byte line per Step() while
// the V sums compute (attention_hwy.cc). row: the next row's slice; line: the next line's offset
// in it; slice: its bytes; rows: rows left; stride: bytes between rows. Addresses only prefetched
// (a prefetch never faults, x86 or Arm), never dereferenced.
struct NextRows {
  uintptr_t row;
  size_t line, slice, rows, stride;
  inline void Step() {
    if (rows == 0) return;
    __builtin_prefetch(reinterpret_cast<const void*>(row + line), 0, 2);
    line += 64;
    if (line >= slice) {
      line = 0;
      row += stride;
      --rows;
    }
  }
};

// Whether this build and CPU run the functions below (x86-64 with AVX512_BF16; false elsewhere).
bool HasBf16Attention();

// Keys per tile; attention_hwy.cc's kTile.
constexpr int kBf16TileKeys = 64;

// Scores of a head block over nk keys of one run: s[h * kBf16TileKeys + j] = sum_d qb[h * D + d] *
// k_j[d] for h < H (1..8), j < nk, by the arithmetic above. qb: H rows of D bf16 (D a multiple
// of 32); k: nk bf16 rows at stride ld elements. Prefetches into L2 the K rows 12 keys ahead (past
// the run's end: the rows that follow it) and these keys' V rows at v (same stride).
void Bf16Scores(const uint16_t* qb, int H, int D, const uint16_t* k, const uint16_t* v, int64_t ld, int nk, float* s);

// w[h * (kBf16TileKeys / 2) + i] = the weights of keys 2i and 2i + 1 of head h as bf16 (key 2i in
// the low half), from p[h * kBf16TileKeys + j] (f32, round to nearest even), for h < G and
// i < ceil(nk / 2); a missing key 2i + 1 (nk odd) weighs 0.
void Bf16PackWeights(const float* p, int G, int nk, uint32_t* w);

// acc_h += sum_j p_h,j v_j for h < H (1..8) and the tile's keys j < nk, in pairs (2i, 2i + 1), as
// above: w from Bf16PackWeights (head h's pairs at w + h * kBf16TileKeys / 2), vrows[j] key j's V
// row (bf16, this KV head's D elements, D a multiple of 32); acc: head h's D floats at acc + h * D
// in the permuted order. Steps next_k twice per key pair and 32 elements.
void Bf16AccumulateV(const uint32_t* w, int H, int D, const uint16_t* const* vrows, int nk, float* acc,
                     NextRows* next_k);

// acc [G, D] from the permuted order of Bf16AccumulateV to the natural one.
void Bf16AccToNatural(float* acc, int G, int D);

}  // namespace g4::cpu
