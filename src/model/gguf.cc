// GGUF reader. Besides the layout checks the header lists, it refuses (DataLoss): bool values
// other than 0/1, duplicate metadata keys or tensor names, arrays nested more than 8 deep,
// tensors with more than 4 dimensions (GGML_MAX_DIMS), data offsets that are not a multiple of
// the alignment, and shapes whose non-zero dimensions multiply past int64 (so every partial
// product of a shape is safe). Counts are bounded by the smallest encoding of what they count
// and the bytes left, so nothing is allocated for data the file does not contain. Metadata arrays
// are views into the mapping (see GgufValue); their bytes are validated here (string lengths,
// bool values), once.
#include "model/gguf.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <utility>

#include "base/check.h"
#include "tensor/quantize.h"

namespace g4 {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader assumes a little-endian host");

namespace {

// GGUF metadata value types (gguf.md, "gguf_metadata_value_type").
enum : uint32_t {
  kTypeUInt8 = 0,
  kTypeInt8 = 1,
  kTypeUInt16 = 2,
  kTypeInt16 = 3,
  kTypeUInt32 = 4,
  kTypeInt32 = 5,
  kTypeFloat32 = 6,
  kTypeBool = 7,
  kTypeString = 8,
  kTypeArray = 9,
  kTypeUInt64 = 10,
  kTypeInt64 = 11,
  kTypeFloat64 = 12,
};

constexpr uint32_t kDefaultAlignment = 32;
// ggml tensors have at most 4 dimensions (GGML_MAX_DIMS).
constexpr uint32_t kMaxDims = 4;
// Arrays of arrays are legal; deeper nesting than this is refused (it bounds the recursion).
constexpr int kMaxArrayDepth = 8;
// Smallest possible encodings, used to bound counts by the bytes left in the file.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;              // empty key, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // empty name, n_dims=0, type, offset

const char* MetaTypeName(uint32_t t) {
  switch (t) {
    case kTypeUInt8: return "uint8";
    case kTypeInt8: return "int8";
    case kTypeUInt16: return "uint16";
    case kTypeInt16: return "int16";
    case kTypeUInt32: return "uint32";
    case kTypeInt32: return "int32";
    case kTypeFloat32: return "float32";
    case kTypeBool: return "bool";
    case kTypeString: return "string";
    case kTypeArray: return "array";
    case kTypeUInt64: return "uint64";
    case kTypeInt64: return "int64";
    case kTypeFloat64: return "float64";
    default: return nullptr;
  }
}

// Encoded size of a scalar type, the minimum encoded size of strings (8: the length) and arrays
// (12: element type + count); 0 for unknown types.
uint64_t MinEncodedSize(uint32_t t) {
  switch (t) {
    case kTypeUInt8: case kTypeInt8: case kTypeBool: return 1;
    case kTypeUInt16: case kTypeInt16: return 2;
    case kTypeUInt32: case kTypeInt32: case kTypeFloat32: return 4;
    case kTypeUInt64: case kTypeInt64: case kTypeFloat64: return 8;
    case kTypeString: return 8;
    case kTypeArray: return 12;
    default: return 0;
  }
}

// ggml_type ids we load -> DType. Other ids: nullopt-like false.
bool MapGgmlType(uint32_t id, DType* out) {
  switch (id) {
    case 0: *out = DType::kF32; return true;
    case 1: *out = DType::kF16; return true;
    case 2: *out = DType::kQ4_0; return true;
    case 3: *out = DType::kQ4_1; return true;
    case 6: *out = DType::kQ5_0; return true;
    case 7: *out = DType::kQ5_1; return true;
    case 8: *out = DType::kQ8_0; return true;
    case 12: *out = DType::kQ4_K; return true;
    case 13: *out = DType::kQ5_K; return true;
    case 14: *out = DType::kQ6_K; return true;
    case 30: *out = DType::kBF16; return true;
    default: return false;
  }
}

// Names of the ggml types we do not load, for messages (ggml.h's enum ggml_type).
const char* OtherGgmlTypeName(uint32_t id) {
  switch (id) {
    case 4: case 5: return "removed Q4_2/Q4_3";
    case 9: return "Q8_1";
    case 10: return "Q2_K";
    case 11: return "Q3_K";
    case 15: return "Q8_K";
    case 16: return "IQ2_XXS";
    case 17: return "IQ2_XS";
    case 18: return "IQ3_XXS";
    case 19: return "IQ1_S";
    case 20: return "IQ4_NL";
    case 21: return "IQ3_S";
    case 22: return "IQ2_S";
    case 23: return "IQ4_XS";
    case 24: return "I8";
    case 25: return "I16";
    case 26: return "I32";
    case 27: return "I64";
    case 28: return "F64";
    case 29: return "IQ1_M";
    case 34: return "TQ1_0";
    case 35: return "TQ2_0";
    case 39: return "MXFP4";
    default: return nullptr;
  }
}

std::string Quote(std::string_view s) {
  std::string q = "'";
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      q.push_back(static_cast<char>(c));
    } else {  // keep messages printable whatever bytes a corrupt file holds
      static const char kHex[] = "0123456789abcdef";
      q += "\\x";
      q.push_back(kHex[c >> 4]);
      q.push_back(kHex[c & 15]);
    }
    if (q.size() > 200) {
      q += "...";
      break;
    }
  }
  q.push_back('\'');
  return q;
}

