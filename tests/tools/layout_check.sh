#!/usr/bin/env bash
# Checks kvsnap's ModelProfile against state files written by real llama.cpp v0.5.0:
# every kvsnap-mkmodel arch and shape below, flash attention on and off.
#   layout_check.sh KVSNAP_MKMODEL KVSNAP_LAYOUT_CHECK LIBDIR WORKDIR
set -u
mk="$1" check="$2" libdir="$3" work="$4"
mkdir -p "$work"
declare -A MODELS=(
  [llama-hd64]="--arch llama --n-layer 4 --n-embd 128 --n-head 2 --n-head-kv 1 --head-dim 64 --n-ff 128"
  [llama-hd80]="--arch llama --n-layer 2 --n-embd 128 --n-head 4 --n-head-kv 2 --head-dim 80 --n-ff 128"
  [llama-hd72-f32]="--arch llama --n-layer 2 --n-embd 128 --n-head 4 --n-head-kv 2 --head-dim 72 --n-ff 128 --dtype f32 --alignment 64"
  [deci-perlayer]="--arch deci --n-layer 4 --n-embd 128 --n-head 4 --n-head-kv 2,2,1,4 --head-dim 32 --n-ff 128"
  [qwen2vl-mrope]="--arch qwen2vl --n-layer 2 --n-embd 128 --n-head 2 --n-head-kv 1 --head-dim 64 --n-ff 128"
  [gemma2-iswa]="--arch gemma2 --n-layer 4 --n-embd 128 --n-head 2 --n-head-kv 1 --head-dim 64 --n-ff 128 --swa 32"
  [gemma3-iswa]="--arch gemma3 --n-layer 6 --n-embd 128 --n-head 2 --n-head-kv 1 --head-dim 64 --n-ff 128 --swa 32"
  [gemma3-pattern]="--arch gemma3 --n-layer 4 --n-embd 128 --n-head 2 --n-head-kv 1 --head-dim 64 --n-ff 128 --swa 32 --swa-layers 1,0,1,1"
  [lfm2-hybrid]="--arch lfm2 --n-layer 6 --n-embd 128 --n-head 2 --n-head-kv 1 --head-dim 64 --n-ff 128"
  [lfm2-hybrid-iswa]="--arch lfm2 --n-layer 6 --n-embd 128 --n-head 2 --n-head-kv 1 --head-dim 64 --n-ff 128 --swa 32"
)
fails=0
for name in $(printf '%s\n' "${!MODELS[@]}" | sort); do
  model="$work/$name.gguf"
  if ! "$mk" --out "$model" ${MODELS[$name]} >/dev/null; then
    echo "FAIL $name: kvsnap-mkmodel ${MODELS[$name]}"; fails=$((fails + 1)); continue
  fi
  for fa in fa nofa; do
    if out="$("$check" "$libdir" "$model" "$work/$name-$fa.state" "$fa" 2>&1)"; then
      echo "ok   $name ($fa): $(tail -n 1 <<<"$out")"
    else
      echo "FAIL $name ($fa):"; echo "$out" | sed 's/^/    /'; fails=$((fails + 1))
    fi
  done
done
[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
