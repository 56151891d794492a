// Microbenchmarks of the CPU matrix kernels (Google Benchmark): the Highway kernels against the
// scalar references, single-threaded, on the shapes of the default model (Gemma 3 270M Q4_K_M).
//
//   ./build/gemma4rt_bench                                  # everything
//   ./build/gemma4rt_bench --benchmark_filter=LmHead        # the LM head (262144 x 640 Q8_0, 1 row)
//
// bytes_per_second is weight bytes read per second; BM_ReadBandwidth is the memory roofline for
// the LM head's 178 MB (a plain sum over a buffer of the same size).
//
//   GEMMA4RT_BENCH_TARGET=SSE4 ./build/gemma4rt_bench --benchmark_filter=BM_Q8
//
// BM_Q8 and BM_Layer name weight types by their DType number (src/tensor/dtype.h): 0 F32, 1 F16,
// 2 BF16, 5 Q8_0, 6 Q4_0, 8 Q5_0, 10 Q4_K, 11 Q5_K, 12 Q6_K.
//
// GEMMA4RT_BENCH_TARGET runs the kernels of one Highway target this CPU supports (its name as
// hwy::TargetName prints it: AVX3, AVX2, SSE4, SSSE3, EMU128, SCALAR), e.g. the 128-bit code that
// NEON shares.
//
//   ./build/gemma4rt_bench --benchmark_filter=BM_AttentionDecode   # decode attention, E2B heads
#include <benchmark/benchmark.h>
#include <hwy/targets.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/attention.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels_q8.h"
#include "base/aligned.h"
#include "base/thread_pool.h"
#include "tensor/dtype.h"
#include "tensor/quantize.h"

