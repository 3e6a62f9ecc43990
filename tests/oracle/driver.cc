// kvsnap-oracle-<npm-version>: drive a real llama.cpp (the prebuilt libraries of one
// node-llama-cpp npm release) to write and read KV-cache state files.
//
//   save    --model M --prompt-file P --ctk T --ctv T --fa on|off [--n-ctx 4096] [--n-seq 1]
//           [--kv-unified on|off] [--swa-full on|off] [--eval-tail K] [--slot OUT] [--session OUT] [--raw-seq OUT]
//           [--logits OUT] [--tokens-out OUT]
//   restore --model M --prompt-file P --ctk T --ctv T --fa on|off [--n-ctx 4096] [--n-seq 1]
//           [--kv-unified on|off] [--swa-full on|off] [--eval-tail K] (--slot F | --session F | --raw-seq F) --logits OUT
//   compare REF.logits GOT.logits [--rows K] [--json] [--max-kl X] [--require-top1]
//   info    (llama.cpp build of this driver: tag, state versions, system info)
//
// Procedure (same as fixtures/llama.cpp-v0.5.0 in /work/shared): tokenize the prompt file with
// BOS into t[0..n-1]; decode t[0..n-2] in sequence 0; save; decode t[n-1] at position n-1 and
// write its n_vocab float32 logits. restore: fresh context, load into sequence 0 (session: the
// whole context), decode t[n-1] at position n-1, write logits.
// --eval-tail K (default 1, the procedure above): the state holds t[0..n-K-1]; the tail
// t[n-K..n-1] is decoded in one batch at positions n-K..n-1 with logits for all K tokens, and the
// logits file holds K rows of n_vocab float32 (row-major). compare --rows K (alias --eval-tail)
// splits both files into K rows and reports the mean KL over the rows.
//
// One source for llama.cpp b5640 (npm 3.10.0), b8121 (3.16.2), b8179 (3.17.1), b8390 (3.18.1),
// b9842 (3.19.0), b10361 (3.20.0), v0.4.0 (3.21.1) and v0.5.0 (3.22.1): every call below has the same
// signature from b8121 on, so the zoo versions need no probe of their own. The era A/B builds
// b3166 (3.0.0-beta.32) and b3543 (3.0.0-beta.44) predate the model/vocab API and the backend
// registry: KVSNAP_ORACLE_LEGACY_API switches to llama_load_model_from_file,
// llama_new_context_with_model, llama_tokenize(model, ...), llama_n_vocab(model) and
// llama_kv_cache_seq_pos_max, with the CPU backend linked into the library. CMake defines
//   KVSNAP_ORACLE_LEGACY_API      llama.h has no llama_model_load_from_file (b3166, b3543)
//   KVSNAP_ORACLE_UNSIZED_SEQ_DATA  llama_state_seq_get/set_data take no buffer size (b3166)
//   KVSNAP_ORACLE_HAS_FA_TYPE     llama_context_params::flash_attn_type (else bool flash_attn)
//   KVSNAP_ORACLE_HAS_KV_UNIFIED  llama_context_params::kv_unified
//   KVSNAP_ORACLE_LIBDIR          directory with libggml-cpu-*.so (for ggml_backend_load_all_from_path)
//   KVSNAP_ORACLE_NPM_VERSION, KVSNAP_ORACLE_TAG
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#ifndef KVSNAP_ORACLE_LIBDIR
#define KVSNAP_ORACLE_LIBDIR ""
#endif
#ifndef KVSNAP_ORACLE_NPM_VERSION
#define KVSNAP_ORACLE_NPM_VERSION "unknown"
#endif
#ifndef KVSNAP_ORACLE_TAG
#define KVSNAP_ORACLE_TAG "unknown"
#endif
#if !defined(KVSNAP_ORACLE_HAS_FA_TYPE) && defined(LLAMA_STATE_SEQ_FLAGS_SWA_ONLY)
// fallback when built without the CMake probe: both appeared between b5640 and b8121
#define KVSNAP_ORACLE_HAS_FA_TYPE 1
#define KVSNAP_ORACLE_HAS_KV_UNIFIED 1
#endif

