#!/usr/bin/env bash
# Measures rotation detection (migrate/rotation_detect.h) on caches written by real
# llama.cpp, and prints the confusion matrix (truth x verdict) per model set.
#
#   bash tests/tools/rotation_eval.sh BUILD_DIR [OUT_DIR] [--quick] [--fresh]
#
# BUILD_DIR: a kvsnap build with kvsnap-mkmodel, kvsnap-rotation-eval and the oracle
# drivers oracle/kvsnap-oracle-3.22.1 (v0.5.0, rotates) and oracle/kvsnap-oracle-3.16.2
# (b8121, does not). OUT_DIR (default: a new mktemp -d directory) receives the models,
# prompts, slot files, results.jsonl and matrix.txt. --quick: two prompts and only
# q4_0/q8_0 (48 files; the oracle ctest uses it). --fresh: delete OUT_DIR/slots first.
# ROT_EVAL_SEEDS="1 2": make each model with more seeds (default 1). Slot files already
# in OUT_DIR are not rewritten: rerunning with the same OUT_DIR re-scores them (after
# changing the detector). Exit 1 when any verdict is wrong (rotated for a plain file or
# the other way round), else 0.
#
# Sets: "random" = kvsnap-mkmodel's random-weight models; "trained-like" = the same
# with --outlier-channels 4 --outlier-scale 10 (trained models' K/V outlier channels);
# "weak" = --outlier-channels 2 --outlier-scale 3 (not in --quick).
# Models per set: llama hd64, llama hd128, qwen2vl (M-RoPE) hd64, llama hd96 (a control
# llama.cpp never rotates: the detector must not even examine it).
# Writers: v0.5.0 (truth rotated, except hd96), v0.5.0 with LLAMA_ATTN_ROT_DISABLE=1
# (plain), b8121 (plain). Cache types -ctk/-ctv: q8_0/q8_0, q4_0/q4_0, q4_0/q8_0.
# Prompts: ~32 tokens, 108 tokens (fixtures/prompt.txt), ~600 tokens.
set -euo pipefail

BUILD=${1:?usage: rotation_eval.sh BUILD_DIR [OUT_DIR] [--quick] [--fresh]}
shift
OUT=""
QUICK=0
FRESH=0
for a in "$@"; do
  case "$a" in
    --quick) QUICK=1 ;;
    --fresh) FRESH=1 ;;
    *) OUT=$a ;;
  esac
done
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/kvsnap-rotation-eval.XXXXXX)
[ "$FRESH" = 1 ] && rm -rf "$OUT/slots"
mkdir -p "$OUT/models" "$OUT/prompts" "$OUT/slots"
BUILD=$(cd "$BUILD" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
MK=$BUILD/kvsnap-mkmodel
EVAL=$BUILD/kvsnap-rotation-eval
V050=$BUILD/oracle/kvsnap-oracle-3.22.1
B8121=$BUILD/oracle/kvsnap-oracle-3.16.2
for x in "$MK" "$EVAL" "$V050" "$B8121"; do
  [ -x "$x" ] || { echo "rotation_eval: missing $x (build it; the oracle drivers need tests/oracle/fetch.sh all)" >&2; exit 2; }
done
export KVSNAP_ORACLE_CPU=x64  # the same bytes on every machine

# ---- prompts (deterministic text from the repository)
P=$OUT/prompts
head -c 32 "$SRC/fixtures/prompt.txt" > "$P/short.txt"
cp "$SRC/fixtures/prompt.txt" "$P/medium.txt"
# ~630 tokens with the tiny vocabulary: a fixed pseudo-random word sequence
python3 - > "$P/long.txt" <<'TXT'
import random
r = random.Random(1)
w = ("the a of and to in is cache key value token model session snapshot it that for on with as was be by "
     "this are or from at an not have has but they which one you all there can state file layer head block "
     "type load save slot server prompt context memory batch sequence position quant float half row column "
     "table store chunk index hash write read time word").split()
out = []
while len(" ".join(out)) < 600:
    out.append(r.choice(w) + ("." if r.random() < 0.08 else ""))
print(" ".join(out))
TXT
PROMPTS="short medium long"
SEEDS=${ROT_EVAL_SEEDS:-1}  # model seeds, e.g. ROT_EVAL_SEEDS="1 2" for twice the files
TYPES="q8_0/q8_0 q4_0/q4_0 q4_0/q8_0"
if [ "$QUICK" = 1 ]; then PROMPTS="short long"; SEEDS="1"; TYPES="q4_0/q8_0"; fi

# ---- models
# name:args
MODELS=(
  "hd64:--head-dim 64 --n-embd 256 --n-head 4 --n-head-kv 2"
  "hd128:--head-dim 128 --n-embd 512 --n-head 4 --n-head-kv 2"
  "qwen2vl:--arch qwen2vl --head-dim 64 --n-embd 256 --n-head 4 --n-head-kv 2"
  "hd96:--head-dim 96 --n-embd 384 --n-head 4 --n-head-kv 2"
)
TRAINED="--outlier-channels 4 --outlier-scale 10"
WEAK="--outlier-channels 2 --outlier-scale 3"  # milder structure: where the detector gives up

RESULTS=$OUT/results.jsonl
: > "$RESULTS"
SETS="random trained-like weak"
[ "$QUICK" = 1 ] && SETS="random trained-like"
for set in $SETS; do
  case $set in
    random) extra="" ;;
    trained-like) extra=$TRAINED ;;
    weak) extra=$WEAK ;;
  esac
  for seed in $SEEDS; do
    for m in "${MODELS[@]}"; do
      name=${m%%:*}
      args=${m#*:}
      model=$OUT/models/$set-$name-s$seed.gguf
      # shellcheck disable=SC2086
      "$MK" --out "$model" $args $extra --seed "$seed" > /dev/null
      for prompt in $PROMPTS; do
        for types in $TYPES; do
          ctk=${types%/*}
          ctv=${types#*/}
          for writer in v050 v050-norot b8121; do
            f=$OUT/slots/$set-$name-s$seed-$prompt-$ctk-$ctv-$writer.slot
            case $writer in
              v050) drv=$V050; envs=() ;;
              v050-norot) drv=$V050; envs=(LLAMA_ATTN_ROT_DISABLE=1) ;;
              b8121) drv=$B8121; envs=() ;;
            esac
            # an existing slot is kept (rerunning after changing the detector re-scores only)
            if [ ! -s "$f" ]; then
              if ! env "${envs[@]}" "$drv" save --model "$model" --prompt-file "$P/$prompt.txt" --ctk "$ctk" \
                   --ctv "$ctv" --fa on --slot "$f.tmp" > "$f.log" 2>&1; then
                echo "rotation_eval: save failed: $f (see $f.log)" >&2
                exit 1
              fi
              mv "$f.tmp" "$f"
            fi
            truth=not-rotated
            [ "$writer" = v050 ] && [ "$name" != hd96 ] && truth=rotated
            "$EVAL" --model "$model" --truth "$truth" --json --tensors "$f" |
              python3 -c 'import json,sys