std::string Str(uint64_t v) { return std::to_string(v); }

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

bool IsScalar(uint32_t t) { return t <= kTypeFloat64 && t != kTypeString && t != kTypeArray; }

template <typename T>
T Load(const uint8_t* p) {
  T x;
  std::memcpy(&x, p, sizeof(T));
  return x;
}

// Decodes the scalar of GGUF type `t` at `p` (its MinEncodedSize bytes must be there) into `v`.
// False for a bool other than 0 or 1.
bool DecodeScalar(uint32_t t, const uint8_t* p, GgufValue* v) {
  using T = GgufValue::Type;
  v->gguf_type = t;
  switch (t) {
    case kTypeUInt8: v->type = T::kUInt; v->u = p[0]; return true;
    case kTypeUInt16: v->type = T::kUInt; v->u = Load<uint16_t>(p); return true;
    case kTypeUInt32: v->type = T::kUInt; v->u = Load<uint32_t>(p); return true;
    case kTypeUInt64: v->type = T::kUInt; v->u = Load<uint64_t>(p); return true;
    case kTypeInt8: v->type = T::kInt; v->i = static_cast<int8_t>(p[0]); return true;
    case kTypeInt16: v->type = T::kInt; v->i = Load<int16_t>(p); return true;
    case kTypeInt32: v->type = T::kInt; v->i = Load<int32_t>(p); return true;
    case kTypeInt64: v->type = T::kInt; v->i = Load<int64_t>(p); return true;
    case kTypeFloat32: v->type = T::kFloat; v->f = Load<float>(p); return true;
    case kTypeFloat64: v->type = T::kFloat; v->f = Load<double>(p); return true;
    case kTypeBool: v->type = T::kBool; v->b = p[0] != 0; return p[0] <= 1;
    default: return false;
  }
}

}  // namespace

// Reads a mapped GGUF file into a GgufFile. Every read goes through Need(), which checks the
// bytes are there; every count is checked against the bytes left before anything is allocated.
class GgufParser {
 public:
  GgufParser(GgufFile* out, const uint8_t* data, uint64_t size)
      : out_(out), data_(data), size_(size), path_(out->path_) {}

  Status Parse();

