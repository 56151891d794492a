// Loading checkpoints: both config schemas give one plan, and every kind of bad checkpoint gives
// an error that names the file and tensor, never a crash.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "backends/cpu/cpu_backend.h"
#include "model/config.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "runtime/engine.h"

namespace g4 {
namespace {

namespace fs = std::filesystem;

std::string Fixture(const std::string& name) { return std::string(GEMMA4RT_TEST_DATA_DIR) + "/golden/" + name; }

// A TensorStore that hides some tensors of another store.
class FilteredStore : public TensorStore {
 public:
  FilteredStore(const TensorStore& base, std::string hidden) : base_(base), hidden_(std::move(hidden)) {}
  const Tensor* Find(std::string_view name) const override { return name == hidden_ ? nullptr : base_.Find(name); }
  std::vector<std::string> Names() const override { return base_.Names(); }

 private:
  const TensorStore& base_;
  std::string hidden_;
};

TEST(ModelLoadTest, HubSchemaAndPerLayerConfigSchemaGiveTheSamePlan) {
  for (const char* name : {"gemma4-e2b-tiny", "gemma4-31b-tiny", "gemma4-26b-a4b-tiny"}) {
    auto a = ParseHfConfigFile(Fixture(name) + "/config.json");
    auto b = ParseHfConfigFile(Fixture(name) + "/config.hub-schema.json");
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ASSERT_EQ(a->layers.size(), b->layers.size());
    for (size_t i = 0; i < a->layers.size(); ++i) {
      EXPECT_EQ(a->layers[i].head_dim, b->layers[i].head_dim) << name << " " << i;
      EXPECT_EQ(a->layers[i].num_kv_heads, b->layers[i].num_kv_heads) << name << " " << i;
      EXPECT_EQ(a->layers[i].kv_donor, b->layers[i].kv_donor) << name << " " << i;
      EXPECT_EQ(a->layers[i].k_eq_v, b->layers[i].k_eq_v) << name << " " << i;
      EXPECT_EQ(a->layers[i].mlp_width, b->layers[i].mlp_width) << name << " " << i;
    }
  }
}

TEST(ModelLoadTest, FixturePlansMatchTransformersAttributes) {
  // Values recorded from transformers' module attributes (tests/golden/README.md).
  auto e2b = ParseHfConfigFile(Fixture("gemma4-e2b-tiny") + "/config.json");
  ASSERT_TRUE(e2b.ok());
  const std::vector<int> donors = {-1, -1, -1, -1, -1, -1, 5, 5, 5, 4};
  const std::vector<int> dims = {16, 16, 16, 16, 32, 16, 16, 16, 16, 32};
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(e2b->layers[i].kv_donor, donors[i]) << i;
    EXPECT_EQ(e2b->layers[i].head_dim, dims[i]) << i;
    EXPECT_EQ(e2b->layers[i].mlp_width, i >= 6 ? 256 : 128) << i;
  }
  auto b31 = ParseHfConfigFile(Fixture("gemma4-31b-tiny") + "/config.json");
  ASSERT_TRUE(b31.ok());
  EXPECT_EQ(b31->layers[5].num_kv_heads, 1);
  EXPECT_EQ(b31->layers[4].num_kv_heads, 2);
  EXPECT_TRUE(b31->layers[11].k_eq_v);
  auto g3 = ParseHfConfigFile(Fixture("gemma3-tiny") + "/config.json");
  ASSERT_TRUE(g3.ok());
  EXPECT_FLOAT_EQ(g3->attn_scale, 1.0f / std::sqrt(24.0f));
  EXPECT_DOUBLE_EQ(g3->layers[2].rope.factor, 8.0);
  EXPECT_EQ(g3->layers[2].type, LayerType::kFull);
  EXPECT_EQ(g3->layers[3].type, LayerType::kSliding);
}

TEST(ModelLoadTest, MissingTensorIsNotFoundNamingIt) {
  auto m = LoadModel(Fixture("gemma4-e2b-tiny"));
  ASSERT_TRUE(m.ok());
  const std::string victim = "model.language_model.layers.3.self_attn.k_norm.weight";
  FilteredStore store(*(*m)->store, victim);
  auto w = BindWeights((*m)->config, store);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kNotFound);
  EXPECT_NE(w.status().message().find(victim), std::string::npos) << w.status().message();
}

TEST(ModelLoadTest, ShapeMismatchNamesTensorFileAndShapes) {
  auto m = LoadModel(Fixture("gemma4-31b-tiny"));
  ASSERT_TRUE(m.ok());
  ModelConfig c = (*m)->config;
  c.layers[2].mlp_width = 100;  // the file has 128
  auto w = BindWeights(c, *(*m)->store);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  const std::string& msg = w.status().message();
  EXPECT_NE(msg.find("model.layers.2.mlp.gate_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[128, 64]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[100, 64]"), std::string::npos) << msg;
}

TEST(ModelLoadTest, BadPathsAndTruncatedWeightsAreErrors) {
  auto missing = LoadModel("/nonexistent/model");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  const fs::path dir = fs::path(::testing::TempDir()) / "g4_truncated_model";
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto no_config = LoadModel(dir.string());
  EXPECT_EQ(no_config.status().code(), StatusCode::kNotFound);
  EXPECT_NE(no_config.status().message().find("config.json"), std::string::npos);
  fs::copy_file(Fixture("gemma4-31b-tiny") + "/config.json", dir / "config.json");
  const auto size = fs::file_size(Fixture("gemma4-31b-tiny") + "/model.safetensors");
  {
    std::ifstream in(Fixture("gemma4-31b-tiny") + "/model.safetensors", std::ios::binary);
    std::string bytes(size / 2, '\0');
    in.read(bytes.data(), bytes.size());
    std::ofstream out(dir / "model.safetensors", std::ios::binary);
    out.write(bytes.data(), bytes.size());
  }
  auto truncated = LoadModel(dir.string());
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), StatusCode::kDataLoss) << truncated.status().ToString();
  EXPECT_NE(truncated.status().message().find("model.safetensors"), std::string::npos);
  fs::remove_all(dir);
}

TEST(EngineInputTest, OutOfVocabularyTokenAndFullContextAreErrors) {
  auto m = LoadModel(Fixture("gemma3-tiny"));
  ASSERT_TRUE(m.ok());
  EngineOptions o;
  o.max_context = 16;
  auto e = Engine::Create(std::move(m).value(), MakeCpuBackend(), o);
  ASSERT_TRUE(e.ok());
  std::vector<float> logits;
  const std::vector<int32_t> bad = {2, 512};
  Status s = (*e)->Prefill(0, bad, false, &logits);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("512"), std::string::npos);
  EXPECT_EQ((*e)->SequenceLength(0), 0);  // nothing written
  const std::vector<int32_t> long_prompt(17, 5);
  s = (*e)->Prefill(0, long_prompt, false, &logits);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ((*e)->SequenceLength(0), 0);
  const std::vector<int32_t> ok_prompt(16, 5);
  EXPECT_TRUE((*e)->Prefill(0, ok_prompt, false, &logits).ok());
  const int32_t seq = 0, tok = 7;
  EXPECT_EQ((*e)->Decode(std::span<const int32_t>(&seq, 1), std::span<const int32_t>(&tok, 1), &logits).code(),
            StatusCode::kResourceExhausted);
  const int32_t bad_seq = 3;
  EXPECT_EQ((*e)->Decode(std::span<const int32_t>(&bad_seq, 1), std::span<const int32_t>(&tok, 1), &logits).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace g4