namespace {

// ---------------------------------------------------------------- logging
bool g_verbose = false;
ggml_log_level g_last_level = GGML_LOG_LEVEL_INFO;
std::vector<std::string> g_errors;  // error-level messages since the last reset
std::string g_partial;              // an error line still being assembled (CONT)

void log_cb(ggml_log_level level, const char* text, void* /*user*/) {
#ifndef KVSNAP_ORACLE_LEGACY_API
  if (level == GGML_LOG_LEVEL_CONT) {
    level = g_last_level;
  } else {
    g_last_level = level;
  }
#else
  g_last_level = level;  // no GGML_LOG_LEVEL_CONT before b3900
#endif
  if (level == GGML_LOG_LEVEL_ERROR && text) {
    g_partial += text;
    size_t nl;
    while ((nl = g_partial.find('\n')) != std::string::npos) {
      std::string line = g_partial.substr(0, nl);
      g_partial.erase(0, nl + 1);
      if (!line.empty()) g_errors.push_back(line);
    }
  }
  bool show = g_verbose;  // errors are reported once, in the one-line reason of die()
  if (show && text) {
    fputs(text, stderr);
  }
}

void reset_errors() {
  g_errors.clear();
  g_partial.clear();
}

std::string error_summary() {
  std::vector<std::string> all = g_errors;
  if (!g_partial.empty()) all.push_back(g_partial);
  std::string s;
  for (const auto& e : all) {
    if (!s.empty()) s += " | ";
    s += e;
  }
  return s.empty() ? std::string("(llama.cpp logged no error)") : s;
}

[[noreturn]] void die(const std::string& msg, int code = 1) {
  fprintf(stderr, "kvsnap-oracle: %s\n", msg.c_str());
  exit(code);
}

// ---------------------------------------------------------------- args
struct Args {
  std::string cmd;
  std::vector<std::string> positional;
  std::map<std::string, std::string> opt;
  bool has(const std::string& k) const { return opt.count(k) != 0; }
  std::string get(const std::string& k, const std::string& def = "") const {
    auto it = opt.find(k);
    return it == opt.end() ? def : it->second;
  }
  std::string need(const std::string& k) const {
    auto it = opt.find(k);
    if (it == opt.end()) die("missing required option --" + k, 2);
    return it->second;
  }
};

const char* kUsage =
    "usage: kvsnap-oracle-" KVSNAP_ORACLE_NPM_VERSION " COMMAND [options]   (llama.cpp " KVSNAP_ORACLE_TAG
    ")\n"
    "  save    --model M --prompt-file P --ctk T --ctv T --fa on|off [--n-ctx 4096] [--n-seq 1]\n"
    "          [--kv-unified on|off] [--swa-full on|off] [--n-batch 512] [--threads 2] [--eval-tail K]\n"
    "          [--slot OUT] [--session OUT] [--raw-seq OUT] [--logits OUT] [--tokens-out OUT]\n"
    "  restore --model M --prompt-file P --ctk T --ctv T --fa on|off [--n-ctx 4096] [--n-seq 1]\n"
    "          [--kv-unified on|off] [--swa-full on|off] [--eval-tail K] (--slot F | --session F | --raw-seq F) --logits OUT\n"
    "  compare REF.logits GOT.logits [--rows K] [--json] [--max-kl X] [--require-top1]\n"
    "  info\n"
    "  global: -v (show llama.cpp info logs)\n"
    "env: KVSNAP_ORACLE_CPU=x64 loads libggml-cpu-x64.so (machine-independent bytes) instead of the best\n"
    "     CPU variant; KVSNAP_ORACLE_LIBDIR overrides the library directory; LLAMA_* pass through.\n"
    "types: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl\n"
    "--tokens-out writes the n prompt tokens as little-endian int32.\n"
    "--eval-tail K (default 1): the state holds t[0..n-K-1]; t[n-K..n-1] are decoded in one batch and\n"
    "     the logits file holds their K x n_vocab float32 logits (row-major). compare --rows K (alias\n"
    "     --eval-tail K) reads K rows per file: mean KL over the rows, max |diff| and top-1 over all.\n";

Args parse_args(int argc, char** argv) {
  Args a;
  // flags without a value
  static const char* kFlags[] = {"json", "require-top1", "help"};
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s == "-v" || s == "--verbose") {
      g_verbose = true;
      continue;
    }
    if (s == "-h" || s == "--help") {
      fputs(kUsage, stdout);
      exit(0);
    }
    if (s.rfind("--", 0) == 0) {
      std::string k = s.substr(2);
      std::string v;
      auto eq = k.find('=');
      bool is_flag = false;
      for (const char* f : kFlags) is_flag |= (k == f);
      if (eq != std::string::npos) {
        v = k.substr(eq + 1);
        k = k.substr(0, eq);
      } else if (!is_flag) {
        if (i + 1 >= argc) die("option --" + k + " needs a value", 2);
        v = argv[++i];
      } else {
        v = "1";
      }
      a.opt[k] = v;
      continue;
    }
    if (a.cmd.empty()) {
      a.cmd = s;
    } else {
      a.positional.push_back(s);
    }
  }
  return a;
}

