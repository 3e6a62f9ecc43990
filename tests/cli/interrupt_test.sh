#!/usr/bin/env bash
# interrupt_test.sh KVSNAP FIXTURES: Ctrl-C during every long command leaves nothing half-written,
# and progress shows on a terminal only.
#
# Each command is stopped by a real SIGINT through kvsnap's handler, raised by the process itself
# once N bytes went through its file layer (KVSNAP_TEST_INTERRUPT_AFTER_BYTES, src/cli/progress.h),
# so the stop lands mid-operation every time. After it: the process ended by the signal ($? 128 + N:
# 130 for SIGINT), "interrupted" on stderr, no output file, no temporary anywhere, the store
# unchanged (ls) and whole (verify --all), a migrated directory whose every file is either its
# original bytes or a complete converted file. A signal the process starts with ignored (nohup) is
# left ignored, and Ctrl-C in a script stops the script too, not only its command.
set -uo pipefail
# The terminal's signals as a terminal leaves them, whatever this script was started with: kvsnap
# keeps a signal that came ignored ignored (checked below), and a CI runner in a script's background
# has SIGINT ignored, which bash itself cannot undo: tests/oracle/default_signals.py restarts it
if [ -z "${KVSNAP_INTERRUPT_TEST_SIGNALS:-}" ]; then
  exec env KVSNAP_INTERRUPT_TEST_SIGNALS=default python3 "$(dirname "$0")/../oracle/default_signals.py" bash "$0" "$@"
