// ModelProfile: what llama.cpp v0.5.0's load_hparams and create_memory make of
// a model's metadata, for the archs kvsnap models and the fallback.
#include "format/model_profile.h"
#include "format/rotation_rule.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "support/gguf_writer.h"
#include "tools/model_builder.h"

namespace kvsnap {
namespace {

Result<ModelProfile> profile_of(const GgufWriter& w) {
  VectorSink sink;
  Status s = w.write(sink);
  if (!s.ok()) return s;
  MemoryFile f("model.gguf", std::move(sink.bytes));
  KV_ASSIGN_OR_RETURN(GgufHeader h, read_gguf(f));
  return profile_from_gguf(h);
}

Result<ModelProfile> profile_of(const testing::ModelSpec& spec) {
  GgufWriter w;
  KV_RETURN_IF_ERROR(testing::build_model(spec, w));
  return profile_of(w);
}

testing::ModelSpec spec(const std::string& arch) {
  testing::ModelSpec s;
  s.arch = arch;
  s.metadata_only = true;
  return s;
}

// Generic transformer metadata for hand-built archs.
GgufWriter meta(const std::string& a, uint32_t n_layer, uint32_t n_embd = 256, uint32_t n_head = 4,
                uint32_t n_head_kv = 2) {
  GgufWriter w;
  w.set_string("general.architecture", a);
  w.set_u32(a + ".context_length", 4096);
  w.set_u32(a + ".embedding_length", n_embd);
  w.set_u32(a + ".block_count", n_layer);
  w.set_u32(a + ".attention.head_count", n_head);
  w.set_u32(a + ".attention.head_count_kv", n_head_kv);
  return w;
}

std::vector<uint32_t> layer_ids(const MemorySectionLayout& s) {
  std::vector<uint32_t> v;
  for (const auto& l : s.layers) v.push_back(l.il);
  return v;
}

std::vector<MemorySectionLayout> sections(const ModelProfile& p) {
  auto r = memory_sections(p);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::vector<MemorySectionLayout>{};
}

// ------------------------------------------------------------------ dense
TEST(ModelProfile, LlamaGqa) {
  auto s = spec("llama");
  s.vocab_words = 14;
  auto p = profile_of(s);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->arch, "llama");
  EXPECT_EQ(p->name, "kvsnap-mkmodel");
  EXPECT_FALSE(p->inferred);
  EXPECT_EQ(p->n_layer, 4u);
  EXPECT_EQ(p->n_embd, 256u);
  EXPECT_EQ(p->n_head, 4u);
  EXPECT_EQ(p->n_head_kv, 2u);
  EXPECT_EQ(p->n_vocab, 302u);  // the shared tiny model's vocabulary size
  EXPECT_EQ(p->n_ctx_train, 4096u);
  EXPECT_EQ(p->rope, RopeKind::kNorm);
  EXPECT_FALSE(p->has_cell_ext);
  EXPECT_EQ(p->cell_ext_bytes, 0u);
  EXPECT_EQ(p->memory, MemoryKind::kKv);
  ASSERT_EQ(p->layers.size(), 4u);
  for (const auto& l : p->layers) {
    EXPECT_EQ(l.head_dim_k, 64u);
    EXPECT_EQ(l.head_dim_v, 64u);
    EXPECT_EQ(l.n_embd_k_gqa, 128u);
    EXPECT_EQ(l.n_embd_v_gqa, 128u);
    EXPECT_TRUE(l.has_kv);
    EXPECT_TRUE(l.has_v);
    EXPECT_FALSE(l.is_swa);
    EXPECT_FALSE(l.is_recurrent);
  }
  EXPECT_EQ(p->uniform_head_dim_k(), 64u);
  auto secs = sections(*p);
  ASSERT_EQ(secs.size(), 1u);
  EXPECT_EQ(secs[0].name, "kv");
  EXPECT_EQ(secs[0].n_layer_field, 4u);
  EXPECT_EQ(layer_ids(secs[0]), (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(secs[0].layers[2].n_embd_k_gqa, 128u);
  EXPECT_FALSE(secs[0].omitted_if_partial);
}

// LongRoPE's two factor tensors are noted (cross-engine moves refuse such models).
TEST(ModelProfile, LongAndShortRopeFactorsAreNoted) {
  GgufWriter w = meta("phi3", 2, 256, 4, 4);
  auto plain = profile_of(w);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_FALSE(plain->rope_long_short_factors);
  const std::vector<float> factors(32, 1.0f);
  ASSERT_TRUE(w.add_tensor_f32("rope_factors_long.weight", {32}, factors).ok());
  ASSERT_TRUE(w.add_tensor_f32("rope_factors_short.weight", {32}, factors).ok());
  auto longrope = profile_of(w);
  ASSERT_TRUE(longrope.ok()) << longrope.status().ToString();
  EXPECT_TRUE(longrope->rope_long_short_factors);
}

TEST(ModelProfile, HeadDimIndependentOfEmbedding) {
  for (uint32_t hd : {80u, 72u, 128u}) {
    auto s = spec("llama");
    s.head_dim = hd;
    auto p = profile_of(s);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(p->layers[0].head_dim_k, hd);
    EXPECT_EQ(p->layers[0].n_embd_k_gqa, 2 * hd);
    EXPECT_EQ(p->n_rot, hd);
  }
  // without key_length: n_embd / n_head
  auto w = meta("llama", 2, 320, 4, 4);
  auto p = profile_of(w);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->layers[1].head_dim_k, 80u);
  EXPECT_EQ(p->layers[1].n_embd_v_gqa, 320u);
}

TEST(ModelProfile, PerLayerHeadCountKvArray) {
  auto s = spec("deci");
  s.n_head_kv_layers = {2, 2, 1, 4};
  auto p = profile_of(s);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_FALSE(p->inferred);
  EXPECT_EQ(p->n_head_kv, 2u);
  EXPECT_EQ(p->layers[2].n_head_kv, 1u);
  EXPECT_EQ(p->layers[3].n_embd_k_gqa, 256u);
  auto secs = sections(*p);
  ASSERT_EQ(secs.size(), 1u);
  EXPECT_EQ(secs[0].layers[2].n_embd_k_gqa, 64u);
  EXPECT_EQ(secs[0].layers[2].n_embd_v_gqa, 64u);
  EXPECT_EQ(p->uniform_head_dim_k(), 64u);  // head dims stay uniform
  // a per-layer array of the wrong length is what llama.cpp refuses
  auto w = meta("llama", 4);
  w.set_u32_array("llama.attention.head_count_kv", {2, 2, 1});
  auto bad = profile_of(w);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kCorruption);
  EXPECT_NE(bad.status().message().find("wrong array length; expected 4, got 3"), std::string::npos)
      << bad.status().ToString();
}

// ------------------------------------------------------------------ SWA
TEST(ModelProfile, Gemma2AlternatesSwa) {
  auto s = spec("gemma2");
  s.n_swa = 64;
  auto p = profile_of(s);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->memory, MemoryKind::kKvIswa);
  EXPECT_TRUE(p->is_iswa());
  EXPECT_EQ(p->swa, SwaKind::kStandard);
  EXPECT_EQ(p->n_swa, 64u);
  EXPECT_EQ(p->rope, RopeKind::kNeox);
  auto secs = sections(*p);
  ASSERT_EQ(secs.size(), 2u);
  EXPECT_EQ(secs[0].name, "kv_base");
  EXPECT_FALSE(secs[0].swa);
  EXPECT_TRUE(secs[0].omitted_if_partial);
  EXPECT_EQ(layer_ids(secs[0]), (std::vector<uint32_t>{1, 3}));
  EXPECT_EQ(secs[1].name, "kv_swa");
  EXPECT_TRUE(secs[1].swa);
  EXPECT_EQ(layer_ids(secs[1]), (std::vector<uint32_t>{0, 2}));
  EXPECT_EQ(secs[1].n_layer_field, 2u);
  // without sliding_window gemma2 keeps its default window of 4096
  auto w = meta("gemma2", 2);
  auto d = profile_of(w);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->n_swa, 4096u);
}