// ---------------------------------------------------------------- files
std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) die("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const void* data, size_t n) {
  FILE* f = fopen(path.c_str(), "wb");
  if (!f) die("cannot write " + path + ": " + strerror(errno));
  if (n && fwrite(data, 1, n, f) != n) die("short write to " + path);
  if (fclose(f) != 0) die("cannot close " + path);
}

std::vector<float> read_logits(const std::string& path) {
  std::string b = read_text(path);
  if (b.empty() || b.size() % 4 != 0) die(path + ": not a float32 logits file (size " + std::to_string(b.size()) + ")");
  std::vector<float> v(b.size() / 4);
  memcpy(v.data(), b.data(), b.size());
  return v;
}

// ---------------------------------------------------------------- llama helpers
ggml_type parse_type(const std::string& s) {
  static const std::pair<const char*, ggml_type> kTypes[] = {
      {"f32", GGML_TYPE_F32},   {"f16", GGML_TYPE_F16},   {"bf16", GGML_TYPE_BF16},
      {"q8_0", GGML_TYPE_Q8_0}, {"q4_0", GGML_TYPE_Q4_0}, {"q4_1", GGML_TYPE_Q4_1},
      {"q5_0", GGML_TYPE_Q5_0}, {"q5_1", GGML_TYPE_Q5_1}, {"iq4_nl", GGML_TYPE_IQ4_NL},
  };
  for (const auto& t : kTypes)
    if (s == t.first) return t.second;
  die("unknown cache type '" + s + "' (f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl)", 2);
}

bool parse_onoff(const std::string& k, const std::string& s) {
  if (s == "on" || s == "1" || s == "true" || s == "yes") return true;
  if (s == "off" || s == "0" || s == "false" || s == "no") return false;
  die("--" + k + " must be on or off, got '" + s + "'", 2);
}

int parse_int(const std::string& k, const std::string& s) {
  char* end = nullptr;
  long v = strtol(s.c_str(), &end, 10);
  if (s.empty() || *end || v <= 0 || v > (1 << 24)) die("--" + k + ": bad number '" + s + "'", 2);
  return static_cast<int>(v);
}

