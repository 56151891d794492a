// Scalar attention reference, the key runs, the split-K merge and the threaded driver of the SIMD
// kernel (attention_hwy.cc). See attention.h.
#include "backends/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "backends/cpu/kernels_bf16.h"
#include "base/check.h"
#include "base/thread_pool.h"
#include "tensor/dtype.h"

namespace g4::cpu {

namespace {
// Every item's keys are cut into chunks (by index from the item's first key), each chunk's
// softmax state is computed on its own and the states are merged in order, whether one thread
// runs the item or several share it: a token's output is then the same bits whatever the thread
// count, the batch, or where the cache ends and the step begins (chunked prefill). The chunk
// length depends only on the item's key count n, which none of those change: 64 keys (the
// kernel's tile) below 2048 keys, so that a decode step of 65-128 keys is already split between
// two threads; from 2048, 64 * (n / 1024) keys, at most 512, which keeps 16-32 chunks up to 16K
// keys. Each chunk's state (G * D floats of acc) is written and read back by the merge, so chunks
// grow with n: at 4000 keys of the E2B's full layers (D 512, G 8) they are 192 keys (21 chunks),
// not 63 chunks of 64 whose merge would take a large share of the call.
constexpr int kTileKeys = 64;
// Split-K merges reading fewer floats of state than this run on the calling thread (waking the
// pool costs more than they do: a sliding layer's 512 keys at D 256, G 8 are 16K floats).
constexpr int64_t kParallelMergeFloats = int64_t{1} << 16;
int ChunkKeys(int keys) { return kTileKeys * std::clamp(keys / 1024, 1, 8); }
int ChunksOf(int keys) { return (keys + ChunkKeys(keys) - 1) / ChunkKeys(keys); }
}  // namespace

int AttentionKeyRuns(const AttentionParams& p, const AttentionStep& s, int t, int kvh, KvRun* runs, int* num_runs) {
  const int64_t ld = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
  const int64_t off = static_cast<int64_t>(kvh) * p.head_dim;
  const int pos = s.positions[t];
  const int first = s.seq_first[t];
  const int start = s.positions[first];
  const int lo = p.window > 0 ? std::max(0, pos - p.window + 1) : 0;
  int n = 0;
  // Rows `row` .. row + count - 1 of K at k and V at v (elements of `type`; i8: scales at ks, vs).
  auto add = [&](const void* k, const void* v, int64_t row, int count, DType type, const float* ks, const float* vs) {
    const int group = type == DType::kI8 ? p.head_dim : 0;
    if (count > 0) runs[n++] = KvRun{k, v, 0, type, ks, vs, group}.Offset(row * ld + off, count);
  };
  const bool i8 = s.cache_type == DType::kI8;
  const float* cks = i8 ? s.k_scale_cache[t] : nullptr;
  const float* cvs = i8 ? s.v_scale_cache[t] : nullptr;
  // Cache: positions lo .. start - 1.
  const int cache_end = std::min(start, pos + 1);
  if (lo < cache_end) {
    const int slot = s.ring ? lo % s.slots : lo;
    const int count = cache_end - lo;
    const int first_part = s.ring ? std::min(count, s.slots - slot) : count;
    add(s.k_cache[t], s.v_cache[t], slot, first_part, s.cache_type, cks, cvs);
    add(s.k_cache[t], s.v_cache[t], 0, count - first_part, s.cache_type, cks, cvs);  // the ring's wrap
  }
  // Step: positions max(lo, start) .. pos, rows first + (j - start).
  const int j0 = std::max(lo, start);
  const int64_t row = first + (j0 - start);
  add(s.k, s.v, row, pos - j0 + 1, s.step_type, s.k_scale, s.v_scale);
  *num_runs = n;
  return pos - lo + 1;
}

int SliceKeyRuns(const KvRun* runs, int num_runs, int begin, int end, int64_t ld, KvRun* out) {
  int n = 0, base = 0;
  for (int r = 0; r < num_runs; ++r) {
    const int b = std::max(begin, base), e = std::min(end, base + runs[r].n);
    if (b < e) out[n++] = runs[r].Offset(static_cast<int64_t>(b - base) * ld, e - b);
    base += runs[r].n;
  }
  return n;
}

namespace {
// One head's softmax state (m, l, acc [D]) folded into the running state (rm, rl, racc [D]): both
// rescaled to the larger maximum, then added. The one routine for every fold (not inlined), so
// a fold is the same operations wherever it runs: the whole-item path folds each chunk as it is
// computed, the split-K merge folds the chunks' stored states in the same order, and their
// outputs are the same bits.
__attribute__((noinline)) void FoldHead(int D, float m, float l, const float* acc, float* rm, float* rl, float* racc) {
  const float mx = std::max(*rm, m);
  const float a = SoftmaxWeight(*rm - mx), b = SoftmaxWeight(m - mx);
  *rl = *rl * a + l * b;
  for (int d = 0; d < D; ++d) racc[d] = racc[d] * a + acc[d] * b;
  *rm = mx;
}

// out [D] = acc / l: a head's folded state normalised.
void FinishHead(int D, float l, const float* acc, float* out) {
  const float inv = 1.0f / l;
  for (int d = 0; d < D; ++d) out[d] = acc[d] * inv;
}
}  // namespace

void AttentionMerge(int G, int D, int parts, const float* m, const float* l, const float* acc, float* out) {
  std::vector<float> racc(static_cast<size_t>(D));
  for (int g = 0; g < G; ++g) {
    float rm = m[g], rl = l[g];
    std::copy(acc + static_cast<size_t>(g) * D, acc + static_cast<size_t>(g + 1) * D, racc.begin());
    for (int c = 1; c < parts; ++c)
      FoldHead(D, m[c * G + g], l[c * G + g], acc + (static_cast<size_t>(c) * G + g) * D, &rm, &rl, racc.data());
    FinishHead(D, rl, racc.data(), out + static_cast<size_t>(g) * D);
  }
}

void ToKvType(DType type, const float* x, int64_t n, void* out) {
  switch (type) {
    case DType::kF32: std::copy(x, x + n, static_cast<float*>(out)); return;
    case DType::kF16: return ToF16(x, n, static_cast<uint16_t*>(out));
    case DType::kBF16: return ConvertRowsToBf16(x, 1, static_cast<int>(n), static_cast<uint16_t*>(out));
    default: G4_CHECK(false && "not a KV cache type");
  }
}

void QuantizeKvRow(const float* x, int heads, int D, int8_t* q, float* scale) {
  for (int h = 0; h < heads; ++h) {
    const float* xh = x + static_cast<size_t>(h) * D;
    int8_t* qh = q + static_cast<size_t>(h) * D;
    float amax = 0.0f;
    bool finite = true;
    for (int d = 0; d < D; ++d) {
      finite = finite && std::isfinite(xh[d]);
      amax = std::max(amax, std::abs(xh[d]));
    }
    if (!finite || amax == 0.0f) {
      std::fill(qh, qh + D, int8_t{0});
      scale[h] = finite ? 0.0f : NAN;
      continue;
    }
    const float inv = 127.0f / amax;
    scale[h] = amax / 127.0f;
    // |x * inv| <= 127 (x * inv rounds to at most 127 for x = amax); the clamp guards it anyway.
    for (int d = 0; d < D; ++d) qh[d] = static_cast<int8_t>(std::clamp(std::nearbyint(xh[d] * inv), -127.0f, 127.0f));
  }
}

void Attention(const AttentionParams& p, const AttentionStep& s, ThreadPool* pool, AttentionScratch* scratch) {
  const int D = p.head_dim, Nq = p.num_heads, Nkv = p.num_kv_heads;
  G4_CHECK(Nkv > 0 && Nq % Nkv == 0 && D > 0);
  // The kernel decides bf16 arithmetic by the rows' type (attention.h): both bf16 or neither; i8
  // rows come with their scales.
  G4_CHECK((s.cache_type == DType::kBF16) == (s.step_type == DType::kBF16));
  G4_CHECK((s.cache_type == DType::kI8) == (s.step_type == DType::kI8));
  G4_CHECK(s.cache_type != DType::kI8 || (s.k_scale != nullptr && s.v_scale != nullptr && s.k_scale_cache != nullptr &&
                                          s.v_scale_cache != nullptr));
  const int G = Nq / Nkv;
  const int64_t ld = static_cast<int64_t>(Nkv) * D;
  const int items = s.tokens * Nkv;
  const int threads = pool != nullptr ? pool->size() : 1;
  auto q_of = [&](int t, int kvh) { return s.q + (static_cast<size_t>(t) * Nq + kvh * G) * D; };
  auto out_of = [&](int t, int kvh) { return s.out + (static_cast<size_t>(t) * Nq + kvh * G) * D; };
  // fn over [0, n) on the pool, or on the calling thread where there is none or !parallel.
  auto for_each = [&](int64_t n, const std::function<void(int, int64_t, int64_t)>& fn, bool parallel = true) {
    if (pool != nullptr && parallel) {
      pool->ParallelFor(n, fn);
    } else if (n > 0) {
      fn(0, 0, n);
    }
  };

  const size_t gd = static_cast<size_t>(G) * D;
  // Chunk c of item `item` (keys [c * ChunkKeys(n), ...) of its n keys) into m/l/acc.
  auto chunk_state = [&](int item, int c, float* m, float* l, float* acc) {
    const int t = item / Nkv, kvh = item % Nkv;
    KvRun runs[3], part[3];
    int nr;
    const int n = AttentionKeyRuns(p, s, t, kvh, runs, &nr);
    const int ck = ChunkKeys(n);
    const int np = SliceKeyRuns(runs, nr, c * ck, std::min(n, (c + 1) * ck), ld, part);
    AttentionPartial(q_of(t, kvh), G, D, part, np, ld, p.scale, p.softcap, m, l, acc);
  };
  auto keys_of = [&](int item) {
    KvRun runs[3];
    int nr;
    return AttentionKeyRuns(p, s, item / Nkv, item % Nkv, runs, &nr);
  };

  if (items >= threads) {
    // Whole items, zig-zag order (see attention.h): a thread runs an item's chunks in order, each
    // folded into the item's running state as soon as it is computed (two states per thread, not
    // one per chunk: 21 chunks of 4 heads x 256 at 4000 keys held ~150 KB per thread).
    for_each(items, [&](int, int64_t b, int64_t e) {
      thread_local std::vector<float> state;
      const size_t one = 2 * static_cast<size_t>(G) + gd;  // m [G], l [G], acc [G, D]
      if (state.size() < 2 * one) state.resize(2 * one);
      float* rm = state.data();
      float* rl = rm + G;
      float* racc = rl + G;
      float* cm = state.data() + one;
      float* cl = cm + G;
      float* cacc = cl + G;
      for (int64_t z = b; z < e; ++z) {
        const int item = static_cast<int>(z % 2 == 0 ? z / 2 : items - 1 - z / 2);
        const int chunks = ChunksOf(keys_of(item));
        chunk_state(item, 0, rm, rl, racc);
        for (int c = 1; c < chunks; ++c) {
          chunk_state(item, c, cm, cl, cacc);
          for (int g = 0; g < G; ++g) FoldHead(D, cm[g], cl[g], cacc + g * D, rm + g, rl + g, racc + g * D);
        }
        float* out = out_of(item / Nkv, item % Nkv);
        for (int g = 0; g < G; ++g) FinishHead(D, rl[g], racc + g * D, out + g * D);
      }
    });
    return;
  }

  // Split-K: the chunks of all items are spread over the threads, then each item's are merged.
  // Where that still leaves a thread idle (decode of fewer chunks than threads), each chunk's
  // G heads are also cut into head groups: a head's scores, softmax and output do not depend on
  // which other heads share its call, so the bits stay the same.
  std::vector<int64_t>& units = scratch->units;
  units.clear();
  int chunks_total = 0;
  for (int item = 0; item < items; ++item) chunks_total += ChunksOf(keys_of(item));
  const int head_groups = std::min(G, (threads + chunks_total - 1) / std::max(1, chunks_total));
  for (int item = 0; item < items; ++item) {
    const int chunks = ChunksOf(keys_of(item));
    for (int h = 0; h < head_groups; ++h) {
      for (int c = 0; c < chunks; ++c) {
        units.push_back(item);
        units.push_back(c);
        units.push_back(G * h / head_groups);        // first head
        units.push_back(G * (h + 1) / head_groups);  // end head
      }
    }
  }
  const int num_units = static_cast<int>(units.size() / 4);
  // State: m [units, G], l [units, G], acc [units, G, D]; an (item, head group)'s chunks are
  // consecutive units.
  const size_t need = num_units * (2 * static_cast<size_t>(G) + gd);
  if (scratch->state.size() < need) scratch->state.resize(need);
  float* m = scratch->state.data();
  float* l = m + static_cast<size_t>(num_units) * G;
  float* acc = l + static_cast<size_t>(num_units) * G;
  auto unit_state = [&](int64_t u) {
    const int item = static_cast<int>(units[4 * u]), c = static_cast<int>(units[4 * u + 1]);
    const int h0 = static_cast<int>(units[4 * u + 2]), h1 = static_cast<int>(units[4 * u + 3]);
    const int t = item / Nkv, kvh = item % Nkv;
    KvRun runs[3], part[3];
    int nr;
    const int n = AttentionKeyRuns(p, s, t, kvh, runs, &nr);
    const int ck = ChunkKeys(n);
    const int np = SliceKeyRuns(runs, nr, c * ck, std::min(n, (c + 1) * ck), ld, part);
    AttentionPartial(q_of(t, kvh) + static_cast<size_t>(h0) * D, h1 - h0, D, part, np, ld, p.scale, p.softcap,
                     m + u * G, l + u * G, acc + u * gd);
  };
  for_each(num_units, [&](int, int64_t b, int64_t e) {
    for (int64_t u = b; u < e; ++u) unit_state(u);
  });
  // The merges, one per item and query head, over the pool too where they read at least
  // kParallelMergeFloats of state (a head's merge does not depend on the others'): an (item, head
  // group)'s chunks are the units u0 .. u1 - 1.
  std::vector<int64_t>& merges = scratch->merges;  // per head: first unit, end unit, head
  merges.clear();
  for (int u0 = 0; u0 < num_units;) {
    int u1 = u0;
    while (u1 < num_units && units[4 * u1] == units[4 * u0] && units[4 * u1 + 2] == units[4 * u0 + 2]) ++u1;
    for (int64_t h = units[4 * u0 + 2]; h < units[4 * u0 + 3]; ++h) {
      merges.push_back(u0);
      merges.push_back(u1);
      merges.push_back(h);
    }
    u0 = u1;
  }
  // Each chunk state the merges read is G * D floats (a head group reads its heads of each unit).
  const int64_t merge_floats = static_cast<int64_t>(chunks_total) * gd;
  for_each(static_cast<int64_t>(merges.size() / 3), [&](int, int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t u0 = merges[3 * i], u1 = merges[3 * i + 1], h = merges[3 * i + 2];
      const int item = static_cast<int>(units[4 * u0]);
      // Each unit's state is G-strided, from its first head h0: head h of unit u at
      // m[u * G + h - h0], acc[(u * G + h - h0) * D].
      // Folded in order into unit u0's own state (no other merge reads this head of it).
      const int64_t i0 = h - units[4 * u0 + 2];
      float* rm = m + u0 * G + i0;
      float* rl = l + u0 * G + i0;
      float* racc = acc + u0 * gd + i0 * D;
      for (int64_t u = u0 + 1; u < u1; ++u)
        FoldHead(D, m[u * G + i0], l[u * G + i0], acc + u * gd + i0 * D, rm, rl, racc);
      FinishHead(D, *rl, racc, out_of(item / Nkv, item % Nkv) + h * D);
    }
  }, /*parallel=*/merge_floats >= kParallelMergeFloats);
}

