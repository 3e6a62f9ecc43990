/* kvsnap.h: the C API of kvsnap.
 *
 * Requantize a live llama.cpp session without files and without reprocessing
 * its prompt:
 *
 *   size_t n = llama_state_seq_get_size(ctx_old, seq);            // f16 cache
 *   uint8_t *buf = malloc(n);
 *   llama_state_seq_get_data(ctx_old, buf, n, seq);
 *   kvsnap_convert_params p;  kvsnap_convert_params_init(&p);
 *   p.ctk = "q8_0"; p.ctv = "q8_0";                                // the new context's types
 *   void *out; size_t out_n; char *err;
 *   if (kvsnap_convert_state(model, buf, n, &p, &out, &out_n, &err) != KVSNAP_OK) { puts(err); kvsnap_free(err); }
 *   llama_state_seq_set_data(ctx_new, out, out_n, seq);             // ctx_new: -ctk q8_0 -ctv q8_0
 *   kvsnap_free(out);
 *
 * Conventions
 *   - Every function returns a kvsnap_status; KVSNAP_OK is 0. Nothing throws
 *     across this API and nothing aborts on bad input: a corrupt, truncated or
 *     foreign buffer is an error with a message.
 *   - Ownership: buffers and strings the API returns through out-parameters
 *     belong to the caller and are released with kvsnap_free(). Objects made by
 *     a *_open function are released by the matching *_free function. Inputs
 *     are borrowed for the duration of the call only.
 *   - `error` out-parameters may be NULL; when not NULL they are set to NULL on
 *     success and to a message (free with kvsnap_free) on failure.
 *   - Thread safety: a kvsnap_model may be shared by threads; every call is
 *     otherwise independent.
 */
#ifndef KVSNAP_H
#define KVSNAP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KVSNAP_API __attribute__((visibility("default")))
#else
#define KVSNAP_API
#endif

#define KVSNAP_API_VERSION 2

/* The same numbers as the kvsnap command's exit codes (docs/cli.md). */
typedef enum kvsnap_status {
  KVSNAP_OK = 0,
  KVSNAP_ERR_INVALID_ARGUMENT = 2, /* the request is impossible (unknown type, quantized V without flash attention) */
  KVSNAP_ERR_CORRUPT = 3,          /* the bytes contradict the format (truncated, bad counts) */
  KVSNAP_ERR_NOT_SUPPORTED = 4,    /* well-formed but outside what kvsnap handles */
  KVSNAP_ERR_MISMATCH = 5,         /* the state does not belong to the model */
  KVSNAP_ERR_AMBIGUOUS = 6,        /* the layout needs the model to be read */
  KVSNAP_ERR_IO = 7,               /* the operating system refused */
  KVSNAP_ERR_NOT_FOUND = 8,
  KVSNAP_ERR_INTERNAL = 70,        /* a bug in kvsnap (an exception it did not expect); please report it */
} kvsnap_status;

/* What the input bytes are. */
typedef enum kvsnap_input_kind {
  KVSNAP_INPUT_AUTO = 0,        /* a state file (ggsq/ggsn) when its magic says so, else a sequence buffer */
  KVSNAP_INPUT_SEQ_BUFFER = 1,  /* llama_state_seq_get_data */
  KVSNAP_INPUT_CONTEXT_BUFFER = 2, /* llama_state_get_data: untagged, so a quantized conversion needs
                                      source_build (or src_rotation) of kvsnap_convert_params_v2 */
  KVSNAP_INPUT_FILE_BYTES = 3,  /* the bytes of a slot or session file */
} kvsnap_input_kind;

typedef struct kvsnap_convert_params {
  const char *ctk;         /* target K type ("f16", "q8_0", ...); NULL: keep */
  const char *ctv;         /* target V type; NULL: keep */
  int flash_attn;          /* target context's flash attention: 1 on, 0 off, -1 keep the V layout */
  const char *rotation;    /* "auto" (llama.cpp's rule; default when NULL), "on", "off" */
  int n_threads;           /* 0: every core, else 1..256 */
  kvsnap_input_kind input; /* default KVSNAP_INPUT_AUTO */
} kvsnap_convert_params;

