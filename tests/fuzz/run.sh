#!/usr/bin/env bash
# Runs the libFuzzer targets of BUILD_DIR (configured with -DKVSNAP_FUZZ=ON,
# built with --target fuzz_all):
#   1. every file under tests/fuzz/regressions/<target>/ once (past crashes),
#   2. each target for a fixed SECONDS_PER_TARGET (default 30) on a copy of
#      tests/fuzz/corpus/<target>/ (the committed corpus is not changed; new
#      inputs are thrown away).
# KVSNAP_FUZZ_JOBS targets (default: the number of CPUs) run at once, each a
# single-threaded libFuzzer with its own fixed time, so the budget per target
# does not depend on the machine; the wall time is about
# targets x seconds / jobs. Each target's report is printed when it ends.
# Fails if any target crashes, leaks, times out (10 s per input) or passes
# 2 GB RSS; crash inputs are kept in BUILD_DIR/fuzz-artifacts/<target>/ and
# their paths printed. Add a fixed crash input to regressions/<target>/.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 BUILD_DIR [SECONDS_PER_TARGET]" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
seconds=${2:-30}
here=$(cd "$(dirname "$0")" && pwd)
flags=(-rss_limit_mb=2048 -timeout=10 -print_final_stats=0)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
shopt -s nullglob
targets=("$build"/tests/fuzz/fuzz_*)
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz: no fuzz_* targets in $build/tests/fuzz (cmake --build $build --target fuzz_all)" >&2
  exit 2
fi
jobs=${KVSNAP_FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
case "$jobs" in '' | *[!0-9]* | 0) echo "fuzz: KVSNAP_FUZZ_JOBS must be a positive number, not '$jobs'" >&2; exit 2 ;; esac
# One target: its regression inputs, then SECONDS of fuzzing. Prints its report to stdout; a line
# "FAILED <what>" in it marks a failure (a subshell cannot add to the caller's array), and a report
# without its last line, "DONE <target>", is one too (the subshell stopped early).
fuzz_one() {
  local bin=$1 t artifacts regressions start runs
  t=$(basename "$bin")
  t=${t#fuzz_}
  artifacts="$build/fuzz-artifacts/$t"
  rm -rf "$artifacts"
  mkdir -p "$artifacts"
  regressions=("$here/regressions/$t"/*)
  if [ ${#regressions[@]} -gt 0 ]; then
    if ! "$bin" "${flags[@]}" -artifact_prefix="$artifacts/" "${regressions[@]}" >"$work/$t.regressions.log" 2>&1; then
      echo "fuzz: $t: a regression input fails again:"
      grep -E "Running:|ERROR|SUMMARY" "$work/$t.regressions.log" | tail -5 || true
      echo "FAILED $t (regressions)"
    else
      echo "fuzz: $t: ${#regressions[@]} regression inputs pass"
    fi
  fi
  mkdir -p "$work/$t"
  cp -R "$here/corpus/$t/." "$work/$t/" 2>/dev/null || true
  start=$(date +%s)
  if "$bin" "${flags[@]}" -max_total_time="$seconds" -artifact_prefix="$artifacts/" "$work/$t" >"$work/$t.log" 2>&1; then
    # libFuzzer's own total ("Done N runs in S second(s)"); the last "#N" of the log can be a byte
    # string of the recommended dictionary printed after it (it once reported "#7 runs").
    runs=$(sed -nE 's/^Done ([0-9]+) runs in.*/\1/p' "$work/$t.log" | tail -1)
    echo "fuzz: $t: no crash in $(( $(date +%s) - start )) s (${runs:-?} runs)"
  else
    echo "fuzz: $t: CRASH"
    grep -E "ERROR|SUMMARY|Test unit written" "$work/$t.log" | tail -5 || true
    for a in "$artifacts"/*; do echo "fuzz: $t: crash input $a"; done
    echo "FAILED $t"
  fi
  echo "DONE $t"
}
running=0
for bin in "${targets[@]}"; do
  [ -x "$bin" ] || continue
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  t=$(basename "$bin")
  ( fuzz_one "$bin" >"$work/${t#fuzz_}.report" 2>&1; grep -v '^DONE ' "$work/${t#fuzz_}.report" ) &
  running=$((running + 1))
done
wait
failed=()
for bin in "${targets[@]}"; do
  t=$(basename "$bin")
  t=${t#fuzz_}
  if [ ! -f "$work/$t.report" ] || [ "$(tail -n 1 "$work/$t.report")" != "DONE $t" ]; then
    failed+=("$t (stopped before the end of its run)")
    continue
  fi
  while read -r what; do failed+=("$what"); done < <(sed -n 's/^FAILED //p' "$work/$t.report")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: every target ran ${seconds} s without a crash"
