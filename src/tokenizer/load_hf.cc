// Tokenizer::FromHfDirectory / FromHfJson: Hugging Face tokenizer.json with a BPE model.

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/model.h"
#include "tokenizer/tokenizer.h"

namespace g4 {

using json = nlohmann::json;
using tokenizer_internal::Model;
using tokenizer_internal::NormalizerStep;
using tokenizer_internal::PreTokenizerStep;

namespace {

class HfLoader {
 public:
  explicit HfLoader(const std::string& origin) : origin_(origin) {}

  Status Err(StatusCode code, const std::string& path, const std::string& what) const {
    return Status(code, origin_ + ": " + path + ": " + what);
  }
  Status Invalid(const std::string& path, const std::string& what) const {
    return Err(StatusCode::kInvalidArgument, path, what);
  }

  Status StringField(const json& obj, const std::string& path, const char* key, std::string* out) const {
    auto it = obj.find(key);
    if (it == obj.end()) return Err(StatusCode::kNotFound, path + "." + key, "missing");
    if (!it->is_string()) return Invalid(path + "." + key, "expected a string");
    *out = it->get<std::string>();
    return OkStatus();
  }

  // A {"String": "..."} pattern; {"Regex": ...} is not supported.
  Status Pattern(const json& obj, const std::string& path, std::string* out) const {
    auto it = obj.find("pattern");
    if (it == obj.end() || !it->is_object()) return Invalid(path + ".pattern", "expected an object");
    if (it->contains("String") && (*it)["String"].is_string()) {
      *out = (*it)["String"].get<std::string>();
      return OkStatus();
    }
    if (it->contains("Regex")) {
      return Err(StatusCode::kUnimplemented, path + ".pattern", "regular-expression patterns are not supported");
    }
    return Invalid(path + ".pattern", "expected {\"String\": ...}");
  }

  Status Normalizer(const json& n, const std::string& path, std::vector<NormalizerStep>* out) const {
    if (n.is_null()) return OkStatus();
    if (!n.is_object()) return Invalid(path, "expected an object or null");
    std::string type;
    G4_RETURN_IF_ERROR(StringField(n, path, "type", &type));
    if (type == "Sequence") {
      auto it = n.find("normalizers");
      if (it == n.end() || !it->is_array()) return Invalid(path + ".normalizers", "expected an array");
      for (size_t k = 0; k < it->size(); ++k) {
        G4_RETURN_IF_ERROR(Normalizer((*it)[k], path + ".normalizers[" + std::to_string(k) + "]", out));
      }
      return OkStatus();
    }
    if (type == "Replace") {
      NormalizerStep s{NormalizerStep::Kind::kReplace, "", ""};
      G4_RETURN_IF_ERROR(Pattern(n, path, &s.pattern));
      G4_RETURN_IF_ERROR(StringField(n, path, "content", &s.content));
      out->push_back(std::move(s));
      return OkStatus();
    }
    if (type == "Prepend") {
      NormalizerStep s{NormalizerStep::Kind::kPrepend, "", ""};
      G4_RETURN_IF_ERROR(StringField(n, path, "prepend", &s.content));
      out->push_back(std::move(s));
      return OkStatus();
    }
    return Err(StatusCode::kUnimplemented, path + ".type", "normalizer '" + type + "' is not supported");
  }

