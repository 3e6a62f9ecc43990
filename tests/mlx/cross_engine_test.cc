// migrate/cross_engine: the K pair permutation, token lists, which models move, the refusals, and an
// exact f32 round trip mlx-lm -> llama.cpp -> mlx-lm on synthetic caches. The real engines are in
// tests/mlx/cross_engine_test.py (oracle.mlx_cross_engine).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>

#include "base/byte_order.h"
#include "format/mlx_layout.h"
#include "format/model_arch_internal.h"
#include "migrate/cross_engine.h"
#include "support/gguf_writer.h"
#include "tools/model_builder.h"

namespace kvsnap {
namespace {

namespace fs = std::filesystem;

class CrossEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kvsnap-cross-" + unique_suffix());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A tiny model of `arch` written to a file and loaded as `kvsnap convert --model` does.
  ModelInfo model(const std::string& arch, uint32_t n_head_kv = 2, uint32_t head_dim = 16) {
    testing::ModelSpec s;
    s.arch = arch;
    s.n_layer = 2;
    s.n_head = 4;
    s.n_head_kv = n_head_kv;
    s.head_dim = head_dim;
    s.n_embd = 4 * head_dim;
    s.n_ff = 32;
    s.vocab_words = 4;
    if (arch == "gemma3") s.swa_pattern = 2;  // layer 0 sliding, layer 1 global
    s.n_swa = 4;
    GgufWriter w;
    EXPECT_TRUE(testing::build_model(s, w).ok());
    VectorSink sink;
    EXPECT_TRUE(w.write(sink).ok());
    const std::string path = (dir_ / (arch + ".gguf")).string();
    auto f = posix_io().open_write(path, false);
    EXPECT_TRUE(f.ok());
    EXPECT_TRUE((*f)->append(sink.bytes).ok());
    EXPECT_TRUE((*f)->close().ok());
    auto m = load_model_info(posix_io(), path);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return std::move(*m);
  }

  // A llama.cpp state file written in memory, parsed with the model's shape.
  static Result<StateFile> parse_for(const ReadableFile& f, const ModelInfo& m) {
    ParseOptions po;
    po.shape = &m.shape;
    return parse_state(f, po);
  }

  // A prompt cache -> an f32 llama.cpp slot (mlx_to_llama) in `slot`.
  static Result<CrossEngineResult> f32_slot_of(const MemoryFile& in, const ModelInfo& m, VectorSink& slot) {
    KV_ASSIGN_OR_RETURN(const MlxPromptCache c, read_mlx_prompt_cache(in));
    MlxToLlamaSpec spec;
    spec.target.ctk = spec.target.ctv = "f32";
    return mlx_to_llama(c, in, m, spec, slot);
  }

  // llama.cpp f32 state -> mlx-lm f32 prompt cache (meta_state layout), read back.
  struct Back {
    std::unique_ptr<MemoryFile> file;
    MlxPromptCache cache;
  };
  static Result<Back> f32_back_to_mlx(const StateFile& st, const ReadableFile& f, const ModelInfo& m) {
    LlamaToMlxSpec to_mlx;
    to_mlx.dtype = "F32";
    to_mlx.layout = MlxLayout::kMeta;
    VectorSink out;
    KV_RETURN_IF_ERROR(llama_to_mlx(st, f, m, to_mlx, out).status());
    Back b;
    b.file = std::make_unique<MemoryFile>("back.safetensors", std::move(out.bytes));
    KV_ASSIGN_OR_RETURN(b.cache, read_mlx_prompt_cache(*b.file));
    return b;
  }

  // mlx-lm f32 -> llama.cpp f32 file of `kind` -> mlx-lm f32 (below).
  void f32_round_trip(StateKind kind);