fi
kvsnap="$1"; fx="$2"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
export KVSNAP_HOME="$work/store"
src="$fx/b10361/hd128-f16-f16-faon.slot" model="$fx/models/tiny-hd128.gguf"
# POSIX spellings (macOS has BSD stat and shasum, not GNU stat -c and sha256sum)
file_size() { wc -c <"$1" | tr -d ' '; }
sha256_of_stdin() { if command -v sha256sum >/dev/null; then sha256sum; else shasum -a 256; fi | cut -d' ' -f1; }
size=$(file_size "$src")
third=$((size / 3))
fails=0
ok() { echo "ok    $1"; }
bad() { echo "FAIL  $1"; fails=$((fails + 1)); }
# stopped NAME RC ERRFILE [SIGNAL]: the command ended as an interrupted one: it said so, then its
# process ended by the signal (SIGNAL, INT by default), which bash reports as 128 + N
stopped() {
  local want=$((128 + $(kill -l "${4:-INT}")))
  if [ "$2" -eq "$want" ] && grep -q "interrupted" "$3"; then ok "$1: \$? $want, $(tail -n1 "$3" | cut -c1-110)"
  else bad "$1: \$? $2 (want $want and 'interrupted'): $(tail -n2 "$3")"; fi
}
no_temps() {  # no_temps NAME DIR...: no kvsnap temporary left in DIRs (the store's tmp/ included)
  local left; left=$(find "${@:2}" \( -name '*kvsnap-tmp*' -o -path '*/store*/tmp/*' \) -type f 2>/dev/null | head -n3)
  if [ -z "$left" ]; then ok "$1: no temporaries left"; else bad "$1: temporaries left: $left"; fi
}
store_whole() {  # store_whole NAME WANT_COUNT
  local n; n=$("$kvsnap" ls --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
  if [ "$n" = "$2" ]; then ok "$1: the store lists $n snapshots, as before"; else bad "$1: the store lists $n snapshots, want $2"; fi
  if "$kvsnap" verify --all >/dev/null 2>&1; then ok "$1: verify --all passes"; else bad "$1: verify --all fails"; fi
}
stop_after() { KVSNAP_TEST_INTERRUPT_AFTER_BYTES="$1" "${@:2}"; }

mkdir -p "$work/out"
# convert
stop_after "$third" "$kvsnap" convert --force "$src" "$work/out/c.slot" --ctk q8_0 --ctv q8_0 --model "$model" \
  >/dev/null 2>"$work/err"; stopped "convert" $? "$work/err"
[ ! -e "$work/out/c.slot" ] && ok "convert: no output file" || bad "convert: the output exists"
no_temps convert "$work/out"
"$kvsnap" convert --force "$src" "$work/out/c.slot" --ctk q8_0 --ctv q8_0 --model "$model" >/dev/null 2>&1 \
  && ok "convert: the same command without the signal succeeds" || bad "convert: fails without the signal"
rm -f "$work/out/c.slot"

# SIGTERM and SIGHUP (the terminal closed, an ssh session lost) stop it the same way: the handler
# takes them too (SIGHUP's default action killed the process, its temporary left for the next run)
for sig in TERM HUP; do
  KVSNAP_TEST_INTERRUPT_SIGNAL=$sig stop_after "$third" "$kvsnap" convert --force "$src" "$work/out/c.slot" --ctk q8_0 --ctv q8_0 \
    --model "$model" >/dev/null 2>"$work/err"; stopped "convert (SIG$sig)" $? "$work/err" $sig
  [ ! -e "$work/out/c.slot" ] && ok "convert (SIG$sig): no output file" || bad "convert (SIG$sig): the output exists"
  no_temps "convert (SIG$sig)" "$work/out"
done

# A signal the process was started with ignored stays ignored: nohup's SIGHUP (a long migrate must
# outlive its terminal), a background job's SIGINT (a script's `kvsnap save ... &`). The same
# signal at the same point then changes nothing: the command finishes, its output whole.
"$kvsnap" convert --force "$src" "$work/out/want.slot" --ctk q8_0 --ctv q8_0 --model "$model" >/dev/null 2>&1
for sig in HUP INT; do
  (trap '' "$sig"; KVSNAP_TEST_INTERRUPT_SIGNAL=$sig stop_after "$third" "$kvsnap" convert --force "$src" "$work/out/c.slot" \
    --ctk q8_0 --ctv q8_0 --model "$model" >/dev/null 2>"$work/err"); rc=$?
  if [ "$rc" -eq 0 ] && cmp -s "$work/out/c.slot" "$work/out/want.slot"; then
    ok "convert with SIG$sig ignored (nohup, a background job): the signal changes nothing, the output is whole"
  else bad "convert with SIG$sig ignored: exit $rc, output $(cmp "$work/out/c.slot" "$work/out/want.slot" 2>&1): $(tail -n2 "$work/err")"; fi
  rm -f "$work/out/c.slot"
done

# Ctrl-C in a script's loop (a terminal's SIGINT reaches the script's shell and the command it waits
# for, KVSNAP_TEST_INTERRUPT_TO_GROUP): the first command stops and so does the script. bash ends a
# script whose foreground command a SIGINT killed, and goes on when the command exits by itself,
# even with 130, taking it for one that handled Ctrl-C (an editor): when kvsnap exited 130 the loop
# went on to convert the next files.
loop=$(cat <<'LOOP'
for i in 1 2 3; do
  if [ "$i" -eq 1 ]; then export KVSNAP_TEST_INTERRUPT_AFTER_BYTES=$4 KVSNAP_TEST_INTERRUPT_TO_GROUP=1
  else unset KVSNAP_TEST_INTERRUPT_AFTER_BYTES KVSNAP_TEST_INTERRUPT_TO_GROUP; fi
  "$1" convert --force "$2" "$3/loop$i.slot" --ctk q8_0 --ctv q8_0 --model "$5" >/dev/null 2>>"$3/loop.err"
done
echo "the loop ran to its end" >>"$3/loop.err"
LOOP
)
# in a process group of its own (as a terminal's foreground job), so that the signal spares this script
python3 -c 'import os, sys; os.setpgid(0, 0); os.execvp("bash", ["bash"] + sys.argv[1:])' \
  -c "$loop" loop "$kvsnap" "$src" "$work/out" "$third" "$model" 2>/dev/null
if ! grep -q "ran to its end" "$work/out/loop.err" && grep -q "interrupted" "$work/out/loop.err" \
  && [ -z "$(ls "$work/out" | grep '^loop[0-9]')" ]; then
  ok "Ctrl-C in a script's loop: the command stops and the script with it (no later file converted)"
else bad "Ctrl-C in a script's loop went on: $(ls "$work/out" | grep '^loop' | tr '\n' ' '), $(tail -n2 "$work/out/loop.err")"; fi
rm -f "$work/out"/loop* "$work/out/want.slot"
no_temps "Ctrl-C in a loop" "$work/out"

# convert of an mlx-lm prompt cache (its own path: format/mlx_*): stopped the same way, nothing left
mlx="$fx/../tests/fuzz/corpus/mlx_prompt_cache/meta_step_q3g128.safetensors"
stop_after 2000 "$kvsnap" convert --force "$mlx" "$work/out/m.safetensors" --kv-bits 4 >/dev/null 2>"$work/err"
stopped "convert (mlx-lm)" $? "$work/err"
[ ! -e "$work/out/m.safetensors" ] && ok "convert (mlx-lm): no output file" || bad "convert (mlx-lm): the output exists"
no_temps "convert (mlx-lm)" "$work/out"
KVSNAP_PROGRESS_DELAY_MS=0 "$kvsnap" convert --force "$mlx" "$work/out/m.safetensors" --kv-bits 4 --json >/dev/null 2>"$work/err"
if python3 -c 'import json,sys; ev=[json.loads(l)["progress"] for l in open(sys.argv[1]) if l.startswith("{\"progress\"")]; assert ev and ev[-1]["finished"] and ev[-1]["done_bytes"] == ev[-1]["total_bytes"], ev' "$work/err"; then
  ok "convert (mlx-lm): --json progress events, the last one finished"
else bad "convert (mlx-lm): --json progress events wrong: $(head -c 300 "$work/err")"; fi
rm -f "$work/out/m.safetensors"

# save (the store is new: an interrupted first save leaves an empty store)
"$kvsnap" save "$fx/v0.5.0/hd64-f16-f16-faon.slot" --name base >/dev/null || bad "save: setup"
stop_after "$third" "$kvsnap" save "$src" --name big --model "$model" >/dev/null 2>"$work/err"; stopped "save" $? "$work/err"
store_whole save 1
no_temps save "$KVSNAP_HOME"
"$kvsnap" save "$src" --name big --model "$model" >/dev/null 2>&1 && ok "save: succeeds without the signal" || bad "save: fails without the signal"

# restore (to a file, converting)
stop_after "$third" "$kvsnap" restore big -o "$work/out/r.slot" --ctk q8_0 --ctv q8_0 >/dev/null 2>"$work/err"
stopped "restore" $? "$work/err"
[ ! -e "$work/out/r.slot" ] && ok "restore: no output file" || bad "restore: the output exists"
no_temps restore "$work/out" "$KVSNAP_HOME"

# verify: stopped is not damaged (ended by the signal, not exit 3)
stop_after "$third" "$kvsnap" verify --all >/dev/null 2>"$work/err"; stopped "verify" $? "$work/err"

# export
stop_after "$third" "$kvsnap" export big base -o "$work/out/e.tar.zst" >/dev/null 2>"$work/err"; stopped "export" $? "$work/err"
[ ! -e "$work/out/e.tar.zst" ] && ok "export: no archive" || bad "export: the archive exists"
no_temps export "$work/out" "$KVSNAP_HOME"

# import into a second store
"$kvsnap" export big base -o "$work/e.tar.zst" >/dev/null 2>&1 || bad "import: setup export"
KVSNAP_HOME="$work/store2" "$kvsnap" save "$fx/v0.5.0/hd64-f16-f16-faoff.slot" --name other >/dev/null 2>&1
KVSNAP_HOME="$work/store2" stop_after "$(( $(file_size "$work/e.tar.zst") / 2 ))" "$kvsnap" import "$work/e.tar.zst" \
  >/dev/null 2>"$work/err"; stopped "import" $? "$work/err"
KVSNAP_HOME="$work/store2" store_whole import 1
no_temps import "$work/store2"

# gc: garbage as crashed saves leave it (packs no catalog row names, temporaries). gc deletes no byte
# through its file layer, so the stop counts the bytes it freed: it lands after the second of five deletions.
garbage() {  # garbage: four unused copies of the store's pack and a temporary
  local pack; pack=$(ls "$KVSNAP_HOME"/packs/*.pack | head -n1)
  for i in 1 2 3 4; do cp "$pack" "$KVSNAP_HOME/packs/00000000000000a$i.pack"; done
  head -c 100000 /dev/zero >"$KVSNAP_HOME/tmp/crashed-save"
  echo $(( $(file_size "$pack") ))
}
n_packs() { ls "$KVSNAP_HOME"/packs/*.pack | wc -l; }
packs_before=$(n_packs)
psize=$(garbage)
stop_after $((psize + psize / 2)) "$kvsnap" gc >/dev/null 2>"$work/err"; stopped "gc" $? "$work/err"
store_whole gc 2
left=$(( $(n_packs) - packs_before ))
[ "$left" -eq 2 ] && ok "gc: stopped after two deletions, two unused packs left for the next gc" \
  || bad "gc: $left unused packs left after the stop (want 2: it stops between deletions)"
"$kvsnap" gc --json >"$work/gc.json" 2>/dev/null && ok "gc: the next gc succeeds" || bad "gc: the next gc fails"
if python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["packs_deleted"] == 2 and j["temporaries_deleted"] == 1, j' "$work/gc.json" \
  && [ "$(n_packs)" -eq "$packs_before" ]; then ok "gc: the next gc deletes the rest (packs_deleted 2, temporaries_deleted 1)"
else bad "gc: the next gc: $(cat "$work/gc.json"), $(n_packs) packs (want $packs_before)"; fi

# migrate: every file either untouched or converted
mkdir -p "$work/slots"
for i in 1 2 3 4; do cp "$src" "$work/slots/s$i.bin"; done
orig=$(sha256_of_stdin <"$src")
# migrate reads every file's header first (a dry run reads those and a little more: its bytes read bound
# them), then a file costs its size in reads plus about half in writes: the stop lands in the second file
KVSNAP_PROGRESS_DELAY_MS=0 "$kvsnap" migrate "$work/slots" --ctk q8_0 --ctv q8_0 --model "$model" --dry-run --json >/dev/null 2>"$work/err"
examined=$(python3 -c 'import json,sys; print([json.loads(l)["progress"] for l in open(sys.argv[1])][-1]["done_bytes"])' "$work/err")
stop_after $((examined + size * 2)) "$kvsnap" migrate "$work/slots" --ctk q8_0 --ctv q8_0 --model "$model" \
  --json >"$work/migrate.json" 2>"$work/err"; stopped "migrate" $? "$work/err"
n_conv=0 n_orig=0
for f in "$work/slots"/s*.bin; do
  if [ "$(sha256_of_stdin <"$f")" = "$orig" ]; then n_orig=$((n_orig + 1))
  elif "$kvsnap" info "$f" --model "$model" --json >"$work/info" 2>&1 && grep -q '"q8_0"' "$work/info"; then n_conv=$((n_conv + 1))
  else bad "migrate: $f is neither the original nor a q8_0 file"; fi
done
[ $((n_conv + n_orig)) -eq 4 ] && [ $n_orig -ge 1 ] && [ $n_conv -ge 1 ] && ok "migrate: $n_conv converted, $n_orig untouched" \
  || bad "migrate: $n_conv converted, $n_orig untouched (want all 4 accounted for, the stop between the first and the last)"
# what the stopped run says it did (--json): the files it converted, and that it was interrupted
said=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["interrupted"], j["converted"])' "$work/migrate.json" 2>&1)
[ "$said" = "True $n_conv" ] && ok "migrate --json after the signal: interrupted, $n_conv converted" \
  || bad "migrate --json after the signal says '$said', want 'True $n_conv'"
no_temps migrate "$work/slots"
# SIGHUP in the middle of the rerun: stopped as Ctrl-C stops it, no temporary left
KVSNAP_TEST_INTERRUPT_SIGNAL=HUP stop_after $((examined + size)) "$kvsnap" migrate "$work/slots" --ctk q8_0 --ctv q8_0 \
  --model "$model" >/dev/null 2>"$work/err"; stopped "migrate (SIGHUP)" $? "$work/err" HUP
no_temps "migrate (SIGHUP)" "$work/slots"
"$kvsnap" migrate "$work/slots" --ctk q8_0 --ctv q8_0 --model "$model" >/dev/null 2>&1 \
  && ok "migrate: the same command finishes the directory" || bad "migrate: the rerun fails"

# progress: on a terminal (a pty from script(1)) it is drawn and cleared; not on a pipe; JSON with --json
export KVSNAP_PROGRESS_DELAY_MS=0
script -qec "$kvsnap convert --force $src $work/out/p.slot --ctk q4_0 --ctv q4_0 --model $model" /dev/null >"$work/tty" 2>&1
if grep -q "kvsnap convert $src: " "$work/tty" && grep -q $'\r\033\\[K' "$work/tty"; then ok "progress: drawn on a terminal, cleared after"
else bad "progress: nothing drawn on a terminal: $(head -c 300 "$work/tty" | od -c | head -n4)"; fi
rm -f "$work/out/p.slot"
"$kvsnap" convert --force "$src" "$work/out/p.slot" --ctk q4_0 --ctv q4_0 --model "$model" >/dev/null 2>"$work/err"
[ ! -s "$work/err" ] && ok "progress: nothing on stderr when it is not a terminal" || bad "progress: stderr not empty: $(head -c 200 "$work/err")"
rm -f "$work/out/p.slot"
script -qec "$kvsnap convert --force $src $work/out/p.slot --ctk q4_0 --ctv q4_0 --model $model --quiet" /dev/null >"$work/tty" 2>&1
! grep -q "kvsnap convert $src: " "$work/tty" && ok "progress: --quiet draws nothing on a terminal" || bad "progress: --quiet drew"
rm -f "$work/out/p.slot"
"$kvsnap" convert --force "$src" "$work/out/p.slot" --ctk q4_0 --ctv q4_0 --model "$model" --json >/dev/null 2>"$work/err"
if python3 -c 'import json,sys; ev=[json.loads(l)["progress"] for l in open(sys.argv[1])]; assert ev and ev[-1]["finished"] and 0 < ev[-1]["done_bytes"] <= ev[-1]["total_bytes"], ev' "$work/err"; then
  ok "progress: --json gives JSON lines on stderr, the last one finished"
else bad "progress: --json events wrong: $(head -c 300 "$work/err")"; fi

# migrate's progress: files done of the total beside the bytes read of the directory's files
mig() { rm -rf "$work/mslots"; mkdir -p "$work/mslots"; for i in 1 2 3; do cp "$src" "$work/mslots/s$i.bin"; done; }
mig
script -qec "$kvsnap migrate $work/mslots --ctk q4_0 --ctv q4_0 --model $model" /dev/null >"$work/tty" 2>&1
# (these files take milliseconds: the one line drawn comes before the first file ends, so the [done/total]
# count is checked in the JSON events below)
if grep -q "kvsnap migrate $work/mslots: " "$work/tty" && grep -q $'\r\033\\[K' "$work/tty"; then
  ok "migrate progress: drawn on a terminal, cleared after"
else bad "migrate progress: not drawn on a terminal: $(head -c 300 "$work/tty" | od -c | head -n4)"; fi
mig
"$kvsnap" migrate "$work/mslots" --ctk q4_0 --ctv q4_0 --model "$model" >/dev/null 2>"$work/err"
[ ! -s "$work/err" ] && ok "migrate progress: nothing on stderr when it is not a terminal" || bad "migrate progress: stderr not empty: $(head -c 200 "$work/err")"
mig
script -qec "$kvsnap migrate $work/mslots --ctk q4_0 --ctv q4_0 --model $model --quiet" /dev/null >"$work/tty" 2>&1
! grep -q "kvsnap migrate " "$work/tty" && ok "migrate progress: --quiet draws nothing on a terminal" || bad "migrate progress: --quiet drew"
mig
# Beside the three slots: a file that is not a state and one already at the target, which the progress
# must not count (files or bytes).
head -c 1000000 /dev/urandom >"$work/mslots/notes.txt"
"$kvsnap" convert --force "$src" "$work/mslots/t0.bin" --ctk q4_0 --ctv q4_0 --model "$model" >/dev/null
"$kvsnap" migrate "$work/mslots" --ctk q4_0 --ctv q4_0 --model "$model" --json >/dev/null 2>"$work/err"
if python3 -c '
import json, sys
ev = [json.loads(l)["progress"] for l in open(sys.argv[1])]
last = ev[-1]
assert last["finished"] and last["files_done"] == last["files_total"] == 3, ev
assert last["total_bytes"] == 3 * int(sys.argv[2]) and last["done_bytes"] >= 3 * int(sys.argv[2]) * 0.9, ev' "$work/err" "$size"; then
  ok "migrate progress: --json gives JSON lines, the last one finished with 3/3 files and the bytes of the files converted (a non-state file and one at the target not counted)"
else bad "migrate progress: --json events wrong: $(head -c 400 "$work/err")"; fi

# export --json: the result and the progress events for scripts
rm -f "$work/out/j.tar.zst"
"$kvsnap" export big base -o "$work/out/j.tar.zst" --json >"$work/export.json" 2>"$work/err"
if python3 -c '
import json, sys
ev = [json.loads(l)["progress"] for l in open(sys.argv[1])]
assert ev and ev[-1]["op"] == "export" and ev[-1]["finished"] and ev[-1]["done_bytes"] > 0, ev
j = json.load(open(sys.argv[2]))
assert j["exported"] == 2 and j["bytes"] > 0, j' "$work/err" "$work/export.json"; then
  ok "export progress: --json gives the result on stdout and JSON lines on stderr, the last one finished"
else bad "export --json: $(head -c 300 "$work/export.json") / $(head -c 300 "$work/err")"; fi

# The totals say what the commands read: an export its snapshots' blobs twice (sizes, then the
# copy: 2 x their stored bytes); an import no total (it reads the archive, then each snapshot for
# the checks and again to store it: more than the archive, which a total from its size hid as 100%).
stored=$("$kvsnap" ls --json | python3 -c 'import json,sys; print(sum(s["stored_bytes"] for s in json.load(sys.stdin) if s["name"] in ("big", "base")))')
rm -rf "$work/store3"
KVSNAP_HOME="$work/store3" "$kvsnap" import "$work/out/j.tar.zst" --json >/dev/null 2>"$work/err.import"
if python3 -c '
import json, os, sys
ev = [json.loads(l)["progress"] for l in open(sys.argv[1])]
assert ev[-1]["total_bytes"] == 2 * int(sys.argv[3]), (ev[-1], sys.argv[3])
im = [json.loads(l)["progress"] for l in open(sys.argv[2])]
assert im and im[-1]["finished"] and all("total_bytes" not in e for e in im), im
assert im[-1]["done_bytes"] > os.path.getsize(sys.argv[4]), (im[-1], os.path.getsize(sys.argv[4]))' \
    "$work/err" "$work/err.import" "$stored" "$work/out/j.tar.zst"; then
  ok "export and import progress: the export total is what it reads, the import has none and reads more than the archive"
else bad "export/import totals: $(tail -c 300 "$work/err") / $(tail -c 300 "$work/err.import")"; fi

# gc's progress counts the bytes of garbage it deletes
garbage >/dev/null
script -qec "$kvsnap gc" /dev/null >"$work/tty" 2>&1
if grep -q "kvsnap gc: " "$work/tty" && grep -q $'\r\033\\[K' "$work/tty" && grep -q "unused packs" "$work/tty"; then
  ok "gc progress: drawn on a terminal, cleared after"
else bad "gc progress: not drawn on a terminal: $(head -c 300 "$work/tty" | od -c | head -n4)"; fi
garbage >/dev/null
"$kvsnap" gc >/dev/null 2>"$work/err"
[ ! -s "$work/err" ] && ok "gc progress: nothing on stderr when it is not a terminal" || bad "gc progress: stderr not empty: $(head -c 200 "$work/err")"
garbage >/dev/null
script -qec "$kvsnap gc --quiet" /dev/null >"$work/tty" 2>&1
! grep -q "kvsnap gc: " "$work/tty" && ok "gc progress: --quiet draws nothing on a terminal" || bad "gc progress: --quiet drew"
garbage >/dev/null
"$kvsnap" gc --json >"$work/gc.json" 2>"$work/err"
if python3 -c '
import json, sys
ev = [json.loads(l)["progress"] for l in open(sys.argv[1])]
assert ev and ev[-1]["op"] == "gc" and ev[-1]["finished"] and ev[-1]["done_bytes"] == ev[-1]["total_bytes"] > 4 * int(sys.argv[3]), ev
assert json.load(open(sys.argv[2]))["packs_deleted"] == 4' "$work/err" "$work/gc.json" "$psize"; then
  ok "gc progress: --json gives JSON lines on stderr, the last one finished with every garbage byte"
else bad "gc progress: --json events wrong: $(head -c 300 "$work/err") / $(head -c 300 "$work/gc.json")"; fi

# A failed operation's last progress event says it did not finish: a restore meets damaged packs
# (last: the store is damaged for good).
for pack in "$KVSNAP_HOME"/packs/*.pack; do
  python3 -c '
import sys
b = bytearray(open(sys.argv[1], "rb").read())
for i in range(0, len(b), 512): b[i] ^= 0xFF
open(sys.argv[1], "wb").write(b)' "$pack"
done
rm -f "$work/out/dmg.slot"
"$kvsnap" restore big -o "$work/out/dmg.slot" --json >/dev/null 2>"$work/err"; rc=$?
if [ "$rc" -eq 3 ] && [ ! -e "$work/out/dmg.slot" ] && python3 -c '
import json, sys
ev = [json.loads(l)["progress"] for l in open(sys.argv[1]) if l.startswith("{\"progress\"")]
assert ev and ev[-1]["op"] == "restore big" and ev[-1]["finished"] is False, ev' "$work/err"; then
  ok "progress: a failed restore's last JSON event says finished: false"
else bad "progress: a failed restore (exit $rc): $(head -c 400 "$work/err")"; fi

echo "$fails failed"
exit $((fails > 0))
