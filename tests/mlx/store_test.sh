#!/usr/bin/env bash
# ctest oracle.mlx_store: makes (or reuses) the mlx-lm bed, then tests/mlx/store_test.py, which saves
# every real prompt cache of the bed in a fresh store, restores it byte for byte and at other bits
# (equal to kvsnap convert, loaded by the mlx-lm that made it), and measures dedup on two real caches
# of one conversation. No bed and no way to make one: exit 77, which ctest reports as Skipped.
#   store_test.sh KVSNAP WORK_DIR
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${KVSNAP_MLX_VENV:-$HOME/.cache/kvsnap-mlx-venv}"
bed="${KVSNAP_MLX_BED:-$HOME/.cache/kvsnap-mlx-bed}"
rm -rf "$2" && mkdir -p "$2"  # a fresh store and fresh outputs: refusals must leave nothing
bash "$here/make-bed.sh" "$bed" >"$2.make-bed.log" 2>&1
made=$?
if [ "$made" -ne 0 ]; then
  # 77: this machine cannot install mlx (Skipped); anything else is a broken bed, a failure.
  [ "$made" -eq 77 ] && echo "SKIP: the mlx-lm bed could not be made here (log: $2.make-bed.log):" ||
    echo "FAIL: making the mlx-lm bed failed, exit $made (tests/mlx/make-bed.sh; log: $2.make-bed.log):"
  tail -5 "$2.make-bed.log"
  [ "$made" -eq 77 ] && exit 77
  exit 1
fi
exec "$venv/bin/python3" "$here/store_test.py" "$1" "$bed" "$venv/bin/python3" "$2"
