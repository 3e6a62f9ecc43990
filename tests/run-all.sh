#!/usr/bin/env bash
# The whole test suite, as README.md and .ci/run invoke it:
#   1. dependencies (Debian packages), 2. the real-llama.cpp bed (npm pack,
#   cached outside the checkout), 3. build and every test, 3b. the base, store and serve unit
#   tests against src/base/os.cc's generic POSIX branch (KVSNAP_OS_GENERIC_POSIX), 4. the kernel
#   layers cross-built for aarch64 and tested under qemu-user (tests/cross/run.sh), 4b. the main
#   build's unit tests, kvsnap-simd-check and a CLI round trip under qemu-x86_64 as CPUs without
#   AVX-512 / without AVX (tests/cross/x86-cpus.sh), 4c. the whole tree with clang 16 + libc++
#   (the macOS proxy, docs/portability.md), warnings as errors, under AddressSanitizer +
#   UndefinedBehaviorSanitizer, and its unit and S3 tests, 5. every libFuzzer target (tests/fuzz)
#   on its regression inputs and for a fixed time (KVSNAP_FUZZ_SECONDS per target, 30 by default).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

# Where a run's minutes go: each step's wall time, a table at the end (also when a stage fails),
# so that the fresh-machine budget (under 60 minutes on 2 cores, README.md) is kept by measurement.
# step NAME ends the current step and starts NAME, with a header naming the minute it starts at.
# Beside each step's time, how busy the machine's CPUs were (all of them, from /proc/stat; "-" where
# there is none): a step well under 100% leaves cores idle that another stage could use, and time
# stolen by a hypervisor (a shared CI host) is named apart, as it is not this run's work.
step_names=() step_secs=() step_cpu=()
step_name="packages (install-deps.sh)" step_start=$SECONDS
minutes() { printf '%d:%02d' $(($1 / 60)) $(($1 % 60)); }
# "BUSY STEAL TOTAL" ticks since boot, or nothing without /proc/stat.
cpu_ticks() {
  local cpu user nice system idle iowait irq softirq steal rest
  [ -r /proc/stat ] || return 0
  read -r cpu user nice system idle iowait irq softirq steal rest </proc/stat
  echo "$((user + nice + system + irq + softirq)) $steal $((user + nice + system + idle + iowait + irq + softirq + steal))"
}
step_ticks=$(cpu_ticks)
# The CPU use of the step that ends now, appended to step_cpu: "83% busy" or "83% busy, 4% stolen";
# "-" when unknown. (Not in a $(...): the ticks it keeps for the next step would stay in the subshell.)
record_step_cpu_use() {
  local now b0 s0 t0 b1 s1 t1 use
  now=$(cpu_ticks)
  read -r b0 s0 t0 <<<"${step_ticks:-0 0 0}"
  read -r b1 s1 t1 <<<"${now:-0 0 0}"
  step_ticks=$now
  if [ -z "$now" ] || [ $((t1 - t0)) -le 0 ]; then
    use="-"
  elif [ $(((s1 - s0) * 100 / (t1 - t0))) -ge 1 ]; then
    use="$(((b1 - b0) * 100 / (t1 - t0)))% busy, $(((s1 - s0) * 100 / (t1 - t0)))% stolen"
  else
    use="$(((b1 - b0) * 100 / (t1 - t0)))% busy"
  fi
  step_cpu+=("$use")
}
end_step() {
  step_names+=("$step_name")
  step_secs+=($((SECONDS - step_start)))
  record_step_cpu_use
}
step() {
  end_step
  step_name=$1 step_start=$SECONDS
  echo "== $1 (at $(minutes $SECONDS)) =="
}
print_steps() {
  local i
  end_step
  echo "== time per step (wall, m:ss; CPU use of all $jobs cores; the jobs run beside are timed on their own lines) =="
  for i in "${!step_names[@]}"; do
    printf '%7s  %-22s %s\n' "$(minutes "${step_secs[$i]}")" "(${step_cpu[$i]})" "${step_names[$i]}"
  done
  printf '%7s  %-22s %s\n' "$(minutes $SECONDS)" "" "the whole run"
}