/* Version 2 of the parameters: those of kvsnap_convert_params and what the kvsnap command line
 * can also say. Its first member is its size as the program was compiled, so later versions can
 * add members at the end without breaking programs built against this one: initialise it with
 * kvsnap_convert_params_v2_init(&p, sizeof p). A library older than the program's kvsnap.h refuses
 * (KVSNAP_ERR_NOT_SUPPORTED) members it does not know only when they are set. */
typedef struct kvsnap_convert_params_v2 {
  size_t struct_size;      /* sizeof(kvsnap_convert_params_v2) as the program was compiled: always
                              initialise the struct with kvsnap_convert_params_v2_init (a garbage
                              size over 4096 is refused, one below it cannot be told from a size) */
  const char *ctk;         /* as in kvsnap_convert_params */
  const char *ctv;
  int flash_attn;
  const char *rotation;    /* both ends; src_rotation / dst_rotation override it per end */
  int n_threads;
  kvsnap_input_kind input;
  const char *requant;      /* quantized -> quantized: "auto" (NULL), "quick", "search", "exact", "reference"
                               (docs/conversion.md) */
  const char *source_build; /* the llama.cpp build that produced src ("b8121", "v0.5.0"): decides whether
                               its quantized values are rotated; for a live buffer, the linked llama.cpp's */
  const char *target_build; /* the build that will load a slot/session file (FILE_BYTES): its format and
                               rotation; a raw buffer keeps its own layout, for the build that made it */
  const char *format;       /* a file's output format ("ggsq-v2", ...; NULL: current, a raw buffer's own) */
  const char *src_rotation; /* "auto", "on", "off": how src is stored, overriding rotation */
  const char *dst_rotation; /* how the output is to be stored, overriding rotation */
  /* Added after the members above (a program built against a kvsnap.h without it passes a
   * smaller struct_size, which this library takes): the KV streams of the context that will load a
   * sequence buffer or slot file: its n_seq_max without kv_unified (one stream per sequence), 1 with;
   * llama.cpp loads one only into a cache with as many. 0: as src. */
  int kv_streams;
} kvsnap_convert_params_v2;

/* The model a state belongs to: layout, head dims (the Hadamard rotation
 * depends on them) and the vocabulary, read from its GGUF header only. */
typedef struct kvsnap_model kvsnap_model;

KVSNAP_API const char *kvsnap_version(void);
KVSNAP_API const char *kvsnap_status_name(kvsnap_status s);
KVSNAP_API void kvsnap_free(void *p);

KVSNAP_API void kvsnap_convert_params_init(kvsnap_convert_params *p);
/* Every member to its default (NULL, flash_attn -1, KVSNAP_INPUT_AUTO) and struct_size = size;
 * pass sizeof the struct as compiled (sizeof p). */
KVSNAP_API void kvsnap_convert_params_v2_init(kvsnap_convert_params_v2 *p, size_t size);

KVSNAP_API kvsnap_status kvsnap_model_open(const char *gguf_path, kvsnap_model **out, char **error);
KVSNAP_API void kvsnap_model_free(kvsnap_model *m);

/* Converts `src` (see kvsnap_convert_params.input) to the requested types and
 * V layout, in the same kind of buffer. `model` may be NULL when the state is
 * unambiguous without it and no conversion crosses the rotation; pass it
 * whenever you have it. On success *out (size *out_size) is a new buffer. */
KVSNAP_API kvsnap_status kvsnap_convert_state(const kvsnap_model *model, const void *src, size_t src_size,
                                              const kvsnap_convert_params *params, void **out, size_t *out_size,
                                              char **error);
/* kvsnap_convert_state with version 2 of the parameters (NULL: every default). */
KVSNAP_API kvsnap_status kvsnap_convert_state_v2(const kvsnap_model *model, const void *src, size_t src_size,
                                                 const kvsnap_convert_params_v2 *params, void **out,
                                                 size_t *out_size, char **error);

#ifdef __cplusplus
}
#endif

#endif /* KVSNAP_H */
