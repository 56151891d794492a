// Config parsing: the per-layer plan derived from real configs (values from
// ../shared/spec/gemma-architecture.md section 1) and refusal of bad ones, naming the field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace g4 {
namespace {

using json = nlohmann::json;

// Google's published E2B text_config schema (global_head_dim at top level).
json E2BConfig() {
  json lt = json::array();
  for (int i = 0; i < 35; ++i) lt.push_back((i % 5 == 4) ? "full_attention" : "sliding_attention");
  return json{{"architectures", {"Gemma4ForConditionalGeneration"}},
              {"model_type", "gemma4"},
              {"eos_token_id", {1, 106}},
              {"text_config",
               {{"model_type", "gemma4_text"}, {"hidden_size", 1536}, {"num_hidden_layers", 35},
                {"num_attention_heads", 8}, {"num_key_value_heads", 1}, {"head_dim", 256},
                {"global_head_dim", 512}, {"intermediate_size", 6144}, {"use_double_wide_mlp", true},
                {"sliding_window", 512}, {"layer_types", lt}, {"num_kv_shared_layers", 20},
                {"hidden_size_per_layer_input", 256}, {"vocab_size_per_layer_input", 262144},
                {"vocab_size", 262144}, {"final_logit_softcapping", 30.0}, {"rms_norm_eps", 1e-6},
                {"hidden_activation", "gelu_pytorch_tanh"}, {"max_position_embeddings", 131072},
                {"attention_k_eq_v", false}, {"num_global_key_value_heads", nullptr},
                {"rope_parameters",
                 {{"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
                  {"full_attention", {{"rope_type", "proportional"}, {"rope_theta", 1000000.0}, {"partial_rotary_factor", 0.25}}}}}}}};
}

TEST(ConfigTest, E2BPlanMatchesSpec) {
  auto c = ParseHfConfig(E2BConfig());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->family, ModelFamily::kGemma4);
  EXPECT_EQ(c->hidden, 1536);
  EXPECT_EQ(c->layers.size(), 35u);
  EXPECT_EQ(c->stop_ids, (std::vector<int>{1, 106}));
  EXPECT_FLOAT_EQ(c->final_softcap, 30.0f);
  EXPECT_FLOAT_EQ(c->attn_scale, 1.0f);
  EXPECT_FLOAT_EQ(c->norm_offset, 0.0f);
  EXPECT_TRUE(c->v_norm);
  EXPECT_EQ(c->ple_dim, 256);
  for (int i = 0; i < 35; ++i) {
    const LayerPlan& l = c->layers[i];
    const bool full = i % 5 == 4;
    SCOPED_TRACE(i);
    EXPECT_EQ(l.type, full ? LayerType::kFull : LayerType::kSliding);
    EXPECT_EQ(l.head_dim, full ? 512 : 256);
    EXPECT_EQ(l.num_kv_heads, 1);
    EXPECT_EQ(l.window, full ? 0 : 512);
    EXPECT_EQ(l.mlp_width, i >= 15 ? 12288 : 6144);
    // Donors (spec 1.2): shared sliding layers read 13, shared full layers read 14.
    EXPECT_EQ(l.kv_donor, i < 15 ? -1 : (full ? 14 : 13));
    EXPECT_FALSE(l.k_eq_v);
    EXPECT_EQ(l.rope.proportional, full);
  }
  EXPECT_EQ(c->NumCacheOwners(), 15);
}

TEST(ConfigTest, ProportionalRopeRotatesFirstQuarterWithFullHeadDimExponent) {
  auto c = ParseHfConfig(E2BConfig());
  ASSERT_TRUE(c.ok());
  const std::vector<float> inv = c->layers[4].rope.InvFreq(512);
  ASSERT_EQ(inv.size(), 256u);
  // 64 rotated pairs: inv[i] = 1e6^(-2i/512); the rest are identity (0).
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_NEAR(inv[1], std::pow(1e6, -2.0 / 512), 1e-7);
  EXPECT_NEAR(inv[63], std::pow(1e6, -126.0 / 512), 1e-7);
  EXPECT_EQ(inv[64], 0.0f);
  EXPECT_EQ(inv[255], 0.0f);
  const std::vector<float> local = c->layers[0].rope.InvFreq(256);
  EXPECT_NEAR(local[127], std::pow(1e4, -254.0 / 256), 1e-9);
}

TEST(ConfigTest, PerLayerConfigSchemaGivesSamePlan) {
  // transformers >= 5.15 writes per_layer_config instead of global_head_dim.
  json j = E2BConfig();
  json& tc = j["text_config"];
  tc.erase("global_head_dim");
  tc.erase("num_global_key_value_heads");
  json plc = json::object();
  for (int i = 4; i < 35; i += 5) plc[std::to_string(i)] = {{"head_dim", 512}};
  tc["per_layer_config"] = plc;
  auto a = ParseHfConfig(E2BConfig());
  auto b = ParseHfConfig(j);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  for (int i = 0; i < 35; ++i) {
    EXPECT_EQ(a->layers[i].head_dim, b->layers[i].head_dim);
    EXPECT_EQ(a->layers[i].num_kv_heads, b->layers[i].num_kv_heads);
  }
}

TEST(ConfigTest, Gemma4_31BKeqVAndGlobalKvHeads) {
  json lt = json::array();
  for (int i = 0; i < 60; ++i) lt.push_back((i % 6 == 5) ? "full_attention" : "sliding_attention");
  json j = {{"model_type", "gemma4_text"}, {"hidden_size", 5376}, {"num_hidden_layers", 60},
            {"num_attention_heads", 32}, {"num_key_value_heads", 16}, {"num_global_key_value_heads", 4},
            {"head_dim", 256}, {"global_head_dim", 512}, {"intermediate_size", 21504},
            {"attention_k_eq_v", true}, {"sliding_window", 1024}, {"layer_types", lt},
            {"hidden_size_per_layer_input", 0}, {"vocab_size", 262144}, {"final_logit_softcapping", 30.0}};
  auto c = ParseHfConfig(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->layers[0].num_kv_heads, 16);
  EXPECT_EQ(c->layers[5].num_kv_heads, 4);
  EXPECT_EQ(c->layers[5].head_dim, 512);
  EXPECT_TRUE(c->layers[5].k_eq_v);
  EXPECT_FALSE(c->layers[0].k_eq_v);
  EXPECT_EQ(c->layers[5].window, 0);
  EXPECT_EQ(c->layers[0].window, 1024);
  EXPECT_EQ(c->ple_dim, 0);
  EXPECT_EQ(c->NumCacheOwners(), 60);
}

TEST(ConfigTest, GlobalKvHeadsIgnoredWithoutKeqV) {
  // transformers applies num_global_key_value_heads only when attention_k_eq_v is true.
  json j = E2BConfig();
  j["text_config"]["num_global_key_value_heads"] = 4;
  auto c = ParseHfConfig(j);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->layers[4].num_kv_heads, 1);
}