TEST(ModelProfile, Gemma3SlidingWindowPattern) {
  // default period 6: layers 0-4 SWA, 5 dense
  auto s = spec("gemma3");
  s.n_layer = 8;
  auto p = profile_of(s);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto secs = sections(*p);
  ASSERT_EQ(secs.size(), 2u);
  EXPECT_EQ(layer_ids(secs[0]), (std::vector<uint32_t>{5}));
  EXPECT_EQ(layer_ids(secs[1]), (std::vector<uint32_t>{0, 1, 2, 3, 4, 6, 7}));
  // a u32 period in the file
  s.swa_pattern = 2;
  p = profile_of(s);
  ASSERT_TRUE(p.ok());
  secs = sections(*p);
  EXPECT_EQ(layer_ids(secs[0]), (std::vector<uint32_t>{1, 3, 5, 7}));
  // a per-layer bool array wins
  s.swa_layers = {true, false, true, true, false, false, true, true};
  p = profile_of(s);
  ASSERT_TRUE(p.ok());
  secs = sections(*p);
  EXPECT_EQ(layer_ids(secs[0]), (std::vector<uint32_t>{1, 4, 5}));
  EXPECT_EQ(layer_ids(secs[1]), (std::vector<uint32_t>{0, 2, 3, 6, 7}));
  // sliding_window 0: no SWA at all
  auto w = meta("gemma3", 4);
  w.set_u32("gemma3.attention.sliding_window", 0);
  p = profile_of(w);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->memory, MemoryKind::kKv);
  // four layers with period 6: every layer SWA, an empty base section
  auto s4 = spec("gemma3");
  p = profile_of(s4);
  ASSERT_TRUE(p.ok());
  secs = sections(*p);
  ASSERT_EQ(secs.size(), 2u);
  EXPECT_TRUE(secs[0].layers.empty());
  EXPECT_EQ(secs[0].n_layer_field, 0u);
}