void AttentionReference(const AttentionParams& p, const AttentionStep& s) {
  const int D = p.head_dim, Nq = p.num_heads, Nkv = p.num_kv_heads;
  const int group = Nq / Nkv;
  const int64_t ld = static_cast<int64_t>(Nkv) * D;
  std::vector<float> scores;
  for (int t = 0; t < s.tokens; ++t) {
    const int pos = s.positions[t];
    const int first = s.seq_first[t];
    const int start = s.positions[first];
    const int lo = p.window > 0 ? std::max(0, pos - p.window + 1) : 0;
    const int n_keys = pos - lo + 1;
    scores.resize(n_keys);
    // Key/value row of absolute position j (head kvh's D elements, as f32): from the cache before
    // the step, else from the step.
    std::vector<float> row_f32(D);
    auto row = [&](int j, bool is_v, int kvh) -> const float* {
      const bool cached = j < start;
      const int64_t r = cached ? (s.ring ? j % s.slots : j) : first + (j - start);
      const int64_t at = r * ld + static_cast<int64_t>(kvh) * D;
      const void* base = cached ? (is_v ? s.v_cache[t] : s.k_cache[t]) : (is_v ? s.v : s.k);
      const DType type = cached ? s.cache_type : s.step_type;
      if (type == DType::kF32) return static_cast<const float*>(base) + at;
      if (type == DType::kI8) {  // x = q * scale, the scale of (row r, head kvh)
        const float* scales = cached ? (is_v ? s.v_scale_cache[t] : s.k_scale_cache[t]) : (is_v ? s.v_scale : s.k_scale);
        const float sc = scales[r * Nkv + kvh];
        const int8_t* qi = static_cast<const int8_t*>(base) + at;
        for (int d = 0; d < D; ++d) row_f32[d] = static_cast<float>(qi[d]) * sc;
        return row_f32.data();
      }
      const uint16_t* h = static_cast<const uint16_t*>(base) + at;
      for (int d = 0; d < D; ++d) row_f32[d] = type == DType::kF16 ? F16ToF32(h[d]) : Bf16ToF32(h[d]);
      return row_f32.data();
    };
    for (int h = 0; h < Nq; ++h) {
      const float* qh = s.q + (static_cast<size_t>(t) * Nq + h) * D;
      const int kvh = h / group;
      float mx = -INFINITY;
      for (int j = lo; j <= pos; ++j) {
        const float* kr = row(j, false, kvh);
        float sc = 0;
        for (int d = 0; d < D; ++d) sc += qh[d] * kr[d];
        sc *= p.scale;
        if (p.softcap > 0) sc = p.softcap * std::tanh(sc / p.softcap);
        scores[j - lo] = sc;
        mx = std::max(mx, sc);
      }
      float sum = 0;
      for (int j = 0; j < n_keys; ++j) {
        scores[j] = std::exp(scores[j] - mx);
        sum += scores[j];
      }
      const float inv = 1.0f / sum;
      float* oh = s.out + (static_cast<size_t>(t) * Nq + h) * D;
      std::fill(oh, oh + D, 0.0f);
      for (int j = lo; j <= pos; ++j) {
        const float pj = scores[j - lo] * inv;
        const float* vr = row(j, true, kvh);
        for (int d = 0; d < D; ++d) oh[d] += pj * vr[d];
      }
    }
  }
}

}  // namespace g4::cpu