#ifdef KVSNAP_ORACLE_LEGACY_API
// b3166/b3543: one library with the CPU backend built in, no backend registry
void init_backend() {
  llama_log_set(log_cb, nullptr);
  llama_backend_init();
}
#else
void init_backend() {
  llama_log_set(log_cb, nullptr);
  ggml_log_set(log_cb, nullptr);
  std::string libdir = KVSNAP_ORACLE_LIBDIR;
  if (const char* e = getenv("KVSNAP_ORACLE_LIBDIR")) libdir = e;
  // KVSNAP_ORACLE_CPU=x64 (or haswell, zen4...): load exactly libggml-cpu-<name>.so instead of the
  // best variant for this CPU; the baseline "x64" gives the same bytes on every x86-64 machine.
  std::string variant;
  if (const char* e = getenv("KVSNAP_ORACLE_CPU")) variant = e;
  if (!variant.empty()) {
    std::string path = libdir + "/libggml-cpu-" + variant + ".so";
    if (!ggml_backend_load(path.c_str())) die("cannot load CPU backend " + path + ": " + error_summary());
  } else if (ggml_backend_reg_count() == 0 || ggml_backend_dev_count() == 0) {
    if (!libdir.empty()) {
      ggml_backend_load_all_from_path(libdir.c_str());
    } else {
      ggml_backend_load_all();
    }
  }
  if (ggml_backend_dev_count() == 0) die("no ggml backend could be loaded from '" + libdir + "'");
  llama_backend_init();
}
#endif

#ifdef KVSNAP_ORACLE_LEGACY_API
#define llama_model_load_from_file llama_load_model_from_file
#define llama_init_from_model llama_new_context_with_model
#define llama_model_free llama_free_model
#endif

struct Setup {
  std::string model_path, prompt_path;
  ggml_type ctk = GGML_TYPE_F16, ctv = GGML_TYPE_F16;
  bool fa = false;
  int n_ctx = 4096, n_seq = 1, n_batch = 512, threads = 2;
  int eval_tail = 1;  // K: the state holds t[0..n-K-1]; t[n-K..n-1] are decoded after it, logits for all K
  int kv_unified = -1;  // -1: library default
  int swa_full = -1;    // -1: library default (off): an iSWA model's SWA cache holds n_swa + ubatch cells
};

Setup parse_setup(const Args& a) {
  Setup s;
  s.model_path = a.need("model");
  s.prompt_path = a.need("prompt-file");
  s.ctk = parse_type(a.need("ctk"));
  s.ctv = parse_type(a.need("ctv"));
  s.fa = parse_onoff("fa", a.need("fa"));
  if (a.has("n-ctx")) s.n_ctx = parse_int("n-ctx", a.get("n-ctx"));
  if (a.has("n-seq")) s.n_seq = parse_int("n-seq", a.get("n-seq"));
  if (a.has("n-batch")) s.n_batch = parse_int("n-batch", a.get("n-batch"));
  if (a.has("threads")) s.threads = parse_int("threads", a.get("threads"));
  if (a.has("eval-tail")) s.eval_tail = parse_int("eval-tail", a.get("eval-tail"));
  if (s.eval_tail > s.n_batch)
    die("--eval-tail " + std::to_string(s.eval_tail) + " exceeds --n-batch " + std::to_string(s.n_batch) +
            " (the tail is decoded in one batch)",
        2);
  if (a.has("kv-unified")) s.kv_unified = parse_onoff("kv-unified", a.get("kv-unified")) ? 1 : 0;
  if (a.has("swa-full")) s.swa_full = parse_onoff("swa-full", a.get("swa-full")) ? 1 : 0;
#ifndef KVSNAP_ORACLE_HAS_KV_UNIFIED
  if (s.swa_full >= 0) die("--swa-full: not offered for this llama.cpp (" KVSNAP_ORACLE_TAG ")", 2);
  if (s.kv_unified == 0) die("--kv-unified off: this llama.cpp (" KVSNAP_ORACLE_TAG ") has no per-sequence streams", 2);
#endif
  return s;
}

