/* live_requant.c: requantize a live llama.cpp session with kvsnap's C API, and
 * compare with reprocessing the prompt (the use case of llama.cpp PR #24134,
 * done with a stock llama.cpp).
 *
 *   kvsnap-live-requant MODEL.gguf PROMPT.txt [CTK CTV] [N_THREADS]
 *
 * 1. context A (f16/f16, flash attention): decode the prompt;
 * 2. llama_state_seq_get_data(A) -> kvsnap_convert_state(-> CTK/CTV) ->
 *    llama_state_seq_set_data(B), B a fresh context with CTK/CTV;
 * 3. context C with CTK/CTV decodes the same prompt (the reprocessing a user
 *    does today);
 * 4. all three decode one more token; prints the next-token KL of B and of C
 *    against A, and the two times. Exit status 0 when B's KL is within
 *    1.5x C's (or 1e-6), i.e. the requantized session computes like a native one.
 * Set KVSNAP_BACKEND_DIR to the directory of libggml-cpu-*.so when the
 * prebuilt llama.cpp needs it (ggml_backend_load_all_from_path).
 */
#include <ggml-backend.h>
#include <llama.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvsnap.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void die(const char *msg) {
  fprintf(stderr, "kvsnap-live-requant: %s\n", msg);
  exit(1);
}

static enum ggml_type type_of(const char *name) {
  static const struct { const char *n; enum ggml_type t; } types[] = {
      {"f32", GGML_TYPE_F32},   {"f16", GGML_TYPE_F16},   {"bf16", GGML_TYPE_BF16},
      {"q8_0", GGML_TYPE_Q8_0}, {"q4_0", GGML_TYPE_Q4_0}, {"q4_1", GGML_TYPE_Q4_1},
      {"q5_0", GGML_TYPE_Q5_0}, {"q5_1", GGML_TYPE_Q5_1}, {"iq4_nl", GGML_TYPE_IQ4_NL}};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; ++i)
    if (!strcmp(types[i].n, name)) return types[i].t;
  die("unknown cache type");
  return GGML_TYPE_F16;
}

static struct llama_context *make_ctx(struct llama_model *m, enum ggml_type k, enum ggml_type v, int n_ctx, int threads) {
  struct llama_context_params p = llama_context_default_params();
  p.n_ctx = n_ctx;
  p.n_batch = p.n_ubatch = 512;
  p.n_threads = p.n_threads_batch = threads;
  p.type_k = k;
  p.type_v = v;
  p.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
  p.no_perf = true;
  struct llama_context *c = llama_init_from_model(m, p);
  if (!c) die("cannot create a context");
  return c;
}

/* Decodes toks[0..n) at positions from `pos0`, in batches; logits for the last. */
static void decode(struct llama_context *c, const llama_token *toks, int n, int pos0) {
  struct llama_batch b = llama_batch_init(512, 0, 1);
  for (int i = 0; i < n;) {
    b.n_tokens = 0;
    for (; i < n && b.n_tokens < 512; ++i) {
      int j = b.n_tokens++;
      b.token[j] = toks[i];
      b.pos[j] = pos0 + i;
      b.n_seq_id[j] = 1;
      b.seq_id[j][0] = 0;
      b.logits[j] = i == n - 1;
    }
    if (llama_decode(c, b) != 0) die("llama_decode failed");
  }
  llama_batch_free(b);
}