TEST(ConfigTest, Gemma3OldSchema) {
  json j = {{"architectures", {"Gemma3ForCausalLM"}}, {"model_type", "gemma3_text"}, {"hidden_size", 640},
            {"num_hidden_layers", 18}, {"num_attention_heads", 4}, {"num_key_value_heads", 1}, {"head_dim", 256},
            {"intermediate_size", 2048}, {"vocab_size", 262144}, {"sliding_window", 512},
            {"query_pre_attn_scalar", 256}, {"rope_theta", 1000000.0}, {"rope_local_base_freq", 10000.0},
            {"sliding_window_pattern", 6}, {"max_position_embeddings", 32768}};
  auto c = ParseHfConfig(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->family, ModelFamily::kGemma3);
  EXPECT_FLOAT_EQ(c->attn_scale, 1.0f / 16.0f);
  EXPECT_FLOAT_EQ(c->norm_offset, 1.0f);
  EXPECT_FALSE(c->v_norm);
  EXPECT_EQ(c->final_softcap, 0.0f);
  for (int i = 0; i < 18; ++i) {
    const bool full = i % 6 == 5;
    EXPECT_EQ(c->layers[i].type, full ? LayerType::kFull : LayerType::kSliding) << i;
    EXPECT_DOUBLE_EQ(c->layers[i].rope.theta, full ? 1e6 : 1e4) << i;
    EXPECT_EQ(c->layers[i].head_dim, 256);
    EXPECT_EQ(c->layers[i].kv_donor, -1);
  }
}

