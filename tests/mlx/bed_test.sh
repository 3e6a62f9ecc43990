#!/usr/bin/env bash
# ctest oracle.mlx_bed: makes (or reuses) the mlx-lm bed, then tests/mlx/bed_test.py on every file.
# No bed and no way to make one (no PyPI, no glibc >= 2.35 for mlx's wheels): exit 77, which ctest
# reports as Skipped, never as a pass.
#   bed_test.sh KVSNAP MLX_ROUNDTRIP WORK_DIR
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${KVSNAP_MLX_VENV:-$HOME/.cache/kvsnap-mlx-venv}"
bed="${KVSNAP_MLX_BED:-$HOME/.cache/kvsnap-mlx-bed}"
bash "$here/make-bed.sh" "$bed" >"$3.make-bed.log" 2>&1
made=$?
if [ "$made" -ne 0 ]; then
  # 77: this machine cannot install mlx (Skipped); anything else is a broken bed, a failure.
  [ "$made" -eq 77 ] && echo "SKIP: the mlx-lm bed could not be made here (log: $3.make-bed.log):" ||
    echo "FAIL: making the mlx-lm bed failed, exit $made (tests/mlx/make-bed.sh; log: $3.make-bed.log):"
  tail -5 "$3.make-bed.log"
  [ "$made" -eq 77 ] && exit 77
  exit 1
fi
exec "$venv/bin/python3" "$here/bed_test.py" "$1" "$2" "$bed" "$venv/bin/python3" "$3"
