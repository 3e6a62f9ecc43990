// mlx_roundtrip IN OUT [LAYOUT]: reads an mlx-lm prompt cache with kvsnap's reader and writes it
// back with kvsnap's writer (format/mlx_safetensors.h), or in another mlx-lm layout
// (format/mlx_layout.h: "meta_state-with-step", "meta_state", "scalars" or an mlx-lm version), for
// the bed test's byte-exact and load-in-mlx-lm checks (tests/mlx/bed_test.py). Exit 1 with the
// reader's error on a file it refuses, 3 when the layout change is not supported for the file.
#include <cstdio>
#include <string>

#include "base/io.h"
#include "format/mlx_layout.h"
#include "format/mlx_prompt_cache.h"

namespace {

int fail(const kvsnap::Status& s) {
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return s.code() == kvsnap::Code::kNotSupported ? 3 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: mlx_roundtrip IN OUT [LAYOUT]\n");
    return 2;
  }
  kvsnap::Io& io = kvsnap::posix_io();
  auto in = io.open_read(argv[1]);
  if (!in.ok()) return fail(in.status());
  auto cache = kvsnap::read_mlx_prompt_cache(**in);
  if (!cache.ok()) return fail(cache.status());
  std::optional<kvsnap::MlxOutFile> changed;
  if (argc == 4) {
    auto to = kvsnap::mlx_target_for(argv[3]);
    if (!to.ok()) return fail(to.status());
    auto c = kvsnap::mlx_change_layout(*cache, *to);
    if (!c.ok()) return fail(c.status());
    changed = std::move(*c);
  }
  auto out = io.open_write(argv[2], false);
  if (!out.ok()) return fail(out.status());
  kvsnap::Status s = changed ? kvsnap::write_mlx_file(*changed, *cache, **in, **out)
                             : kvsnap::write_safetensors(cache->st, **in, **out);
  if (s.ok()) s = (*out)->close();
  return s.ok() ? 0 : fail(s);
}