# A job run beside the stages that follow it: start_beside NAME COMMAND... starts it with its output
# in a file, in a process group of its own (set -m while it starts); finish_beside NAME waits for it,
# prints that output and returns its status.
declare -A beside_pid beside_log beside_start
start_beside() {
  local name=$1
  shift
  beside_log[$name]=$(mktemp)
  beside_start[$name]=$SECONDS
  set -m
  "$@" >"${beside_log[$name]}" 2>&1 &
  beside_pid[$name]=$!
  set +m
}
finish_beside() {
  local rc=0
  wait "${beside_pid[$1]}" || rc=$?
  echo "== $1 (run beside the stages above: $(minutes $((SECONDS - beside_start[$1]))) from its start," \
       "waited for at $(minutes $SECONDS)) =="
  cat "${beside_log[$1]}"
  rm -f "${beside_log[$1]}"
  unset "beside_pid[$1]" "beside_log[$1]" "beside_start[$1]"
  return "$rc"
}
# A stage that fails ends the script (set -e): a job still beside it is stopped, its whole process
# group (ctest, the bed scripts, Swift), and its output shown.
stop_beside_jobs() {
  local name
  for name in "${!beside_pid[@]}"; do
    kill -TERM -- "-${beside_pid[$name]}" 2>/dev/null || true
    finish_beside "$name" || true
  done
}
trap 'stop_beside_jobs; print_steps' EXIT

# The llama.cpp bed's first release (npm pack: the network) is fetched beside the Debian packages
# (apt: another server) when the tools fetch.sh needs are here before them (npm, git, tar); else
# after them, in its own step below.
fetch_beside_packages=0
if [ -f tests/oracle/fetch.sh ] && command -v npm >/dev/null 2>&1 && command -v git >/dev/null 2>&1 &&
   command -v tar >/dev/null 2>&1; then
  start_beside "llama.cpp 3.22.1 download" bash tests/oracle/fetch.sh 3.22.1
  fetch_beside_packages=1
fi
# --cross: the aarch64 stage's packages too, now, in the same apt transaction (install-deps.sh says why)
bash tests/install-deps.sh --cross
# ccache (installed by install-deps) serves every build below when the machine has built this tree
# before, in any clone: paths are hashed relative to the checkout (CCACHE_BASEDIR), so another
# clone's objects are hits. A fresh machine only fills the cache. CMake reads the launcher from the
# environment when it configures a new build directory.
if command -v ccache >/dev/null 2>&1; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
fi

# The Python beds (PyPI: downloads and unpacking) are made beside the npm downloads and the
# llama-server build below (a cold run had them done in 44 s, during the downloads); the main tests
# wait for them.
# - the openai Python client for oracle.serve's real-client check (a venv cached outside the checkout);
# - the mlx-lm bed for oracle.mlx_bed (mlx[cpu], mlx-lm[cpu] in a venv cached outside the checkout;
#   ~2 min the first time, cached afterwards; the test is Skipped when it cannot be made).
# The openai venv itself is made first, here: configuring build/ looks for its python3 (tests/oracle).
openai_venv="$HOME/.cache/kvsnap-openai-venv"
[ -x "$openai_venv/bin/python3" ] || python3 -m venv "$openai_venv"
make_python_beds() {
  if ! "$openai_venv/bin/python3" -c 'import openai' 2>/dev/null; then
    "$openai_venv/bin/pip" install -q openai
  fi
  # 77: no PyPI or no wheel here (the oracle.mlx_* tests are then Skipped); anything else fails the run.
  local made=0
  bash tests/mlx/make-bed.sh || made=$?
  [ "$made" -eq 0 ] || [ "$made" -eq 77 ] || { echo "making the mlx-lm bed failed (exit $made)" >&2; return 1; }
  [ "$made" -eq 0 ] || echo "mlx-lm bed not made: the oracle.mlx_* tests will be Skipped"
}
start_beside "Python beds" make_python_beds

if [ -x tests/oracle/fetch.sh ] || [ -f tests/oracle/fetch.sh ]; then
  # llama-server is built from node-llama-cpp 3.22.1's source bundle: that version first, then the
  # server build (~1.5 min the first time on 2 cores: only what the release's prebuilt libraries do
  # not hold, build-server.sh; cached afterwards) with the other downloads
  # beside it (they wait on the network, the build on the CPU): node-llama-cpp 3.21.1 3.20.0 3.19.0
  # 3.18.1 3.17.1 3.16.2 3.10.0, @fugood/llama.node and eras A and B (3.0.0-beta.32/44), ~1 min
  # the first time (npm pack + the source bundles), cached afterwards.
  step "the real-llama.cpp bed: 3.22.1, then llama-server built (the other releases fetched beside it)"
  if [ "$fetch_beside_packages" -eq 1 ]; then
    finish_beside "llama.cpp 3.22.1 download"
  else
    bash tests/oracle/fetch.sh 3.22.1
  fi
  start_beside "oracle beds" bash -c 'bash tests/oracle/fetch.sh all && bash tests/oracle/fetch.sh eras-ab'
  bash tests/oracle/build-server.sh 3.22.1
  finish_beside "oracle beds"