for l in sys.stdin:
    j=json.loads(l); j.update(set=sys.argv[1], model=sys.argv[2], seed=int(sys.argv[3]), prompt=sys.argv[4],
                            types=sys.argv[5], writer=sys.argv[6]); print(json.dumps(j))' \
                "$set" "$name" "$seed" "$prompt" "$types" "$writer" >> "$RESULTS"
          done
        done
      done
    done
  done
done

rc=0
python3 - "$RESULTS" > "$OUT/matrix.txt" <<'PY' || rc=$?
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1])]
verdicts = ["rotated", "not-rotated", "unsure"]
wrong = 0
for s in ["random", "trained-like", "weak"]:
    rs = [r for r in rows if r["set"] == s]
    if not rs:
        continue
    print(f"## {s}: {len(rs)} files")
    print("truth / verdict".ljust(16) + "".join(f"{v:>13}" for v in verdicts))
    for t in ["rotated", "not-rotated"]:
        c = collections.Counter(r["verdict"] for r in rs if r["truth"] == t)
        print(f"{t:<16}" + "".join(f"{c[v]:>13}" for v in verdicts))
    w = [r for r in rs if r["verdict"] != "unsure" and r["verdict"] != r["truth"]]
    wrong += len(w)
    print(f"wrong verdicts: {len(w)}")
    # per model: verdict counts, score range, tensors examined
    by = collections.defaultdict(list)
    for r in rs:
        by[(r["model"], r["truth"])].append(r)
    for (m, t), g in sorted(by.items()):
        c = collections.Counter(r["verdict"] for r in g)
        sc = [r["score"] for r in g]
        print(f"  {m:<8} truth {t:<12} n={len(g):<3} " + " ".join(f"{v}={c[v]}" for v in verdicts) +
              f"  score [{min(sc):+.2f}, {max(sc):+.2f}]  tensors {min(r['tensors'] for r in g)}..{max(r['tensors'] for r in g)}")
    # per-tensor margins: |d| and |z| of the tensors, decisive or not
    ts = [t for r in rs for t in r.get("per_tensor", [])]
    nd = [t for t in ts if t["decisive"] == 0]
    de = [t for t in ts if t["decisive"] != 0]
    wrong_t = [t for r in rs for t in r.get("per_tensor", []) if t["decisive"] != 0 and
               (t["decisive"] > 0) != (r["truth"] == "rotated")]
    if ts:
        print(f"  tensors: {len(ts)}, decisive {len(de)} (wrong way {len(wrong_t)})" +
              (f"; not decisive: max |d| {max(abs(t['d']) for t in nd):.3f}" if nd else "") +
              (f"; decisive: min |d| {min(abs(t['d']) for t in de):.3f}, min |z| {min(abs(t['z']) for t in de):.1f}" if de else ""))
    for r in w:
        print(f"  WRONG {r['file']}: {r['verdict']} ({r['summary']})")
    print()
print(f"total wrong verdicts: {wrong}")
sys.exit(1 if wrong else 0)
PY
cat "$OUT/matrix.txt"
echo "results: $RESULTS"
exit $rc