  Status PreTokenizer(const json& p, const std::string& path, std::vector<PreTokenizerStep>* out) const {
    if (p.is_null()) return OkStatus();
    if (!p.is_object()) return Invalid(path, "expected an object or null");
    std::string type;
    G4_RETURN_IF_ERROR(StringField(p, path, "type", &type));
    if (type == "Sequence") {
      auto it = p.find("pretokenizers");
      if (it == p.end() || !it->is_array()) {
        return Invalid(path + ".pretokenizers", "expected an array");
      }
      for (size_t k = 0; k < it->size(); ++k) {
        G4_RETURN_IF_ERROR(PreTokenizer((*it)[k], path + ".pretokenizers[" + std::to_string(k) + "]", out));
      }
      return OkStatus();
    }
    if (type == "Split") {
      PreTokenizerStep s{PreTokenizerStep::Kind::kSplit, ""};
      G4_RETURN_IF_ERROR(Pattern(p, path, &s.pattern));
      std::string behavior;
      G4_RETURN_IF_ERROR(StringField(p, path, "behavior", &behavior));
      using B = PreTokenizerStep::Behavior;
      if (behavior == "Removed")
        s.behavior = B::kRemoved;
      else if (behavior == "Isolated")
        s.behavior = B::kIsolated;
      else if (behavior == "MergedWithPrevious")
        s.behavior = B::kMergedWithPrevious;
      else if (behavior == "MergedWithNext")
        s.behavior = B::kMergedWithNext;
      else if (behavior == "Contiguous")
        s.behavior = B::kContiguous;
      else
        return Invalid(path + ".behavior", "unknown split behavior '" + behavior + "'");
      if (p.value("invert", false)) {
        return Err(StatusCode::kUnimplemented, path + ".invert", "inverted splits are not supported");
      }
      out->push_back(std::move(s));
      return OkStatus();
    }
    if (type == "Metaspace") {
      PreTokenizerStep s{PreTokenizerStep::Kind::kMetaspace, "\xE2\x96\x81"};
      if (p.contains("replacement")) G4_RETURN_IF_ERROR(StringField(p, path, "replacement", &s.pattern));
      std::string scheme = "always";
      if (p.contains("prepend_scheme")) {
        G4_RETURN_IF_ERROR(StringField(p, path, "prepend_scheme", &scheme));
      } else if (p.contains("add_prefix_space") && !p.value("add_prefix_space", true)) {
        scheme = "never";
      }
      if (scheme == "always")
        s.prepend = PreTokenizerStep::Prepend::kAlways;
      else if (scheme == "first")
        s.prepend = PreTokenizerStep::Prepend::kFirst;
      else if (scheme == "never")
        s.prepend = PreTokenizerStep::Prepend::kNever;
      else
        return Invalid(path + ".prepend_scheme", "unknown scheme '" + scheme + "'");
      s.split = p.value("split", true);
      out->push_back(std::move(s));
      return OkStatus();
    }
    return Err(StatusCode::kUnimplemented, path + ".type", "pre-tokenizer '" + type + "' is not supported");
  }

  // tokenizer_config.json's "bos_token": a string or {"content": ...}.
  static std::string ConfigToken(const json& cfg, const char* key) {
    auto it = cfg.find(key);
    if (it == cfg.end()) return {};
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      return (*it)["content"].get<std::string>();
    }
    return {};
  }

  StatusOr<std::unique_ptr<Model>> Load(std::string_view text, std::string_view config_text) const;

 private:
  std::string origin_;
};

StatusOr<std::unique_ptr<Model>> HfLoader::Load(std::string_view text, std::string_view config_text) const {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status(StatusCode::kDataLoss, origin_ + ": not a valid JSON object");
  }
  auto m = std::make_unique<Model>();
  m->kind = Tokenizer::Kind::kHfBpe;