static double kl(const float *ref, const float *x, int n) {
  double mr = -INFINITY, mx = -INFINITY, sr = 0, sx = 0, d = 0;
  for (int i = 0; i < n; ++i) {
    if (ref[i] > mr) mr = ref[i];
    if (x[i] > mx) mx = x[i];
  }
  for (int i = 0; i < n; ++i) {
    sr += exp(ref[i] - mr);
    sx += exp(x[i] - mx);
  }
  for (int i = 0; i < n; ++i) {
    double lp = ref[i] - mr - log(sr), lq = x[i] - mx - log(sx);
    d += exp(lp) * (lp - lq);
  }
  return d;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) die("cannot open the prompt file");
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc(n + 1);
  if (!s || fread(s, 1, n, f) != (size_t)n) die("cannot read the prompt file");
  s[n] = 0;
  fclose(f);
  return s;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: kvsnap-live-requant MODEL.gguf PROMPT.txt [CTK CTV] [N_THREADS]\n");
    return 2;
  }
  const char *ctk = argc > 4 ? argv[3] : "q8_0", *ctv = argc > 4 ? argv[4] : "q8_0";
  int threads = argc > 5 ? atoi(argv[5]) : 2;
  const char *backends = getenv("KVSNAP_BACKEND_DIR");
  if (backends) ggml_backend_load_all_from_path(backends);
  else ggml_backend_load_all();
  llama_backend_init();

  struct llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  struct llama_model *model = llama_model_load_from_file(argv[1], mp);
  if (!model) die("cannot load the model");
  char *err = NULL;
  kvsnap_model *km = NULL;
  if (kvsnap_model_open(argv[1], &km, &err) != KVSNAP_OK) die(err);

  char *text = slurp(argv[2]);
  const struct llama_vocab *vocab = llama_model_get_vocab(model);
  int cap = (int)strlen(text) + 16;
  llama_token *toks = malloc(sizeof(llama_token) * cap);
  int n = llama_tokenize(vocab, text, (int)strlen(text), toks, cap, true, false);
  if (n < 2) die("the prompt tokenizes to fewer than 2 tokens");
  const int n_prompt = n - 1; /* the last token is the "next" one all three contexts decode */
  const int n_ctx = n + 64;
  const int n_vocab = llama_vocab_n_tokens(vocab);

  struct llama_context *a = make_ctx(model, GGML_TYPE_F16, GGML_TYPE_F16, n_ctx, threads);
  double t0 = now_ms();
  decode(a, toks, n_prompt, 0);
  double t_prefill_f16 = now_ms() - t0;

  /* the live requantization */
  struct llama_context *b = make_ctx(model, type_of(ctk), type_of(ctv), n_ctx, threads);
  t0 = now_ms();
  size_t sz = llama_state_seq_get_size(a, 0);
  unsigned char *buf = malloc(sz);
  if (llama_state_seq_get_data(a, buf, sz, 0) != sz) die("llama_state_seq_get_data failed");
  double t_get = now_ms() - t0;
  kvsnap_convert_params cp;
  kvsnap_convert_params_init(&cp);
  cp.ctk = ctk;
  cp.ctv = ctv;
  cp.n_threads = threads;
  cp.input = KVSNAP_INPUT_SEQ_BUFFER;
  void *out = NULL;
  size_t out_n = 0;
  double t1 = now_ms();
  kvsnap_status st = kvsnap_convert_state(km, buf, sz, &cp, &out, &out_n, &err);
  if (st != KVSNAP_OK) die(err);
  double t_convert = now_ms() - t1;
  t1 = now_ms();
  if (llama_state_seq_set_data(b, out, out_n, 0) != out_n) die("llama_state_seq_set_data refused the converted state");
  double t_set = now_ms() - t1;
  double t_requant = t_get + t_convert + t_set;

  /* what users do today: reprocess the prompt in the new types */
  struct llama_context *c = make_ctx(model, type_of(ctk), type_of(ctv), n_ctx, threads);
  t0 = now_ms();
  decode(c, toks, n_prompt, 0);
  double t_reprocess = now_ms() - t0;

  decode(a, toks + n_prompt, 1, n_prompt);
  decode(b, toks + n_prompt, 1, n_prompt);
  decode(c, toks + n_prompt, 1, n_prompt);
  double kl_b = kl(llama_get_logits_ith(a, -1), llama_get_logits_ith(b, -1), n_vocab);
  double kl_c = kl(llama_get_logits_ith(a, -1), llama_get_logits_ith(c, -1), n_vocab);
  double bound = 1.5 * kl_c > 1e-6 ? 1.5 * kl_c : 1e-6;

  printf("prompt: %d tokens; state %zu bytes f16 -> %zu bytes %s/%s\n", n_prompt, sz, out_n, ctk, ctv);
  printf("requantize live: %.2f ms (get %.2f + kvsnap convert %.2f + set %.2f)\n", t_requant, t_get, t_convert, t_set);
  printf("reprocess prompt: %.2f ms (f16 prefill took %.2f ms)\n", t_reprocess, t_prefill_f16);
  printf("ratio: requantizing is %.1fx faster than reprocessing\n", t_reprocess / t_requant);
  printf("next-token KL vs f16: requantized %.3g, reprocessed %.3g (bound %.3g): %s\n", kl_b, kl_c, bound,
         kl_b <= bound ? "ok" : "FAIL");

  kvsnap_free(out);
  free(buf);
  free(toks);
  free(text);
  kvsnap_model_free(km);
  llama_free(a);
  llama_free(b);
  llama_free(c);
  llama_model_free(model);
  llama_backend_free();
  return kl_b <= bound ? 0 : 1;
}