  fs::path dir_;
};

float value(int layer, int side, int h, int t, int d) {
  return float(layer * 1000 + side * 500 + h * 100 + t) + float(d) / 64.0f;
}

// A RotatingKVCache's state (meta_state: keep, max_size, offset, _idx); its T rows may pass offset.
struct Ring {
  int max_size, offset, idx;
};

// A float32 KVCache prompt cache (meta_state layout) of 2 layers, H heads, T tokens, D dims; with
// `ring`, RotatingKVCache layers of that state.
std::vector<std::byte> mlx_cache(int H, int T, int D, const std::string& tokens, std::optional<Ring> ring = {}) {
  MlxOutFile f;
  for (int il = 0; il < 2; ++il) {
    for (int side = 0; side < 2; ++side) {
      MlxOutTensor t;
      t.t.name = std::to_string(il) + "." + std::to_string(side);
      t.t.dtype = "F32";
      t.t.shape = {1, H, T, D};
      for (int h = 0; h < H; ++h) {
        for (int tt = 0; tt < T; ++tt) {
          for (int d = 0; d < D; ++d) append_le<uint32_t>(t.bytes, std::bit_cast<uint32_t>(value(il, side, h, tt, d)));
        }
      }
      f.tensors.push_back(std::move(t));
    }
    const std::string meta = "0." + std::to_string(il);
    if (ring) {
      const int fields[] = {0, ring->max_size, ring->offset, ring->idx};
      for (int i = 0; i < 4; ++i) f.metadata.emplace_back(meta + "." + std::to_string(i), std::to_string(fields[i]));
    } else {
      f.metadata.emplace_back(meta, "");
    }
    f.metadata.emplace_back("2." + std::to_string(il), ring ? "RotatingKVCache" : "KVCache");
  }
  if (!tokens.empty()) f.metadata.emplace_back("1.tokens", tokens);
  std::sort(f.metadata.begin(), f.metadata.end());
  VectorSink out;
  const MemoryFile none("none", std::vector<std::byte>{});
  EXPECT_TRUE(write_mlx_file(f, MlxPromptCache{}, none, out).ok());
  return out.bytes;
}

TEST(CrossEngineKRow, PairsToHalvesAndBack) {
  const float llama[8] = {0, 1, 2, 3, 4, 5, 6, 7};  // pairs (0,1) (2,3) (4,5) (6,7)
  float mlx[8], back[8];
  k_row_to_mlx(llama, mlx, 8);
  const float want[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // pair j at (j, j + 4)
  for (int i = 0; i < 8; ++i) EXPECT_EQ(mlx[i], want[i]) << i;
  k_row_to_llama(mlx, back, 8);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(back[i], llama[i]) << i;
}

// mlx-lm's RotatingKVCache._temporal_order, as buffer rows: in order after a multi-token update
// (_idx = rows), not yet full (_idx = offset < rows), wrapped (_idx < offset), with sink rows.
TEST(CrossEngineRing, TemporalOrder) {
  using V = std::vector<uint32_t>;
  auto full = mlx_ring_rows(6, 0, 92, 6, "x");
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(*full, (V{0, 1, 2, 3, 4, 5}));
  auto growing = mlx_ring_rows(256, 0, 3, 3, "x");  // a buffer grown in steps, 3 rows written
  ASSERT_TRUE(growing.ok());
  EXPECT_EQ(*growing, (V{0, 1, 2}));
  auto wrapped = mlx_ring_rows(4, 0, 7, 3, "x");  // 7 single steps into 4 slots: row 3 holds position 3
  ASSERT_TRUE(wrapped.ok());
  EXPECT_EQ(*wrapped, (V{3, 0, 1, 2}));
  auto at_start = mlx_ring_rows(4, 0, 8, 0, "x");  // _idx 0 after a wrap: rows 0..3 are oldest first
  ASSERT_TRUE(at_start.ok());
  EXPECT_EQ(*at_start, (V{0, 1, 2, 3}));
  auto sinks = mlx_ring_rows(5, 2, 9, 3, "x");  // keep 2: the sinks, then 3..4, then 2
  ASSERT_TRUE(sinks.ok());
  EXPECT_EQ(*sinks, (V{0, 1, 3, 4, 2}));
  for (const auto& [rows, keep, offset, idx] :
       std::vector<std::array<int64_t, 4>>{{4, 0, 7, 5}, {4, 0, 3, 4}, {4, 2, 9, 1}, {4, -1, 7, 3}}) {
    auto r = mlx_ring_rows(rows, keep, offset, idx, "cache.safetensors: layer 0");
    ASSERT_FALSE(r.ok()) << rows << " " << keep << " " << offset << " " << idx;
    EXPECT_EQ(r.status().code(), Code::kCorruption);
    EXPECT_NE(r.status().message().find("cache.safetensors: layer 0"), std::string::npos) << r.status().ToString();
  }
  EXPECT_EQ(swa_rows(92, 16), 16u);
  EXPECT_EQ(swa_rows(3, 16), 3u);
}

TEST(CrossEngineTokens, ListsAndRefusals) {
  auto a = parse_token_list("[1, 2,3]\n", "t");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::vector<int32_t>{1, 2, 3}));
  auto b = parse_token_list("1 2\n3,-4", "t");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (std::vector<int32_t>{1, 2, 3, -4}));
  auto e = parse_token_list("[]", "t");
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->empty());
  for (const char* bad : {"[1, x]", "[1, 2", "1.5", "99999999999", "[1] 2", "-"}) {
    auto r = parse_token_list(bad, "toks.json");
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("toks.json"), std::string::npos) << r.status().ToString();
  }
  // the bad word is quoted without the list's closing bracket
  EXPECT_NE(parse_token_list("[1, x]", "t").status().message().find("'x' is not"), std::string::npos);
  EXPECT_NE(parse_token_list("1 2]", "t").status().message().find("']' is not"), std::string::npos);
}

