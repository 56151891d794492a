// Tokenizer::FromGguf: the tokenizer.ggml.* metadata written by llama.cpp's converters.

#include <string>

#include "model/gguf.h"
#include "tokenizer/model.h"
#include "tokenizer/tokenizer.h"

namespace g4 {

using tokenizer_internal::Model;

namespace {

// llama.cpp's LLAMA_TOKEN_TYPE_* values as stored in tokenizer.ggml.token_type.
uint32_t AttrFromType(int64_t type) {
  switch (type) {
    case 1:
      return kTokenNormal;
    case 2:
      return kTokenUnknown;
    case 3:
      return kTokenControl;
    case 4:
      return kTokenUserDefined;
    case 5:
      return kTokenUnused;
    case 6:
      return kTokenByte;
    default:
      return kTokenUndefined;
  }
}

std::string Quote(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else
      out += c;
  }
  return out + "'";
}

Status KeyError(const GgufFile& f, StatusCode code, const std::string& key, const std::string& what) {
  return Status(code, f.path() + ": " + key + ": " + what);
}

// Fetches an array-valued key and checks its element type. nullptr (and OK) if absent and not
// required.
StatusOr<const GgufValue*> GetArray(const GgufFile& f, const std::string& key, std::initializer_list<uint32_t> types,
                                    bool required) {
  const GgufValue* v = f.FindMeta(key);
  if (v == nullptr) {
    if (required) return KeyError(f, StatusCode::kNotFound, key, "missing");
    return static_cast<const GgufValue*>(nullptr);
  }
  if (v->type != GgufValue::Type::kArray) {
    return KeyError(f, StatusCode::kInvalidArgument, key, "expected an array");
  }
  for (uint32_t t : types) {
    if (v->array_type == t) return v;
  }
  return KeyError(f, StatusCode::kInvalidArgument, key,
                  "unexpected array element type " + std::to_string(v->array_type));
}

// Reads an optional token id key; absent -> `dflt`. An id outside the vocabulary is an error.
Status ReadTokenId(const GgufFile& f, const std::string& key, int32_t n, int32_t dflt, int32_t* out) {
  const GgufValue* v = f.FindMeta(key);
  if (v == nullptr) {
    *out = dflt < n ? dflt : -1;
    return OkStatus();
  }
  auto id = f.GetInt(key);
  if (!id.ok()) return id.status();
  if (*id < 0 || *id >= n) {
    return KeyError(
        f, StatusCode::kInvalidArgument, key,
        "token id " + std::to_string(*id) + " is outside the vocabulary (" + std::to_string(n) + " tokens)");
  }
  *out = static_cast<int32_t>(*id);
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& f) {
  auto m = std::make_unique<Model>();
  const std::string kModelKey = "tokenizer.ggml.model";
  if (f.FindMeta(kModelKey) == nullptr) {
    return KeyError(f, StatusCode::kNotFound, kModelKey, "missing (the file has no tokenizer)");
  }
  G4_ASSIGN_OR_RETURN(const std::string model_name, f.GetString(kModelKey));
  if (model_name == "llama") {
    m->kind = Kind::kSentencePiece;
  } else if (model_name == "gemma4") {
    m->kind = Kind::kGemma4Bpe;
  } else {
    return KeyError(f, StatusCode::kUnimplemented, kModelKey,
                    "tokenizer model " + Quote(model_name) + " is not supported (expected 'llama' or 'gemma4')");
  }
  const bool spm = m->kind == Kind::kSentencePiece;

  // Tokens.
  const std::string kTokensKey = "tokenizer.ggml.tokens";
  G4_ASSIGN_OR_RETURN(const GgufValue* toks, GetArray(f, kTokensKey, {kGgufString}, true));
  const size_t n = toks->size();
  if (n == 0) return KeyError(f, StatusCode::kInvalidArgument, kTokensKey, "is empty");
  if (n > static_cast<size_t>(INT32_MAX)) {
    return KeyError(f, StatusCode::kInvalidArgument, kTokensKey, "too many tokens");
  }
  // llama.cpp renames empty entries so that they can never match text.
  std::string renamed;  // Assign copies each text before asking for the next
  G4_RETURN_IF_ERROR(m->tokens.Assign(n, [&](size_t i) {
    const std::string_view t = toks->StringAt(i);
    if (!t.empty()) return t;
    renamed = "[EMPTY_" + std::to_string(i) + "]";
    return std::string_view(renamed);
  }));

  // Scores: required for SentencePiece (they drive the merges).
  const std::string kScoresKey = "tokenizer.ggml.scores";
  G4_ASSIGN_OR_RETURN(const GgufValue* scores, GetArray(f, kScoresKey, {kGgufFloat32, kGgufInt32}, spm));
  if (scores != nullptr) {
    if (scores->size() != n) {
      return KeyError(
          f, StatusCode::kInvalidArgument, kScoresKey,
          "has " + std::to_string(scores->size()) + " entries but " + kTokensKey + " has " + std::to_string(n));
    }
    for (size_t i = 0; i < n; ++i) m->tokens.set_score(static_cast<int32_t>(i), static_cast<float>(scores->FloatAt(i)));
  }

  // Token types.
  const std::string kTypesKey = "tokenizer.ggml.token_type";
  G4_ASSIGN_OR_RETURN(const GgufValue* types, GetArray(f, kTypesKey, {kGgufInt32}, false));
  if (types != nullptr) {
    if (types->size() != n) {
      return KeyError(
          f, StatusCode::kInvalidArgument, kTypesKey,
          "has " + std::to_string(types->size()) + " entries but " + kTokensKey + " has " + std::to_string(n));
    }
    for (size_t i = 0; i < n; ++i) m->tokens.set_attrs(static_cast<int32_t>(i), AttrFromType(types->IntAt(i)));
  }

  m->BuildIndex();

  // Merges (gemma4 BPE).
  if (!spm) {
    const std::string kMergesKey = "tokenizer.ggml.merges";
    G4_ASSIGN_OR_RETURN(const GgufValue* merges, GetArray(f, kMergesKey, {kGgufString}, true));
    m->merges.reserve(merges->size());
    for (size_t r = 0; r < merges->size(); ++r) {
      const std::string_view s = merges->StringAt(r);
      const std::string where = kMergesKey + "[" + std::to_string(r) + "] " + Quote(s);
      const size_t sp = s.find(' ', 1);
      if (sp == std::string::npos || sp + 1 >= s.size()) {
        return Status(StatusCode::kInvalidArgument,
                      f.path() + ": " + where + ": expected two pieces separated by a space");
      }
      const std::string left(s.substr(0, sp)), right(s.substr(sp + 1));
      const int32_t a = m->Lookup(left), b = m->Lookup(right), c = m->Lookup(left + right);
      const std::string* missing = a < 0 ? &left : b < 0 ? &right : nullptr;
      if (missing != nullptr) {
        return Status(StatusCode::kInvalidArgument,
                      f.path() + ": " + where + ": piece " + Quote(*missing) + " is not in " + kTokensKey);
      }
      if (c < 0) {
        return Status(StatusCode::kInvalidArgument,
                      f.path() + ": " + where + ": merged piece " + Quote(left + right) + " is not in " + kTokensKey);
      }
      m->merges.emplace(Model::PairKey(a, b), tokenizer_internal::Merge{static_cast<int32_t>(r), c});  // first wins
    }
  }

  // Special ids (llama.cpp defaults: SentencePiece bos=1 eos=2 unk=0, gemma4 none).
  const int32_t nn = static_cast<int32_t>(n);
  G4_RETURN_IF_ERROR(ReadTokenId(f, "tokenizer.ggml.bos_token_id", nn, spm ? 1 : -1, &m->bos));
  G4_RETURN_IF_ERROR(ReadTokenId(f, "tokenizer.ggml.eos_token_id", nn, spm ? 2 : -1, &m->eos));
  G4_RETURN_IF_ERROR(ReadTokenId(f, "tokenizer.ggml.unknown_token_id", nn, spm ? 0 : -1, &m->unk));
  G4_RETURN_IF_ERROR(ReadTokenId(f, "tokenizer.ggml.padding_token_id", nn, -1, &m->pad));
  m->add_bos = f.GetBool("tokenizer.ggml.add_bos_token", spm);
  if (m->kind == Kind::kGemma4Bpe) m->add_bos = true;  // llama.cpp forces it for Gemma 4
  if (m->add_bos && m->bos < 0) {
    return KeyError(f, StatusCode::kInvalidArgument, "tokenizer.ggml.add_bos_token",
                    "is true but tokenizer.ggml.bos_token_id is not set");
  }
  m->add_space_prefix = f.GetBool("tokenizer.ggml.add_space_prefix", spm);
  m->byte_fallback = true;

  m->Finalize();
  f.ReleaseMetadataPages();  // the vocabulary is copied: its mapped pages can go
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(m)));
}

}  // namespace g4
