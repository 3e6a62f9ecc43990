#!/usr/bin/env bash
# Partial rotary (NEOX rope over the first n_rot values of each head: Phi-4-mini's 96 of 128, phi2,
# stablelm, gpt-neox) in caches real llama.cpp v0.5.0 writes, for kvsnap-mkmodel's phi3 models:
#   - layer 0's RoPE (docs/rope-witness.md) confirms the head dim and tells how q8_0 K was stored,
#     from the data alone: rotated as v0.5.0 writes it by default, plain under
#     LLAMA_ATTN_ROT_DISABLE=1, where the file's layout says "rotated";
#   - so the plain file is refused (exit 6, naming LLAMA_ATTN_ROT_DISABLE) instead of being
#     un-rotated by the layout's default; declared off, it converts to f16 and restores in
#     llama.cpp within 1.5x the native q8_0 cache's KL; the negative control (declared on, as the
#     layout alone would have it) gives a KL far above that bound, so this test can fail;
#   - a model of twice the head dim and the same rope dims and KV width is refused (exit 5).
#   partial_rotary_test.sh KVSNAP MKMODEL DRIVER_3_22_1 PROMPT WORK_DIR
set -euo pipefail
kvsnap="$1" mk="$2" drv="$3" P="$4" work="$5"
rm -rf "$work" && mkdir -p "$work"
export KVSNAP_ORACLE_CPU="${KVSNAP_ORACLE_CPU-x64}"
fail=0 pass=0
ok() { printf 'ok   %s\n' "$*"; pass=$((pass + 1)); }
bad() { printf 'FAIL %s\n' "$*"; fail=$((fail + 1)); }

kl() { "$drv" compare "$1" "$2" | sed -n 's/.* kl \([^ ]*\) .*/\1/p'; }
# within KL BOUND_KL: KL <= 1.5 * BOUND_KL or KL <= 1e-5
within() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= 1.5 * b || a <= 1e-5) }'; }

# save MODEL CTK OUT_STEM [env...]: a slot (K and V of one type) and the logits after it
save() {
  local model=$1 t=$2 stem=$3
  shift 3
  env "$@" "$drv" save --model "$model" --prompt-file "$P" --ctk "$t" --ctv "$t" --fa on --slot "$stem.slot" \
    --logits "$stem.logits" >"$stem.log" 2>&1 || { echo "partial_rotary: llama.cpp could not save $stem (see $stem.log)" >&2; exit 1; }
}

# restored_kl NAME MODEL SLOT REF: the slot restored at f16 in llama.cpp; prints KL against REF, or "refused"
restored_kl() {
  local name=$1 model=$2 slot=$3 ref=$4
  if ! "$drv" restore --model "$model" --prompt-file "$P" --ctk f16 --ctv f16 --fa on --slot "$slot" \
       --logits "$work/$name.logits" >/dev/null 2>"$work/$name.restore.err"; then
    echo refused
    return
  fi
  kl "$ref" "$work/$name.logits"
}

# A model: NAME and kvsnap-mkmodel arguments (phi3: NEOX rope, n_rot below the head dim allowed)
check_model() {
  local name=$1 hd=$2
  shift 2
  local m="$work/$name.gguf" s="$work/$name"
  "$mk" --out "$m" --arch phi3 "$@" --seed 5 >/dev/null
  save "$m" f16 "$s-f16"
  save "$m" q8_0 "$s-rot"
  save "$m" q8_0 "$s-plain" LLAMA_ATTN_ROT_DISABLE=1
  local native; native=$(kl "$s-f16.logits" "$s-rot.logits")

  # The witness on the rotated file: the head dim confirmed, K stored rotated.
  local line
  line=$("$kvsnap" info "$s-rot.slot" --model "$m" --json | python3 -c '
import json, sys
ev = json.load(sys.stdin)["source_rotation"]["evidence"]
print(next((e for e in ev if e.startswith("data (RoPE of layer 0)")), "no RoPE line"))')
  if [[ "$line" == *"stored rotated: head dim $hd confirmed"* ]]; then ok "$name rotated q8_0: $line"
  else bad "$name rotated q8_0: the RoPE does not confirm head dim $hd rotated: $line"; fi

  # Rotated (the default): converts by itself and restores.
  "$kvsnap" convert --force "$s-rot.slot" "$s-rot-f16.slot" --ctk f16 --ctv f16 --model "$m" >/dev/null
  local k; k=$(restored_kl "$name-rot-f16" "$m" "$s-rot-f16.slot" "$s-f16.logits")
  if [ "$k" != refused ] && within "$k" "$native"; then ok "$name rotated q8_0 -> f16: KL $k (native q8_0 $native)"
  else bad "$name rotated q8_0 -> f16: KL $k, native q8_0 $native (bound 1.5x)"; fi

  # Plain in the layout of a rotating build: the data disagrees with the layout, so it is refused.
  local rc=0
  "$kvsnap" convert --force "$s-plain.slot" "$s-guess.slot" --ctk f16 --ctv f16 --model "$m" >/dev/null 2>"$s-guess.err" || rc=$?
  if [ "$rc" -eq 6 ] && grep -q LLAMA_ATTN_ROT_DISABLE "$s-guess.err"; then ok "$name plain q8_0 in v0.5.0's layout: refused (exit 6)"
  else bad "$name plain q8_0 in v0.5.0's layout: exit $rc, not 6 naming LLAMA_ATTN_ROT_DISABLE: $(cat "$s-guess.err")"; fi
  "$kvsnap" convert --force "$s-plain.slot" "$s-plain-f16.slot" --ctk f16 --ctv f16 --model "$m" --src-rotation off >/dev/null
  k=$(restored_kl "$name-plain-f16" "$m" "$s-plain-f16.slot" "$s-f16.logits")
  if [ "$k" != refused ] && within "$k" "$native"; then ok "$name plain q8_0 declared off -> f16: KL $k (native q8_0 $native)"
  else bad "$name plain q8_0 declared off -> f16: KL $k, native q8_0 $native (bound 1.5x)"; fi
  # The negative control: what the layout's default would have made of it.
  "$kvsnap" convert --force "$s-plain.slot" "$s-wrong.slot" --ctk f16 --ctv f16 --model "$m" --src-rotation on >/dev/null
  k=$(restored_kl "$name-wrong" "$m" "$s-wrong.slot" "$s-f16.logits")
  if [ "$k" != refused ] && ! within "$k" "$native"; then ok "$name negative control: un-rotating plain K gives KL $k"
  else bad "$name negative control: un-rotating plain K gives KL $k, within the bound of $native: this test cannot tell"; fi
}

check_model phi4mini-like 128 --head-dim 128 --n-rot 96 --n-embd 512 --n-head 4 --n-head-kv 2
check_model hd64-rot32 64 --head-dim 64 --n-rot 32 --n-embd 256 --n-head 4 --n-head-kv 2

# Another model of the same KV width (1 head of 128 against 2 of 64) and the same rope dims: refused.
"$mk" --out "$work/wide.gguf" --arch phi3 --head-dim 128 --n-rot 32 --n-embd 256 --n-head 2 --n-head-kv 1 --seed 5 >/dev/null
rc=0
"$kvsnap" info "$work/hd64-rot32-rot.slot" --model "$work/wide.gguf" >/dev/null 2>"$work/wide.err" || rc=$?
if [ "$rc" -eq 5 ] && grep -q "has head dim 64" "$work/wide.err"; then ok "hd64-rot32 read with a head-dim-128 model: refused (exit 5)"
else bad "hd64-rot32 read with a head-dim-128 model: exit $rc, not 5 naming head dim 64: $(cat "$work/wide.err")"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
