#!/usr/bin/env bash
# The aarch64 stage: cross-compiles the layers the row kernels live in (base, format, migrate:
# -DKVSNAP_CORE_ONLY=ON) with Debian's aarch64 toolchain and runs their unit tests (and those of
# tests/mlx: MLX's affine codec and the prompt-cache files), the golden tests pinned to ggml
# (tests/migrate) and kvsnap-simd-check (every NEON kernel against the scalar reference, byte
# for byte) under qemu-user. The migrate and mlx tests run twice: at the NEON level (the
# default on aarch64) and at KVSNAP_SIMD=scalar, which proves the scalar reference itself on ARM.
# Bytes only: timings under qemu mean nothing (docs/performance.md, "ARM").
#
#   bash tests/cross/run.sh [BUILD_DIR [TOOLCHAIN_FILE]]   (default build-aarch64, tests/cross/aarch64.cmake;
#                                                         tests/cross/aarch64-clang.cmake: clang 16, the Apple clang proxy)
#
# Installs its packages when root (CI: .ci/run runs as root with CI=true) or with sudo:
# g++-aarch64-linux-gnu, qemu-user, and the arm64 -dev packages of the libraries those layers
# link (tests/install-deps.sh --cross, which run-all.sh has run before any stage).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-aarch64}
toolchain=${2:-tests/cross/aarch64.cmake}
jobs=$(nproc 2>/dev/null || echo 2)

bash tests/install-deps.sh --cross

cmake -S . -B "$build" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$toolchain" -DKVSNAP_CORE_ONLY=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" -DKVSNAP_TEST_CODE_FLAGS=-O1 \
  >/dev/null  # no debug information: nothing reads it here; the test files at -O1 (CMakeLists.txt)
cmake --build "$build" -j"$jobs" --target base_tests format_tests migrate_tests mlx_tests kvsnap-simd-check
# ctest runs every command through CMAKE_CROSSCOMPILING_EMULATOR (qemu-aarch64, the toolchain file).
#
# Left out: the golden tests of the quantized types (tests/migrate/golden/*.golden, made by ggml
# on x86-64). For q4_0..q8_0 every encoding matches on aarch64, but they also hash decoded
# rows holding NaNs that the arithmetic makes (inf * 0, inf / inf: an inf scale), and the default
# NaN differs by hardware: 0xFFC00000 on x86-64, 0x7FC00000 on aarch64 (iq4_nl's huge_range
# block even stores its scale as 0x7E00 where x86 ggml stores 0xFE00).
# ggml itself computes the same on ARM; the files pin the x86 bytes. See docs/performance.md, "ARM".
# (ctest's names of those tests end in '  # GetParam() = "q4_0"', hence the space)
golden_x86_nan='GoldenTypes\.MatchesGgml/(q4_0|q4_1|q5_0|q5_1|q8_0|iq4_nl) '
# Also left out: the snapshot tests' reruns under each SHA-256 kernel (label kernel-reruns): the
# kernels are x86's, so on aarch64 all three runs would take the same OpenSSL path (45 s under qemu).
# ctest starts the tests known to be long first (tests/ctest-costs/aarch64.txt, seconds under qemu in
# one cold CI run): kvsnap-simd-check, started last, ran 79 s alone at the end.
bash tests/ctest-costs/seed.sh "$build" tests/ctest-costs/aarch64.txt
# tests/migrate and tests/mlx at KVSNAP_SIMD=scalar (the scalar reference on aarch64), started beside
# the ctest below (their reports follow it): run after it, the mlx tests ended in 4 s and the migrate
# tests ran ~45 s alone on one core.
# (the emulator line of tests/cross/aarch64.cmake; each program runs in one emulator, one core)
# A temporary directory of their own: tests that write fixed names under ::testing::TempDir()
# (TEST_TMPDIR) or the system's (TMPDIR) would meet the ctest's runs of the same programs.
scalar_log=$(mktemp -d)
trap 'rm -rf "$scalar_log"' EXIT
mkdir "$scalar_log/tmp"
TEST_TMPDIR="$scalar_log/tmp/" TMPDIR="$scalar_log/tmp" KVSNAP_SIMD=scalar \
  qemu-aarch64 -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib \
  "$build/tests/migrate/migrate_tests" --gtest_brief=1 \
  --gtest_filter='-AllKvTypes/GoldenTypes.MatchesGgml/q*:AllKvTypes/GoldenTypes.MatchesGgml/iq4_nl' \
  >"$scalar_log/migrate" 2>&1 & migrate_pid=$!
TEST_TMPDIR="$scalar_log/tmp/" TMPDIR="$scalar_log/tmp" KVSNAP_SIMD=scalar \
  qemu-aarch64 -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib \
  "$build/tests/mlx/mlx_tests" --gtest_brief=1 >"$scalar_log/mlx" 2>&1 & mlx_pid=$!
# Under qemu-user a thread that only computes still blocks on the emulator's own locks (code
# translation): the tests that count a thread's waits skip that part (Os.AnotherThreadsWaitIsNotThisThreads).
ctest_failed=0
KVSNAP_TEST_EMULATED=1 ctest --test-dir "$build" -L unit -LE kernel-reruns -E "$golden_x86_nan" --output-on-failure -j"$jobs" || ctest_failed=1
echo "== cross: tests/migrate and tests/mlx at KVSNAP_SIMD=scalar (the scalar reference on aarch64), beside the ctest above =="
scalar_failed=0
wait "$migrate_pid" || scalar_failed=1
wait "$mlx_pid" || scalar_failed=1
echo "-- migrate_tests:"; cat "$scalar_log/migrate"
echo "-- mlx_tests:"; cat "$scalar_log/mlx"
[ "$scalar_failed" -eq 0 ] || { echo "cross: FAILED at KVSNAP_SIMD=scalar (above)" >&2; exit 1; }
[ "$ctest_failed" -eq 0 ] || { echo "cross: FAILED: the ctest under qemu (above)" >&2; exit 1; }