// A token file: JSON arrays as JSON (messages name the element), other text as a plain list; an id
// outside int32 refused either way.
TEST_F(CrossEngine, TokenFileText) {
  auto j = parse_token_file_text("[1, 2, -3]", "ids.json");
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ(*j, (std::vector<int32_t>{1, 2, -3}));
  auto p = parse_token_file_text("1\r\n2\r\n3\r\n", "ids.txt");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*p, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_NE(parse_token_file_text("[1, 2, 99999999999]", "ids.json").status().message().find("ids.json: [2]: "),
            std::string::npos);
  EXPECT_NE(parse_token_file_text("[1, \"x\"]", "ids.json").status().message().find("[1]: expected an integer"),
            std::string::npos);
  for (const char* past : {"4 5 4294967297", "2147483648", "-2147483649"})
    EXPECT_EQ(parse_token_file_text(past, "ids.txt").status().code(), Code::kInvalidArgument) << past;
}

TEST_F(CrossEngine, WhichModelsMove) {
  auto llama = cross_engine_k_order(model("llama"));
  ASSERT_TRUE(llama.ok()) << llama.status().ToString();
  EXPECT_TRUE(llama->permuted);
  auto gemma3 = cross_engine_k_order(model("gemma3"));
  ASSERT_TRUE(gemma3.ok()) << gemma3.status().ToString();
  EXPECT_FALSE(gemma3->permuted);
  EXPECT_EQ(gemma3->n_swa, 4u);
  EXPECT_TRUE(gemma3->mlx_window);
  auto gemma2 = cross_engine_k_order(model("gemma2"));  // mlx-lm's gemma2 has no window
  ASSERT_TRUE(gemma2.ok()) << gemma2.status().ToString();
  EXPECT_EQ(gemma2->n_swa, 4u);
  EXPECT_FALSE(gemma2->mlx_window);
  for (const char* kept : {"qwen2", "qwen3", "phi3", "command-r", "olmo2"}) {
    auto r = cross_engine_k_order(model(kept));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(r->permuted) << kept;
    EXPECT_NE(r->why.find("K in the same order"), std::string::npos) << r->why;
  }
  const std::pair<const char*, const char*> refused[] = {{"lfm2", "recurrent"},
                                                         {"qwen2vl", "M-RoPE"},
                                                         {"deci", "arch 'deci' (rope norm) is not in kvsnap's cross-engine table"}};
  for (const auto& [arch, why] : refused) {
    auto r = cross_engine_k_order(model(arch));
    ASSERT_FALSE(r.ok()) << arch;
    EXPECT_EQ(r.status().code(), Code::kNotSupported) << arch;
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().ToString();
    EXPECT_NE(r.status().message().find(std::string("(") + arch + ")"), std::string::npos) << r.status().ToString();
  }
}

// A profile of `arch` as load_model_profile gives it: llama.cpp's rope kind, 2 KV layers of head
// dim 64, rope over n_rot dims.
ModelProfile profile_of(const std::string& arch, uint32_t n_rot = 64) {
  ModelProfile p;
  p.arch = arch;
  p.rope = model_detail::table_rope(arch);
  p.n_rot = n_rot;
  for (int i = 0; i < 2; ++i) {
    LayerProfile l;
    l.has_kv = true;
    l.n_head_kv = 2;
    l.head_dim_k = l.head_dim_v = 64;
    p.layers.push_back(l);
  }
  return p;
}