llama_model* load_model(const std::string& path) {
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  reset_errors();
  llama_model* m = llama_model_load_from_file(path.c_str(), mp);
  if (!m) die("cannot load model " + path + ": " + error_summary());
  return m;
}

llama_context* make_context(llama_model* model, const Setup& s) {
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = s.n_ctx;
  cp.n_batch = s.n_batch;
  cp.n_ubatch = s.n_batch;
  cp.n_seq_max = s.n_seq;
  cp.n_threads = s.threads;
  cp.n_threads_batch = s.threads;
  cp.type_k = s.ctk;
  cp.type_v = s.ctv;
#ifndef KVSNAP_ORACLE_LEGACY_API
  cp.no_perf = true;
#endif
#ifdef KVSNAP_ORACLE_HAS_FA_TYPE
  cp.flash_attn_type = s.fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
#else
  cp.flash_attn = s.fa;
#endif
#ifdef KVSNAP_ORACLE_HAS_KV_UNIFIED
  if (s.kv_unified >= 0) cp.kv_unified = s.kv_unified != 0;
  if (s.swa_full >= 0) cp.swa_full = s.swa_full != 0;
#endif
  reset_errors();
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) die("cannot create context: " + error_summary());
  return ctx;
}

#ifdef KVSNAP_ORACLE_LEGACY_API
const llama_model* vocab_of(const llama_model* model) { return model; }
int32_t n_vocab_of(const llama_model* model) { return llama_n_vocab(model); }
#else
const llama_vocab* vocab_of(const llama_model* model) { return llama_model_get_vocab(model); }
int32_t n_vocab_of(const llama_model* model) { return llama_vocab_n_tokens(llama_model_get_vocab(model)); }
#endif

std::vector<llama_token> tokenize(llama_model* model, const std::string& text) {
  const auto* vocab = vocab_of(model);
  std::vector<llama_token> toks(text.size() + 16);
  int n = llama_tokenize(vocab, text.data(), (int32_t)text.size(), toks.data(), (int32_t)toks.size(),
                         /*add_special*/ true, /*parse_special*/ false);
  if (n < 0) {
    toks.resize(-n);
    n = llama_tokenize(vocab, text.data(), (int32_t)text.size(), toks.data(), (int32_t)toks.size(), true, false);
  }
  if (n < 2) die("prompt tokenizes to " + std::to_string(n) + " tokens; need at least 2");
  toks.resize(n);
  return toks;
}

// decode toks[first..last) at positions first.. in seq 0; logits only for the last token
// (decode_tail: the whole range in one batch, logits for every token)
void decode_range(llama_context* ctx, const std::vector<llama_token>& toks, int first, int last, int n_batch,
                  bool all_logits = false) {
  llama_batch b = llama_batch_init(n_batch, 0, 1);
  for (int i = first; i < last;) {
    int n = std::min(n_batch, last - i);
    b.n_tokens = n;
    for (int j = 0; j < n; ++j) {
      b.token[j] = toks[i + j];
      b.pos[j] = i + j;
      b.n_seq_id[j] = 1;
      b.seq_id[j][0] = 0;
      b.logits[j] = (all_logits || i + j == last - 1) ? 1 : 0;
    }
    reset_errors();
    int rc = llama_decode(ctx, b);
    if (rc != 0) {
      llama_batch_free(b);
      die("llama_decode failed (rc " + std::to_string(rc) + ") at token " + std::to_string(i) + ": " + error_summary());
    }
    i += n;
  }
  llama_batch_free(b);
}

// decode the K tail tokens t[n-K..n-1] at positions n-K..n-1 in one batch (K <= n_batch, checked
// in parse_setup) and return their K x n_vocab logits, row i for t[n-K+i]
std::vector<float> decode_tail(llama_context* ctx, llama_model* model, const std::vector<llama_token>& toks, int k) {
  const int n = (int)toks.size();
  decode_range(ctx, toks, n - k, n, k, /*all_logits*/ true);
  const int n_vocab = n_vocab_of(model);
  std::vector<float> out;
  out.reserve((size_t)k * n_vocab);
  for (int i = 0; i < k; ++i) {
    const float* l = llama_get_logits_ith(ctx, i);
    if (!l) die("no logits for tail token " + std::to_string(i) + " (position " + std::to_string(n - k + i) + ")");
    out.insert(out.end(), l, l + n_vocab);
  }
  return out;
}

