#!/usr/bin/env bash
# ctest oracle.mlx_cross_engine: makes (or reuses) the mlx-lm venv (tests/mlx/make-bed.sh), then
# tests/mlx/cross_engine_test.py, which moves sessions between real llama.cpp (the oracle drivers)
# and real mlx-lm with kvsnap convert --to mlx|llama and scores them by next-token KL.
# No venv and no way to make one: exit 77, which ctest reports as Skipped, never as a pass.
#   cross_engine_test.sh KVSNAP MKMODEL DRIVER_V050 DRIVER_B8121|- PROMPT WORK_DIR [LLAMA_SERVER|-]
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${KVSNAP_MLX_VENV:-$HOME/.cache/kvsnap-mlx-venv}"
bed="${KVSNAP_MLX_BED:-$HOME/.cache/kvsnap-mlx-bed}"
work="$6"
rm -rf "$work" && mkdir -p "$work"
bash "$here/make-bed.sh" "$bed" >"$work.make-bed.log" 2>&1
made=$?
if [ "$made" -ne 0 ]; then
  # 77: this machine cannot install mlx (Skipped); anything else is a broken bed, a failure.
  [ "$made" -eq 77 ] && echo "SKIP: the mlx-lm bed could not be made here (log: $work.make-bed.log):" ||
    echo "FAIL: making the mlx-lm bed failed, exit $made (tests/mlx/make-bed.sh; log: $work.make-bed.log):"
  tail -5 "$work.make-bed.log"
  [ "$made" -eq 77 ] && exit 77
  exit 1
fi
exec "$venv/bin/python3" "$here/cross_engine_test.py" "$1" "$2" "$3" "$4" "$5" "$work" "${7:--}"
