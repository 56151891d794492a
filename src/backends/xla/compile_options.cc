#include "backends/xla/compile_options.h"

namespace g4::xla {
namespace {

// Protobuf wire format: a key is (field << 3) | wire type; varints are little-endian base-128.
constexpr int kVarint = 0;
constexpr int kLengthDelimited = 2;

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void PutKey(std::string* out, int field, int wire_type) { PutVarint(out, (static_cast<uint64_t>(field) << 3) | wire_type); }
void PutInt(std::string* out, int field, int64_t v) {  // int64 and bool: negative int64s take 10 bytes
  PutKey(out, field, kVarint);
  PutVarint(out, static_cast<uint64_t>(v));
}
void PutMessage(std::string* out, int field, const std::string& bytes) {
  PutKey(out, field, kLengthDelimited);
  PutVarint(out, bytes.size());
  out->append(bytes);
}

}  // namespace

std::string SerializeCompileOptions(const CompileOptions& o) {
  std::string build;  // ExecutableBuildOptionsProto
  if (o.device_ordinal >= 0) PutInt(&build, 1, o.device_ordinal);
  PutInt(&build, 4, o.num_replicas);
  PutInt(&build, 5, o.num_partitions);
  if (o.use_spmd_partitioning) PutInt(&build, 6, 1);
  if (o.use_shardy_partitioner) PutInt(&build, 19, 1);
  std::string options;  // CompileOptionsProto
  PutMessage(&options, 3, build);
  if (o.portable) PutInt(&options, 4, 1);
  return options;
}

}  // namespace g4::xla