 private:
  uint64_t Left() const { return size_ - pos_; }
  Status Error(const std::string& what) const { return DataLoss(path_ + ": " + what); }
  // DataLoss unless `n` more bytes are available; `what` names the field being read.
  Status Need(uint64_t n, const std::string& what) const {
    if (n > Left()) {
      return Error(what + " runs past the end of the file (needs " + Str(n) + " bytes at offset " +
                   Str(pos_) + ", file is " + Str(size_) + " bytes)");
    }
    return OkStatus();
  }
  template <typename T>
  Status Read(T* v, const std::string& what) {
    G4_RETURN_IF_ERROR(Need(sizeof(T), what));
    std::memcpy(v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return OkStatus();
  }
  // Reads a string; `what` (with "[index]" appended unless index is kNoIndex) names it in errors.
  static constexpr uint64_t kNoIndex = ~0ull;
  Status ReadString(std::string* s, const std::string& what, uint64_t index = kNoIndex);
  // Steps over a string; its bytes are [*begin, *begin + *len) of the file (either may be null).
  Status SkipString(const std::string& what, uint64_t index, uint64_t* begin = nullptr, uint64_t* len = nullptr);
  Status ReadValue(uint32_t type, GgufValue* v, const std::string& where, int depth);
  Status ReadTensorInfos(uint64_t count, uint32_t alignment);

  GgufFile* out_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& path_;
};

Status GgufParser::SkipString(const std::string& what, uint64_t index, uint64_t* begin, uint64_t* len) {
  // Messages are only built on failure: this runs once per vocabulary entry.
  auto name = [&] { return index == kNoIndex ? what : what + "[" + Str(index) + "]"; };
  if (Left() < 8) return Need(8, name() + " (string length)");
  uint64_t n = 0;
  std::memcpy(&n, data_ + pos_, 8);
  pos_ += 8;
  if (n > Left()) {
    return Error(name() + ": string length " + Str(n) + " runs past the end of the file (" +
                 Str(Left()) + " bytes left at offset " + Str(pos_) + ")");
  }
  if (begin) *begin = pos_;
  if (len) *len = n;
  pos_ += n;
  return OkStatus();
}

Status GgufParser::ReadString(std::string* s, const std::string& what, uint64_t index) {
  uint64_t begin = 0, len = 0;
  G4_RETURN_IF_ERROR(SkipString(what, index, &begin, &len));
  s->assign(reinterpret_cast<const char*>(data_ + begin), static_cast<size_t>(len));
  return OkStatus();
}

Status GgufParser::ReadValue(uint32_t type, GgufValue* v, const std::string& where, int depth) {
  const uint64_t size = MinEncodedSize(type);
  if (size == 0) {
    return Unimplemented(path_ + ": " + where + ": unknown metadata type " + Str(type));
  }
  if (IsScalar(type)) {
    G4_RETURN_IF_ERROR(Need(size, where));
    if (!DecodeScalar(type, data_ + pos_, v)) {
      return Error(where + ": bool value " + Str(data_[pos_]) + " is neither 0 nor 1");
    }
    pos_ += size;
    return OkStatus();
  }
  v->gguf_type = type;
  if (type == kTypeString) {
    v->type = GgufValue::Type::kString;
    return ReadString(&v->s, where);
  }
  // An array: element type, count, elements.
  if (depth >= kMaxArrayDepth) {
    return Error(where + ": arrays nested more than " + Str(kMaxArrayDepth) + " deep");
  }
  uint32_t elem_type = 0;
  uint64_t count = 0;
  G4_RETURN_IF_ERROR(Read(&elem_type, where + " (array element type)"));
  const uint64_t elem_min = MinEncodedSize(elem_type);
  if (elem_min == 0) {
    return Unimplemented(path_ + ": " + where + ": unknown metadata type " + Str(elem_type) +
                         " for array elements");
  }
  G4_RETURN_IF_ERROR(Read(&count, where + " (array count)"));
  // Every element takes at least elem_min bytes: this bounds the allocations below by the file.
  if (count > Left() / elem_min) {
    return Error(where + ": array count " + Str(count) + " of " + MetaTypeName(elem_type) +
                 " needs at least " +
                 (count > std::numeric_limits<uint64_t>::max() / elem_min
                      ? std::string("2^64")
                      : Str(count * elem_min)) +
                 " bytes but only " + Str(Left()) + " are left in the file");
  }
  v->type = GgufValue::Type::kArray;
  v->array_type = elem_type;
  v->count_ = static_cast<size_t>(count);
  if (elem_type == kTypeString) {
    // Views: the offset of every kStringStride-th element from the first one; the bytes stay in
    // the mapping.
    const uint64_t first = pos_;
    v->elems_ = data_ + pos_;
    v->string_offsets_.resize(static_cast<size_t>((count + GgufValue::kStringStride - 1) / GgufValue::kStringStride));
    for (uint64_t k = 0; k < count; ++k) {
      if (pos_ - first > std::numeric_limits<uint32_t>::max()) {
        return Unimplemented(path_ + ": " + where + ": string array of more than 4 GiB is not supported");
      }
      if (k % GgufValue::kStringStride == 0) v->string_offsets_[k / GgufValue::kStringStride] = static_cast<uint32_t>(pos_ - first);
      G4_RETURN_IF_ERROR(SkipString(where, k));
    }
  } else if (IsScalar(elem_type)) {
    // The count check above guarantees all count * elem_min bytes are present.
    v->elems_ = data_ + pos_;
    if (elem_type == kTypeBool) {
      for (uint64_t k = 0; k < count; ++k) {
        if (data_[pos_ + k] > 1) {
          return Error(where + "[" + Str(k) + "]: bool value " + Str(data_[pos_ + k]) + " is neither 0 nor 1");
        }
      }
    }
    pos_ += count * elem_min;
  } else {  // arrays of arrays
    v->arrays_.resize(static_cast<size_t>(count));
    for (uint64_t k = 0; k < count; ++k) {
      G4_RETURN_IF_ERROR(ReadValue(elem_type, &v->arrays_[k], where + "[" + Str(k) + "]", depth + 1));
    }
  }
  return OkStatus();
}

Status GgufParser::Parse() {
  // Header: magic, version, tensor_count, kv_count.
  if (size_ < 4 || std::memcmp(data_, "GGUF", 4) != 0) {
    std::string got;
    for (uint64_t k = 0; k < std::min<uint64_t>(size_, 4); ++k) {
      got.push_back(static_cast<char>(data_[k]));
    }
    return Error("bad magic " + Quote(got) + " (expected 'GGUF'); not a GGUF file");
  }
  pos_ = 4;
  uint32_t version = 0;
  G4_RETURN_IF_ERROR(Read(&version, "truncated header: version"));
  if (version != 2 && version != 3) {
    if (version == 1) {
      return Unimplemented(path_ + ": GGUF version 1 is not supported (versions 2 and 3 are)");
    }
    if (version == 0x02000000u || version == 0x03000000u) {
      return Unimplemented(path_ + ": big-endian GGUF files are not supported");
    }
    return Unimplemented(path_ + ": unsupported GGUF version " + Str(version) +
                         " (versions 2 and 3 are supported)");
  }
  out_->version_ = version;
  uint64_t tensor_count = 0, kv_count = 0;
  G4_RETURN_IF_ERROR(Read(&tensor_count, "truncated header: tensor_count"));
  G4_RETURN_IF_ERROR(Read(&kv_count, "truncated header: kv_count"));
  if (kv_count > Left() / kMinKvBytes) {
    return Error("kv_count " + Str(kv_count) + " is larger than the file can hold (" +
                 Str(Left()) + " bytes after the header)");
  }
  if (tensor_count > Left() / kMinTensorInfoBytes ||
      tensor_count * kMinTensorInfoBytes + kv_count * kMinKvBytes > Left()) {
    return Error("tensor_count " + Str(tensor_count) + " is larger than the file can hold (" +
                 Str(Left()) + " bytes after the header, " + Str(kv_count) +
                 " metadata entries)");
  }

  // Metadata.
  for (uint64_t k = 0; k < kv_count; ++k) {
    std::string key;
    G4_RETURN_IF_ERROR(ReadString(&key, "metadata entry " + Str(k) + " key"));
    const std::string where = "metadata key " + Quote(key);
    uint32_t type = 0;
    G4_RETURN_IF_ERROR(Read(&type, where + " (value type)"));
    GgufValue value;
    G4_RETURN_IF_ERROR(ReadValue(type, &value, where, 0));
    if (!out_->metadata_.emplace(key, std::move(value)).second) {
      return Error(where + " appears twice");
    }
  }

  uint32_t alignment = kDefaultAlignment;
  if (const GgufValue* a = out_->FindMeta("general.alignment")) {
    uint64_t v = 0;
    if (a->type == GgufValue::Type::kUInt) {
      v = a->u;
    } else if (a->type == GgufValue::Type::kInt && a->i >= 0) {
      v = static_cast<uint64_t>(a->i);
    } else {
      return Error("metadata key 'general.alignment' has type " +
                   std::string(MetaTypeName(a->gguf_type)) + ", expected uint32");
    }
    if (!IsPowerOfTwo(v) || v > (1ull << 31)) {
      return Error("metadata key 'general.alignment' is " + Str(v) +
                   ", not a power of two (at most 2^31)");
    }
    alignment = static_cast<uint32_t>(v);
  }

  return ReadTensorInfos(tensor_count, alignment);
}

Status GgufParser::ReadTensorInfos(uint64_t count, uint32_t alignment) {
  struct Info {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t ggml_type;
    uint64_t offset;
  };
  std::vector<Info> infos(static_cast<size_t>(count));
  for (uint64_t k = 0; k < count; ++k) {
    Info& info = infos[k];
    G4_RETURN_IF_ERROR(ReadString(&info.name, "tensor info " + Str(k) + " name"));
    const std::string where = "tensor " + Quote(info.name);
    uint32_t n_dims = 0;
    G4_RETURN_IF_ERROR(Read(&n_dims, where + " (n_dims)"));
    if (n_dims > kMaxDims) {
      return Error(where + ": n_dims " + Str(n_dims) + " exceeds the maximum of " +
                   Str(kMaxDims));
    }
    info.ne.resize(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) {
      G4_RETURN_IF_ERROR(Read(&info.ne[d], where + " (ne[" + Str(d) + "])"));
    }
    G4_RETURN_IF_ERROR(Read(&info.ggml_type, where + " (type)"));
    G4_RETURN_IF_ERROR(Read(&info.offset, where + " (offset)"));
  }
  // The data section starts at the next multiple of `alignment` (pos_ <= size_ < 2^63: no
  // overflow).
  const uint64_t data_start = (pos_ + alignment - 1) / alignment * alignment;
  out_->data_start_ = std::min(data_start, size_);

  struct Range {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  ranges.reserve(infos.size());
  for (Info& info : infos) {
    const std::string where = "tensor " + Quote(info.name);
    DType dtype;
    if (!MapGgmlType(info.ggml_type, &dtype)) {
      const char* known = OtherGgmlTypeName(info.ggml_type);
      return Unimplemented(path_ + ": " + where + ": ggml type " + Str(info.ggml_type) +
                           (known ? std::string(" (") + known + ")" : std::string(" (unknown)")) +
                           " is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, "
                           "Q5_1, Q4_K, Q5_K, Q6_K)");
    }
    std::string ne_str = "[";
    for (size_t d = 0; d < info.ne.size(); ++d) ne_str += (d ? ", " : "") + Str(info.ne[d]);
    ne_str += "]";
    // Every ne is a non-negative int64, and so is the product of the non-zero ones: then every
    // partial product of the shape, in any order (Tensor::numel, row counts), fits an int64 too,
    // even when a zero dimension makes the element count 0.
    constexpr uint64_t kMaxI64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    uint64_t nonzero_product = 1;
    for (uint64_t n : info.ne) {
      if (n > kMaxI64) return Error(where + ": ne " + ne_str + " has a dimension over 2^63-1");
      if (n == 0) continue;
      if (__builtin_mul_overflow(nonzero_product, n, &nonzero_product) ||
          nonzero_product > kMaxI64) {
        return Error(where + ": ne " + ne_str + ": the product of the dimensions overflows");
      }
    }
    uint64_t rows = 1;
    for (size_t d = 1; d < info.ne.size(); ++d) rows *= info.ne[d];  // cannot overflow now
    const uint64_t ne0 = info.ne.empty() ? 1 : info.ne[0];
    const uint64_t block = static_cast<uint64_t>(DTypeBlockElems(dtype));
    if (ne0 % block != 0) {
      return Error(where + ": ne[0] = " + Str(ne0) + " is not a multiple of the " +
                   std::string(DTypeName(dtype)) + " block size " + Str(block));
    }
    uint64_t row_bytes = 0, nbytes = 0;
    if (__builtin_mul_overflow(ne0 / block, static_cast<uint64_t>(DTypeBlockBytes(dtype)),
                               &row_bytes) ||
        __builtin_mul_overflow(rows, row_bytes, &nbytes)) {
      return Error(where + ": ne " + ne_str + " of " + std::string(DTypeName(dtype)) +
                   " is too many bytes (overflow)");
    }
    if (info.offset % alignment != 0) {
      return Error(where + ": data offset " + Str(info.offset) +
                   " is not a multiple of the alignment " + Str(alignment));
    }
    if (data_start > size_ || info.offset > size_ - data_start ||
        nbytes > size_ - data_start - info.offset) {
      return Error(where + ": data (offset " + Str(info.offset) + ", " + Str(nbytes) +
                   " bytes, data section at " + Str(data_start) +
                   ") runs past the end of the file (" + Str(size_) + " bytes)");
    }
    Tensor t;
    t.name = info.name;
    t.dtype = dtype;
    t.shape.assign(info.ne.rbegin(), info.ne.rend());
    t.data = data_ + data_start + info.offset;
    t.nbytes = static_cast<size_t>(nbytes);
    t.file = path_;
    auto [it, inserted] = out_->tensors_.emplace(info.name, std::move(t));
    if (!inserted) return Error(where + " appears twice");
    ranges.push_back({info.offset, info.offset + nbytes, &it->first});
  }

  // No two tensors may share bytes (empty tensors occupy none).
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t max_end = 0;
  const std::string* max_owner = nullptr;
  for (const Range& r : ranges) {
    if (r.begin == r.end) continue;
    if (max_owner != nullptr && r.begin < max_end) {
      return Error("tensor " + Quote(*r.name) + " (data bytes [" + Str(r.begin) + ", " +
                   Str(r.end) + ")) overlaps tensor " + Quote(*max_owner) +
                   " (ending at byte " + Str(max_end) + ")");
    }
    if (r.end > max_end) {
      max_end = r.end;
      max_owner = r.name;
    }
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  G4_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  std::unique_ptr<GgufFile> g(new GgufFile());
  g->path_ = path;
  GgufParser parser(g.get(), file->data(), file->size());
  G4_RETURN_IF_ERROR(parser.Parse());
  g->file_ = std::move(file);
  g->ReleaseMetadataPages();  // parsed: the metadata bytes are read again only through array views
  return StatusOr<std::unique_ptr<GgufFile>>(std::move(g));
}

void GgufFile::ReleaseMetadataPages() const {
  if (file_) file_->ReleasePages(0, static_cast<size_t>(data_start_));
}

const GgufValue* GgufFile::FindMeta(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {

// A numeric or bool element decoded from its little-endian bytes.
struct Number {
  bool is_float = false, is_unsigned = false, ok = true;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
};

Number DecodeNumber(uint32_t t, const uint8_t* p) {
  Number n;
  switch (t) {
    case kTypeUInt8: case kTypeBool: n.is_unsigned = true; n.u = p[0]; break;
    case kTypeUInt16: n.is_unsigned = true; n.u = Load<uint16_t>(p); break;
    case kTypeUInt32: n.is_unsigned = true; n.u = Load<uint32_t>(p); break;
    case kTypeUInt64: n.is_unsigned = true; n.u = Load<uint64_t>(p); break;
    case kTypeInt8: n.i = static_cast<int8_t>(p[0]); break;
    case kTypeInt16: n.i = Load<int16_t>(p); break;
    case kTypeInt32: n.i = Load<int32_t>(p); break;
    case kTypeInt64: n.i = Load<int64_t>(p); break;
    case kTypeFloat32: n.is_float = true; n.f = Load<float>(p); break;
    case kTypeFloat64: n.is_float = true; n.f = Load<double>(p); break;
    default: n.ok = false; break;
  }
  return n;
}

Number ElementNumber(const GgufValue& v, size_t k, const uint8_t* elems) {
  G4_CHECK(k < v.size());
  if (!IsScalar(v.array_type)) return Number{false, false, false, 0, 0, 0};
  return DecodeNumber(v.array_type, elems + k * MinEncodedSize(v.array_type));
}

}  // namespace

int64_t GgufValue::IntAt(size_t k) const {
  const Number n = ElementNumber(*this, k, elems_);
  if (!n.ok) return 0;
  if (n.is_float) {
    // Truncate toward zero, saturating where the double does not fit (NaN -> 0).
    if (!(n.f == n.f)) return 0;
    if (n.f >= 9223372036854775807.0) return std::numeric_limits<int64_t>::max();
    if (n.f <= -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
    return static_cast<int64_t>(n.f);
  }
  return n.is_unsigned ? static_cast<int64_t>(n.u) : n.i;
}

double GgufValue::FloatAt(size_t k) const {
  const Number n = ElementNumber(*this, k, elems_);
  if (!n.ok) return 0;
  return n.is_float ? n.f : n.is_unsigned ? static_cast<double>(n.u) : static_cast<double>(n.i);
}

bool GgufValue::BoolAt(size_t k) const {
  const Number n = ElementNumber(*this, k, elems_);
  if (!n.ok) return false;
  return n.is_float ? n.f != 0 : n.is_unsigned ? n.u != 0 : n.i != 0;
}

std::string_view GgufValue::StringAt(size_t k) const {
  G4_CHECK(k < size());
  if (array_type != kTypeString) return {};
  const uint8_t* p = elems_ + string_offsets_[k / kStringStride];
  for (size_t j = k / kStringStride * kStringStride; j < k; ++j) p += 8 + Load<uint64_t>(p);
  const uint64_t len = Load<uint64_t>(p);  // checked against the file by the parser
  return std::string_view(reinterpret_cast<const char*>(p + 8), static_cast<size_t>(len));
}

const GgufValue& GgufValue::ArrayAt(size_t k) const {
  G4_CHECK(k < size());
  static const GgufValue kEmpty;
  return array_type == kTypeArray ? arrays_[k] : kEmpty;
}

std::vector<std::string> GgufValue::Strings() const {
  std::vector<std::string> out;
  if (type != Type::kArray || array_type != kTypeString) return out;
  out.reserve(size());
  for (size_t k = 0; k < size(); ++k) out.emplace_back(StringAt(k));
  return out;
}

namespace {

std::string TypeNameOf(const GgufValue& v) {
  const char* n = MetaTypeName(v.gguf_type);
  std::string s = n ? n : "?";
  if (v.type == GgufValue::Type::kArray) {
    const char* e = MetaTypeName(v.array_type);
    s += std::string(" of ") + (e ? e : "?");
  }
  return s;
}

// The value as int64 if it is an integer that fits.
bool AsInt(const GgufValue& v, int64_t* out) {
  if (v.type == GgufValue::Type::kInt) {
    *out = v.i;
    return true;
  }
  if (v.type == GgufValue::Type::kUInt &&
      v.u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    *out = static_cast<int64_t>(v.u);
    return true;
  }
  return false;
}

bool AsFloat(const GgufValue& v, double* out) {
  switch (v.type) {
    case GgufValue::Type::kFloat: *out = v.f; return true;
    case GgufValue::Type::kInt: *out = static_cast<double>(v.i); return true;
    case GgufValue::Type::kUInt: *out = static_cast<double>(v.u); return true;
    default: return false;
  }
}

}  // namespace

StatusOr<int64_t> GgufFile::GetInt(const std::string& key) const {
  const GgufValue* v = FindMeta(key);
  if (v == nullptr) return NotFound(path_ + ": no metadata key " + Quote(key));
  int64_t out;
  if (!AsInt(*v, &out)) {
    if (v->type == GgufValue::Type::kUInt) {
      return InvalidArgument(path_ + ": metadata key " + Quote(key) + " = " + Str(v->u) +
                             " does not fit in int64");
    }
    return InvalidArgument(path_ + ": metadata key " + Quote(key) + " is a " + TypeNameOf(*v) +
                           ", not an integer");
  }
  return out;
}

int64_t GgufFile::GetInt(const std::string& key, int64_t dflt) const {
  const GgufValue* v = FindMeta(key);
  int64_t out;
  return v != nullptr && AsInt(*v, &out) ? out : dflt;
}

StatusOr<double> GgufFile::GetFloat(const std::string& key) const {
  const GgufValue* v = FindMeta(key);
  if (v == nullptr) return NotFound(path_ + ": no metadata key " + Quote(key));
  double out;
  if (!AsFloat(*v, &out)) {
    return InvalidArgument(path_ + ": metadata key " + Quote(key) + " is a " + TypeNameOf(*v) +
                           ", not a number");
  }
  return out;
}

double GgufFile::GetFloat(const std::string& key, double dflt) const {
  const GgufValue* v = FindMeta(key);
  double out;
  return v != nullptr && AsFloat(*v, &out) ? out : dflt;
}

StatusOr<std::string> GgufFile::GetString(const std::string& key) const {
  const GgufValue* v = FindMeta(key);
  if (v == nullptr) return NotFound(path_ + ": no metadata key " + Quote(key));
  if (v->type != GgufValue::Type::kString) {
    return InvalidArgument(path_ + ": metadata key " + Quote(key) + " is a " + TypeNameOf(*v) +
                           ", not a string");
  }
  return v->s;
}

bool GgufFile::GetBool(const std::string& key, bool dflt) const {
  const GgufValue* v = FindMeta(key);
  return v != nullptr && v->type == GgufValue::Type::kBool ? v->b : dflt;
}

const Tensor* GgufFile::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> GgufFile::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, t] : tensors_) names.push_back(name);
  return names;
}

bool GgufFile::PackQ4_0x4(const Tensor& t) {
  auto it = tensors_.find(t.name);
  if (!file_ || it == tensors_.end() || &it->second != &t) return false;
  Tensor& mine = it->second;
  if (!Q4_0x4Packable(mine.dtype, mine.shape)) return false;
  const int64_t M = mine.shape[0], K = mine.shape[1];
  const size_t offset = static_cast<size_t>(mine.data - file_->data());
  if (!file_->Rewrite(offset, mine.nbytes, [&](uint8_t* p) { PackQ4_0x4InPlace(p, M, K); })) return false;
  mine.dtype = DType::kQ4_0x4;
  return true;
}

}  // namespace g4
