// mlx_roundtrip IN OUT: reads an mlx-lm prompt cache with kvsnap's reader and writes it back with
// kvsnap's writer (format/mlx_safetensors.h), for the bed test's byte-exact and load-in-mlx-lm
// checks (tests/mlx/bed_test.py). Exit 1 with the reader's error on a file it refuses.
#include <cstdio>

#include "base/io.h"
#include "format/mlx_prompt_cache.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: mlx_roundtrip IN OUT\n");
    return 2;
  }
  kvsnap::Io& io = kvsnap::posix_io();
  auto in = io.open_read(argv[1]);
  if (!in.ok()) {
    std::fprintf(stderr, "%s\n", in.status().ToString().c_str());
    return 1;
  }
  auto cache = kvsnap::read_mlx_prompt_cache(**in);
  if (!cache.ok()) {
    std::fprintf(stderr, "%s\n", cache.status().ToString().c_str());
    return 1;
  }
  auto out = io.open_write(argv[2], false);
  kvsnap::Status s = out.ok() ? kvsnap::write_safetensors(cache->st, **in, **out) : out.status();
  if (s.ok()) s = (*out)->close();
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