TEST(CrossEngineArchs, TableRowsAgreeWithLlamaCppAndWithThemselves) {
  ASSERT_GE(cross_engine_archs().size(), 15u);
  for (const CrossEngineArch& a : cross_engine_archs()) {
    SCOPED_TRACE(a.arch);
    // kvsnap's copy of llama_model_rope_type says the same rope kind
    EXPECT_EQ(model_detail::table_rope(a.arch), a.rope);
    // the map follows from converter and mlx-lm rope: permuted rows need NORM + rotate-half;
    // copied rows need NORM + traditional, or NEOX + rotate-half
    if (a.converter_permutes) {
      EXPECT_EQ(a.map, KMap::kPermute);
      EXPECT_EQ(a.rope, RopeKind::kNorm);
      EXPECT_FALSE(a.mlx_traditional);
      EXPECT_FALSE(a.partial_rotary);
    } else {
      EXPECT_EQ(a.map, KMap::kCopy);
      EXPECT_EQ(a.mlx_traditional, a.rope == RopeKind::kNorm);
    }
    EXPECT_EQ(find_cross_engine_arch(a.arch), &a);
    auto r = cross_engine_arch_for(profile_of(a.arch), "m.gguf");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, &a);
  }
  for (const char* arch : {"llama", "granite", "granitemoe", "smollm3", "olmo", "minicpm", "internlm2"}) {
    EXPECT_EQ(find_cross_engine_arch(arch)->map, KMap::kPermute) << arch;
  }
  for (const char* arch : {"command-r", "ernie4_5", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3",
                           "starcoder2", "olmo2", "stablelm", "exaone"}) {
    EXPECT_EQ(find_cross_engine_arch(arch)->map, KMap::kCopy) << arch;
  }
}

TEST(CrossEngineArchs, RefusedByName) {
  // NEOX and NORM archs not audited: refused, never moved by rope kind alone. cohere2 and
  // xverse's converters and gpt-neox's fused QKV are among the reasons (docs/mlx.md).
  for (const char* arch : {"cohere2", "xverse", "gptneox", "falcon", "baichuan", "deci", "llama4", "arcee",
                           "mistral3", "nemotron", "apertus", "some-new-arch"}) {
    auto r = cross_engine_arch_for(profile_of(arch), "m.gguf");
    ASSERT_FALSE(r.ok()) << arch;
    EXPECT_EQ(r.status().code(), Code::kNotSupported);
    EXPECT_NE(r.status().message().find(std::string("arch '") + arch + "'"), std::string::npos)
        << r.status().ToString();
    EXPECT_NE(r.status().message().find("not in kvsnap's cross-engine table"), std::string::npos);
  }
  // a GGUF whose rope kind is not the arch's
  ModelProfile p = profile_of("qwen2");
  p.rope = RopeKind::kNorm;
  auto r = cross_engine_arch_for(p, "m.gguf");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("the GGUF's rope is norm, but arch 'qwen2' runs neox"), std::string::npos)
      << r.status().ToString();
  // partial rope: moves where mlx-lm ropes partial_rotary_factor dims, refused where it ropes the head
  EXPECT_TRUE(cross_engine_arch_for(profile_of("phi3", 48), "m.gguf").ok());
  // LongRoPE (a review's finding): llama.cpp ropes with the short factors up to the original context,
  // mlx-lm's SuScaledRoPE always with the long ones.
  ModelProfile longrope = profile_of("phi3", 48);
  longrope.rope_long_short_factors = true;
  auto lr = cross_engine_arch_for(longrope, "m.gguf");
  ASSERT_FALSE(lr.ok());
  EXPECT_EQ(lr.status().code(), Code::kNotSupported);
  EXPECT_NE(lr.status().message().find("m.gguf: the GGUF has long and short rope factors"), std::string::npos)
      << lr.status().ToString();
  EXPECT_TRUE(cross_engine_arch_for(profile_of("stablelm", 16), "m.gguf").ok());
  for (const char* arch : {"llama", "qwen3", "command-r"}) {
    auto q = cross_engine_arch_for(profile_of(arch, 32), "m.gguf");
    ASSERT_FALSE(q.ok()) << arch;
    EXPECT_NE(q.status().message().find("rope over 32 of 64 K dims"), std::string::npos) << q.status().ToString();
  }
}

