// kvsnap-mkmodel: writes a tiny random-weight GGUF model that real llama.cpp
// (v0.5.0, b8121, b5640) loads and decodes, for tests that need real KV caches.
//
//   kvsnap-mkmodel --out F.gguf [--arch llama|deci|qwen2|qwen3|phi3|command-r|olmo2|qwen2vl|gemma2|gemma3|lfm2]
//       [--n-layer 4] [--n-embd 256] [--n-head 4] [--n-head-kv 2 | 2,2,1,1]
//       [--head-dim 64] [--n-rot N] [--n-ff 512] [--vocab-words 14] [--seed 1] [--dtype f16|f32]
//       [--n-ctx-train 4096] [--swa 128] [--swa-pattern N | --swa-layers 1,1,0,...]
//       [--rope-base 10000] [--rope-base-swa F]
//       [--alignment 32] [--name S] [--metadata-only] [--describe]
//       [--outlier-channels N [--outlier-scale 10] [--channel-spread 0.5]]
//       [--lora-rank N [--lora-alpha F] [--lora-targets k,v] [--lora-strength 1] [--lora-seed S]]
//
// --outlier-channels gives K/V the channel structure of trained models (a few outlier
// channels per KV head, spread per-channel scales; see ModelSpec), so that the caches
// llama.cpp writes from it can be told rotated or plain (migrate/rotation_detect.h).
// Without it the bytes are exactly those of earlier versions.
//
// --lora-rank N writes, instead of the model, a LoRA adapter GGUF for the model the
// same options describe (llama.cpp: --lora F.gguf next to -m of that model). It
// targets attn_k and attn_v by default (--lora-targets, any of q k v o gate up down;
// phi3's q/k/v is its fused attn_qkv), so the KV cache differs with the adapter;
// --lora-alpha (default N: llama.cpp's scale alpha/rank is 1) and --lora-strength
// (B·A about the base weights' magnitude times it) set its effect, --lora-seed
// (default --seed) its random weights. --dtype sets the type of lora_a/lora_b. E.g.
//   kvsnap-mkmodel --arch llama --n-layer 4 --n-embd 128 --n-ff 128 --n-head 4 --n-head-kv 2
//       --head-dim 64 --seed 1 --lora-rank 4 --out tiny-hd64-lora.gguf
// is an adapter for fixtures/models/tiny-hd64.gguf.
//
// See tests/tools/model_builder.h for what each arch writes and docs/model-profile.md.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "support/gguf_writer.h"
#include "format/model_profile.h"
#include "tools/model_builder.h"

namespace {

void usage() {
  std::fprintf(stderr,
               "usage: kvsnap-mkmodel --out F.gguf [--arch llama|deci|qwen2|qwen3|phi3|command-r|olmo2|qwen2vl|gemma2|gemma3|lfm2]\n"
               "         [--n-layer 4] [--n-embd 256] [--n-head 4] [--n-head-kv 2 | 2,2,1,1] [--head-dim 64]\n"
               "         [--n-rot N (rope dims, default head-dim)]\n"
               "         [--n-ff 512] [--vocab-words 14] [--seed 1] [--dtype f16|f32] [--n-ctx-train 4096]\n"
               "         [--swa 128] [--swa-pattern N | --swa-layers 1,1,0,...] [--alignment 32]\n"
               "         [--rope-base 10000] [--rope-base-swa F (gemma3: rope.freq_base_swa)]\n"
               "         [--name S] [--metadata-only] [--describe]\n"
               "         [--outlier-channels N [--outlier-scale 10] [--channel-spread 0.5]]\n"
               "         [--lora-rank N [--lora-alpha F (default N)] [--lora-targets k,v (of q,k,v,o,gate,up,down)]\n"
               "          [--lora-strength 1] [--lora-seed S (default --seed)]]\n"
               "  --lora-rank N: write a LoRA adapter (llama.cpp --lora) for the model the other options\n"
               "  describe, instead of the model\n");
}

bool parse_u64(const char* s, uint64_t& out) {
  if (!s || !*s) return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (errno || *end || s[0] == '-') return false;
  out = v;
  return true;
}

bool parse_u32(const char* s, uint32_t& out) {
  uint64_t v;
  if (!parse_u64(s, v) || v > 0xffffffffull) return false;
  out = static_cast<uint32_t>(v);
  return true;
}

bool parse_float(const char* s, float& out) {
  if (!s || !*s) return false;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s, &end);
  if (errno || *end || !(v >= 0) || v > 1e6) return false;
  out = float(v);
  return true;
}