  auto mit = j.find("model");
  if (mit == j.end() || !mit->is_object()) return Err(StatusCode::kNotFound, "model", "missing");
  const json& model = *mit;
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") {
    return Err(StatusCode::kUnimplemented, "model.type", "model '" + type + "' is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    if (it != model.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty())) {
      return Err(StatusCode::kUnimplemented, std::string("model.") + key, "is not supported");
    }
  }
  if (auto it = model.find("dropout"); it != model.end() && it->is_number() && it->get<double>() > 0) {
    return Err(StatusCode::kUnimplemented, "model.dropout", "BPE dropout is not supported");
  }
  m->byte_fallback = model.value("byte_fallback", false);
  m->fuse_unk = model.value("fuse_unk", false);
  m->ignore_merges = model.value("ignore_merges", false);

  // Vocabulary: model.vocab plus added_tokens (which may extend it).
  auto vit = model.find("vocab");
  if (vit == model.end() || !vit->is_object()) return Invalid("model.vocab", "expected an object");
  std::vector<std::pair<int64_t, std::string>> entries;
  entries.reserve(vit->size());
  int64_t max_id = -1;
  for (auto it = vit->begin(); it != vit->end(); ++it) {
    if (!it.value().is_number_integer()) {
      return Invalid("model.vocab[\"" + it.key() + "\"]", "expected an integer id");
    }
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= INT32_MAX) return Invalid("model.vocab[\"" + it.key() + "\"]", "id out of range");
    entries.emplace_back(id, it.key());
    max_id = std::max(max_id, id);
  }
  const json added = j.value("added_tokens", json::array());
  if (!added.is_array()) return Invalid("added_tokens", "expected an array");
  for (size_t k = 0; k < added.size(); ++k) {
    const json& a = added[k];
    const std::string path = "added_tokens[" + std::to_string(k) + "]";
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer()) {
      return Invalid(path + ".id", "expected an integer id");
    }
    const int64_t id = a["id"].get<int64_t>();
    if (id < 0 || id >= INT32_MAX) return Invalid(path + ".id", "id out of range");
    max_id = std::max(max_id, id);
  }
  if (max_id < 0) return Invalid("model.vocab", "is empty");
  const size_t n = static_cast<size_t>(max_id + 1);
  std::vector<std::string> texts(n);
  std::vector<uint32_t> attrs(n, kTokenNormal);
  std::vector<bool> seen(n, false);
  for (auto& [id, piece] : entries) {
    if (seen[id]) {
      return Invalid("model.vocab", "id " + std::to_string(id) + " is used by '" + texts[id] + "' and '" + piece + "'");
    }
    seen[id] = true;
    texts[id] = std::move(piece);
  }
  for (size_t k = 0; k < added.size(); ++k) {
    const json& a = added[k];
    const std::string path = "added_tokens[" + std::to_string(k) + "]";
    std::string content;
    G4_RETURN_IF_ERROR(StringField(a, path, "content", &content));
    if (content.empty()) return Invalid(path + ".content", "is empty");
    const int64_t id = a["id"].get<int64_t>();
    if (seen[id] && texts[id] != content) {
      return Invalid(path, "id " + std::to_string(id) + " is '" + texts[id] +
                               "' in model.vocab but the added token is '" + content + "'");
    }
    seen[id] = true;
    texts[id] = std::move(content);
    uint32_t& at = attrs[id];
    at = a.value("special", false) ? kTokenControl : kTokenUserDefined;
    if (a.value("normalized", false)) at |= kTokenNormalized;
    if (a.value("lstrip", false)) at |= kTokenLstrip;
    if (a.value("rstrip", false)) at |= kTokenRstrip;
    if (a.value("single_word", false)) at |= kTokenSingleWord;
  }
  for (size_t id = 0; id < seen.size(); ++id) {
    if (!seen[id]) {
      return Invalid("model.vocab", "no token has id " + std::to_string(id) + " (ids must be 0.." +
                                        std::to_string(seen.size() - 1) + " without gaps)");
    }
  }
  // Byte-fallback tokens.
  for (size_t id = 0; id < n; ++id) {
    const std::string& t = texts[id];
    if (m->byte_fallback && (attrs[id] & kTokenNormal) && t.size() == 6 && t.starts_with("<0x") && t[5] == '>') {
      attrs[id] = kTokenByte;
    }
  }
  G4_RETURN_IF_ERROR(m->tokens.Assign(n, [&](size_t i) -> const std::string& { return texts[i]; }));
  for (size_t id = 0; id < n; ++id) m->tokens.set_attrs(static_cast<int32_t>(id), attrs[id]);
  std::vector<std::string>().swap(texts);
  m->BuildIndex();

  // The unknown token.
  if (auto it = model.find("unk_token"); it != model.end() && it->is_string()) {
    m->unk = m->Lookup(it->get<std::string>());
    if (m->unk < 0) {
      return Invalid("model.unk_token", "'" + it->get<std::string>() + "' is not in the vocabulary");
    }
    m->tokens.set_attrs(m->unk, m->tokens.attrs(m->unk) | kTokenUnknown);
  }

  // Merges: "left right" strings or [left, right] pairs.
  auto merges_it = model.find("merges");
  if (merges_it != model.end() && !merges_it->is_array()) return Invalid("model.merges", "expected an array");
  const json merges = merges_it == model.end() ? json::array() : *merges_it;
  m->merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string path = "model.merges[" + std::to_string(r) + "]";
    std::string left, right;
    const json& e = merges[r];
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ', 1);
      if (sp == std::string::npos) return Invalid(path, "'" + s + "' has no space separator");
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      left = e[0].get<std::string>();
      right = e[1].get<std::string>();
    } else {
      return Invalid(path, "expected \"left right\" or [left, right]");
    }
    const int32_t a = m->Lookup(left), b = m->Lookup(right), c = m->Lookup(left + right);
    if (a < 0) return Invalid(path, "piece '" + left + "' is not in the vocabulary");
    if (b < 0) return Invalid(path, "piece '" + right + "' is not in the vocabulary");
    if (c < 0) return Invalid(path, "merged piece '" + left + right + "' is not in the vocabulary");
    m->merges.emplace(Model::PairKey(a, b), tokenizer_internal::Merge{static_cast<int32_t>(r), c});
  }

  G4_RETURN_IF_ERROR(Normalizer(j.value("normalizer", json()), "normalizer", &m->normalizer));
  G4_RETURN_IF_ERROR(PreTokenizer(j.value("pre_tokenizer", json()), "pre_tokenizer", &m->pre_tokenizer));

  // Special ids: tokenizer_config.json when given, else the conventional Gemma names.
  json cfg = json::object();
  if (!config_text.empty()) {
    cfg = json::parse(config_text, nullptr, false);
    if (cfg.is_discarded() || !cfg.is_object()) {
      return Status(StatusCode::kDataLoss, origin_ + ": tokenizer_config.json is not a valid JSON object");
    }
  }
  const auto pick = [&](const char* key, const char* dflt, int32_t* out) -> Status {
    std::string name = ConfigToken(cfg, key);
    const bool from_config = !name.empty();
    if (!from_config) name = dflt;
    *out = m->Lookup(name);
    if (*out < 0 && from_config) {
      return Status(StatusCode::kInvalidArgument,
                    origin_ + ": tokenizer_config.json: " + key + " '" + name + "' is not in the vocabulary");
    }
    return OkStatus();
  };
  G4_RETURN_IF_ERROR(pick("bos_token", "<bos>", &m->bos));
  G4_RETURN_IF_ERROR(pick("eos_token", "<eos>", &m->eos));
  G4_RETURN_IF_ERROR(pick("pad_token", "<pad>", &m->pad));
  if (m->unk < 0) G4_RETURN_IF_ERROR(pick("unk_token", "<unk>", &m->unk));
  m->add_bos = cfg.value("add_bos_token", m->bos >= 0);

  m->Finalize();
  return m;
}

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return DataLoss(path + ": read error");
  return ss.str();
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromHfJson(std::string_view tokenizer_json,
                                                           std::string_view tokenizer_config_json,
                                                           const std::string& origin) {
  HfLoader loader(origin);
  G4_ASSIGN_OR_RETURN(auto m, loader.Load(tokenizer_json, tokenizer_config_json));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(m)));
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromHfDirectory(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  G4_ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(path));
  std::string config;
  const std::string config_path = dir + "/tokenizer_config.json";
  if (std::ifstream(config_path).good()) {
    G4_ASSIGN_OR_RETURN(config, ReadWholeFile(config_path));
  }
  return FromHfJson(text, config, path);
}

}  // namespace g4