namespace g4 {
namespace {

// Random weight rows in `t` with finite scales of a realistic size (|d| < 0.03).
std::vector<uint8_t> RandomWeights(DType t, int M, int K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> w(DTypeRowBytes(t, K) * M);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> u(-0.03f, 0.03f);
  auto put_half = [&](uint8_t* p) {
    const uint16_t h = F32ToF16(u(rng));
    p[0] = h & 0xff;
    p[1] = h >> 8;
  };
  const size_t bb = DTypeBlockBytes(t);
  const size_t nblocks = w.size() / bb;
  for (size_t i = 0; i < nblocks; ++i) {
    uint8_t* b = w.data() + i * bb;
    switch (t) {
      case DType::kF32: { float f = u(rng); std::memcpy(b, &f, 4); break; }
      case DType::kF16: put_half(b); break;
      case DType::kBF16: { const uint16_t h = F32ToBf16(u(rng)); b[0] = h & 0xff; b[1] = h >> 8; break; }
      case DType::kQ8_0: case DType::kQ4_0: case DType::kQ5_0: put_half(b); break;
      case DType::kQ4_1: case DType::kQ5_1: case DType::kQ4_K: case DType::kQ5_K: put_half(b); put_half(b + 2); break;
      case DType::kQ6_K: put_half(b + 208); break;
      default: break;
    }
  }
  return w;
}

std::vector<float> RandomActs(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = g(rng);
  return x;
}

using MatMulFn = void (*)(const float*, int, int, const uint8_t*, DType, int, float, float*, int, float*);

void RunMatMul(benchmark::State& state, MatMulFn fn, DType t, int M, int K, int rows) {
  const std::vector<uint8_t> w = RandomWeights(t, M, K, 1);
  const std::vector<float> x = RandomActs(static_cast<size_t>(rows) * K, 2);
  std::vector<float> y(static_cast<size_t>(rows) * M), scratch(K);
  for (auto _ : state) {
    fn(x.data(), rows, K, w.data(), t, M, 1.0f, y.data(), M, scratch.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(w.size()));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * M * K * rows * state.iterations(), benchmark::Counter::kIsRate,
                                                 benchmark::Counter::kIs1000);
  state.SetLabel(cpu::SimdTargetName());
}

// The tied LM head of Gemma 3 270M: 262144 x 640 Q8_0 (178 MB), one activation row (decode).
void BM_LmHead_Q8_0_Hwy(benchmark::State& s) { RunMatMul(s, cpu::MatMul, DType::kQ8_0, 262144, 640, 1); }
void BM_LmHead_Q8_0_Reference(benchmark::State& s) { RunMatMul(s, cpu::MatMulReference, DType::kQ8_0, 262144, 640, 1); }
BENCHMARK(BM_LmHead_Q8_0_Hwy)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_LmHead_Q8_0_Reference)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// The same split over threads as the CPU backend's ParallelMatMul (2 threads).
void BM_LmHead_Q8_0_Hwy_2Threads(benchmark::State& state) {
  const int M = 262144, K = 640;
  const DType t = DType::kQ8_0;
  const std::vector<uint8_t> w = RandomWeights(t, M, K, 1);
  const std::vector<float> x = RandomActs(K, 2);
  std::vector<float> y(M);
  ThreadPool pool(2);
  const size_t row_bytes = DTypeRowBytes(t, K);
  std::vector<std::vector<float>> scratch(pool.size(), std::vector<float>(K));
  for (auto _ : state) {
    pool.ParallelFor(M, [&](int task, int64_t mb, int64_t me) {
      cpu::MatMul(x.data(), 1, K, w.data() + mb * row_bytes, t, static_cast<int>(me - mb), 1.0f, y.data() + mb, M,
                  scratch[task].data());
    });
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(w.size()));
}
BENCHMARK(BM_LmHead_Q8_0_Hwy_2Threads)->Unit(benchmark::kMillisecond)->MinTime(2.0)->UseRealTime();

// Memory roofline: sum of 64-bit words over a buffer the size of the LM head.
void BM_ReadBandwidth(benchmark::State& state) {
  std::vector<uint64_t> buf(DTypeRowBytes(DType::kQ8_0, 640) * 262144 / 8, 1);
  for (auto _ : state) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= buf.size(); i += 4) {
      s0 += buf[i];
      s1 += buf[i + 1];
      s2 += buf[i + 2];
      s3 += buf[i + 3];
    }
    benchmark::DoNotOptimize(s0 + s1 + s2 + s3);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(buf.size() * 8));
}
BENCHMARK(BM_ReadBandwidth)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// Layer matmuls of the default model, decode (1 row) and prefill (64 rows), per weight type. The
// weights (< 4 MB) stay in cache, so these measure the kernels' arithmetic.
template <bool kHwy>
void BM_Layer(benchmark::State& s) {
  const DType t = static_cast<DType>(s.range(0));
  const int M = static_cast<int>(s.range(1)), K = static_cast<int>(s.range(2)), rows = static_cast<int>(s.range(3));
  RunMatMul(s, kHwy ? cpu::MatMul : cpu::MatMulReference, t, M, K, rows);
}
void LayerArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"dtype", "M", "K", "rows"});
  // ffn_gate/ffn_up shape (2048 x 640) for the 32-element formats and plain floats, ffn_down
  // (640 x 2048) for the k-quants (their rows need K % 256 == 0).
  for (DType t : {DType::kQ5_0, DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ6_K, DType::kF16, DType::kBF16,
                  DType::kF32}) {
    const bool k_quant = DTypeBlockElems(t) == 256;
    for (int rows : {1, 64}) b->Args({static_cast<int64_t>(t), k_quant ? 640 : 2048, k_quant ? 2048 : 640, rows});
  }
  // Gemma 4 E2B's FFN gate/up (6144 x 1536) and down (1536 x 6144) in BF16, prefill: a few
  // activation rows of 1536 floats fill L1, of 6144 floats exceed it.
  b->Args({static_cast<int64_t>(DType::kBF16), 6144, 1536, 64});
  b->Args({static_cast<int64_t>(DType::kBF16), 1536, 6144, 64});
}
BENCHMARK(BM_Layer<true>)->Name("BM_Layer_Hwy")->Apply(LayerArgs)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Layer<false>)->Name("BM_Layer_Reference")->Apply(LayerArgs)->Unit(benchmark::kMicrosecond);