// mlx-lm f32 -> llama.cpp f32 slot or session -> mlx-lm f32: every value back bit for bit, the
// llama.cpp rows in its pair order, the tokens carried through the metadata.
void CrossEngine::f32_round_trip(StateKind kind) {
  const ModelInfo m = model("llama");
  const int H = 2, T = 5, D = 16;
  const MemoryFile in("in.safetensors", mlx_cache(H, T, D, "[1,2,3,4,5]"));
  auto cache = read_mlx_prompt_cache(in);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  MlxToLlamaSpec to_llama;
  to_llama.target.ctk = to_llama.target.ctv = "f32";
  to_llama.file_kind = kind;
  VectorSink slot;
  auto r = mlx_to_llama(*cache, in, m, to_llama, slot);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->n_tokens, uint32_t(T));
  EXPECT_TRUE(r->k_order.permuted);

  const MemoryFile slot_file("out.slot", std::move(slot.bytes));
  auto st = parse_for(slot_file, m);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->kind, kind);
  if (kind == StateKind::kSessionFile) {  // what llama_state_save_file writes: ggsn v10, the arch
    EXPECT_EQ(st->magic, kMagicGgsn);
    EXPECT_EQ(st->version, kGgsnVersionCurrent);
    EXPECT_EQ(st->arch, "llama");
    EXPECT_EQ(r->to, "ggsn v10, K f32, V f32 (rows)");
  } else {
    EXPECT_EQ(st->magic, kMagicGgsq);
    EXPECT_EQ(st->version, kGgsqVersionCurrent);
  }
  EXPECT_EQ(st->tokens.tokens, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_FALSE(st->tokens.packed);
  // layer 1, cell 3, head 1: K value 2j+1 of llama.cpp's row is mlx-lm's D/2 + j
  const KvLayer& L1 = st->memory.kv[0].streams[0].layers[1];
  std::vector<std::byte> row(H * D * 4);
  ASSERT_TRUE(slot_file.read_at(L1.k.offset + 3 * row.size(), row).ok());
  const int j = 5;
  const float got = std::bit_cast<float>(load_le<uint32_t>(row.data() + (D + 2 * j + 1) * 4));
  EXPECT_EQ(got, value(1, 0, 1, 3, D / 2 + j));

  auto again = f32_back_to_mlx(*st, slot_file, m);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  const MemoryFile& back_file = *again->file;
  for (size_t il = 0; il < 2; ++il) {
    for (int side = 0; side < 2; ++side) {
      const MlxKvSide& a = side ? *cache->layers[il].v : *cache->layers[il].k;
      const MlxKvSide& b = side ? *again->cache.layers[il].v : *again->cache.layers[il].k;
      auto x = read_tensor(cache->st, in, *a.data);
      auto y = read_tensor(again->cache.st, back_file, *b.data);
      ASSERT_TRUE(x.ok() && y.ok());
      EXPECT_TRUE(*x == *y) << "layer " << il << " side " << side;
    }
  }
  bool has_tokens = false;
  for (const auto& [k, v] : again->cache.user_metadata) has_tokens = has_tokens || (k == "tokens" && v == "[1,2,3,4,5]");
  EXPECT_TRUE(has_tokens);
}

TEST_F(CrossEngine, F32RoundTripThroughASlotIsExact) { f32_round_trip(StateKind::kSeqFile); }

// K f16 beside V f32: the prompt cache takes F32, the type both fit in (a review's finding: layer
// 0's K type was taken for both, which rounded V to f16).
TEST_F(CrossEngine, MixedKAndVTypesMoveAtTheWiderType) {
  const ModelInfo m = model("llama");
  const MemoryFile in("in.safetensors", mlx_cache(2, 5, 16, "[1,2,3,4,5]"));
  auto cache = read_mlx_prompt_cache(in);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  MlxToLlamaSpec spec;
  spec.target.ctk = "f16";
  spec.target.ctv = "f32";
  VectorSink slot;
  auto made = mlx_to_llama(*cache, in, m, spec, slot);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  const MemoryFile slot_file("mixed.slot", std::move(slot.bytes));
  auto st = parse_for(slot_file, m);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  LlamaToMlxSpec to_mlx;  // no dtype given
  to_mlx.layout = MlxLayout::kMeta;
  VectorSink out;
  auto moved = llama_to_mlx(*st, slot_file, m, to_mlx, out);
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  const MemoryFile back("back.safetensors", std::move(out.bytes));
  auto c = read_mlx_prompt_cache(back);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->layers[0].k->dtype, "F32");
  EXPECT_EQ(c->layers[0].v->dtype, "F32");
}
TEST_F(CrossEngine, F32RoundTripThroughASessionIsExact) { f32_round_trip(StateKind::kSessionFile); }

