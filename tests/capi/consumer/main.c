/* A program outside the kvsnap tree: uses only the installed kvsnap.h and libkvsnap. */
#include <kvsnap.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  if (argc != 3) return 2;
  FILE *f = fopen(argv[2], "rb");
  if (!f) return 3;
  static unsigned char buf[1 << 22];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  char *err = NULL;
  kvsnap_model *m = NULL;
  if (kvsnap_model_open(argv[1], &m, &err) != KVSNAP_OK) { fprintf(stderr, "%s\n", err); kvsnap_free(err); return 1; }
  kvsnap_convert_params p;
  kvsnap_convert_params_init(&p);
  p.ctk = "q8_0";
  p.ctv = "q8_0";
  void *out = NULL;
  size_t out_n = 0;
  kvsnap_status s = kvsnap_convert_state(m, buf, n, &p, &out, &out_n, &err);
  if (s != KVSNAP_OK) { fprintf(stderr, "%s: %s\n", kvsnap_status_name(s), err); kvsnap_free(err); return 1; }
  printf("kvsnap %s: %zu -> %zu bytes\n", kvsnap_version(), n, out_n);
  kvsnap_free(out);
  kvsnap_model_free(m);
  return 0;
}