TEST(ConfigTest, Gemma3LinearRopeScalingOnGlobalLayersOnly) {
  json j = {{"model_type", "gemma3_text"}, {"hidden_size", 64}, {"num_hidden_layers", 6},
            {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"head_dim", 16}, {"intermediate_size", 128},
            {"vocab_size", 100}, {"rope_scaling", {{"rope_type", "linear"}, {"factor", 8.0}}}};
  auto c = ParseHfConfig(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_DOUBLE_EQ(c->layers[5].rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(c->layers[0].rope.factor, 1.0);
  EXPECT_FLOAT_EQ(c->layers[5].rope.InvFreq(16)[0], 1.0f / 8.0f);
}

struct BadCase {
  const char* what;
  std::function<void(json&)> mutate;
  const char* expected_in_message;
  StatusCode code;
};

TEST(ConfigTest, BadConfigsAreRefusedNamingTheField) {
  const std::vector<BadCase> cases = {
      {"missing hidden", [](json& j) { j["text_config"].erase("hidden_size"); }, "text_config.hidden_size", StatusCode::kInvalidArgument},
      {"string hidden", [](json& j) { j["text_config"]["hidden_size"] = "1536"; }, "text_config.hidden_size", StatusCode::kInvalidArgument},
      {"negative layers", [](json& j) { j["text_config"]["num_hidden_layers"] = -3; }, "num_hidden_layers", StatusCode::kInvalidArgument},
      {"layer_types length", [](json& j) { j["text_config"]["layer_types"].erase(0); }, "layer_types", StatusCode::kInvalidArgument},
      {"layer_types value", [](json& j) { j["text_config"]["layer_types"][2] = "chunked_attention"; }, "layer_types[2]", StatusCode::kInvalidArgument},
      {"heads not multiple", [](json& j) { j["text_config"]["num_key_value_heads"] = 3; }, "not a multiple", StatusCode::kInvalidArgument},
      {"all shared", [](json& j) { j["text_config"]["num_kv_shared_layers"] = 35; }, "num_kv_shared_layers", StatusCode::kInvalidArgument},
      {"unknown rope", [](json& j) { j["text_config"]["rope_parameters"]["full_attention"]["rope_type"] = "yarn"; }, "rope_type", StatusCode::kUnimplemented},
      {"activation", [](json& j) { j["text_config"]["hidden_activation"] = "silu"; }, "silu", StatusCode::kUnimplemented},
      {"model type", [](json& j) { j["model_type"] = "llama"; j["architectures"] = {"LlamaForCausalLM"}; }, "llama", StatusCode::kUnimplemented},
      {"moe without experts", [](json& j) { j["text_config"]["enable_moe_block"] = true; }, "text_config.num_experts", StatusCode::kInvalidArgument},
      {"bidirectional", [](json& j) { j["text_config"]["use_bidirectional_attention"] = "all"; }, "use_bidirectional_attention", StatusCode::kUnimplemented},
      {"per-layer bad key", [](json& j) { j["text_config"]["per_layer_config"] = {{"99", {{"head_dim", 512}}}}; }, "per_layer_config.99", StatusCode::kInvalidArgument},
  };
  for (const BadCase& bc : cases) {
    json j = E2BConfig();
    bc.mutate(j);
    auto c = ParseHfConfig(j);
    ASSERT_FALSE(c.ok()) << bc.what;
    EXPECT_EQ(c.status().code(), bc.code) << bc.what << ": " << c.status().ToString();
    EXPECT_NE(c.status().message().find(bc.expected_in_message), std::string::npos) << bc.what << ": " << c.status().message();
  }
}

}  // namespace
}  // namespace g4
