// kvsnap-layout-check: checks ModelProfile / memory_sections() against the state
// files a real llama.cpp v0.5.0 writes. Built only when the oracle bed has the
// v0.5.0 libraries (tests/tools/CMakeLists.txt); run by layout_check.sh.
//
//   kvsnap-layout-check LIBDIR MODEL.gguf OUT.state [fa|nofa]
//
// Loads MODEL, decodes a fixed prompt in sequence 0 (batches of 256), saves the
// sequence with llama_state_seq_save_file, then walks the file section by
// section with the layout the profile predicts: n_stream, cell metadata with
// the predicted ext bytes, v_trans, n_layer, every K/V (or r/s) record's type
// and row size. Exit 0 only if the walk ends exactly at the end of the file.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "format/ggml_types.h"
#include "format/model_profile.h"
#include "ggml-backend.h"
#include "llama.h"

namespace {

void log_errors_only(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

struct Walk {
  std::vector<unsigned char> b;
  size_t p = 0;
  bool ok = true;
  bool need(size_t n) {
    if (b.size() - p < n) {
      std::printf("  FAIL: truncated at %zu (need %zu)\n", p, n);
      ok = false;
    }
    return ok;
  }
  uint32_t u32() {
    uint32_t x = 0;
    if (need(4)) std::memcpy(&x, &b[p], 4), p += 4;
    return x;
  }
  uint64_t u64() {
    uint64_t x = 0;
    if (need(8)) std::memcpy(&x, &b[p], 8), p += 8;
    return x;
  }
  void skip(uint64_t n) {
    if (need(n)) p += n;
  }
};

uint64_t row_bytes_of(int32_t type, uint64_t n) {
  const kvsnap::TypeLayout* t = kvsnap::find_type(type);
  if (!t) return ~0ull;
  auto r = kvsnap::row_bytes(*t, n);
  return r.ok() ? *r : ~0ull;
}

bool check_kv(Walk& w, const kvsnap::MemorySectionLayout& s) {
  const uint32_t n_stream = w.u32();
  for (uint32_t st = 0; st < n_stream && w.ok; ++st) {
    const uint32_t cells = w.u32();
    std::printf("  %s: stream %u, %u cells, ext %u\n", s.name.c_str(), st, cells, s.cell_ext_bytes);
    if (cells == 0) continue;
    for (uint32_t c = 0; c < cells && w.ok; ++c) {
      w.skip(4);  // pos
      const uint32_t n_seq = w.u32();
      if (n_seq != 1) {
        std::printf("  FAIL: cell %u has n_seq_id %u (wrong ext size?)\n", c, n_seq);
        return false;
      }
      w.skip(s.cell_ext_bytes + 4ull * n_seq);
    }
    const uint32_t v_trans = w.u32(), n_layer = w.u32();
    if (n_layer != s.n_layer_field) {
      std::printf("  FAIL: n_layer %u, profile says %u\n", n_layer, s.n_layer_field);
      return false;
    }
    for (const auto& l : s.layers) {
      const int32_t type = int32_t(w.u32());
      const uint64_t rb = w.u64();
      if (rb != row_bytes_of(type, l.n_embd_k_gqa)) {
        std::printf("  FAIL: layer %u K row %llu bytes, profile width %u\n", l.il, (unsigned long long)rb,
                    l.n_embd_k_gqa);
        return false;
      }
      w.skip(rb * cells);
    }
    for (const auto& l : s.layers) {
      if (!l.has_v) continue;
      const int32_t type = int32_t(w.u32());
      if (!v_trans) {
        const uint64_t rb = w.u64();
        if (rb != row_bytes_of(type, l.n_embd_v_gqa)) {
          std::printf("  FAIL: layer %u V row %llu bytes, profile width %u\n", l.il, (unsigned long long)rb,
                      l.n_embd_v_gqa);
          return false;
        }
        w.skip(rb * cells);
      } else {
        const uint32_t el = w.u32(), ne = w.u32();
        if (ne != l.n_embd_v_gqa) {
          std::printf("  FAIL: layer %u transposed V has %u rows, profile width %u\n", l.il, ne, l.n_embd_v_gqa);
          return false;
        }
        w.skip(uint64_t(el) * ne * cells);
      }
    }
    std::printf("    v_trans %u, n_layer %u: ok\n", v_trans, n_layer);
  }
  return w.ok;
}

bool check_recurrent(Walk& w, const kvsnap::MemorySectionLayout& s) {
  const uint32_t cells = w.u32();
  std::printf("  %s: %u cells\n", s.name.c_str(), cells);
  for (uint32_t c = 0; c < cells && w.ok; ++c) {
    w.skip(4);
    const uint32_t n_seq = w.u32();
    w.skip(4ull * n_seq);
  }
  const uint32_t s_trans = w.u32(), n_layer = w.u32();
  if (s_trans != 0 || n_layer != s.n_layer_field) {
    std::printf("  FAIL: s_trans %u n_layer %u, profile says n_layer %u\n", s_trans, n_layer, s.n_layer_field);
    return false;
  }
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& l : s.layers) {
      const int32_t type = int32_t(w.u32());
      const uint64_t rb = w.u64();
      const uint32_t width = pass == 0 ? l.n_embd_r : l.n_embd_s;
      if (type != 0 || rb != 4ull * width) {
        std::printf("  FAIL: layer %u %c row: type %d, %llu bytes, profile width %u\n", l.il, pass ? 's' : 'r', type,
                    (unsigned long long)rb, width);
        return false;
      }
      w.skip(rb * cells);
    }
  }
  std::printf("    n_layer %u, %zu state layers: ok\n", n_layer, s.layers.size());
  return w.ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: kvsnap-layout-check LIBDIR MODEL.gguf OUT.state [fa|nofa]\n");
    return 2;
  }
  const bool fa = argc > 4 && std::string(argv[4]) == "fa";
  llama_log_set(log_errors_only, nullptr);
  ggml_backend_load_all_from_path(argv[1]);
  llama_backend_init();

  auto prof = kvsnap::load_model_profile(kvsnap::posix_io(), argv[2]);
  if (!prof.ok()) {
    std::printf("FAIL: profile: %s\n", prof.status().ToString().c_str());
    return 1;
  }
  auto sections = kvsnap::memory_sections(*prof);
  if (!sections.ok()) {
    std::printf("FAIL: %s\n", sections.status().ToString().c_str());
    return 1;
  }

  llama_model* model = llama_model_load_from_file(argv[2], llama_model_default_params());
  if (!model) {
    std::printf("FAIL: llama.cpp cannot load %s\n", argv[2]);
    return 1;
  }
  auto cp = llama_context_default_params();
  cp.n_ctx = 1024;
  cp.n_batch = 512;
  cp.n_ubatch = 512;
  cp.n_threads = 2;
  cp.n_threads_batch = 2;
  cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) {
    std::printf("FAIL: no context\n");
    return 1;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  std::string prompt = "the key value cache of a model is a snapshot of the session, and it is saved to a file. ";
  for (int i = 0; i < 5; ++i) prompt += prompt.substr(0, 90);
  std::vector<llama_token> toks(4096);
  const int n = llama_tokenize(vocab, prompt.c_str(), int32_t(prompt.size()), toks.data(), int32_t(toks.size()),
                               true, false);
  if (n <= 0) {
    std::printf("FAIL: tokenize %d\n", n);
    return 1;
  }
  toks.resize(size_t(n));
  for (int i = 0; i < n; i += 256) {
    if (llama_decode(ctx, llama_batch_get_one(toks.data() + i, std::min(256, n - i))) != 0) {
      std::printf("FAIL: decode\n");
      return 1;
    }
  }
  const float* logits = llama_get_logits_ith(ctx, -1);
  for (int i = 0; i < llama_vocab_n_tokens(vocab); ++i) {
    if (!std::isfinite(logits[i])) {
      std::printf("FAIL: logit %d is not finite\n", i);
      return 1;
    }
  }
  const size_t written = llama_state_seq_save_file(ctx, argv[3], 0, toks.data(), toks.size());
  llama_free(ctx);
  llama_model_free(model);
  if (written == 0) {
    std::printf("FAIL: llama_state_seq_save_file\n");
    return 1;
  }

  Walk w;
  {
    std::ifstream f(argv[3], std::ios::binary);
    w.b.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  const uint32_t magic = w.u32(), version = w.u32(), n_token = w.u32();
  w.skip(4ull * n_token);
  std::printf("%s (%s, %s): ggsq %08x v%u, %u tokens, memory %s\n", argv[2], prof->arch.c_str(),
              fa ? "fa" : "nofa", magic, version, n_token, kvsnap::memory_kind_name(prof->memory));
  for (const auto& s : *sections) {
    const bool good = s.kind == kvsnap::SectionKind::kKv ? check_kv(w, s) : check_recurrent(w, s);
    if (!good) return 1;
  }
  if (w.p != w.b.size()) {
    std::printf("FAIL: walked %zu of %zu bytes\n", w.p, w.b.size());
    return 1;
  }
  std::printf("OK: %zu bytes, exactly as the profile predicts\n", w.b.size());
  return 0;
}
