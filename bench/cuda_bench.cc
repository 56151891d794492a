// Decode and prefill speed of the CUDA backend on one model, beside the device's own copy rate
// measured in the same run (scripts/device-check-cuda.sh runs it on the synthetic E2B).
//
//   gemma4rt_cuda_bench -m MODEL [--quantize q4_0] [-p 512] [-n 32] [--batches 1,8,32]
//                       [--cache-type bf16] [--device 0] [--label NAME]
//
// Prints one JSON object per line: the device's copy rate (cudaMemcpy device to device of a
// 1 GiB buffer, best of 5; bytes read + written per second), prefill tokens/s (one sequence of
// -p tokens in one chunk), and per decode batch B: steps/s, tokens/s (B per step) and the
// fraction of the copy rate that reading every MatMul weight once per step takes
// (matmul_bytes x steps/s / copy rate: 1.0 = at the bandwidth limit, KV reads not counted).
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "model/model.h"
#include "runtime/engine.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }

int Fail(const g4::Status& s) {
  std::fprintf(stderr, "gemma4rt_cuda_bench: %s\n", s.ToString().c_str());
  return 1;
}

double CopyRate(int device) {
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  cudaSetDevice(device);
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0;
  cudaMemset(a, 1, bytes);
  double best = 0;
  for (int i = 0; i < 6; ++i) {
    cudaDeviceSynchronize();
    const auto t0 = Clock::now();
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaDeviceSynchronize();
    if (i > 0) best = std::max(best, 2.0 * bytes / Seconds(t0));
  }
  cudaFree(a);
  cudaFree(b);
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("gemma4rt CUDA backend benchmark");
  std::string model, quantize, cache_type = "bf16", label;
  int n_prompt = 512, n_gen = 32, device = 0;
  std::vector<int> batches{1, 8, 32};
  app.add_option("-m,--model", model, "model (GGUF or checkpoint directory)")->required();
  app.add_option("--quantize", quantize, "quantise at load: q8_0, q4_0 or w4a16")->check(CLI::IsMember({"q8_0", "q4_0", "w4a16"}));
  app.add_option("-p", n_prompt, "prefill tokens (0: none)")->check(CLI::Range(0, 8192));
  app.add_option("-n", n_gen, "decode steps per batch")->check(CLI::Range(1, 4096));
  app.add_option("--batches", batches, "decode batch sizes")->delimiter(',')->check(CLI::Range(1, 256));
  app.add_option("--cache-type", cache_type, "KV cache type: f32, f16, bf16, q8 or fp8 (compute capability >= 8.9)");
  app.add_option("--device", device, "CUDA device");
  app.add_option("--label", label, "a name for the output lines");
  CLI11_PARSE(app, argc, argv);

  g4::LoadOptions lo;
  if (quantize == "q8_0") lo.quantize = g4::DType::kQ8_0;
  if (quantize == "q4_0") lo.quantize = g4::DType::kQ4_0;
  if (quantize == "w4a16") lo.quantize = g4::DType::kW4G32;
  const double copy = CopyRate(device);
  std::printf("{\"label\":\"%s\",\"test\":\"copy\",\"bytes_per_s\":%.4g}\n", label.c_str(), copy);
  int max_b = 1;
  for (int b : batches) max_b = std::max(max_b, b);
  auto loaded = g4::LoadModel(model, lo);
  if (!loaded.ok()) return Fail(loaded.status());
  auto backend = g4::MakeCudaBackend({device, "auto"});
  if (!backend.ok()) return Fail(backend.status());
  const g4::Backend* raw = backend->get();
  g4::EngineOptions eo;
  eo.max_seqs = max_b;
  eo.max_context = std::max(n_prompt, 16) + n_gen + 8;
  eo.prefill_chunk = std::max(n_prompt, 16);
  auto kv = g4::ParseCacheType(cache_type);
  if (!kv.ok()) return Fail(kv.status());
  eo.kv_type = *kv;
  auto engine = g4::Engine::Create(std::move(loaded).value(), std::move(backend).value(), eo);
  if (!engine.ok()) return Fail(engine.status());
  g4::Engine& e = **engine;
  const int V = e.config().vocab;
  std::mt19937 rng(1);
  auto tok = [&] { return static_cast<int32_t>(rng() % V); };
  std::vector<float> logits;
  std::vector<int32_t> prompt(std::max(n_prompt, 16));
  for (auto& t : prompt) t = tok();
  // Warm-up (uploads the weights, compiles the shapes), then the prefill.
  if (auto s = e.Prefill(0, prompt, false, &logits); !s.ok()) return Fail(s);
  e.ResetSequence(0);
  if (n_prompt > 0) {
    const auto t0 = Clock::now();
    if (auto s = e.Prefill(0, std::span<const int32_t>(prompt).first(n_prompt), false, &logits); !s.ok()) return Fail(s);
    const double sec = Seconds(t0);
    std::printf("{\"label\":\"%s\",\"test\":\"prefill\",\"tokens\":%d,\"seconds\":%.4f,\"tokens_per_s\":%.1f}\n", label.c_str(),
                n_prompt, sec, n_prompt / sec);
    e.ResetSequence(0);
  }
  const g4::CudaWeightBytes wb = g4::CudaWeights(*raw);
  for (int B : batches) {
    std::vector<int32_t> seqs(B), toks(B);
    for (int s = 0; s < max_b; ++s) e.ResetSequence(s);
    for (int s = 0; s < B; ++s) {
      seqs[s] = s;
      if (auto st = e.Prefill(s, std::span<const int32_t>(prompt).first(16), false, &logits); !st.ok()) return Fail(st);
    }
    for (auto& t : toks) t = tok();
    if (auto st = e.Decode(seqs, toks, &logits); !st.ok()) return Fail(st);  // this batch size's first step
    const auto t0 = Clock::now();
    for (int i = 0; i < n_gen - 1; ++i)
      if (auto st = e.Decode(seqs, toks, &logits); !st.ok()) return Fail(st);
    const double sec = Seconds(t0), steps = (n_gen - 1) / sec;
    std::printf("{\"label\":\"%s\",\"test\":\"decode\",\"batch\":%d,\"steps_per_s\":%.2f,\"tokens_per_s\":%.1f,"
                "\"matmul_bytes\":%zu,\"weights_on_device\":%zu,\"fraction_of_copy_rate\":%.3f}\n",
                label.c_str(), B, steps, steps * B, wb.matmul, wb.on_device, copy > 0 ? wb.matmul * steps / copy : 0.0);
  }
  return 0;
}
