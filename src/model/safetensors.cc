#include "model/safetensors.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <set>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

namespace g4 {
namespace {

using json = nlohmann::json;

// The reference implementation's limit (safetensors MAX_HEADER_SIZE); real headers are < 10 MB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSingleFile = "model.safetensors";

std::string Quote(std::string_view s) {
  std::string q;
  q.reserve(s.size() + 2);
  q.push_back('\'');
  q.append(s);
  q.push_back('\'');
  return q;
}

// The safetensors dtype spelling -> ours. Known-but-unsupported and unknown names both yield
// Unimplemented (the message says which).
StatusOr<DType> ParseDType(const std::string& s, const std::string& where) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  if (s == "I32") return DType::kI32;
  if (s == "I64") return DType::kI64;
  static const std::set<std::string, std::less<>> kKnown = {
      "BOOL", "U8",  "I8",  "U16", "I16",     "U32",     "U64",     "F64",      "C64",
      "F8_E4M3", "F8_E5M2", "F8_E8M0", "E8M0", "F4", "F6_E2M3", "F6_E3M2", "F8_E4M3FNUZ",
      "F8_E5M2FNUZ"};
  if (kKnown.count(s)) {
    return Unimplemented(where + ": dtype " + s +
                         " is not supported (supported: F32, F16, BF16, I32, I64)");
  }
  return Unimplemented(where + ": unknown dtype " + Quote(s) +
                       " (supported: F32, F16, BF16, I32, I64)");
}

// A JSON integer in [0, 2^64), or an error (floats, bools, negatives are refused).
bool GetU64(const json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}

struct Range {
  uint64_t begin, end;
  const std::string* name;
};

// Rejects absolute paths and ".." components in a shard name from an index file.
bool IsSafeRelativePath(const std::string& s) {
  if (s.empty()) return false;
  std::filesystem::path p(s);
  if (p.is_absolute() || p.has_root_path()) return false;
  for (const auto& part : p) {
    if (part == "..") return false;
  }
  return true;
}

bool IsRegularFile(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

}  // namespace

StatusOr<std::unique_ptr<SafetensorsStore>> SafetensorsStore::OpenFile(const std::string& path) {
  auto store = std::make_unique<SafetensorsStore>();
  G4_RETURN_IF_ERROR(store->AddFile(path));
  return StatusOr<std::unique_ptr<SafetensorsStore>>(std::move(store));
}

StatusOr<std::unique_ptr<SafetensorsStore>> SafetensorsStore::OpenDirectory(
    const std::string& dir) {
  const std::string index_path = (std::filesystem::path(dir) / kIndexFile).string();
  const std::string single_path = (std::filesystem::path(dir) / kSingleFile).string();

  if (!IsRegularFile(index_path)) {
    if (IsRegularFile(single_path)) return OpenFile(single_path);
    return NotFound(dir + ": no " + kIndexFile + " or " + kSingleFile + " in this directory");
  }

  G4_ASSIGN_OR_RETURN(std::string text, ReadTextFile(index_path));
  json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded()) return DataLoss(index_path + ": not valid JSON");
  if (!index.is_object()) return DataLoss(index_path + ": top level is not a JSON object");
  auto wm = index.find("weight_map");
  if (wm == index.end()) return DataLoss(index_path + ": no \"weight_map\"");
  if (!wm->is_object()) return DataLoss(index_path + ": \"weight_map\" is not a JSON object");
  if (wm->empty()) return DataLoss(index_path + ": \"weight_map\" is empty");

