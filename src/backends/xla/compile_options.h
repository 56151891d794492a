// The serialized xla.CompileOptionsProto that PJRT_Client_Compile takes, written by a tiny
// protobuf encoder (no protobuf library): only the fields gemma4rt sets. Field numbers are those
// of xla/pjrt/proto/compile_options.proto (pypjrt 0.1.1's vendor/ copy).
#pragma once

#include <cstdint>
#include <string>

namespace g4::xla {

struct CompileOptions {
  int64_t num_replicas = 1;    // ExecutableBuildOptionsProto.num_replicas = 4 (must be > 0: an empty
                               // message makes XLA's CPU plugin abort on "replica_count > 0")
  int64_t num_partitions = 1;  // ExecutableBuildOptionsProto.num_partitions = 5
  bool use_spmd_partitioning = false;   // ExecutableBuildOptionsProto.use_spmd_partitioning = 6
  bool use_shardy_partitioner = false;  // ExecutableBuildOptionsProto.use_shardy_partitioner = 19
  int64_t device_ordinal = -1;  // ExecutableBuildOptionsProto.device_ordinal = 1; -1: not written
  // CompileOptionsProto.compile_portable_executable = 4: no device assignment; each Execute names
  // its device (LoadedExecutable::Execute's `device`). One replica and partition only.
  bool portable = false;
};

// CompileOptionsProto { executable_build_options (field 3) { ... } }: the bytes for `options`.
// The defaults give 1a 04 20 01 28 01.
std::string SerializeCompileOptions(const CompileOptions& options = {});

}  // namespace g4::xla