TEST(ModelProfile, Gemma3nKvOnlyInTheFirstTwentyLayers) {
  auto w = meta("gemma3n", 24);
  w.set_u32("gemma3n.attention.sliding_window", 512);
  auto p = profile_of(w);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_FALSE(p->inferred);
  auto secs = sections(*p);
  ASSERT_EQ(secs.size(), 2u);
  EXPECT_EQ(layer_ids(secs[0]), (std::vector<uint32_t>{4, 9, 14, 19}));
  EXPECT_EQ(secs[1].layers.size(), 16u);
  EXPECT_FALSE(p->layers[20].has_kv);
  EXPECT_TRUE(p->layers[20].is_swa);
  // sliding_window is required
  auto bad = profile_of(meta("gemma3n", 4));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("gemma3n.attention.sliding_window"), std::string::npos);
}

TEST(ModelProfile, Gemma4SwaHeadSizesAndSharedKv) {
  auto w = meta("gemma4", 6, 256, 4, 2);
  w.set_u32("gemma4.attention.sliding_window", 512);
  w.set_bool_array("gemma4.attention.sliding_window_pattern", {true, true, false, true, true, false});
  w.set_u32("gemma4.attention.shared_kv_layers", 2);
  w.set_u32("gemma4.attention.key_length", 512);
  w.set_u32("gemma4.attention.value_length", 512);
  w.set_u32("gemma4.attention.key_length_swa", 256);
  w.set_u32("gemma4.attention.value_length_swa", 256);
  auto p = profile_of(w);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto secs = sections(*p);
  ASSERT_EQ(secs.size(), 2u);
  EXPECT_EQ(layer_ids(secs[0]), (std::vector<uint32_t>{2}));
  EXPECT_EQ(secs[0].layers[0].n_embd_k_gqa, 1024u);
  EXPECT_EQ(layer_ids(secs[1]), (std::vector<uint32_t>{0, 1, 3}));
  EXPECT_EQ(secs[1].layers[0].n_embd_k_gqa, 512u);
  EXPECT_FALSE(p->uniform_head_dim_k());
}

TEST(ModelProfile, Phi3IgnoresItsSlidingWindow) {
  auto w = meta("phi3", 2);
  w.set_u32("phi3.attention.sliding_window", 2048);
  auto p = profile_of(w);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->memory, MemoryKind::kKv);
  EXPECT_EQ(p->swa, SwaKind::kNone);
  EXPECT_FALSE(p->notes.empty());
}

