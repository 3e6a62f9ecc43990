#!/usr/bin/env bash
# The mlx-lm test bed: a venv with the real mlx (CPU build) and mlx-lm, cached outside the checkout
# (like the llama.cpp bed), then real save_prompt_cache files from tiny random models
# (tests/mlx/make_caches.py) with mlx-lm's own description of each file next to it.
#   bash tests/mlx/make-bed.sh [OUT_DIR]     (default ~/.cache/kvsnap-mlx-bed)
# Re-running reuses the venv; the caches are rebuilt only when the versions or the script change.
# Measured on 2 shared cores: the venv ~70 s (pip, once), old mlx-lm releases ~3 s each, caches ~20 s.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${KVSNAP_MLX_VENV:-$HOME/.cache/kvsnap-mlx-venv}"
out="${1:-$HOME/.cache/kvsnap-mlx-bed}"
# One maker at a time: the four mlx oracles each call this script, and ctest -j runs them together
# (two pip installs into one venv, or one maker's `rm -rf OUT.tmp` under another's feet, break both).
# The lock is held until this script exits; a waiting maker then finds the stamp and returns at once.
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
# Pinned: the versions the bed's oracle JSON and the readers were checked with.
mlx_version=0.32.4
mlx_lm_version=0.32.2

if [ ! -x "$venv/bin/python3" ] ||
   ! "$venv/bin/python3" -c "import mlx.core, mlx_lm, sys; import importlib.metadata as m; \
sys.exit(m.version('mlx') != '$mlx_version' or m.version('mlx-lm') != '$mlx_lm_version')" 2>/dev/null; then
  # What this machine may lack (no PyPI, no wheel for its glibc) is exit 77, the only code the
  # oracle.mlx_* wrappers take as "Skipped"; anything else below (a broken make_caches.py) fails them.
  python3 -m venv "$venv" || { echo "make-bed: cannot make a venv at $venv" >&2; exit 77; }
  "$venv/bin/pip" install -q "mlx[cpu]==$mlx_version" "mlx-lm[cpu]==$mlx_lm_version" ||
    { echo "make-bed: cannot install mlx $mlx_version / mlx-lm $mlx_lm_version (no PyPI, or no wheel here)" >&2; exit 77; }
fi
# Older mlx-lm releases for the older file layouts: pure Python, run on the same mlx (make_caches.py).
for v in 0.31.3 0.30.5 0.28.0; do
  if [ ! -d "$venv/old/mlx-lm-$v/mlx_lm" ]; then
    "$venv/bin/pip" install -q --no-deps --target "$venv/old/mlx-lm-$v" "mlx-lm==$v" ||
      { echo "make-bed: cannot install mlx-lm $v (no PyPI?)" >&2; exit 77; }
  fi
done

stamp="mlx $mlx_version mlx-lm $mlx_lm_version $(sha256sum "$here/make_caches.py" | cut -d' ' -f1)"
if [ -f "$out/STAMP" ] && [ "$(cat "$out/STAMP")" = "$stamp" ]; then
  exit 0
fi
rm -rf "$out.tmp" && mkdir -p "$out.tmp"
"$venv/bin/python3" "$here/make_caches.py" "$out.tmp"
echo "$stamp" >"$out.tmp/STAMP"
rm -rf "$out" && mv "$out.tmp" "$out"