void check_tail(const Setup& s, int n) {
  if (s.eval_tail > n - 1)
    die("--eval-tail " + std::to_string(s.eval_tail) + ": the prompt has " + std::to_string(n) +
            " tokens; the state must keep at least one (K <= " + std::to_string(n - 1) + ")",
        2);
}

// ---------------------------------------------------------------- commands
int cmd_save(const Args& a) {
  Setup s = parse_setup(a);
  if (!a.has("slot") && !a.has("session") && !a.has("raw-seq") && !a.has("logits"))
    die("save: nothing to write (give --slot, --session, --raw-seq and/or --logits)", 2);
  init_backend();
  llama_model* model = load_model(s.model_path);
  std::vector<llama_token> t = tokenize(model, read_text(s.prompt_path));
  const int n = (int)t.size();
  if (n - 1 > s.n_ctx) die("prompt has " + std::to_string(n) + " tokens, more than --n-ctx");
  check_tail(s, n);
  const int n_state = n - s.eval_tail;  // the state holds t[0..n_state-1]
  if (a.has("tokens-out")) write_bytes(a.get("tokens-out"), t.data(), t.size() * sizeof(llama_token));

  llama_context* ctx = make_context(model, s);
  decode_range(ctx, t, 0, n_state, s.n_batch);

  if (a.has("slot")) {
    reset_errors();
    size_t w = llama_state_seq_save_file(ctx, a.get("slot").c_str(), 0, t.data(), n_state);
    if (w == 0) die("llama_state_seq_save_file failed: " + error_summary());
  }
  if (a.has("session")) {
    reset_errors();
    if (!llama_state_save_file(ctx, a.get("session").c_str(), t.data(), n_state))
      die("llama_state_save_file failed: " + error_summary());
  }
  if (a.has("raw-seq")) {
    size_t sz = llama_state_seq_get_size(ctx, 0);
    std::vector<uint8_t> buf(sz);
    reset_errors();
#ifdef KVSNAP_ORACLE_UNSIZED_SEQ_DATA
    size_t w = llama_state_seq_get_data(ctx, buf.data(), 0);
#else
    size_t w = llama_state_seq_get_data(ctx, buf.data(), buf.size(), 0);
#endif
    if (w == 0) die("llama_state_seq_get_data failed: " + error_summary());
    write_bytes(a.get("raw-seq"), buf.data(), w);
  }

  std::vector<float> logits = decode_tail(ctx, model, t, s.eval_tail);
  if (a.has("logits")) write_bytes(a.get("logits"), logits.data(), logits.size() * sizeof(float));
  if (g_verbose)
    fprintf(stderr, "kvsnap-oracle: saved; n_tokens %d (state holds %d, logits of %d)\n", n, n_state, s.eval_tail);

  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}