// ------------------------------------------------------------------ M-RoPE
TEST(ModelProfile, Qwen2vlMropeHasCellExt) {
  auto s = spec("qwen2vl");
  auto p = profile_of(s);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->rope, RopeKind::kMrope);
  EXPECT_TRUE(p->has_cell_ext);
  EXPECT_EQ(p->cell_ext_bytes, 12u);
  EXPECT_EQ(p->rope_sections, (std::array<int32_t, 4>{8, 12, 12, 0}));
  auto secs = sections(*p);
  ASSERT_EQ(secs.size(), 1u);
  EXPECT_EQ(secs[0].cell_ext_bytes, 12u);
  // llama.cpp requires the sections
  auto w = meta("qwen2vl", 2);
  auto bad = profile_of(w);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kCorruption);
  EXPECT_NE(bad.status().message().find("qwen2vl.rope.dimension_sections"), std::string::npos);
}

TEST(ModelProfile, Qwen3vlImropeAndGlm4Dynamic) {
  auto w = meta("qwen3vl", 2);
  w.set_i32_array("qwen3vl.rope.dimension_sections", {24, 20, 20, 0});
  auto p = profile_of(w);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->rope, RopeKind::kImrope);
  EXPECT_TRUE(p->has_cell_ext);
  auto g = meta("glm4", 2);
  p = profile_of(g);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->rope, RopeKind::kNorm);
  EXPECT_FALSE(p->has_cell_ext);
  g.set_u32_array("glm4.rope.dimension_sections", {8, 12, 12, 0});
  p = profile_of(g);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->rope, RopeKind::kMrope);
  EXPECT_TRUE(p->has_cell_ext);
}

// ------------------------------------------------------------------ hybrid / recurrent
GgufWriter qwen35(uint32_t n_layer) {
  auto w = meta("qwen35", n_layer, 256, 4, 2);
  w.set_u32("qwen35.attention.key_length", 128);
  w.set_u32("qwen35.attention.value_length", 128);
  w.set_i32_array("qwen35.rope.dimension_sections", {11, 11, 10, 0});
  w.set_u32("qwen35.ssm.conv_kernel", 4);
  w.set_u32("qwen35.ssm.inner_size", 64);
  w.set_u32("qwen35.ssm.state_size", 16);
  w.set_u32("qwen35.ssm.time_step_rank", 8);
  w.set_u32("qwen35.ssm.group_count", 2);
  return w;
}

TEST(ModelProfile, Qwen35Hybrid) {
  auto w = qwen35(8);
  w.set_u32("qwen35.full_attention_interval", 4);
  auto p = profile_of(w);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_FALSE(p->inferred);
  EXPECT_EQ(p->memory, MemoryKind::kHybrid);
  EXPECT_TRUE(p->is_hybrid());
  EXPECT_EQ(p->rope, RopeKind::kImrope);
  EXPECT_TRUE(p->has_cell_ext);
  EXPECT_EQ(p->n_embd_r, 3u * (64 + 2 * 2 * 16));
  EXPECT_EQ(p->n_embd_s, 16u * 64);
  auto secs = sections(*p);
  ASSERT_EQ(secs.size(), 2u);
  EXPECT_EQ(secs[0].kind, SectionKind::kKv);
  EXPECT_TRUE(secs[0].omitted_if_partial);
  EXPECT_EQ(layer_ids(secs[0]), (std::vector<uint32_t>{3, 7}));
  EXPECT_EQ(secs[0].layers[0].n_embd_k_gqa, 256u);
  EXPECT_EQ(secs[0].cell_ext_bytes, 12u);
  EXPECT_EQ(secs[1].kind, SectionKind::kRecurrent);
  EXPECT_EQ(secs[1].n_layer_field, 8u);  // the recurrent section counts every layer
  EXPECT_EQ(layer_ids(secs[1]), (std::vector<uint32_t>{0, 1, 2, 4, 5, 6}));
  EXPECT_EQ(secs[1].layers[0].n_embd_r, p->n_embd_r);
  EXPECT_TRUE(p->layers[0].is_recurrent);
  EXPECT_FALSE(p->layers[0].has_kv);

  // an explicit per-layer list, and an MTP layer outside both sections
  auto m = qwen35(5);
  m.set_u32("qwen35.nextn_predict_layers", 1);
  m.set_bool_array("qwen35.attention.recurrent_layers", {true, false, true, false, false});
  p = profile_of(m);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->n_layer_nextn, 1u);
  secs = sections(*p);
  ASSERT_EQ(secs.size(), 2u);
  EXPECT_EQ(layer_ids(secs[0]), (std::vector<uint32_t>{1, 3}));
  EXPECT_EQ(secs[1].n_layer_field, 4u);
  EXPECT_EQ(layer_ids(secs[1]), (std::vector<uint32_t>{0, 2}));

  // the SSM keys are required
  auto bad = meta("qwen35", 4);
  bad.set_i32_array("qwen35.rope.dimension_sections", {11, 11, 10, 0});
  auto r = profile_of(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("qwen35.ssm.conv_kernel"), std::string::npos) << r.status().ToString();
}

