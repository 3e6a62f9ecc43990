#!/usr/bin/env bash
# kvsnap convert on every memory layout and llama.cpp release the fixtures hold, checked inside
# real llama.cpp v0.5.0: the converted file must restore, and its next-token KL against the f16
# reference must stay within 1.5x the KL of the natively computed target cache (or 1e-5).
# Also a negative control: treating a rotated q8_0 cache as unrotated must be caught (KL far above
# the bound), so this test can fail.
#   convert_layouts_test.sh KVSNAP DRIVER_3_22_1 FIXTURES_DIR WORK_DIR
set -euo pipefail
kvsnap="$1" drv="$2" fx="$3" work="$4"
mkdir -p "$work"
export KVSNAP_ORACLE_CPU="${KVSNAP_ORACLE_CPU-x64}"
P="$fx/prompt.txt"
fail=0 pass=0

kl() { "$drv" compare "$1" "$2" | sed -n 's/.* kl \([^ ]*\) .*/\1/p'; }
# within KL BOUND_KL: KL <= 1.5 * BOUND_KL or KL <= 1e-5; a KL that could not be computed (empty)
# is never within
within() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "" && b != "" && (a <= 1.5 * b || a <= 1e-5)) }'; }

# check NAME SRC MODEL CTK CTV FA REF_LOGITS NATIVE_LOGITS [convert args...]
check() {
  local name="$1" src="$2" model="$3" ctk="$4" ctv="$5" fa="$6" ref="$7" native="$8"; shift 8
  local out="$work/$name.slot" got="$work/$name.logits"
  if ! "$kvsnap" convert --force "$src" "$out" --ctk "$ctk" --ctv "$ctv" --flash-attn "$fa" --model "$fx/models/tiny-$model.gguf" "$@" >/dev/null; then
    echo "FAIL $name: kvsnap convert failed"; fail=$((fail + 1)); return
  fi
  if ! "$drv" restore --model "$fx/models/tiny-$model.gguf" --prompt-file "$P" --ctk "$ctk" --ctv "$ctv" --fa "$fa" \
       --slot "$out" --logits "$got" >/dev/null 2>"$work/$name.err"; then
    echo "FAIL $name: llama.cpp refused the converted file: $(tail -1 "$work/$name.err")"; fail=$((fail + 1)); return
  fi
  local k n; k=$(kl "$ref" "$got"); n=$(kl "$ref" "$native")
  if within "$k" "$n"; then
    printf 'ok   %-44s KL %-12s native %s\n' "$name" "$k" "$n"; pass=$((pass + 1))
  else
    printf 'FAIL %-44s KL %-12s native %s (bound 1.5x)\n' "$name" "$k" "$n"; fail=$((fail + 1))
  fi
}

# native MODEL CTK CTV FA -> path of logits computed natively with those types (for models whose
# fixtures do not include that configuration)
native() {
  local f="$work/native-$1-$2-$3-fa$4.logits"
  [ -f "$f" ] || "$drv" save --model "$fx/models/tiny-$1.gguf" --prompt-file "$P" --ctk "$2" --ctv "$3" --fa "$4" \
    --logits "$f" >/dev/null 2>&1
  printf '%s\n' "$f"
}

V=$fx/v0.5.0
check iswa-f16-to-q8_0      $V/iswa-f16-f16-faon.slot   iswa   q8_0 q8_0 on  $V/iswa-f16-f16-faon.logits   $V/iswa-q8_0-q8_0-faon.logits
check iswa-q8_0-to-f16      $V/iswa-q8_0-q8_0-faon.slot iswa   f16  f16  on  $V/iswa-f16-f16-faon.logits   $V/iswa-q8_0-q8_0-faon.logits
check hd64-f16-to-faoff     $V/hd64-f16-f16-faon.slot   hd64   f16  f16  off $V/hd64-f16-f16-faon.logits   $V/hd64-f16-f16-faoff.logits
check hd64-faoff-to-q8_0    $V/hd64-f16-f16-faoff.slot  hd64   q8_0 q8_0 on  $V/hd64-f16-f16-faon.logits   $V/hd64-q8_0-q8_0-faon.logits
check hd128-q4q8-to-f16off  $V/hd128-q4_0-q8_0-faon.slot hd128 f16  f16  off $V/hd128-f16-f16-faon.logits  $V/hd128-q4_0-q8_0-faon.logits
check hd128-f16-to-q4q8     $V/hd128-f16-f16-faon.slot  hd128  q4_0 q8_0 on  $V/hd128-f16-f16-faon.logits  $V/hd128-q4_0-q8_0-faon.logits
# Older releases, upgraded to the v0.5.0 format while converting (the references are v0.5.0's).
for tag in b8121 b5640; do
  check $tag-hd64-f16-to-q8_0   $fx/$tag/hd64-f16-f16-faon.slot  hd64 q8_0 q8_0 on $V/hd64-f16-f16-faon.logits $V/hd64-q8_0-q8_0-faon.logits
  check $tag-hd64-q8_0-rotate   $fx/$tag/hd64-q8_0-q8_0-faon.slot hd64 q8_0 q8_0 on $V/hd64-f16-f16-faon.logits $V/hd64-q8_0-q8_0-faon.logits --source-build $tag
  check $tag-iswa-f16-to-q8_0   $fx/$tag/iswa-f16-f16-faon.slot  iswa q8_0 q8_0 on $V/iswa-f16-f16-faon.logits $V/iswa-q8_0-q8_0-faon.logits