int cmd_restore(const Args& a) {
  Setup s = parse_setup(a);
  int kinds = a.has("slot") + a.has("session") + a.has("raw-seq");
  if (kinds != 1) die("restore: give exactly one of --slot, --session, --raw-seq", 2);
  if (!a.has("logits")) die("restore: --logits OUT is required", 2);
  init_backend();
  llama_model* model = load_model(s.model_path);
  std::vector<llama_token> t = tokenize(model, read_text(s.prompt_path));
  const int n = (int)t.size();
  check_tail(s, n);
  const int n_state = n - s.eval_tail;  // the state should hold t[0..n_state-1]
  llama_context* ctx = make_context(model, s);

  std::vector<llama_token> loaded(s.n_ctx + 16);
  size_t n_loaded = 0;
  std::string what;
  reset_errors();
  if (a.has("slot")) {
    what = a.get("slot");
    size_t r = llama_state_seq_load_file(ctx, what.c_str(), 0, loaded.data(), loaded.size(), &n_loaded);
    if (r == 0) die("restore failed: " + what + ": " + error_summary(), 3);
  } else if (a.has("session")) {
    what = a.get("session");
    if (!llama_state_load_file(ctx, what.c_str(), loaded.data(), loaded.size(), &n_loaded))
      die("restore failed: " + what + ": " + error_summary(), 3);
  } else {
    what = a.get("raw-seq");
    std::string buf = read_text(what);
#ifdef KVSNAP_ORACLE_UNSIZED_SEQ_DATA
    size_t r = llama_state_seq_set_data(ctx, reinterpret_cast<const uint8_t*>(buf.data()), 0);
#else
    size_t r = llama_state_seq_set_data(ctx, reinterpret_cast<const uint8_t*>(buf.data()), buf.size(), 0);
#endif
    if (r == 0) die("restore failed: " + what + ": " + error_summary(), 3);
    n_loaded = (size_t)-1;
  }

#ifdef KVSNAP_ORACLE_LEGACY_API
  llama_pos pmax = llama_kv_cache_seq_pos_max(ctx, 0);
#else
  llama_memory_t mem = llama_get_memory(ctx);
  llama_pos pmax = llama_memory_seq_pos_max(mem, 0);
#endif
  if (pmax != n_state - 1) {
    fprintf(stderr, "kvsnap-oracle: warning: restored sequence 0 ends at position %d, prompt expects %d\n", (int)pmax,
            n_state - 1);
  }
  if (n_loaded != (size_t)-1 && n_loaded != (size_t)n_state && g_verbose) {
    fprintf(stderr, "kvsnap-oracle: note: file carries %zu token words, prompt has %d-%d\n", n_loaded, n,
            s.eval_tail);
  }

  std::vector<float> logits = decode_tail(ctx, model, t, s.eval_tail);
  write_bytes(a.get("logits"), logits.data(), logits.size() * sizeof(float));
  if (g_verbose) fprintf(stderr, "kvsnap-oracle: restored %s; pos_max %d\n", what.c_str(), (int)pmax);

  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}