// gemma3 (layer 0 sliding, window 4; layer 1 global) after 7 tokens: mlx-lm's wrapped ring (4 slots,
// _idx 3: slot 3 holds position 3, slots 0..2 positions 4..6) -> llama.cpp's base section (7 cells)
// and SWA section (positions 3..6) -> back to a ring in temporal order (_idx 4). Values bit for bit.
std::vector<std::byte> gemma_cache(int H, int D, const char* keep = "0", const char* max_size = "4") {
  MlxOutFile f;
  const int ring_pos[4] = {4, 5, 6, 3};
  for (int il = 0; il < 2; ++il) {
    const int rows = il == 0 ? 4 : 7;
    for (int side = 0; side < 2; ++side) {
      MlxOutTensor t;
      t.t.name = std::to_string(il) + "." + std::to_string(side);
      t.t.dtype = "F32";
      t.t.shape = {1, H, rows, D};
      for (int h = 0; h < H; ++h) {
        for (int r = 0; r < rows; ++r) {
          const int pos = il == 0 ? ring_pos[r] : r;
          for (int d = 0; d < D; ++d) append_le<uint32_t>(t.bytes, std::bit_cast<uint32_t>(value(il, side, h, pos, d)));
        }
      }
      f.tensors.push_back(std::move(t));
    }
  }
  const char* ring[4] = {keep, max_size, "7", "3"};  // keep, max_size, offset, _idx
  for (int i = 0; i < 4; ++i) f.metadata.emplace_back("0.0." + std::to_string(i), ring[i]);
  f.metadata.emplace_back("2.0", "RotatingKVCache");
  f.metadata.emplace_back("0.1", "");
  f.metadata.emplace_back("2.1", "KVCache");
  f.metadata.emplace_back("1.tokens", "[1,2,3,4,5,6,7]");
  std::sort(f.metadata.begin(), f.metadata.end());
  VectorSink out;
  const MemoryFile none("none", std::vector<std::byte>{});
  EXPECT_TRUE(write_mlx_file(f, MlxPromptCache{}, none, out).ok());
  return out.bytes;
}

float f32_at(const ReadableFile& f, uint64_t offset) {
  std::vector<std::byte> b(4);
  EXPECT_TRUE(f.read_at(offset, b).ok());
  return std::bit_cast<float>(load_le<uint32_t>(b.data()));
}

TEST_F(CrossEngine, SlidingWindowRingThroughASlotIsExact) {
  const ModelInfo m = model("gemma3");
  const int H = 2, D = 16;
  const MemoryFile in("in.safetensors", gemma_cache(H, D));
  auto cache = read_mlx_prompt_cache(in);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  MlxToLlamaSpec to_llama;
  to_llama.target.ctk = to_llama.target.ctv = "f32";
  VectorSink slot;
  auto r = mlx_to_llama(*cache, in, m, to_llama, slot);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->n_tokens, 7u);
  const MemoryFile slot_file("out.slot", std::move(slot.bytes));
  auto st = parse_for(slot_file, m);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_EQ(st->memory.kv.size(), 2u);
  const KvStream& base = st->memory.kv[0].streams[0];
  const KvStream& swa = st->memory.kv[1].streams[0];
  ASSERT_EQ(base.cell_count, 7u);
  ASSERT_EQ(swa.cell_count, 4u);
  for (uint32_t c = 0; c < 4; ++c) EXPECT_EQ(swa.cells[c].pos, int32_t(3 + c));
  // SWA cell 2 (position 5), head 1, dim 7: mlx-lm's slot 1
  EXPECT_EQ(f32_at(slot_file, swa.layers[0].k.offset + (2 * H * D + D + 7) * 4), value(0, 0, 1, 5, 7));
  EXPECT_EQ(f32_at(slot_file, base.layers[0].v.offset + (6 * H * D + 3) * 4), value(1, 1, 0, 6, 3));

  auto again = f32_back_to_mlx(*st, slot_file, m);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  const MemoryFile& back_file = *again->file;
  const MlxLayer& ring = again->cache.layers[0];
  EXPECT_EQ(ring.cls, "RotatingKVCache");
  EXPECT_EQ(*ring.keep, 0);
  EXPECT_EQ(*ring.max_size, 4);
  EXPECT_EQ(*ring.offset, 7);
  EXPECT_EQ(*ring.idx, 4);
  EXPECT_EQ(again->cache.layers[1].cls, "KVCache");
  EXPECT_EQ(*again->cache.layers[1].offset, 7);
  for (int side = 0; side < 2; ++side) {
    const MlxKvSide& k = side ? *ring.v : *ring.k;
    ASSERT_EQ(k.rows, 4);
    auto bytes = read_tensor(again->cache.st, back_file, *k.data);
    ASSERT_TRUE(bytes.ok());
    for (int t = 0; t < 4; ++t) {  // temporal order: row t holds position 3 + t (head 1, dim 5)
      EXPECT_EQ(std::bit_cast<float>(load_le<uint32_t>(bytes->data() + ((1 * 4 + t) * D + 5) * 4)),
                value(0, side, 1, 3 + t, 5));
    }
  }
}