fi

# The builds here carry no debug information (-g is a third of gcc's compile time on this tree, and
# nothing here reads it); a developer's RelWithDebInfo build keeps it. The fuzz and clang builds keep
# line tables (cheap in clang) so that a report names its line.
# ctest starts the tests it knows to be long first: tests/ctest-costs/seed.sh seeds each build
# directory with the seconds each test took in a measured run (the script says why).

# The gtest programs' own files at -O1 (KVSNAP_TEST_CODE_FLAGS, CMakeLists.txt): 404 s of compile
# for them against 420 at -O2 (two cold runs); the libraries they test stay at -O2. The command
# layer's own files (src/cli, KVSNAP_CLI_CODE_FLAGS) at -O1 too: CLI11's header is mostly code
# generation in each of them (cmd_info.cc 14.5 -> 10.4 s); what the commands do runs in the libraries.
release=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG"
         -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" -DKVSNAP_TEST_CODE_FLAGS=-O1 -DKVSNAP_CLI_CODE_FLAGS=-O1)
step "main build (gcc 12)"
cmake -S . -B build -G Ninja "${release[@]}" >/dev/null
cmake --build build -j"$jobs"
finish_beside "Python beds"
step "main tests (ctest -LE slow)"
# Left out: "slow" (bigger matrices, e.g. oracle.zoo_full).
bash tests/ctest-costs/seed.sh build tests/ctest-costs/main.txt
ctest --test-dir build --output-on-failure -j"$jobs" -LE 'slow'
# The multi-host proof (issue 16): two hosts against one PostgreSQL and one Swift+s3api bed. Labelled
# slow (3.5-4.5 min on 2 cores) so that it can move to a job of its own. Until it does, it runs beside
# the generic POSIX and aarch64 stages below: it keeps about one core busy (Swift's proxy and object
# server, 117% of a core over 4.4 min in one measured run), the cross build and qemu take the rest.
# Its own ctest entry in build/ (the stages beside it use other build directories); waited for, and
# its output shown, before the x86-cpus stage runs ctest in build/ again.
start_beside fleet.two_hosts ctest --test-dir build --output-on-failure -L 'fleet'

step "generic POSIX: src/base/os.cc's branch for other systems, with the base, store and serve unit tests"
# The macOS proxy for the OS seam (docs/portability.md): no prctl, close_range, sync_file_range,
# pipe2 or fdatasync; the lifeline without the parent-death signal. Only os.cc and its test differ from
# build/'s objects, which ccache serves. The test programs run directly (their ctest entries would
# need every other test program built).
cmake -S . -B build-posix -G Ninja -DKVSNAP_OS_GENERIC_POSIX=ON -DKVSNAP_BUILD_BENCH=OFF "${release[@]}" >/dev/null
cmake --build build-posix -j"$jobs" --target base_tests store_tests serve_tests
# Two at a time: serve_tests (29 s in one run) beside base_tests and store_tests (1.5 + 21 s).
posix_serve_log=$(mktemp)
build-posix/tests/serve_tests --gtest_brief=1 >"$posix_serve_log" 2>&1 & posix_serve=$!
posix_rc=0
build-posix/tests/base_tests --gtest_brief=1 || posix_rc=1
build-posix/tests/store_tests --gtest_brief=1 || posix_rc=1
wait "$posix_serve" || posix_rc=1
cat "$posix_serve_log"
rm -f "$posix_serve_log"
[ "$posix_rc" -eq 0 ] || { echo "generic POSIX: a unit test program failed (above)" >&2; exit 1; }

step "aarch64: cross build, unit + golden tests and kvsnap-simd-check (NEON) under qemu-user"
# tests/cross/run.sh: g++-aarch64-linux-gnu, qemu-user and the arm64 -dev packages were installed above.
# Measured clean on 2 cores shared with other builds: 7.0 min (9.8 min at load 6-9).
bash tests/cross/run.sh build-aarch64
finish_beside fleet.two_hosts
# The same with clang 16 (tests/cross/aarch64-clang.cmake, the Apple clang proxy) passes too, but takes
# several times as long under qemu: run by hand, not here (docs/portability.md, "What was proven").