int cmd_compare(const Args& a) {
  if (a.positional.size() != 2)
    die("compare REF.logits GOT.logits [--rows K] [--json] [--max-kl X] [--require-top1]", 2);
  if (a.has("rows") && a.has("eval-tail") && a.get("rows") != a.get("eval-tail"))
    die("compare: --rows and --eval-tail disagree", 2);
  const size_t rows = (size_t)parse_int("rows", a.has("rows") ? a.get("rows") : a.get("eval-tail", "1"));
  std::vector<float> ref = read_logits(a.positional[0]);
  std::vector<float> got = read_logits(a.positional[1]);
  if (ref.size() != got.size())
    die("sizes differ: " + std::to_string(ref.size()) + " vs " + std::to_string(got.size()) +
        " floats (rows x n_vocab; were both written with the same --eval-tail?)");
  if (ref.size() % rows != 0)
    die(a.positional[0] + ": " + std::to_string(ref.size()) + " floats do not split into " + std::to_string(rows) +
        " rows");
  const size_t n = ref.size() / rows;  // n_vocab
  // one row: KL(softmax(ref) || softmax(got)) in double
  auto softmax = [](const float* x, size_t len) {
    double mx = -INFINITY;
    for (size_t i = 0; i < len; ++i) mx = std::max(mx, (double)x[i]);
    std::vector<double> p(len);
    double sum = 0;
    for (size_t i = 0; i < len; ++i) sum += (p[i] = std::exp((double)x[i] - mx));
    for (double& v : p) v /= sum;
    return p;
  };
  double kl_sum = 0, kl_max = 0, max_abs = 0;
  size_t top_r = 0, top_g = 0, agree = 0;  // top-1 of the last row (t[n-1]); agreement over all rows
  bool finite = true;
  for (size_t r = 0; r < rows; ++r) {
    const float* rr = ref.data() + r * n;
    const float* gr = got.data() + r * n;
    std::vector<double> p = softmax(rr, n), q = softmax(gr, n);
    double kl = 0;
    top_r = top_g = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!std::isfinite(rr[i]) || !std::isfinite(gr[i])) finite = false;
      if (p[i] > 0) kl += p[i] * (std::log(p[i]) - std::log(std::max(q[i], 1e-300)));
      max_abs = std::max(max_abs, std::fabs((double)rr[i] - (double)gr[i]));
      if (rr[i] > rr[top_r]) top_r = i;
      if (gr[i] > gr[top_g]) top_g = i;
    }
    if (kl < 0) kl = 0;  // rounding
    kl_sum += kl;
    kl_max = std::max(kl_max, kl);
    agree += top_r == top_g;
  }
  const double kl = kl_sum / (double)rows;
  bool match = agree == rows;
  bool ok = finite;
  if (a.has("max-kl")) ok = ok && kl <= std::strtod(a.get("max-kl").c_str(), nullptr);
  if (a.has("require-top1")) ok = ok && match;
  if (a.has("json")) {
    printf(
        "{\"n_vocab\": %zu, \"rows\": %zu, \"kl\": %.9g, \"kl_max_row\": %.9g, \"max_abs_diff\": %.9g, "
        "\"top1_ref\": %zu, \"top1_got\": %zu, \"top1_agree\": %zu, \"match\": %s, \"finite\": %s, \"ok\": %s}\n",
        n, rows, kl, kl_max, max_abs, top_r, top_g, agree, match ? "true" : "false", finite ? "true" : "false",
        ok ? "true" : "false");
  } else if (rows == 1) {
    printf("n_vocab %zu  rows 1  kl %.6g  max_abs_diff %.6g  top1_ref %zu  top1_got %zu  match %s%s\n", n, kl, max_abs,
           top_r, top_g, match ? "yes" : "no", finite ? "" : "  NON-FINITE");
  } else {
    printf("n_vocab %zu  rows %zu  kl %.6g  max_abs_diff %.6g  top1_agree %zu/%zu  kl_max_row %.6g  match %s%s\n", n,
           rows, kl, max_abs, agree, rows, kl_max, match ? "yes" : "no", finite ? "" : "  NON-FINITE");
  }
  return ok ? 0 : 1;
}

int cmd_info() {
  init_backend();
  printf("npm_version %s\ntag %s\nsession_version %d\nstate_seq_version %d\n", KVSNAP_ORACLE_NPM_VERSION,
         KVSNAP_ORACLE_TAG, (int)LLAMA_SESSION_VERSION, (int)LLAMA_STATE_SEQ_VERSION);
  printf("libdir %s\n", KVSNAP_ORACLE_LIBDIR);
#ifndef KVSNAP_ORACLE_LEGACY_API
  for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
    ggml_backend_dev_t d = ggml_backend_dev_get(i);
    printf("device %s (%s)\n", ggml_backend_dev_name(d), ggml_backend_dev_description(d));
  }
#endif
  printf("system %s\n", llama_print_system_info());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse_args(argc, argv);
  if (a.cmd.empty()) {
    fputs(kUsage, stderr);
    return 2;
  }
  if (a.cmd == "save") return cmd_save(a);
  if (a.cmd == "restore") return cmd_restore(a);
  if (a.cmd == "compare") return cmd_compare(a);
  if (a.cmd == "info") return cmd_info();
  fprintf(stderr, "kvsnap-oracle: unknown command '%s'\n%s", a.cmd.c_str(), kUsage);
  return 2;
}
