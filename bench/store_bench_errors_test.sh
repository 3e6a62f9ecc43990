#!/usr/bin/env bash
# store_bench_errors_test.sh KVSNAP_STORE_BENCH: kvsnap-store-bench fails with a message naming the
# problem and exit 1, never a crash (an abort, an uncaught exception: exit 134), when
#   - a second bench is given the --dir a running one uses (they would remove and reuse each
#     other's stores midway: the way two benches once crashed);
#   - its --dir cannot be made;
#   - an option it does not know (exit 2; "--level=-10" was once taken for a file name and the run
#     went on at the default level).
set -uo pipefail
bench="$1"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
fails=0
bad() { echo "FAIL $1"; fails=$((fails + 1)); }

"$bench" --dir "$work/shared" --rounds 200 >"$work/a.out" 2>"$work/a.err" &
a=$!
for _ in $(seq 1 600); do [ -e "$work/shared/kvsnap-store-bench.lock" ] && break; sleep 0.05; done
[ -e "$work/shared/kvsnap-store-bench.lock" ] || bad "the first bench did not lock its --dir"
"$bench" --dir "$work/shared" --rounds 1 >"$work/b.out" 2>"$work/b.err"
rc=$?
[ $rc -eq 1 ] || bad "a second bench on the same --dir exited $rc, not 1: $(tail -n 3 "$work/b.err")"
grep -q "another kvsnap-store-bench is using this directory" "$work/b.err" ||
  bad "the second bench did not say why: $(cat "$work/b.err")"
kill "$a" 2>/dev/null
wait "$a" 2>/dev/null

"$bench" --dir /proc/kvsnap-store-bench-test --rounds 1 >"$work/c.out" 2>"$work/c.err"
rc=$?
[ $rc -eq 1 ] || bad "an impossible --dir exited $rc, not 1: $(tail -n 3 "$work/c.err")"
grep -q "kvsnap-store-bench: create /proc/kvsnap-store-bench-test" "$work/c.err" ||
  bad "an impossible --dir was not named: $(cat "$work/c.err")"

"$bench" --dir "$work/unknown" --level=-10 >"$work/d.out" 2>"$work/d.err"
rc=$?
[ $rc -eq 2 ] || bad "an unknown option exited $rc, not 2: $(tail -n 3 "$work/d.err")"
grep -q "unknown option --level=-10" "$work/d.err" || bad "the unknown option was not named: $(cat "$work/d.err")"
[ ! -s "$work/d.out" ] || bad "the bench ran with an unknown option: $(head -n 3 "$work/d.out")"

echo "$fails failed"
exit $((fails > 0))