step "x86-64 CPUs below this one: AVX2 without AVX-512 and SHA-NI (Haswell), SSE4.2 only (Nehalem), under qemu-x86_64"
# tests/cross/x86-cpus.sh: the level and SHA-256 kernel chosen from CPUID alone, no instruction the
# CPU lacks on any path (SIGILL), the same bytes. Uses build/ from above; ~6 min on 2 cores.
bash tests/cross/x86-cpus.sh build

step "clang 16 + libc++ + ASan + UBSan: every portable target, warnings as errors (the build)"
# One build for three proofs: macOS has only libc++ and Apple clang (docs/portability.md), the unit
# tests run under AddressSanitizer + UndefinedBehaviorSanitizer, and -Werror holds for clang. Debug
# (-O0, asserts on): clang compiles this tree with ASan 2-3x faster than at -O1 (cmd_info.cc 13.6 s
# against 29.8, store_test.cc 8.0 against 25.7), more than the slower tests cost; line tables name
# the line of a report. The compute-bound code (parsers, conversions, kernels, SHA-256:
# KVSNAP_HOT_CODE_FLAGS in CMakeLists.txt) is -O1: the unit tests ~7 min instead of 9.7 (one run).
# GoogleTest is compiled from /usr/src/googletest (Debian's libgtest.a is libstdc++), cpp-httplib
# from the header-only copy llama.cpp b5640 vendors (0.20.1, fetched above: Debian's is a libstdc++
# .so). The sanitizer runtimes are libclang-rt-16-dev's.
# Configured as on a machine without the real-llama.cpp bed (KVSNAP_ORACLE_DIR names no directory),
# as a Mac is: the programs that link node-llama-cpp's linux-x64 libraries (the oracle drivers,
# kvsnap-layout-check, kvsnap-live-requant, the migrate oracle tests) are not made, where they were
# built and never run here; the unit and S3 tests are the same set either way.
CC=clang-16 CXX=clang++-16 cmake -S . -B build-clang -G Ninja -DKVSNAP_LIBCXX=ON -DKVSNAP_WERROR=ON \
  -DKVSNAP_SANITIZE=ON -DKVSNAP_HOT_CODE_FLAGS=-O1 -DKVSNAP_ORACLE_DIR="$PWD/build-clang/no-oracle-bed" \
  -DKVSNAP_HTTPLIB_INCLUDE_DIR="${KVSNAP_ORACLE_DIR:-$HOME/.cache/kvsnap-oracle}/3.10.0/src/vendor/cpp-httplib" \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-gline-tables-only" \
  -DCMAKE_CXX_FLAGS_DEBUG="-gline-tables-only" >/dev/null
cmake --build build-clang -j"$jobs"
step "clang 16 + libc++ + ASan + UBSan: the unit tests and the S3 client"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
bash tests/ctest-costs/seed.sh build-clang tests/ctest-costs/sanitized.txt
# Without the snapshot tests' reruns under each SHA-256 kernel (label kernel-reruns, 125 s here): the
# main stage runs them, and base_tests' Sha256Lanes runs each kernel under the sanitizers.
# Nor the adaptive level's tests on 150 MiB states (SnapshotAdaptive.*, Store.TheAdaptiveLevelHearsThePacksDisk):
# 1-3 s each in the main stage, 38-219 s each here (794 s of the stage's 1,861 test seconds on a
# 2.45 GHz Zen 3, a fresh run of 86.8 min), ~87% of it building their synthetic state at -O0
# (perf); they test when a save compresses, which the main stage runs, while every store and CLI
# save here runs the same adaptive code on small files.
ctest --test-dir build-clang -L unit -LE kernel-reruns -E '^(SnapshotAdaptive\.|Store\.TheAdaptiveLevelHearsThePacksDisk$)' \
  --output-on-failure -j"$jobs"
# The S3 client reads untrusted replies: its tests against the Swift bed under the sanitizers too (~1 min).
ctest --test-dir build-clang -L s3 -LE slow --output-on-failure
unset ASAN_OPTIONS UBSAN_OPTIONS

step "fuzz targets (clang, libFuzzer + ASan + UBSan): the build"
# Only the fuzz targets and the libraries they link. The runs take KVSNAP_FUZZ_SECONDS per target
# (15 targets), two at a time on 2 cores (tests/fuzz/run.sh), plus a few seconds of regression inputs.
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DKVSNAP_FUZZ=ON -DKVSNAP_BUILD_TESTS=OFF \
  -DKVSNAP_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -gline-tables-only -DNDEBUG" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -gline-tables-only -DNDEBUG" >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz_all
step "fuzz targets: the runs"
bash tests/fuzz/run.sh build-fuzz "${KVSNAP_FUZZ_SECONDS:-30}"
