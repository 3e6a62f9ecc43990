#!/usr/bin/env bash
# Seeds a build directory's ctest cost data from one of the files here, so that ctest -j starts the
# tests known to be long first: a fresh build directory has no Testing/Temporary/CTestCostData.txt,
# and without it a long test can be started last and run alone on one core at the end (the
# sanitized stage's kvsnap-simd-check did: its last 2 of 8 minutes; the aarch64 one's: 79 s).
# Each file holds "NAME 1 SECONDS" lines, the seconds each test took in one measured cold CI run
# (main.txt, sanitized.txt: run-all.sh's stages; aarch64.txt: seconds under qemu, tests/cross/run.sh).
# A name no longer there is ignored; a test not listed runs after the listed ones.
#   bash tests/ctest-costs/seed.sh BUILD_DIR COSTS_FILE
set -euo pipefail
build=${1:?usage: seed.sh BUILD_DIR COSTS_FILE}
costs=${2:?usage: seed.sh BUILD_DIR COSTS_FILE}
mkdir -p "$build/Testing/Temporary"
{ cat "$costs"; echo ---; } > "$build/Testing/Temporary/CTestCostData.txt"
