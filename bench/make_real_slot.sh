#!/usr/bin/env bash
# Makes the real slots kvsnap-store-bench runs on (docs/store.md, "Speed and space"):
#
#   real-f16.slot      a llama.cpp v0.5.0 (test bed 3.22.1) f16 slot of ~3,200 tokens, 16 layers,
#                      8 KV heads x head dim 128: ~210 MB
#   real-f16-ext.slot  the same prompt plus ~6% more tokens (the incremental-save case)
#   model.gguf         the random-weight model both were evaluated with
#
# into ${KVSNAP_BENCH_DIR:-~/.cache/kvsnap-bench} (outside the checkout). Reproducible: the model
# is seeded and the prompt is fixtures/prompt.txt repeated. Slots already there are kept.
#
#   bench/make_real_slot.sh BUILD_DIR
# BUILD_DIR must hold kvsnap-mkmodel and oracle/kvsnap-oracle-3.22.1 (a build configured with the
# test bed of tests/oracle/fetch.sh 3.22.1):
#   cmake --build BUILD --target kvsnap-mkmodel kvsnap-oracle-3.22.1
set -euo pipefail
build=${1:?usage: make_real_slot.sh BUILD_DIR}
src=$(cd "$(dirname "$0")/.." && pwd)
out=${KVSNAP_BENCH_DIR:-$HOME/.cache/kvsnap-bench}
mkmodel=$build/kvsnap-mkmodel
oracle=$build/oracle/kvsnap-oracle-3.22.1
for x in "$mkmodel" "$oracle"; do
  [[ -x $x ]] || { echo "make_real_slot.sh: $x is missing (build it first)" >&2; exit 2; }
done
mkdir -p "$out"

if [[ ! -s $out/model.gguf ]]; then
  "$mkmodel" --out "$out/model.gguf.tmp" --arch llama --n-layer 16 --n-embd 1024 --n-head 8 \
    --n-head-kv 8 --head-dim 128 --n-ff 2816 --seed 9
  mv "$out/model.gguf.tmp" "$out/model.gguf"
fi

# $1 copies of fixtures/prompt.txt, one a line.
prompt() {
  local i
  for ((i = 0; i < $1; i++)); do cat "$src/fixtures/prompt.txt"; echo; done
}

make_slot() {  # NAME REPEATS
  local name=$1 reps=$2
  [[ -s $out/$name ]] && { echo "kept $out/$name"; return; }
  prompt "$reps" > "$out/$name.prompt.txt"
  "$oracle" save --model "$out/model.gguf" --prompt-file "$out/$name.prompt.txt" \
    --ctk f16 --ctv f16 --fa on --n-ctx 4096 --threads 2 --slot "$out/$name.tmp" \
    --tokens-out "$out/$name.tokens"
  mv "$out/$name.tmp" "$out/$name"
  echo "made $out/$name: $(stat -c %s "$out/$name") bytes, $(($(stat -c %s "$out/$name.tokens") / 4)) tokens"
}

make_slot real-f16.slot 30
make_slot real-f16-ext.slot 32