TEST(ModelProfile, Lfm2ShortConvAndSwa) {
  auto w = meta("lfm2", 6, 128, 4, 2);
  w.set_u32_array("lfm2.attention.head_count_kv", {0, 0, 2, 0, 0, 2});
  w.set_u32("lfm2.shortconv.l_cache", 3);
  auto p = profile_of(w);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->memory, MemoryKind::kHybrid);
  EXPECT_EQ(p->n_embd_r, 256u);
  EXPECT_EQ(p->n_embd_s, 0u);
  auto secs = sections(*p);
  ASSERT_EQ(secs.size(), 2u);
  EXPECT_EQ(layer_ids(secs[0]), (std::vector<uint32_t>{2, 5}));
  EXPECT_EQ(layer_ids(secs[1]), (std::vector<uint32_t>{0, 1, 3, 4}));
  w.set_u32("lfm2.attention.sliding_window", 64);
  p = profile_of(w);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->memory, MemoryKind::kHybridIswa);
  secs = sections(*p);
  ASSERT_EQ(secs.size(), 3u);
  EXPECT_EQ(secs[0].name, "kv_base");
  EXPECT_TRUE(secs[0].layers.empty());
  EXPECT_EQ(layer_ids(secs[1]), (std::vector<uint32_t>{2, 5}));
  EXPECT_EQ(secs[2].kind, SectionKind::kRecurrent);
}

TEST(ModelProfile, Lfm2FromTheModelBuilder) {
  // the kvsnap-mkmodel lfm2 model (verified against llama.cpp v0.5.0 state files)
  auto s = spec("lfm2");
  s.n_layer = 6;
  s.n_ff = 256;
  auto p = profile_of(s);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_FALSE(p->inferred);
  auto secs = sections(*p);
  ASSERT_EQ(secs.size(), 2u);
  EXPECT_EQ(layer_ids(secs[0]), (std::vector<uint32_t>{2, 5}));
  EXPECT_EQ(secs[1].n_layer_field, 6u);
  EXPECT_EQ(layer_ids(secs[1]), (std::vector<uint32_t>{0, 1, 3, 4}));
  EXPECT_EQ(p->n_embd_r, 2u * 256);
  s.lfm2_swa = true;
  p = profile_of(s);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->memory, MemoryKind::kHybridIswa);
  EXPECT_EQ(p->n_swa, 128u);
}