// A cache that still holds older positions (here a KVCache on the sliding layer, 7 rows, window 4)
// moves 5 SWA cells, positions 2..6: the window and the one llama-server's reuse rule wants.
TEST_F(CrossEngine, SlidingWindowKeepsOneMorePositionForTheServer) {
  const ModelInfo m = model("gemma3");
  const MemoryFile in("in.safetensors", mlx_cache(2, 7, 16, "[1,2,3,4,5,6,7]"));
  VectorSink slot;
  auto r = f32_slot_of(in, m, slot);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const MemoryFile slot_file("out.slot", std::move(slot.bytes));
  auto st = parse_for(slot_file, m);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  const KvStream& swa = st->memory.kv[1].streams[0];
  ASSERT_EQ(swa.cell_count, 5u);
  EXPECT_EQ(swa.cells[0].pos, 2);
  EXPECT_EQ(f32_at(slot_file, swa.layers[0].k.offset + 3 * 4), value(0, 0, 0, 2, 3));
  EXPECT_EQ(swa_server_rows(92, 16), 17u);
  EXPECT_EQ(swa_server_rows(10, 16), 10u);
}

TEST_F(CrossEngine, SlidingWindowRefusals) {
  const ModelInfo m = model("gemma3");
  VectorSink out;
  auto refused = [&](std::vector<std::byte> bytes, Code code, const std::string& why) {
    const MemoryFile in("in.safetensors", std::move(bytes));
    auto c = read_mlx_prompt_cache(in);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto r = mlx_to_llama(*c, in, m, MlxToLlamaSpec{}, out);
    ASSERT_FALSE(r.ok()) << why;
    EXPECT_EQ(r.status().code(), code) << r.status().ToString();
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().ToString();
  };
  refused(gemma_cache(2, 16, "1"), Code::kNotSupported, "attention-sink");
  refused(gemma_cache(2, 16, "0", "8"), Code::kNotSupported, "sliding window is 4");
  EXPECT_TRUE(out.bytes.empty());
}

// gemma2 (window 4; mlx-lm attends to every position): 4 tokens move, every SWA cell kept; 5 are
// past the window, where the engines' caches differ: refused both ways.
TEST_F(CrossEngine, Gemma2MovesOnlyWithinTheWindow) {
  const ModelInfo m = model("gemma2");
  for (int T : {4, 5}) {
    std::string toks = "[1";
    for (int t = 2; t <= T; ++t) toks += "," + std::to_string(t);
    const MemoryFile in("in.safetensors", mlx_cache(2, T, 16, toks + "]"));
    VectorSink slot;
    auto r = f32_slot_of(in, m, slot);
    if (T == 5) {
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), Code::kNotSupported);
      EXPECT_NE(r.status().message().find("past the sliding window of 4"), std::string::npos) << r.status().ToString();
      EXPECT_TRUE(slot.bytes.empty());
      continue;
    }
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const MemoryFile slot_file("out.slot", std::move(slot.bytes));
    auto st = parse_for(slot_file, m);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    ASSERT_EQ(st->memory.kv.size(), 2u);
    EXPECT_EQ(st->memory.kv[1].streams[0].cell_count, 4u);  // the SWA section: every position
    auto again = f32_back_to_mlx(*st, slot_file, m);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    for (const MlxLayer& L : again->cache.layers) {
      EXPECT_EQ(L.cls, "KVCache");
      EXPECT_EQ(*L.offset, 4);
    }
  }
}

