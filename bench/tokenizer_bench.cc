// Encode time against input length (Google Benchmark's fitted complexity): three inputs that
// once made SentencePiece-style merging quadratic: one run without spaces (a single symbol run,
// with byte fallback), long runs of blanks and newlines, and long prose.
//
//   ./build/gemma4rt_tokenizer_bench                 # the tiny Gemma 4 tokenizer (tests/data)
//   GEMMA4RT_DEFAULT_MODEL=model.gguf ./build/gemma4rt_tokenizer_bench   # also that GGUF's
//
// Each family reports its time per input size and a fitted big-O (expected: N).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "model/gguf.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace g4 {
namespace {

std::string NoSpaces(size_t n) {
  std::string s;
  while (s.size() < n) s += s.size() % 7 == 6 ? "\xE2\x82\xAC" : std::string(1, "abcdefghij0123456789"[s.size() % 20]);
  return s;
}
std::string Blanks(size_t n) { return std::string(n / 2, ' ') + "x" + std::string(n / 2, '\n'); }
std::string Prose(size_t n) {
  std::string s;
  while (s.size() < n) s += "The quick brown fox\n\n  jumps over the lazy dog. ";
  return s;
}

void Run(benchmark::State& state, const Tokenizer* tok, std::string (*make)(size_t)) {
  const std::string text = make(static_cast<size_t>(state.range(0)));
  size_t ids = 0;
  for (auto _ : state) {
    ids = tok->Encode(text, false, true).size();
    benchmark::DoNotOptimize(ids);
  }
  state.SetComplexityN(state.range(0));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["ids"] = static_cast<double>(ids);
}

void Register(const std::string& name, const Tokenizer* tok) {
  const std::pair<const char*, std::string (*)(size_t)> inputs[] = {
      {"NoSpaces", NoSpaces}, {"Blanks", Blanks}, {"Prose", Prose}};
  for (const auto& [what, make] : inputs) {
    benchmark::RegisterBenchmark(("BM_Encode_" + name + "_" + what).c_str(),
                                 [tok, make = make](benchmark::State& s) { Run(s, tok, make); })
        ->RangeMultiplier(2)
        ->Range(12500, 200000)
        ->Complexity(benchmark::oN)
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace
}  // namespace g4

int main(int argc, char** argv) {
  using g4::Tokenizer;
  std::unique_ptr<Tokenizer> tiny, gguf_tok;
  auto hf = Tokenizer::FromHfDirectory(std::string(GEMMA4RT_TEST_DATA_DIR) + "/data/tokenizer_gemma4_tiny");
  if (!hf.ok()) {
    std::fprintf(stderr, "tiny tokenizer: %s\n", hf.status().ToString().c_str());
    return 1;
  }
  tiny = std::move(*hf);
  g4::Register("Gemma4Tiny", tiny.get());
  const std::string model = g4::DefaultModelFile();
  if (std::filesystem::exists(model)) {
    auto file = g4::GgufFile::Open(model);
    if (file.ok()) {
      auto tok = Tokenizer::FromGguf(**file);
      if (tok.ok()) {
        gguf_tok = std::move(*tok);
        g4::Register("DefaultModel", gguf_tok.get());
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
