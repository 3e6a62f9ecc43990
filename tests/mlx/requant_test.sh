#!/usr/bin/env bash
# ctest oracle.mlx_requant: makes (or reuses) the mlx-lm bed, then tests/mlx/requant_test.py, which
# checks kvsnap convert --kv-bits/--kv-group-size against the real mx.quantize (CPU) and mlx-lm.
# No bed and no way to make one: exit 77, which ctest reports as Skipped, never as a pass.
#   requant_test.sh KVSNAP WORK_DIR
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${KVSNAP_MLX_VENV:-$HOME/.cache/kvsnap-mlx-venv}"
bed="${KVSNAP_MLX_BED:-$HOME/.cache/kvsnap-mlx-bed}"
rm -rf "$2" && mkdir -p "$2"  # fresh: the checks look for files a refusal must not leave
if ! bash "$here/make-bed.sh" "$bed" >"$2.make-bed.log" 2>&1; then
  echo "SKIP: the mlx-lm bed could not be made (tests/mlx/make-bed.sh; log: $2.make-bed.log):"
  tail -5 "$2.make-bed.log"
  exit 77
fi
exec "$venv/bin/python3" "$here/requant_test.py" "$1" "$bed" "$venv/bin/python3" "$2"