TEST_F(CrossEngine, MlxToLlamaRefusals) {
  const ModelInfo m = model("llama");
  VectorSink out;
  {  // no token ids anywhere
    const MemoryFile in("in.safetensors", mlx_cache(2, 5, 16, ""));
    auto c = read_mlx_prompt_cache(in);
    ASSERT_TRUE(c.ok());
    auto r = mlx_to_llama(*c, in, m, MlxToLlamaSpec{}, out);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find("--tokens"), std::string::npos) << r.status().ToString();
    MlxToLlamaSpec spec;
    spec.tokens = std::vector<int32_t>{1, 2, 3};  // 3 ids for 5 tokens
    r = mlx_to_llama(*c, in, m, spec, out);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kMismatch) << r.status().ToString();
    // ids outside the model's vocabulary (a review's finding: written with exit 0, and every later
    // command refused the slot as another model's)
    spec.tokens = std::vector<int32_t>{1, 2, 3, 4, 99999999};
    r = mlx_to_llama(*c, in, m, spec, out);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kMismatch) << r.status().ToString();
    EXPECT_NE(r.status().message().find("outside the vocabulary"), std::string::npos) << r.status().ToString();
  }
  {  // token ids in the file's metadata that are no list: the file is corrupt (exit 3), not the user's
     // word (a review's finding: exit 2)
    const MemoryFile in("in.safetensors", mlx_cache(2, 5, 16, "[1,2,x]"));
    auto c = read_mlx_prompt_cache(in);
    ASSERT_TRUE(c.ok());
    auto r = mlx_to_llama(*c, in, m, MlxToLlamaSpec{}, out);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().ToString();
    EXPECT_NE(r.status().message().find("metadata 'tokens'"), std::string::npos) << r.status().ToString();
  }
  {  // 3 KV heads for a model of 2
    const MemoryFile in("in.safetensors", mlx_cache(3, 5, 16, "[1,2,3,4,5]"));
    auto c = read_mlx_prompt_cache(in);
    ASSERT_TRUE(c.ok());
    auto r = mlx_to_llama(*c, in, m, MlxToLlamaSpec{}, out);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kMismatch);
    EXPECT_NE(r.status().message().find("KV heads"), std::string::npos) << r.status().ToString();
  }
  EXPECT_TRUE(out.bytes.empty());  // nothing is written before every check passed
}

// mlx-lm --max-kv-size: a ring that has not wrapped is a prefix and moves exactly as a KVCache of its
// first `offset` rows (rows past offset are the ring's unused zeros); a wrapped ring is refused.
TEST_F(CrossEngine, RotatingKVCacheMovesUntilItsRingWraps) {
  const ModelInfo m = model("llama");
  MlxToLlamaSpec spec;
  spec.target.ctk = spec.target.ctv = "f32";
  auto move = [&](const std::vector<std::byte>& bytes, VectorSink& out) {
    const MemoryFile in("in.safetensors", bytes);
    auto c = read_mlx_prompt_cache(in);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return mlx_to_llama(*c, in, m, spec, out);
  };
  VectorSink plain;
  ASSERT_TRUE(move(mlx_cache(2, 5, 16, "[1,2,3,4,5]"), plain).ok());
  for (const Ring ring : {Ring{16, 5, 5}, Ring{5, 5, 5}}) {
    VectorSink got;
    auto r = move(mlx_cache(2, ring.max_size == 5 ? 5 : 8, 16, "[1,2,3,4,5]", ring), got);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->from, "mlx-lm RotatingKVCache F32 (meta_state)");
    EXPECT_TRUE(got.bytes == plain.bytes) << "max_size " << ring.max_size;
  }
  const std::pair<Ring, const char*> wrapped[] = {
      {{8, 20, 4}, "layer 0 (RotatingKVCache): its ring of 8 positions has wrapped (offset 20, _idx 4)"},
      {{8, 8, 3}, "has wrapped (offset 8, _idx 3)"}};
  for (const auto& [ring, why] : wrapped) {
    VectorSink out;
    auto r = move(mlx_cache(2, 8, 16, "", ring), out);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kNotSupported);
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().ToString();
    EXPECT_TRUE(out.bytes.empty());
  }
}

}  // namespace
}  // namespace kvsnap