TEST(ModelProfile, GraniteHybridAndNemotronH) {
  auto w = meta("granitehybrid", 4, 128, 4, 2);
  w.set_u32_array("granitehybrid.attention.head_count_kv", {0, 2, 0, 0});
  w.set_u32("granitehybrid.ssm.conv_kernel", 4);
  w.set_u32("granitehybrid.ssm.inner_size", 256);
  w.set_u32("granitehybrid.ssm.state_size", 64);
  w.set_u32("granitehybrid.ssm.time_step_rank", 8);
  w.set_u32("granitehybrid.ssm.group_count", 1);
  auto p = profile_of(w);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto secs = sections(*p);
  ASSERT_EQ(secs.size(), 2u);
  EXPECT_EQ(layer_ids(secs[0]), (std::vector<uint32_t>{1}));
  EXPECT_EQ(layer_ids(secs[1]), (std::vector<uint32_t>{0, 2, 3}));
  EXPECT_EQ(p->n_embd_r, 3u * (256 + 2 * 64));
  EXPECT_EQ(p->rope, RopeKind::kNorm);

  // nemotron_h: layers with a feed-forward are in neither section
  auto n = meta("nemotron_h", 4, 128, 4, 2);
  n.set_u32_array("nemotron_h.attention.head_count_kv", {0, 2, 0, 0});
  n.set_u32_array("nemotron_h.feed_forward_length", {0, 0, 512, 0});
  for (const char* k : {"ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank",
                        "ssm.group_count"}) {
    n.set_u32(std::string("nemotron_h.") + k, 4);
  }
  p = profile_of(n);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  secs = sections(*p);
  EXPECT_EQ(layer_ids(secs[0]), (std::vector<uint32_t>{1}));
  EXPECT_EQ(layer_ids(secs[1]), (std::vector<uint32_t>{0, 3}));
}

TEST(ModelProfile, RecurrentOnly) {
  auto w = meta("mamba", 3, 64, 0, 0);
  w.set_u32("mamba.ssm.conv_kernel", 4);
  w.set_u32("mamba.ssm.inner_size", 128);
  w.set_u32("mamba.ssm.state_size", 16);
  w.set_u32("mamba.ssm.time_step_rank", 4);
  auto p = profile_of(w);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->memory, MemoryKind::kRecurrent);
  EXPECT_TRUE(p->is_recurrent_only());
  EXPECT_EQ(p->rope, RopeKind::kNone);
  EXPECT_EQ(p->n_embd_r, 3u * 128);
  EXPECT_EQ(p->n_embd_s, 16u * 128);
  auto secs = sections(*p);
  ASSERT_EQ(secs.size(), 1u);
  EXPECT_EQ(secs[0].kind, SectionKind::kRecurrent);
  EXPECT_EQ(layer_ids(secs[0]), (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_FALSE(p->uniform_head_dim_k());

  auto r = meta("rwkv6", 2, 256, 0, 0);
  r.set_u32("rwkv6.wkv.head_size", 64);
  p = profile_of(r);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->n_embd_r, 512u);
  EXPECT_EQ(p->n_embd_s, 256u * 64);
  r.set_u32("rwkv6.token_shift_count", 1);
  p = profile_of(r);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->n_embd_r, 256u);
}

// ------------------------------------------------------------------ other kinds
TEST(ModelProfile, UnknownArchFallsBackToGenericKeys) {
  auto w = meta("someday-arch", 3, 256, 8, 2);
  w.set_u32("someday-arch.attention.key_length", 48);
  auto p = profile_of(w);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_TRUE(p->inferred);
  ASSERT_FALSE(p->notes.empty());
  EXPECT_EQ(p->memory, MemoryKind::kKv);
  EXPECT_EQ(p->rope, RopeKind::kUnknown);
  EXPECT_EQ(p->layers[0].n_embd_k_gqa, 96u);
  EXPECT_EQ(p->layers[0].n_embd_v_gqa, 64u);  // value_length defaults to n_embd / n_head
  std::string all;
  for (const auto& n : p->notes) all += n;
  EXPECT_NE(all.find("not modelled"), std::string::npos);
}

TEST(ModelProfile, MlaHasNoV) {
  auto w = meta("deepseek2", 3, 256, 16, 1);
  w.set_u32("deepseek2.attention.key_length", 576);
  w.set_u32("deepseek2.attention.value_length", 512);
  w.set_u32("deepseek2.attention.key_length_mla", 192);
  w.set_u32("deepseek2.attention.value_length_mla", 128);
  auto p = profile_of(w);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_TRUE(p->is_mla);
  EXPECT_TRUE(p->inferred);
  auto secs = sections(*p);
  ASSERT_EQ(secs.size(), 1u);
  EXPECT_EQ(secs[0].layers[0].n_embd_k_gqa, 576u);
  EXPECT_FALSE(secs[0].layers[0].has_v);
  EXPECT_EQ(secs[0].layers[0].n_embd_v_gqa, 0u);
}