  // tensor -> shard path, and each distinct shard (with one tensor it holds, for messages).
  std::map<std::string, std::string> expected;
  std::map<std::string, std::string> shards;  // sorted: files are opened in a fixed order
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string()) {
      return DataLoss(index_path + ": \"weight_map\" entry for tensor " + Quote(it.key()) +
                      " is not a string");
    }
    const std::string shard = it.value().get<std::string>();
    if (!IsSafeRelativePath(shard)) {
      return DataLoss(index_path + ": tensor " + Quote(it.key()) + " names shard " +
                      Quote(shard) + ", which is not a relative path inside " + dir);
    }
    const std::string shard_path = (std::filesystem::path(dir) / shard).string();
    expected[it.key()] = shard_path;
    shards.emplace(shard_path, it.key());
  }

  auto store = std::make_unique<SafetensorsStore>();
  for (const auto& [shard_path, some_tensor] : shards) {
    if (!IsRegularFile(shard_path)) {
      return NotFound(shard_path + ": shard named by " + index_path + " (e.g. for tensor " +
                      Quote(some_tensor) + ") does not exist");
    }
    G4_RETURN_IF_ERROR(store->AddFile(shard_path));
  }
  for (const auto& [name, shard_path] : expected) {
    const Tensor* t = store->Find(name);
    if (t == nullptr) {
      return DataLoss(index_path + ": tensor " + Quote(name) + " is listed in shard " +
                      shard_path + " but that file does not contain it");
    }
    if (t->file != shard_path) {
      return DataLoss(index_path + ": tensor " + Quote(name) + " is listed in shard " +
                      shard_path + " but was found in " + t->file);
    }
  }
  return StatusOr<std::unique_ptr<SafetensorsStore>>(std::move(store));
}

const Tensor* SafetensorsStore::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> SafetensorsStore::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, t] : tensors_) names.push_back(name);  // std::map: already sorted
  return names;
}

