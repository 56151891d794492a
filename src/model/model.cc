#include "model/model.h"

#include <filesystem>

#include "model/gguf_model.h"
#include "model/safetensors.h"

namespace g4 {

StatusOr<std::unique_ptr<LoadedModel>> LoadModel(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) return NotFound("model path '" + path + "' does not exist");
  auto m = std::make_unique<LoadedModel>();
  m->path = path;
  if (!fs::is_directory(path, ec)) {
    G4_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(path));
    G4_ASSIGN_OR_RETURN(m->config, ConfigFromGguf(*gguf));
    m->gguf = gguf.get();
    m->store = MakeHfNamedGgufStore(std::move(gguf));
    StatusOr<ModelWeights> w = BindWeights(m->config, *m->store);
    if (!w.ok()) return Status(w.status().code(), path + ": " + w.status().message());
    m->weights = std::move(w).value();
    return m;
  }
  const std::string config_path = (fs::path(path) / "config.json").string();
  if (!fs::exists(config_path, ec)) return NotFound("no config.json in '" + path + "'");
  G4_ASSIGN_OR_RETURN(m->config, ParseHfConfigFile(config_path));
  G4_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsStore> store, SafetensorsStore::OpenDirectory(path));
  m->store = std::move(store);
  StatusOr<ModelWeights> w = BindWeights(m->config, *m->store);
  if (!w.ok()) return Status(w.status().code(), path + ": " + w.status().message());
  m->weights = std::move(w).value();
  return m;
}

}  // namespace g4