TEST(ModelProfile, NoMemoryAndSpecialCaches) {
  auto p = profile_of(meta("bert", 2));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->memory, MemoryKind::kNone);
  EXPECT_TRUE(sections(*p).empty());
  EXPECT_FALSE(p->layers[0].has_kv);

  p = profile_of(meta("deepseek32", 2));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->memory, MemoryKind::kSpecial);
  auto s = memory_sections(*p);
  EXPECT_EQ(s.status().code(), Code::kNotSupported);
}

TEST(ModelProfile, NextnLayersOutsideTheMainCache) {
  auto w = meta("glm4moe", 4);
  w.set_u32("glm4moe.nextn_predict_layers", 1);
  auto p = profile_of(w);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto secs = sections(*p);
  ASSERT_EQ(secs.size(), 1u);
  EXPECT_EQ(layer_ids(secs[0]), (std::vector<uint32_t>{0, 1, 2}));
}

TEST(ModelProfile, MissingOrBadRequiredKeys) {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.embedding_length", 256);
  auto p = profile_of(w);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Code::kCorruption);
  EXPECT_EQ(p.status().message(), "model.gguf: key 'llama.block_count' not found (llama.cpp requires it for arch 'llama')");

  auto big = meta("llama", 600);
  p = profile_of(big);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("must be 1..512"), std::string::npos);

  auto typed = meta("llama", 2);
  typed.set_string("llama.attention.head_count", "four");
  p = profile_of(typed);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Code::kCorruption);
  EXPECT_NE(p.status().message().find("llama.attention.head_count"), std::string::npos);

  GgufWriter none;
  none.set_u32("x", 1);
  p = profile_of(none);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("general.architecture"), std::string::npos);
}

TEST(ModelProfile, LoadFromFileSetsFingerprint) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / "kvsnap_profile_io";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "m.gguf").string();
  GgufWriter w;
  auto s = spec("qwen2vl");
  s.metadata_only = false;
  s.n_layer = 2;
  s.n_embd = 64;
  s.n_head = 2;
  s.n_head_kv = 1;
  s.head_dim = 32;
  s.n_ff = 64;
  ASSERT_TRUE(testing::build_model(s, w).ok());
  ASSERT_TRUE(w.write_file(posix_io(), path).ok());
  auto p = load_model_profile(posix_io(), path);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->fingerprint, *gguf_fingerprint(posix_io(), path));
  EXPECT_EQ(p->layers[1].n_embd_k_gqa, 32u);
  const std::string d = describe(*p);
  EXPECT_NE(d.find("cell ext 12 bytes"), std::string::npos) << d;
  EXPECT_NE(d.find("section kv: n_layer 2"), std::string::npos) << d;
  auto missing = load_model_profile(posix_io(), (dir / "nope.gguf").string());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  std::filesystem::remove_all(dir);
}

// llama.cpp's K rotation block is the largest power of two (>= 64) dividing the shared head dim;
// a head dim of 2^31 (a hostile GGUF: `llama.attention.key_length = 0x80000000`) once made the
// 32-bit search wrap to 0 and divide by it (SIGFPE in `kvsnap save --model`).
TEST(RotationRule, KBlockIsTheLargestPowerOfTwoDividingTheHeadDim) {
  EXPECT_EQ(k_rotation_block(64, 64), std::optional<uint32_t>(64));
  EXPECT_EQ(k_rotation_block(96, 96), std::nullopt);
  EXPECT_EQ(k_rotation_block(128, 128), std::optional<uint32_t>(128));
  EXPECT_EQ(k_rotation_block(192, 192), std::optional<uint32_t>(64));
  EXPECT_EQ(k_rotation_block(256, 256), std::optional<uint32_t>(256));
  EXPECT_EQ(k_rotation_block(0, 64), std::nullopt);
  EXPECT_EQ(k_rotation_block(0x80000000u, 0x80000000u), std::optional<uint32_t>(0x80000000u));
  EXPECT_EQ(k_rotation_block(0xFFFFFFC0u, 0xFFFFFFC0u), std::optional<uint32_t>(64));
  EXPECT_EQ(v_rotation_block(0x80000000u, 0x80000000u), std::optional<uint32_t>(64));
}

}  // namespace
}  // namespace kvsnap