Status SafetensorsStore::AddFile(const std::string& path) {
  G4_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  const uint8_t* base = file->data();
  const uint64_t size = file->size();

  if (size < 8) {
    return DataLoss(path + ": file is " + std::to_string(size) +
                    " bytes, shorter than the 8-byte safetensors header length");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];  // little-endian
  if (header_len > kMaxHeaderBytes) {
    return DataLoss(path + ": header length " + std::to_string(header_len) +
                    " is implausibly large (limit " + std::to_string(kMaxHeaderBytes) +
                    " bytes); not a safetensors file?");
  }
  if (header_len > size - 8) {
    return DataLoss(path + ": header length " + std::to_string(header_len) +
                    " runs past the end of the file (" + std::to_string(size) + " bytes)");
  }
  const uint8_t* header_begin = base + 8;
  const uint8_t* header_end = header_begin + header_len;
  const uint8_t* data_begin = header_end;
  const uint64_t data_size = size - 8 - header_len;

  // Duplicate top-level keys would silently hide a tensor: catch them while parsing.
  std::set<std::string> seen_keys;
  std::string duplicate;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      if (!seen_keys.insert(parsed.get<std::string>()).second && duplicate.empty()) {
        duplicate = parsed.get<std::string>();
      }
    }
    return true;
  };
  json header = json::parse(header_begin, header_end, cb, /*allow_exceptions=*/false);
  if (header.is_discarded()) return DataLoss(path + ": header is not valid JSON (or not UTF-8)");
  if (!header.is_object()) return DataLoss(path + ": header is not a JSON object");
  if (!duplicate.empty()) {
    return DataLoss(path + ": tensor " + Quote(duplicate) + " appears twice in the header");
  }

  std::map<std::string, std::string> metadata;
  std::map<std::string, Tensor, std::less<>> tensors;
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) return DataLoss(path + ": \"__metadata__\" is not a JSON object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) {
          return DataLoss(path + ": \"__metadata__\" value for key " + Quote(m.key()) +
                          " is not a string");
        }
        metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor " + Quote(name);
    if (!entry.is_object()) return DataLoss(where + ": entry is not a JSON object");

    // dtype
    auto jd = entry.find("dtype");
    if (jd == entry.end()) return DataLoss(where + ": missing \"dtype\"");
    if (!jd->is_string()) return DataLoss(where + ": \"dtype\" is not a string");
    // shape
    auto js = entry.find("shape");
    if (js == entry.end()) return DataLoss(where + ": missing \"shape\"");
    if (!js->is_array()) return DataLoss(where + ": \"shape\" is not an array");
    // data_offsets
    auto jo = entry.find("data_offsets");
    if (jo == entry.end()) return DataLoss(where + ": missing \"data_offsets\"");
    if (!jo->is_array() || jo->size() != 2) {
      return DataLoss(where + ": \"data_offsets\" is not an array of two integers");
    }

    G4_ASSIGN_OR_RETURN(DType dtype, ParseDType(jd->get<std::string>(), where));

    std::vector<int64_t> shape;
    shape.reserve(js->size());
    uint64_t numel = 1;
    for (const json& d : *js) {
      if (!d.is_number_integer()) {
        return DataLoss(where + ": \"shape\" has a non-integer entry " + d.dump());
      }
      if (!d.is_number_unsigned() && d.get<int64_t>() < 0) {
        return DataLoss(where + ": \"shape\" has a negative dimension " + d.dump());
      }
      const uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(numel, dim, &numel) ||
          numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return DataLoss(where + ": shape " + js->dump() + " has too many elements (overflow)");
      }
      shape.push_back(static_cast<int64_t>(dim));
    }
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(DTypeSize(dtype)), &nbytes)) {
      return DataLoss(where + ": shape " + js->dump() + " of " + std::string(DTypeName(dtype)) +
                      " is too many bytes (overflow)");
    }

    uint64_t begin = 0, end = 0;
    if (!GetU64((*jo)[0], &begin) || !GetU64((*jo)[1], &end)) {
      return DataLoss(where + ": \"data_offsets\" " + jo->dump() +
                      " are not two non-negative integers");
    }
    if (begin > end) {
      return DataLoss(where + ": data_offsets " + jo->dump() + " begin after they end");
    }
    if (end > data_size) {
      return DataLoss(where + ": data_offsets " + jo->dump() +
                      " run past the end of the file (data section is " +
                      std::to_string(data_size) + " bytes)");
    }
    if (end - begin != nbytes) {
      return DataLoss(where + ": data_offsets " + jo->dump() + " span " +
                      std::to_string(end - begin) + " bytes but shape " + js->dump() + " of " +
                      std::string(DTypeName(dtype)) + " needs " + std::to_string(nbytes));
    }

    Tensor t;
    t.name = name;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.data = data_begin + begin;
    t.nbytes = static_cast<size_t>(nbytes);
    t.file = path;
    auto [pos, inserted] = tensors.emplace(name, std::move(t));
    ranges.push_back({begin, end, &pos->first});
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
      return DataLoss(path + ": tensor " + Quote(*r.name) + " (bytes [" +
                      std::to_string(r.begin) + ", " + std::to_string(r.end) +
                      ")) overlaps tensor " + Quote(*max_owner) + " (ending at byte " +
                      std::to_string(max_end) + ")");
    }
    if (r.end > max_end) {
      max_end = r.end;
      max_owner = r.name;
    }
  }

  // Names must be unique across the files of one store.
  for (const auto& [name, t] : tensors) {
    auto prev = tensors_.find(name);
    if (prev != tensors_.end()) {
      return DataLoss(path + ": tensor " + Quote(name) + " is also in " + prev->second.file +
                      " (duplicate tensor name across shards)");
    }
  }

  tensors_.merge(tensors);
  for (auto& [k, v] : metadata) metadata_[k] = std::move(v);  // later files win
  files_.push_back(std::move(file));
  data_offsets_.push_back(static_cast<size_t>(8 + header_len));
  return OkStatus();
}

size_t SafetensorsStore::DataBytesToCopy() const {
  size_t n = 0;
  for (size_t i = 0; i < files_.size(); ++i) n += files_[i]->BytesToCopy(data_offsets_[i]);
  return n;
}

Status SafetensorsStore::ReadDataIntoMemory(const std::function<void(size_t)>& on_read) {
  for (size_t i = 0; i < files_.size(); ++i) G4_RETURN_IF_ERROR(files_[i]->ReadIntoMemory(data_offsets_[i], on_read));
  return OkStatus();
}

}  // namespace g4
