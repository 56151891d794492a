// libFuzzer target for the GGUF reader: every input is written to a temporary file and opened
// with GgufFile::Open; when it opens, all metadata is walked, the typed getters are called on
// every key, and every tensor's bytes are read and converted to f32 (dequantising block types).
// Built by fuzz/CMakeLists.txt (clang, -fsanitize=fuzzer,address,undefined; not part of the main
// build), run by scripts/fuzz-gguf.sh and, for a minute on the corpus, scripts/test-fuzz.sh.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "tensor/dtype.h"

namespace {

const std::string& TempPath() {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/gguf_fuzz_" + std::to_string(getpid()) +
           ".gguf";
  }();
  return path;
}

volatile uint64_t g_sink;

uint64_t Bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}  // keeps the reads below from being optimised away

void Touch(const g4::GgufValue& v, uint64_t* h) {
  *h = *h * 31 + v.gguf_type + v.u + static_cast<uint64_t>(v.i) + (v.b ? 1 : 0) + Bits(v.f);
  for (char c : v.s) *h = *h * 131 + static_cast<unsigned char>(c);
  for (size_t k = 0; k < v.size(); ++k) {
    for (char c : v.StringAt(k)) *h = *h * 131 + static_cast<unsigned char>(c);
    *h = *h * 31 + static_cast<uint64_t>(v.IntAt(k)) + Bits(v.FloatAt(k)) + (v.BoolAt(k) ? 1 : 0);
    Touch(v.ArrayAt(k), h);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = TempPath();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);

  auto opened = g4::GgufFile::Open(path);
  if (!opened.ok()) {
    // A rejected file must say which file it was.
    if (opened.status().message().find(path) == std::string::npos) std::abort();
    return 0;
  }
  const g4::GgufFile& g = **opened;
  uint64_t h = g.version();
  for (const auto& [key, value] : g.metadata()) {
    for (char c : key) h = h * 131 + static_cast<unsigned char>(c);
    Touch(value, &h);
    if (g.FindMeta(key) != &value) std::abort();
    auto i = g.GetInt(key);
    if (i.ok()) h += static_cast<uint64_t>(*i);
    auto d = g.GetFloat(key);
    if (d.ok()) h += Bits(*d);
    auto s = g.GetString(key);
    if (s.ok()) h += s->size();
    h += g.GetBool(key, false) + static_cast<uint64_t>(g.GetInt(key, 3)) + Bits(g.GetFloat(key, 0.5));
  }
  std::vector<float> buf;
  for (const std::string& name : g.Names()) {
    const g4::Tensor* t = g.Find(name);
    if (t == nullptr || t->name != name) std::abort();
    for (size_t k = 0; k < t->nbytes; ++k) h += t->data[k];
    // Elements actually stored: nbytes is whole rows of whole blocks.
    const size_t block_bytes = g4::DTypeBlockBytes(t->dtype);
    const size_t n = t->nbytes / block_bytes * static_cast<size_t>(g4::DTypeBlockElems(t->dtype));
    if (t->nbytes % block_bytes != 0) std::abort();
    if (static_cast<int64_t>(n) != t->numel()) std::abort();
    if (n > 0) {
      buf.resize(n);
      g4::ConvertToF32(t->dtype, t->data, buf.data(), n);
      for (float x : buf) h += Bits(x);
    }
  }
  g_sink = h;
  return 0;
}