// The int8-activation path (kernels_q8.h, the engine's default for block-quantised weights) on
// the shapes of Gemma 4 E2B (hidden 1536, FFN 6144: gate/up 6144 x 1536, down 1536 x 6144) and
// of the Gemma 3 270M (2048 x 640, and its LM head 262144 x 640 Q8_0), decode (1 row) and prefill
// (64 rows), single-threaded, and decode of a 512 x 1536 weight that stays in L2. Activations are quantised once outside the loop, as the backend
// shares one quantisation among the matmuls of an input.
void BM_Q8(benchmark::State& state) {
  const DType t = static_cast<DType>(state.range(0));
  const int M = static_cast<int>(state.range(1)), K = static_cast<int>(state.range(2)),
            rows = static_cast<int>(state.range(3)), group = static_cast<int>(state.range(4));
  // kQ4_0x4: the same random Q4_0 weights, packed as the loader does (LoadOptions::pack_q4_0).
  std::vector<uint8_t> w = RandomWeights(t == DType::kQ4_0x4 ? DType::kQ4_0 : t, M, K, 1);
  if (t == DType::kQ4_0x4) PackQ4_0x4InPlace(w.data(), M, K);
  const std::vector<float> x = RandomActs(static_cast<size_t>(rows) * K, 2);
  std::vector<cpu::ActBlockQ8> xq(static_cast<size_t>(rows) * K / 32);
  std::vector<float> sums(static_cast<size_t>(rows) * K / 16), y(static_cast<size_t>(rows) * M);
  cpu::QuantizeRowsQ8(x.data(), rows, K, xq.data(), sums.data(), group);
  for (auto _ : state) {
    cpu::MatMulQ8(xq.data(), sums.data(), rows, K, w.data(), t, M, 1.0f, y.data(), M, group);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(w.size()));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * M * K * rows * state.iterations(), benchmark::Counter::kIsRate,
                                                 benchmark::Counter::kIs1000);
}
void Q8Args(benchmark::internal::Benchmark* b) {
  // group: the activation group (kernels_q8.h); 256 is what the engine uses for Q4_K/Q5_K.
  b->ArgNames({"dtype", "M", "K", "rows", "group"});
  for (DType t : {DType::kQ4_0, DType::kQ4_0x4, DType::kQ8_0, DType::kQ5_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    for (int rows : {1, 64}) {
      for (int group : {32, 256}) {
        if (group == 256 && DTypeBlockElems(t) != 256) continue;
        b->Args({static_cast<int64_t>(t), 6144, 1536, rows, group});
      }
    }
  }
  for (DType t : {DType::kQ5_0, DType::kQ8_0}) {
    for (int rows : {1, 64}) b->Args({static_cast<int64_t>(t), 2048, 640, rows, 32});
  }
  b->Args({static_cast<int64_t>(DType::kQ8_0), 262144, 640, 1, 32});
  // 512 x 1536 (0.4-0.6 MB, in L2): decode's arithmetic without the memory.
  for (DType t : {DType::kQ4_0x4, DType::kQ4_K, DType::kQ6_K}) {
    b->Args({static_cast<int64_t>(t), 512, 1536, 1, DTypeBlockElems(t) == 256 ? 256 : 32});
  }
}
BENCHMARK(BM_Q8)->Apply(Q8Args)->Unit(benchmark::kMicrosecond);

// A BF16 weight of 48 MB (more than the last-level caches), one activation row: decode of a BF16
// checkpoint streams its weights from memory (compare bytes_per_second with BM_ReadBandwidth).
void BM_Stream_BF16(benchmark::State& s) { RunMatMul(s, cpu::MatMul, DType::kBF16, 16384, 1536, 1); }
BENCHMARK(BM_Stream_BF16)->Unit(benchmark::kMillisecond);

// Decode attention of one token (Gemma 4 E2B: 8 query heads on 1 KV head, MQA), head_dim D over
// ctx cached keys plus its own, on `threads` threads. cold = 1: each iteration reads the cache of
// another of 35 layers (35 x 2 x ctx x D floats: 9-18 MB at 128 keys, which a 32 MiB L3 holds;
// 73-147 MB at 1024 keys and 287-573 MB at 4000, which no cache does), as decode does;
// cold = 0: the same layer every time (the kernel's arithmetic). kv: the cache's element type, 0
// f32, 1 f16 (--cache-type f16: half the bytes), 2 bf16 (--cache-type bf16: half the bytes, bf16
// arithmetic, on the bf16 dot-product kernels where the CPU has them), 3 i8 (--cache-type q8: a
// quarter of f32's bytes plus a scale per row, widened to f32 in registers). Before 2026-12-03 the last
// argument was `f16` (0 or 1): `f16:1` is now `kv:1`.
void BM_AttentionDecode(benchmark::State& s) {
  const int D = static_cast<int>(s.range(0)), ctx = static_cast<int>(s.range(1));
  const int threads = static_cast<int>(s.range(2));
  const bool cold = s.range(3) != 0;
  const DType type = s.range(4) == 0   ? DType::kF32
                     : s.range(4) == 1 ? DType::kF16
                     : s.range(4) == 2 ? DType::kBF16
                                       : DType::kI8;
  const bool i8 = type == DType::kI8;
  const bool half = type == DType::kF16 || type == DType::kBF16;
  constexpr int kHeads = 8, kLayers = 35;
  const int layers = cold ? kLayers : 1;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  const size_t per_layer = static_cast<size_t>(ctx) * D;
  AlignedVector<float> kc(per_layer * layers), vc(per_layer * layers);
  AlignedVector<uint16_t> kh(half ? kc.size() : 0), vh(half ? vc.size() : 0);
  std::vector<float> q(kHeads * D), k(D), v(D), out(kHeads * D);
  std::vector<uint16_t> k16(D), v16(D);  // the step's row as a 16-bit cache passes it
  AlignedVector<int8_t> k8(i8 ? kc.size() : 0), v8(i8 ? vc.size() : 0);  // i8: the cache, one scale per row
  std::vector<float> ks8(i8 ? kc.size() / D : 0), vs8(ks8.size());
  std::vector<int8_t> k8s(D), v8s(D);  // i8: the step's row
  float step_ks = 0, step_vs = 0;
  for (auto& x : kc) x = 0.1f * nd(rng);
  for (auto& x : vc) x = nd(rng);
  for (auto* b : {&q, &k, &v})
    for (auto& x : *b) x = nd(rng);
  auto to16 = [&](float x) { return type == DType::kF16 ? F32ToF16(x) : F32ToBf16(x); };
  if (half) {
    for (size_t i = 0; i < kh.size(); ++i) kh[i] = to16(kc[i]), vh[i] = to16(vc[i]);
    for (int d = 0; d < D; ++d) k16[d] = to16(k[d]), v16[d] = to16(v[d]);
    kc = {};
    vc = {};
  }
  if (i8) {
    for (size_t r = 0; r < ks8.size(); ++r) {
      cpu::QuantizeKvRow(kc.data() + r * D, 1, D, k8.data() + r * D, &ks8[r]);
      cpu::QuantizeKvRow(vc.data() + r * D, 1, D, v8.data() + r * D, &vs8[r]);
    }
    cpu::QuantizeKvRow(k.data(), 1, D, k8s.data(), &step_ks);
    cpu::QuantizeKvRow(v.data(), 1, D, v8s.data(), &step_vs);
    kc = {};
    vc = {};
  }
  ThreadPool pool(threads);
  cpu::AttentionScratch scratch;
  const cpu::AttentionParams p{kHeads, 1, D, 0, 1.0f / 16, 0.0f};
  const int32_t pos = ctx, first = 0;
  int layer = 0;
  const void* step_k = i8 ? static_cast<const void*>(k8s.data()) : half ? static_cast<const void*>(k16.data()) : k.data();
  const void* step_v = i8 ? static_cast<const void*>(v8s.data()) : half ? static_cast<const void*>(v16.data()) : v.data();
  for (auto _ : s) {
    const void* kp = i8     ? static_cast<const void*>(k8.data() + per_layer * layer)
                     : half ? static_cast<const void*>(kh.data() + per_layer * layer)
                            : kc.data() + per_layer * layer;
    const void* vp = i8     ? static_cast<const void*>(v8.data() + per_layer * layer)
                     : half ? static_cast<const void*>(vh.data() + per_layer * layer)
                            : vc.data() + per_layer * layer;
    cpu::AttentionStep step{1, q.data(), step_k, step_v, out.data(), &pos, &first, &kp, &vp, ctx + 1, false, type, type};
    const float* ksp = i8 ? ks8.data() + static_cast<size_t>(ctx) * layer : nullptr;
    const float* vsp = i8 ? vs8.data() + static_cast<size_t>(ctx) * layer : nullptr;
    if (i8) {
      step.k_scale = &step_ks;
      step.v_scale = &step_vs;
      step.k_scale_cache = &ksp;
      step.v_scale_cache = &vsp;
    }
    cpu::Attention(p, step, threads > 1 ? &pool : nullptr, &scratch);
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % layers;
  }
  const size_t row_bytes = static_cast<size_t>(D) * DTypeSize(type) + (i8 ? sizeof(float) : 0);
  s.SetBytesProcessed(static_cast<int64_t>(s.iterations()) * static_cast<int64_t>(2 * static_cast<size_t>(ctx) * row_bytes));
}
BENCHMARK(BM_AttentionDecode)
    ->ArgNames({"D", "ctx", "threads", "cold", "kv"})
    ->ArgsProduct({{256, 512}, {128, 1024, 4000}, {1, 2}, {0, 1}, {0, 1, 2, 3}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
}  // namespace g4

int main(int argc, char** argv) {
  if (const char* want = std::getenv("GEMMA4RT_BENCH_TARGET"); want != nullptr && *want != '\0') {
    int64_t found = 0;
    for (int64_t t : hwy::SupportedAndGeneratedTargets())
      if (std::strcmp(hwy::TargetName(t), want) == 0) found = t;
    if (found == 0) {
      std::fprintf(stderr, "gemma4rt_bench: GEMMA4RT_BENCH_TARGET=%s is not a target this CPU runs; it runs:", want);
      for (int64_t t : hwy::SupportedAndGeneratedTargets()) std::fprintf(stderr, " %s", hwy::TargetName(t));
      std::fprintf(stderr, "\n");
      return 2;
    }
    hwy::SetSupportedTargetsForTest(found);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
