#!/usr/bin/env bash
# bed_test.sh: checks of the real-llama.cpp test bed (ctest label "oracle").
#
#   bed_test.sh (--model M.gguf | --mkmodel KVSNAP_MKMODEL) --prompt P --work DIR
#               --driver NPM_VERSION=PATH [--driver ...] [--fixtures DIR]
#
# For every driver: the files it writes have the magic/version (and n_stream field) of its
# llama.cpp; f16 slot/session/raw-seq states (and a q8_0 slot) restored with the same cache types
# give the saved logits back (KL ~ 0, same top-1); an f16 slot does not load into a q8_0 context,
# nor an fa-off (transposed V) slot into an fa-on context; --eval-tail 4 (state without the last
# 4 tokens, 4 logits rows) restores to the same 4 rows. With several drivers: a slot file of one
# state version does not load into a llama.cpp of another.
# --fixtures DIR (the committed fixtures/): every DIR/<tag>/*.{slot,session,raw}[.pending] whose driver and
# model (DIR/models/tiny-hdNN.gguf) are present restores with KL ~ 0 against its .logits.
set -uo pipefail

model="" mkmodel="" prompt="" work="" fixtures=""
drivers=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --mkmodel) mkmodel="$2"; shift 2 ;;
    --prompt) prompt="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --driver) drivers+=("$2"); shift 2 ;;
    --fixtures) fixtures="$2"; shift 2 ;;
    *) echo "bed_test: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$prompt" ] && [ -n "$work" ] && [ ${#drivers[@]} -gt 0 ] || { echo "bed_test: missing arguments" >&2; exit 2; }
[ -f "$prompt" ] || { echo "bed_test: no prompt file $prompt" >&2; exit 2; }

rm -rf "$work"
mkdir -p "$work"

if [ -z "$model" ]; then
  [ -n "$mkmodel" ] || { echo "bed_test: give --model or --mkmodel" >&2; exit 2; }
  model="$work/tiny-hd64.gguf"
  "$mkmodel" --out "$model" --arch llama --n-layer 4 --n-embd 256 --n-head 4 --n-head-kv 2 --head-dim 64 --seed 1 \
    || { echo "bed_test: kvsnap-mkmodel failed" >&2; exit 1; }
fi
[ -f "$model" ] || { echo "bed_test: no model $model" >&2; exit 2; }

fails=0
pass() { printf 'ok    %s\n' "$*"; }
fail() { printf 'FAIL  %s\n' "$*"; fails=$((fails + 1)); }
u32at() { od -An -tu4 -j "$2" -N 4 "$1" | tr -d ' \n'; }
hex32at() { od -An -tx4 -j "$2" -N 4 "$1" | tr -d ' \n'; }

# expect_ok NAME CMD...
expect_ok() {
  local name="$1"; shift
  local out
  if out="$("$@" 2>&1)"; then pass "$name"; return 0; fi
  fail "$name: $out"
  return 1
}
# expect_fail NAME CMD...: must exit 3 (load refused), not crash nor succeed
expect_refused() {
  local name="$1"; shift
  local out rc
  out="$("$@" 2>&1)"; rc=$?
  if [ $rc -eq 3 ]; then pass "$name (${out##*restore failed: })"; else fail "$name: exit $rc: $out"; fi
}

declare -A slot_of
for d in "${drivers[@]}"; do
  v="${d%%=*}" drv="${d#*=}"
  w="$work/$v"
  mkdir -p "$w"
  echo "== $v ($drv)"
  [ -x "$drv" ] || { fail "$v: driver $drv missing"; continue; }
  case "$v" in
    # raw_pre: v0.5.0's llama_state_seq_get_data puts u32 0xaf143cd8 + i32 seq_id before the memory section
    # (b9842 and later: the io magic prefix came before the v3/v10 bump, docs/oracle.md)
    3.22.1|3.21.1) want_sq=3 want_sn=10 want_stream=1 raw_pre=8 ;;
    3.20.0|3.19.0) want_sq=2 want_sn=9 want_stream=1 raw_pre=8 ;;
    3.18.1|3.17.1) want_sq=2 want_sn=9 want_stream=1 raw_pre=0 ;;
    3.16.2) want_sq=2 want_sn=9 want_stream=1 raw_pre=0 ;;
    3.10.0) want_sq=2 want_sn=9 want_stream=0 raw_pre=0 ;;
    *) want_sq="$("$drv" info | sed -n 's/^state_seq_version //p')"
       want_sn="$("$drv" info | sed -n 's/^session_version //p')"
       want_stream="" raw_pre="" ;;
  esac
  common=(--model "$model" --prompt-file "$prompt")
  f16=(--ctk f16 --ctv f16 --fa on)

  expect_ok "$v save f16/f16 fa on (slot, session, raw-seq)" \
    "$drv" save "${common[@]}" "${f16[@]}" --slot "$w/f16.slot" --session "$w/f16.session" \
    --raw-seq "$w/f16.raw" --logits "$w/f16.logits" --tokens-out "$w/tokens.bin" || continue
  n=$(( $(stat -c %s "$w/tokens.bin") / 4 ))
  slot_of[$v]="$w/f16.slot"

  # headers
  m="$(hex32at "$w/f16.slot" 0)" ver="$(u32at "$w/f16.slot" 4)" nt="$(u32at "$w/f16.slot" 8)"
  if [ "$m" = 67677371 ] && [ "$ver" = "$want_sq" ] && [ "$nt" = $((n - 1)) ]; then
    pass "$v slot header ggsq v$ver, $nt tokens"
  else
    fail "$v slot header: magic $m version $ver n_token $nt (want 67677371 v$want_sq $((n - 1)))"
  fi
  m="$(hex32at "$w/f16.session" 0)" ver="$(u32at "$w/f16.session" 4)"
  if [ "$m" = 6767736e ] && [ "$ver" = "$want_sn" ]; then
    pass "$v session header ggsn v$ver"
  else
    fail "$v session header: magic $m version $ver (want 6767736e v$want_sn)"
  fi
  # memory section: [u32 n_stream] u32 cell_count
  off=$((12 + 4 * (n - 1)))
  a="$(u32at "$w/f16.slot" $off)" b="$(u32at "$w/f16.slot" $((off + 4)))"
  r0="$(u32at "$w/f16.raw" "${raw_pre:-0}")"
  if [ "$raw_pre" = 8 ]; then
    rm="$(hex32at "$w/f16.raw" 0)" rs="$(u32at "$w/f16.raw" 4)"
    if [ "$rm" = af143cd8 ] && [ "$rs" = 0 ]; then pass "$v raw-seq buffer starts with io magic af143cd8, seq_id 0"
    else fail "$v raw-seq prefix: $rm $rs (want af143cd8 0)"; fi
  fi
  slot_mem=$(( $(stat -c %s "$w/f16.slot") - off ))
  raw_mem=$(( $(stat -c %s "$w/f16.raw") - ${raw_pre:-0} ))
  if [ -z "$raw_pre" ] || [ "$slot_mem" = "$raw_mem" ]; then pass "$v raw-seq = slot memory section ($raw_mem bytes) after a ${raw_pre:-?}-byte prefix"
  else fail "$v raw-seq memory section $raw_mem bytes, slot's $slot_mem"; fi
  if [ "$want_stream" = 1 ]; then
    if [ "$a" = 1 ] && [ "$b" = $((n - 1)) ] && [ "$r0" = 1 ]; then pass "$v memory section has n_stream 1, $b cells"
    else fail "$v memory section: n_stream $a cell_count $b raw[0] $r0 (want 1, $((n - 1)), 1)"; fi
  elif [ "$want_stream" = 0 ]; then
    if [ "$a" = $((n - 1)) ] && [ "$r0" = $((n - 1)) ]; then pass "$v memory section has no n_stream, $a cells"
    else fail "$v memory section: first u32 $a raw[0] $r0 (want cell_count $((n - 1)))"; fi
  fi

  # round trips with the same types
  for kind in slot session raw-seq; do
    ext="${kind%-seq}"
    if expect_ok "$v restore f16 $kind" "$drv" restore "${common[@]}" "${f16[@]}" --"$kind" "$w/f16.$ext" \
         --logits "$w/r-$ext.logits"; then
      expect_ok "$v f16 $kind logits KL ~ 0" "$drv" compare "$w/f16.logits" "$w/r-$ext.logits" --max-kl 1e-6 --require-top1
    fi
  done
  q8=(--ctk q8_0 --ctv q8_0 --fa on)
  if expect_ok "$v save q8_0/q8_0 fa on" "$drv" save "${common[@]}" "${q8[@]}" --slot "$w/q8.slot" --logits "$w/q8.logits" &&
     expect_ok "$v restore q8_0 slot" "$drv" restore "${common[@]}" "${q8[@]}" --slot "$w/q8.slot" --logits "$w/r-q8.logits"; then
    expect_ok "$v q8_0 slot logits KL ~ 0" "$drv" compare "$w/q8.logits" "$w/r-q8.logits" --max-kl 1e-6 --require-top1
  fi

  # --eval-tail K: the state holds t[0..n-K-1]; K rows of logits, all given back by a restore
  tk=4
  if expect_ok "$v save --eval-tail $tk (q8_0/q8_0 slot, session)" "$drv" save "${common[@]}" "${q8[@]}" --eval-tail $tk \
       --slot "$w/tail.slot" --session "$w/tail.session" --logits "$w/tail.logits"; then
    nt="$(u32at "$w/tail.slot" 8)" sz=$(stat -c %s "$w/tail.logits") sz1=$(stat -c %s "$w/q8.logits" 2>/dev/null || echo 0)
    if [ "$nt" = $((n - tk)) ] && [ "$sz" = $((tk * sz1)) ]; then pass "$v --eval-tail $tk: slot holds $nt tokens, $tk logits rows"
    else fail "$v --eval-tail $tk: slot n_token $nt (want $((n - tk))), logits $sz bytes (want $tk x $sz1)"; fi
    for kind in slot session; do
      if expect_ok "$v restore --eval-tail $tk $kind" "$drv" restore "${common[@]}" "${q8[@]}" --eval-tail $tk \
           --"$kind" "$w/tail.$kind" --logits "$w/r-tail.logits"; then
        expect_ok "$v --eval-tail $tk $kind logits KL ~ 0 on all rows" \
          "$drv" compare "$w/tail.logits" "$w/r-tail.logits" --rows $tk --max-kl 1e-6 --require-top1
      fi
    done
  fi

  # refusals
  expect_refused "$v f16 slot into q8_0 context is refused" \
    "$drv" restore "${common[@]}" "${q8[@]}" --slot "$w/f16.slot" --logits "$w/x.logits"
  if expect_ok "$v save f16/f16 fa off" "$drv" save "${common[@]}" --ctk f16 --ctv f16 --fa off --slot "$w/f16-nofa.slot"; then
    expect_refused "$v fa-off slot into fa-on context is refused" \
      "$drv" restore "${common[@]}" "${f16[@]}" --slot "$w/f16-nofa.slot" --logits "$w/x.logits"
  fi