done
check b8121-hybrid-f16-to-q8_0 $fx/b8121/hybrid-f16-f16-faon.slot hybrid q8_0 q8_0 on $V/hybrid-f16-f16-faon.logits "$(native hybrid q8_0 q8_0 on)"
check hybrid-f16-to-q4_0    $V/hybrid-f16-f16-faon.slot hybrid q4_0 q4_0 on $V/hybrid-f16-f16-faon.logits "$(native hybrid q4_0 q4_0 on)"
check mrope-f16-to-q8_0     $V/mrope-f16-f16-faon.slot  mrope  q8_0 q8_0 on  $V/mrope-f16-f16-faon.logits  "$(native mrope q8_0 q8_0 on)"
check mrope-f16-to-q4_0     $V/mrope-f16-f16-faon.slot  mrope  q4_0 q4_0 on  $V/mrope-f16-f16-faon.logits  "$(native mrope q4_0 q4_0 on)"

# A ggsq v2 file does not say whether its build rotated (b8121 did not, b10361 did). Layer 0's RoPE
# does (docs/rope-witness.md): without the build named, each converts as llama.cpp v0.5.0 wants it.
check b8121-hd64-q8_0-by-rope  $fx/b8121/hd64-q8_0-q8_0-faon.slot  hd64  q8_0 q8_0 on $V/hd64-f16-f16-faon.logits  $V/hd64-q8_0-q8_0-faon.logits
check b10361-hd64-q8_0-by-rope $fx/b10361/hd64-q8_0-q8_0-faon.slot hd64  f16  f16  on $V/hd64-f16-f16-faon.logits  $V/hd64-q8_0-q8_0-faon.logits
check b8390-hd128-q8_0-by-rope $fx/b8390/hd128-q8_0-q8_0-faon.slot hd128 f16  f16  on $V/hd128-f16-f16-faon.logits $V/hd128-q8_0-q8_0-faon.logits
# Without repeated tokens nothing tells: a conversion that depends on it is refused (exit 6),
# never guessed. (The copy's token list holds no token twice; its cells are b8121's.)
python3 - "$fx/b8121/hd64-q8_0-q8_0-faon.slot" "$work/unique-tokens.slot" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack_from("<I", b, 8)[0]
for i in range(n):
    struct.pack_into("<i", b, 12 + 4 * i, i)
open(sys.argv[2], "wb").write(b)
PY
if "$kvsnap" convert --force "$work/unique-tokens.slot" "$work/guess.slot" --ctk q8_0 --ctv q8_0 --model "$fx/models/tiny-hd64.gguf" >/dev/null 2>"$work/guess.err"; then
  echo "FAIL b8121 q8_0 without repeated tokens or --source-build: converted on a guess"; fail=$((fail + 1))
elif [ "$(cat "$work/guess.err" | grep -c -- --source-build)" -eq 0 ]; then
  echo "FAIL b8121 q8_0 without --source-build: the error does not name --source-build: $(cat "$work/guess.err")"; fail=$((fail + 1))
else
  echo "ok   b8121 q8_0 without repeated tokens or --source-build is refused"; pass=$((pass + 1))
fi

# An unrotated (b5640) q8_0 cache declared rotated is refused: its layout is older than any build
# that rotates (exit 5), where it was un-rotated (exit 0, garbage).
rc=0
"$kvsnap" convert --force "$fx/b5640/hd64-q8_0-q8_0-faon.slot" "$work/neg-b5640.slot" --ctk q8_0 --ctv q8_0 --model "$fx/models/tiny-hd64.gguf" --src-rotation on >/dev/null 2>"$work/neg-b5640.err" || rc=$?
if [ "$rc" -eq 5 ] && grep -q "no build that writes it rotates K" "$work/neg-b5640.err" && [ ! -e "$work/neg-b5640.slot" ]; then
  echo "ok   b5640 q8_0 declared rotated is refused (exit 5)"; pass=$((pass + 1))
else
  echo "FAIL b5640 q8_0 declared rotated: exit $rc, not 5 with no output: $(cat "$work/neg-b5640.err")"; fail=$((fail + 1))
fi

# Negative control: a rotated (v0.5.0) q8_0 cache declared unrotated goes to f16 without its
# un-rotation, garbage that the bound catches.
"$kvsnap" convert --force "$fx/v0.5.0/hd64-q8_0-q8_0-faon.slot" "$work/neg.slot" --ctk f16 --ctv f16 --model "$fx/models/tiny-hd64.gguf" --src-rotation off >/dev/null
"$drv" restore --model "$fx/models/tiny-hd64.gguf" --prompt-file "$P" --ctk f16 --ctv f16 --fa on --slot "$work/neg.slot" --logits "$work/neg.logits" >/dev/null 2>&1
neg=$(kl "$V/hd64-f16-f16-faon.logits" "$work/neg.logits"); native=$(kl "$V/hd64-f16-f16-faon.logits" "$V/hd64-q8_0-q8_0-faon.logits")
if [ -z "$neg" ] || [ -z "$native" ]; then
  echo "FAIL negative control: a KL could not be computed (wrong rotation: '$neg', native: '$native')"; fail=$((fail + 1))
elif within "$neg" "$native"; then
  echo "FAIL negative control: wrong rotation gave KL $neg, within the bound of $native: this test cannot tell"; fail=$((fail + 1))
else
  echo "ok   negative control: wrong rotation gives KL $neg (bound 1.5 x $native)"; pass=$((pass + 1))
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