bool parse_list(const char* s, std::vector<uint32_t>& out) {
  out.clear();
  std::string str = s ? s : "";
  size_t pos = 0;
  while (pos <= str.size()) {
    size_t comma = str.find(',', pos);
    if (comma == std::string::npos) comma = str.size();
    uint32_t v;
    if (!parse_u32(str.substr(pos, comma - pos).c_str(), v)) return false;
    out.push_back(v);
    pos = comma + 1;
  }
  return !out.empty();
}

}  // namespace

int main(int argc, char** argv) {
  kvsnap::testing::ModelSpec spec;
  std::string out;
  bool describe = false;
  bool swa_given = false;
  kvsnap::testing::LoraSpec lora;
  bool lora_option = false;  // a --lora-* option other than --lora-rank
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kvsnap-mkmodel: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto num = [&](uint32_t& dst) {
      const char* v = val();
      if (!parse_u32(v, dst)) {
        std::fprintf(stderr, "kvsnap-mkmodel: %s: '%s' is not a number\n", a.c_str(), v);
        std::exit(2);
      }
    };
    if (a == "--out") {
      out = val();
    } else if (a == "--arch") {
      spec.arch = val();
    } else if (a == "--name") {
      spec.name = val();
    } else if (a == "--n-layer") {
      num(spec.n_layer);
    } else if (a == "--n-embd") {
      num(spec.n_embd);
    } else if (a == "--n-head") {
      num(spec.n_head);
    } else if (a == "--n-head-kv") {
      const char* v = val();
      std::vector<uint32_t> list;
      if (!parse_list(v, list)) {
        std::fprintf(stderr, "kvsnap-mkmodel: --n-head-kv: '%s' is not N or N,N,...\n", v);
        return 2;
      }
      if (list.size() == 1) {
        spec.n_head_kv = list[0];
        spec.n_head_kv_layers.clear();
      } else {
        spec.n_head_kv = list[0];
        spec.n_head_kv_layers = list;
      }
    } else if (a == "--head-dim") {
      num(spec.head_dim);
    } else if (a == "--n-rot") {
      num(spec.n_rot);
    } else if (a == "--n-ff") {
      num(spec.n_ff);
    } else if (a == "--vocab-words") {
      num(spec.vocab_words);
    } else if (a == "--n-ctx-train") {
      num(spec.n_ctx_train);
    } else if (a == "--seed") {
      const char* v = val();
      if (!parse_u64(v, spec.seed)) {
        std::fprintf(stderr, "kvsnap-mkmodel: --seed: '%s' is not a number\n", v);
        return 2;
      }
    } else if (a == "--dtype") {
      const std::string v = val();
      if (v == "f16") {
        spec.f16 = true;
      } else if (v == "f32") {
        spec.f16 = false;
      } else {
        std::fprintf(stderr, "kvsnap-mkmodel: --dtype must be f16 or f32\n");
        return 2;
      }
    } else if (a == "--swa") {
      num(spec.n_swa);
      swa_given = true;
    } else if (a == "--swa-pattern") {
      num(spec.swa_pattern);
    } else if (a == "--swa-layers") {
      const char* v = val();
      std::vector<uint32_t> list;
      if (!parse_list(v, list)) {
        std::fprintf(stderr, "kvsnap-mkmodel: --swa-layers: '%s' is not a 0/1 list\n", v);
        return 2;
      }
      spec.swa_layers.assign(list.begin(), list.end());
    } else if (a == "--outlier-channels") {
      num(spec.outlier_channels);
    } else if (a == "--rope-base" || a == "--rope-base-swa") {
      const char* v = val();
      if (!parse_float(v, a == "--rope-base" ? spec.rope_base : spec.rope_base_swa)) {
        std::fprintf(stderr, "kvsnap-mkmodel: %s: '%s' is not a number >= 0\n", a.c_str(), v);
        return 2;
      }
    } else if (a == "--outlier-scale" || a == "--channel-spread") {
      const char* v = val();
      if (!parse_float(v, a == "--outlier-scale" ? spec.outlier_scale : spec.channel_spread)) {
        std::fprintf(stderr, "kvsnap-mkmodel: %s: '%s' is not a number >= 0\n", a.c_str(), v);
        return 2;
      }
    } else if (a == "--lora-rank") {
      num(lora.rank);
      if (lora.rank == 0) {
        std::fprintf(stderr, "kvsnap-mkmodel: --lora-rank must be positive\n");
        return 2;
      }
    } else if (a == "--lora-alpha" || a == "--lora-strength") {
      const char* v = val();
      if (!parse_float(v, a == "--lora-alpha" ? lora.alpha : lora.strength)) {
        std::fprintf(stderr, "kvsnap-mkmodel: %s: '%s' is not a number >= 0\n", a.c_str(), v);
        return 2;
      }
      lora_option = true;
    } else if (a == "--lora-targets") {
      const std::string v = val();
      lora.targets.clear();
      size_t pos = 0;
      while (pos <= v.size()) {
        size_t comma = v.find(',', pos);
        if (comma == std::string::npos) comma = v.size();
        lora.targets.push_back(v.substr(pos, comma - pos));
        pos = comma + 1;
      }
      lora_option = true;
    } else if (a == "--lora-seed") {
      const char* v = val();
      if (!parse_u64(v, lora.seed)) {
        std::fprintf(stderr, "kvsnap-mkmodel: --lora-seed: '%s' is not a number\n", v);
        return 2;
      }
      lora_option = true;
    } else if (a == "--alignment") {
      num(spec.alignment);
    } else if (a == "--metadata-only") {
      spec.metadata_only = true;
    } else if (a == "--describe") {
      describe = true;
    } else if (a == "-h" || a == "--help") {
      usage();
      return 0;
    } else {
      std::fprintf(stderr, "kvsnap-mkmodel: unknown option '%s'\n", a.c_str());
      usage();
      return 2;
    }
  }
  if (lora_option && lora.rank == 0) {
    std::fprintf(stderr, "kvsnap-mkmodel: --lora-alpha/--lora-targets/--lora-strength/--lora-seed need --lora-rank\n");
    return 2;
  }
  if (out.empty()) {
    usage();
    return 2;
  }
  spec.lfm2_swa = swa_given;
  if (!spec.n_head_kv_layers.empty() && spec.arch == "llama") {
    bool uniform = true;
    for (uint32_t v : spec.n_head_kv_layers) uniform = uniform && v == spec.n_head_kv_layers[0];
    if (!uniform) {
      std::fprintf(stderr,
                   "kvsnap-mkmodel: warning: llama.cpp sizes llama-arch tensors from layer 0; a model with "
                   "per-layer n_head_kv loads only as --arch deci\n");
    }
  }

  if (lora.rank > 0) {
    if (describe) {
      std::fprintf(stderr, "kvsnap-mkmodel: --describe describes a model, not a LoRA adapter\n");
      return 2;
    }
    kvsnap::GgufWriter w;
    kvsnap::Status st = kvsnap::testing::build_lora(spec, lora, w);
    if (st.ok()) st = w.write_file(kvsnap::posix_io(), out);
    if (!st.ok()) {
      std::fprintf(stderr, "kvsnap-mkmodel: %s\n", st.ToString().c_str());
      return 1;
    }
    auto hdr = kvsnap::read_gguf(kvsnap::posix_io(), out);
    if (!hdr.ok()) {
      std::fprintf(stderr, "kvsnap-mkmodel: wrote %s but cannot read it back: %s\n", out.c_str(),
                   hdr.status().ToString().c_str());
      return 1;
    }
    std::string targets;
    for (const auto& t : lora.targets) targets += (targets.empty() ? "" : ",") + t;
    std::printf("%s: LoRA adapter for %s, rank %u, alpha %g, targets %s, %zu tensors (%zu pairs)\n", out.c_str(),
                spec.arch.c_str(), lora.rank, double(lora.alpha > 0 ? lora.alpha : float(lora.rank)),
                targets.c_str(), hdr->tensors.size(), hdr->tensors.size() / 2);
    return 0;
  }

  kvsnap::GgufWriter w;
  kvsnap::Status st = kvsnap::testing::build_model(spec, w);
  if (st.ok()) st = w.write_file(kvsnap::posix_io(), out);
  if (!st.ok()) {
    std::fprintf(stderr, "kvsnap-mkmodel: %s\n", st.ToString().c_str());
    return 1;
  }
  auto prof = kvsnap::load_model_profile(kvsnap::posix_io(), out);
  if (!prof.ok()) {
    std::fprintf(stderr, "kvsnap-mkmodel: wrote %s but cannot read it back: %s\n", out.c_str(),
                 prof.status().ToString().c_str());
    return 1;
  }
  if (describe) {
    std::printf("%s", kvsnap::describe(*prof).c_str());
  } else {
    std::printf("%s: %s, %u layers, n_embd %u, head_dim %u, vocab %u, fingerprint %s\n", out.c_str(),
                prof->arch.c_str(), prof->n_layer, prof->n_embd, spec.head_dim, prof->n_vocab,
                prof->fingerprint.c_str());
  }
  return 0;
}