done

# cross-version: a state file of another version is refused
if [ ${#slot_of[@]} -gt 1 ]; then
  echo "== cross-version"
  for d in "${drivers[@]}"; do
    v="${d%%=*}" drv="${d#*=}"
    for u in "${!slot_of[@]}"; do
      [ "$u" = "$v" ] && continue
      sv="$(u32at "${slot_of[$u]}" 4)" mine="$(u32at "${slot_of[$v]:-/dev/null}" 4 2>/dev/null)"
      [ -n "$mine" ] && [ "$sv" != "$mine" ] || continue
      expect_refused "$v refuses the ggsq v$sv slot of $u" \
        "$drv" restore --model "$model" --prompt-file "$prompt" --ctk f16 --ctv f16 --fa on \
        --slot "${slot_of[$u]}" --logits "$work/x.logits"
    done
  done
fi

# committed fixtures still agree with the bed
if [ -n "$fixtures" ] && [ -d "$fixtures" ]; then
  for d in "${drivers[@]}"; do
    v="${d%%=*}" drv="${d#*=}"
    tag="$("$drv" info 2>/dev/null | sed -n 's/^tag //p')"
    fdir="$fixtures/$tag"
    [ -n "$tag" ] && [ -d "$fdir" ] || continue
    echo "== fixtures/$tag"
    # NAME.pending: a file kvsnap cannot read yet (fixtures/README.md); llama.cpp reads it all the same
    for f in "$fdir"/*.slot "$fdir"/*.session "$fdir"/*.raw "$fdir"/*.pending; do
      [ -f "$f" ] || continue
      b="$(basename "${f%.pending}")" stem="${b%.*}" ext="${b##*.}"
      IFS=- read -r mname ctk ctv fa <<<"$stem"
      fmodel="$fixtures/models/tiny-$mname.gguf"
      if [ ! -f "$fmodel" ] && [ -n "$mkmodel" ]; then
        # not committed (too big): remake it as MANIFEST.json says and check its sha256
        fmodel="$work/fixture-tiny-$mname.gguf"
        if [ ! -f "$fmodel" ]; then
          line="$(grep -F "\"file\": \"models/tiny-$mname.gguf\"" "$fdir/MANIFEST.json" | head -n1)"
          margs="$(sed -n 's/.*"made_by": "kvsnap-mkmodel \([^"]*\)".*/\1/p' <<<"$line")"
          msha="$(sed -n 's/.*"sha256": "\([0-9a-f]*\)".*/\1/p' <<<"$line")"
          # shellcheck disable=SC2086
          if [ -n "$margs" ] && "$mkmodel" --out "$fmodel" $margs >/dev/null 2>&1; then
            got="$(sha256sum "$fmodel" | cut -d' ' -f1)"
            if [ "$got" = "$msha" ]; then pass "kvsnap-mkmodel $margs reproduces models/tiny-$mname.gguf"
            else fail "kvsnap-mkmodel $margs: sha256 $got, MANIFEST says $msha"; fi
          else
            rm -f "$fmodel"
          fi
        fi
      fi
      if [ ! -f "$fmodel" ]; then echo "skip  $tag/$b (no model tiny-$mname.gguf; run fixtures/regen.sh)"; continue; fi
      case "$ext" in slot) kind=slot ;; session) kind=session ;; raw) kind=raw-seq ;; esac
      if expect_ok "$tag/$b restores" "$drv" restore --model "$fmodel" --prompt-file "$fdir/prompt.txt" \
           --ctk "$ctk" --ctv "$ctv" --fa "${fa#fa}" --"$kind" "$f" --logits "$work/fx.logits"; then
        expect_ok "$tag/$b logits KL ~ 0" "$drv" compare "$fdir/$stem.logits" "$work/fx.logits" --max-kl 1e-5 --require-top1
      fi
    done
  done
fi

echo "bed_test: $fails failure(s)"
[ $fails -eq 0 ]
