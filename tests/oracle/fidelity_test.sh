#!/usr/bin/env bash
# fidelity_test.sh: does a file converted by `kvsnap convert` predict as well as a cache that
# real llama.cpp (v0.5.0) computed natively with the target types?  (ctest labels "oracle;fidelity";
# docs/fidelity.md has the method, the bound and the observed matrices.)
#
#   fidelity_test.sh --kvsnap BIN --driver KVSNAP_ORACLE_3_22_1 --work DIR
#                    (--mkmodel KVSNAP_MKMODEL | --model NAME=GGUF ...) [--prompt P | --prompt-chars N]
#                    [--models hd64,hd128,hd96] [--fa on,off] [--jobs N] [--no-cross] [--strict-bytes]
#                    [--eval-tail K]
#
# Every KL below is the mean over the last K prompt positions (--eval-tail, default 16): the saved
# state holds t[0..n-K-1], and the driver decodes t[n-K..n-1] in one batch after saving / restoring
# and compares the K next-token distributions (kvsnap-oracle --eval-tail K, compare --rows K).
# One next-token distribution of a tiny random model is too noisy a statistic for a 1.5x bound.
#
# Per model (hd64, hd128: quantized caches are Hadamard-rotated, blocks of 64 / 128; hd96: head dim
# not a multiple of 64, no rotation -- 96 rather than 80 because llama.cpp needs the head dim to be a
# multiple of the 32-value quant block: it refuses quantized caches at 80 with flash attention and
# computes NaN without) and flash-attention setting:
#  1. native caches: the driver saves a slot file + next-token logits for every cache config
#       fa on : K=V for f32 f16 bf16 q8_0 q4_0 q4_1 iq4_nl q5_0 q5_1, and K/V q8_0/q4_0 q4_0/q8_0 f16/q8_0
#       fa off: K=V for f32 f16 bf16; K q8_0 ... q5_1 with V f16 (a quantized V needs flash attention)
#     KL_native(c) = KL(f16 native logits || native c logits)   (reference: f16/f16, same fa;
#     mean over the K tail positions)
#  2. every pair (S, T) of configs: kvsnap convert native-S.slot --ctk/--ctv T --model M, restore
#     with T's types (must load), KL vs the reference. Pass iff
#       KL <= 1.5 * max(KL_native(S), KL_native(T))  or  KL <= 1e-6,
#     or for a lateral pair (two different 4/5-bit types on a side, or S and T lossy on different
#     sides) KL <= 1.5 * (KL_native(S) + KL_native(T)).
#     S == T must give the input bytes back; f16->f32->f16 and bf16->f32->bf16 too (cmp).
#     Unless --no-cross: also fa on -> fa off and fa off -> fa on (--flash-attn, V transposed),
#     same bound, KL and both natives measured against the f16 reference of the target's fa.
#  3. negative control: f16 -> q8_0 with --rotation off (wrong for v0.5.0): its KL must break the
#     bound by far (for hd96 --rotation off must change nothing: no rotation at head dim 96).
#  4. (informational) layer 0 of native T == kvsnap's f32 -> T conversion, byte for byte (layer 0
#     is computed from the embeddings alone); a failure only with --strict-bytes.
# Prints the matrices of KL / max(KL_native(S), KL_native(T)) and of KL; exits 1 on any failure.
# Environment: KVSNAP_ORACLE_CPU defaults to x64 (machine-independent llama.cpp numbers).
set -uo pipefail

kvsnap="" driver="" mkmodel="" prompt="" prompt_chars=0 work="" jobs=2 cross=1 strict_bytes=0 tail=16
l0diff=()
models_sel="hd64,hd128,hd96" fa_sel="on,off"
declare -A model_file
while [ $# -gt 0 ]; do
  case "$1" in
    --kvsnap) kvsnap="$2"; shift 2 ;;
    --driver) driver="$2"; shift 2 ;;
    --mkmodel) mkmodel="$2"; shift 2 ;;
    --model) model_file["${2%%=*}"]="${2#*=}"; shift 2 ;;
    --prompt) prompt="$2"; shift 2 ;;
    --prompt-chars) prompt_chars="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --models) models_sel="$2"; shift 2 ;;
    --fa) fa_sel="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --no-cross) cross=0; shift ;;
    --strict-bytes) strict_bytes=1; shift ;;
    --eval-tail) tail="$2"; shift 2 ;;
    -h|--help) sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fidelity: unknown argument $1" >&2; exit 2 ;;
  esac
done
die() { echo "fidelity: $*" >&2; exit 2; }
[ -n "$kvsnap" ] && [ -n "$driver" ] && [ -n "$work" ] || die "need --kvsnap, --driver and --work"
[ -x "$kvsnap" ] || die "no kvsnap binary $kvsnap"
[ -x "$driver" ] || die "no driver $driver"
[ -n "$prompt" ] || [ "$prompt_chars" -gt 0 ] || die "need --prompt or --prompt-chars"
[[ "$tail" =~ ^[1-9][0-9]*$ ]] || die "--eval-tail needs a positive number"
export KVSNAP_ORACLE_CPU="${KVSNAP_ORACLE_CPU-x64}"
t_start=$(date +%s)

tag="$("$driver" info 2>/dev/null | sed -n 's/^tag //p')"
[ "$tag" = v0.5.0 ] || echo "fidelity: warning: driver is llama.cpp '$tag', the test is written for v0.5.0 (rotation rule)"

rm -rf "$work"
mkdir -p "$work"

# ---------------------------------------------------------------- prompt
if [ "$prompt_chars" -gt 0 ]; then
  # deterministic filler text (the tiny models tokenize it about one token per character)
  awk -v n="$prompt_chars" 'BEGIN {
    split("the a of and to in is cache key value token model session snapshot it that for on with as was be by this are or from at an not have has but they which one you all there can", w, " ")
    x = 12345; s = ""
    while (length(s) < n) { x = (x * 16807) % 2147483647; s = s (length(s) ? " " : "") w[1 + x % 40]; if (x % 11 == 0) s = s "." }
    printf "%s", s }' > "$work/prompt.txt"
  prompt="$work/prompt.txt"
fi
[ -f "$prompt" ] || die "no prompt $prompt"

# ---------------------------------------------------------------- models
declare -A MK=(
  [hd64]="--arch llama --n-layer 4 --n-embd 256 --n-head 4 --n-head-kv 2 --head-dim 64 --seed 1"
  [hd128]="--arch llama --n-layer 4 --n-embd 256 --n-head 2 --n-head-kv 1 --head-dim 128 --seed 2"
  [hd96]="--arch llama --n-layer 4 --n-embd 256 --n-head 4 --n-head-kv 2 --head-dim 96 --seed 3"
)
IFS=, read -r -a models <<<"$models_sel"
IFS=, read -r -a fas <<<"$fa_sel"
fa_pairs=()   # "src dst": same setting first, then the crossings
for f in "${fas[@]}"; do fa_pairs+=("$f $f"); done
if [ "$cross" = 1 ]; then
  for f in "${fas[@]}"; do for g in "${fas[@]}"; do [ "$f" = "$g" ] || fa_pairs+=("$f $g"); done; done
fi
for m in "${models[@]}"; do
  [ -n "${MK[$m]:-}" ] || die "unknown model $m (hd64, hd128, hd96)"
  if [ -z "${model_file[$m]:-}" ]; then
    [ -n "$mkmodel" ] || die "no --model $m=GGUF and no --mkmodel"
    model_file[$m]="$work/tiny-$m.gguf"
    # shellcheck disable=SC2086
    "$mkmodel" --out "${model_file[$m]}" ${MK[$m]} >/dev/null || die "kvsnap-mkmodel ${MK[$m]} failed"
  fi
  [ -f "${model_file[$m]}" ] || die "no model ${model_file[$m]}"
  echo "model $m: ${model_file[$m]} sha256 $(sha256sum "${model_file[$m]}" | cut -c1-16)... (kvsnap-mkmodel ${MK[$m]})"
done

TYPES=(f32 f16 bf16 q8_0 q4_0 q4_1 iq4_nl q5_0 q5_1)
configs_for() {  # configs_for on|off -> "K/V" words
  local t out=()
  if [ "$1" = on ]; then
    for t in "${TYPES[@]}"; do out+=("$t/$t"); done
    out+=(q8_0/q4_0 q4_0/q8_0 f16/q8_0)
  else
    for t in "${TYPES[@]}"; do
      case "$t" in f32|f16|bf16) out+=("$t/$t") ;; *) out+=("$t/f16") ;; esac
    done
  fi
  printf '%s\n' "${out[@]}"
}
fname() { echo "${1/\//-}"; }   # q8_0/q4_0 -> q8_0-q4_0

# ---------------------------------------------------------------- job pool
throttle() { while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n 2>/dev/null || true; done; }
kl_of() {  # kl_of REF GOT -> KL, or "nan" when the driver calls it non-finite / fails
  local j
  j="$("$driver" compare "$1" "$2" --rows "$tail" --json 2>/dev/null)"
  local kl; kl="$(sed -n 's/.*"kl": *\([^,}]*\).*/\1/p' <<<"$j")"
  if [ -z "$kl" ] || ! grep -q '"finite": *true' <<<"$j"; then echo nan; else echo "$kl"; fi
}

# one pair: convert, (identity cmp), restore, KL. Appends one line to $results:
#   model fa_src fa_dst S T status kl identity
# status: ok | convert-failed | restore-failed | nonfinite
run_pair() {
  local m="$1" fs="$2" fd="$3" s="$4" t="$5"
  local model="${model_file[$m]}" dir="$work/$m/pairs"
  local src base ref="$work/$m/fa$fd/f16-f16.logits"
  src="$work/$m/fa$fs/$(fname "$s").slot"
  base="$dir/fa$fs-$(fname "$s")__fa$fd-$(fname "$t")"
  local kt="${t%/*}" vt="${t#*/}" status=ok kl=nan ident=-
  if ! "$kvsnap" convert --force "$src" "$base.slot" --ctk "$kt" --ctv "$vt" --flash-attn "$fd" --model "$model" \
       --threads 1 >"$base.convert.log" 2>&1; then
    status=convert-failed
  else
    if [ "$s" = "$t" ] && [ "$fs" = "$fd" ]; then
      if cmp -s "$src" "$base.slot"; then ident=same; else ident=differs; fi
    fi
    if ! "$driver" restore --model "$model" --prompt-file "$prompt" --ctk "$kt" --ctv "$vt" --fa "$fd" \
         --threads 1 --eval-tail "$tail" --slot "$base.slot" --logits "$base.logits" >"$base.restore.log" 2>&1; then
      status=restore-failed
    else
      kl="$(kl_of "$ref" "$base.logits")"
      [ "$kl" = nan ] && status=nonfinite
    fi
  fi
  echo "$m $fs $fd $s $t $status $kl $ident" >>"$base.result"
  [ "$status" = ok ] && rm -f "$base.slot"   # keep the failures for inspection
}

results="$work/results.txt" natives="$work/natives.txt" checks="$work/checks.txt"
: >"$results"; : >"$natives"; : >"$checks"
check() {  # check NAME ok|FAIL DETAIL
  printf '%-5s %s%s\n' "$2" "$1" "${3:+: $3}" | tee -a "$checks"
}

# ---------------------------------------------------------------- 1. native caches
echo "== native caches (llama.cpp $tag, $(basename "$driver"), KVSNAP_ORACLE_CPU=$KVSNAP_ORACLE_CPU)"
for m in "${models[@]}"; do
  for fa in "${fas[@]}"; do
    mkdir -p "$work/$m/fa$fa" "$work/$m/pairs"
    while read -r c; do
      throttle
      (
        f="$work/$m/fa$fa/$(fname "$c")"
        if ! "$driver" save --model "${model_file[$m]}" --prompt-file "$prompt" --ctk "${c%/*}" --ctv "${c#*/}" \
             --fa "$fa" --threads 1 --eval-tail "$tail" --slot "$f.slot" --logits "$f.logits" --tokens-out "$f.tokens" \
             >"$f.save.log" 2>&1; then
          echo "save failed: $(cat "$f.save.log")" >"$f.failed"
        fi
      ) &
    done < <(configs_for "$fa")
  done
done
wait
n_tok=""
# natives.txt: model fa config ref_fa KL -- against the f16 reference of each fa setting (a pair
# crossing fa on/off is judged against the target's reference, so are both of its natives)
for m in "${models[@]}"; do
  for fa in "${fas[@]}"; do
    while read -r c; do
      f="$work/$m/fa$fa/$(fname "$c")"
      if [ -f "$f.failed" ] || [ ! -f "$f.logits" ]; then
        check "$m fa $fa native $c save" FAIL "$(cat "$f.failed" 2>/dev/null)"
        continue
      fi
      [ -n "$n_tok" ] || n_tok=$(( $(stat -c %s "$f.tokens") / 4 ))
      for r in "${fas[@]}"; do
        echo "$m $fa $c $r $(kl_of "$work/$m/fa$r/f16-f16.logits" "$f.logits")" >>"$natives"
      done
    done < <(configs_for "$fa")
  done
done
echo "prompt: $prompt ($n_tok tokens; the state holds $((n_tok - tail)) cells; KL = mean over the last $tail positions); natives took $(( $(date +%s) - t_start )) s"
t_pairs=$(date +%s)

# ---------------------------------------------------------------- 2. all pairs
echo "== conversions"
for m in "${models[@]}"; do
  for fsd in "${fa_pairs[@]}"; do
    fs="${fsd% *}" fd="${fsd#* }"
    while read -r s; do
        [ -f "$work/$m/fa$fs/$(fname "$s").slot" ] || continue
        while read -r t; do
          throttle
          run_pair "$m" "$fs" "$fd" "$s" "$t" &
        done < <(configs_for "$fd")
    done < <(configs_for "$fs")
  done
done
wait
cat "$work"/*/pairs/*.result >"$results" 2>/dev/null
echo "$(wc -l <"$results") conversions restored and compared in $(( $(date +%s) - t_pairs )) s"

# round trips through f32, byte for byte
for m in "${models[@]}"; do
  for fa in "${fas[@]}"; do
    for t in f16 bf16; do
      src="$work/$m/fa$fa/$t-$t.slot" mid="$work/$m/rt-fa$fa-$t-f32.slot" back="$work/$m/rt-fa$fa-$t-back.slot"
      [ -f "$src" ] || continue
      if "$kvsnap" convert --force "$src" "$mid" --ctk f32 --ctv f32 --model "${model_file[$m]}" >/dev/null 2>&1 &&
         "$kvsnap" convert --force "$mid" "$back" --ctk "$t" --ctv "$t" --model "${model_file[$m]}" >/dev/null 2>&1 &&
         cmp -s "$src" "$back"; then
        check "$m fa $fa $t -> f32 -> $t is byte-identical" ok
      else
        check "$m fa $fa $t -> f32 -> $t is byte-identical" FAIL "$(cmp "$src" "$back" 2>&1 | head -n1)"
      fi
    done
  done
done

# ---------------------------------------------------------------- 3. negative control
echo "== negative control: f16 -> q8_0/q8_0 with --rotation off (llama.cpp v0.5.0 expects rotated q8_0)"
for m in "${models[@]}"; do
  case " ${fas[*]} " in *" on "*) ;; *) continue ;; esac
  d="$work/$m/faon" model="${model_file[$m]}"
  "$kvsnap" convert --force "$d/f16-f16.slot" "$work/$m/neg-auto.slot" --ctk q8_0 --ctv q8_0 --model "$model" >/dev/null 2>&1
  if ! "$kvsnap" convert --force "$d/f16-f16.slot" "$work/$m/neg-off.slot" --ctk q8_0 --ctv q8_0 --model "$model" \
       --rotation off >/dev/null 2>&1; then
    check "$m negative control: convert --rotation off" FAIL "kvsnap convert failed"; continue
  fi
  if [ "$m" = hd96 ]; then
    # head dim 96: llama.cpp does not rotate, so "off" is what "auto" does already
    if cmp -s "$work/$m/neg-auto.slot" "$work/$m/neg-off.slot"; then
      check "$m negative control: --rotation off = auto (no rotation at head dim 96)" ok
    else
      check "$m negative control: --rotation off = auto (no rotation at head dim 96)" FAIL "the files differ"
    fi
    continue
  fi
  if ! "$driver" restore --model "$model" --prompt-file "$prompt" --ctk q8_0 --ctv q8_0 --fa on \
       --eval-tail "$tail" --slot "$work/$m/neg-off.slot" --logits "$work/$m/neg-off.logits" >/dev/null 2>&1; then
    check "$m negative control: restore" FAIL "llama.cpp refused the file"; continue
  fi
  kl="$(kl_of "$d/f16-f16.logits" "$work/$m/neg-off.logits")"
  top="$("$driver" compare "$d/f16-f16.logits" "$work/$m/neg-off.logits" --rows "$tail" --json |
         sed -n 's/.*"top1_agree": *\([0-9]*\).*/\1/p')/$tail"
  echo "$m $kl $top" >>"$work/negative.txt"
done

# ---------------------------------------------------------------- 4. layer-0 bytes (informational)
# Layer 0's K and V come from the token embeddings alone, so every native context computes the same
# floats there: native T's layer 0 should be, byte for byte, kvsnap's conversion of native f32 to T
# (rotation and quantizer as llama.cpp's cache write does them). Reported; fails only with --strict-bytes.
u32at() { od -An -tu4 -j "$2" -N 4 "$1" | tr -d ' \n'; }
u64at() { od -An -tu8 -j "$2" -N 8 "$1" | tr -d ' \n'; }
layer0() {  # layer0 SLOT -> "k_off k_len v_off v_len" (ggsq v3, one stream, one seq id a cell, V as rows)
  local f="$1" nt cc off nl rb i k_off k_len
  nt=$(u32at "$f" 8); off=$((12 + 4 * nt + 4)); cc=$(u32at "$f" "$off")
  off=$((off + 4 + 12 * cc)); nl=$(u32at "$f" $((off + 4))); off=$((off + 8))
  k_off=$((off + 12)); k_len=$(( $(u64at "$f" $((off + 4))) * cc ))
  for ((i = 0; i < nl; i++)); do rb=$(u64at "$f" $((off + 4))); off=$((off + 12 + rb * cc)); done
  echo "$k_off $k_len $((off + 12)) $(( $(u64at "$f" $((off + 4))) * cc ))"
}
case " ${fas[*]} " in *" on "*) l0_models=("${models[@]}") ;; *) l0_models=() ;; esac
[ ${#l0_models[@]} -eq 0 ] || echo "== layer 0 bytes: native T vs kvsnap convert native-f32 -> T (fa on)"
for m in "${l0_models[@]}"; do
  line="" d="$work/$m/faon"
  for t in "${TYPES[@]}"; do
    [ "$t" = f32 ] && continue
    nat_f="$d/$t-$t.slot" conv_f="$work/$m/l0-$t.slot"
    [ -f "$nat_f" ] && [ -f "$d/f32-f32.slot" ] || continue
    "$kvsnap" convert --force "$d/f32-f32.slot" "$conv_f" --ctk "$t" --ctv "$t" --model "${model_file[$m]}" >/dev/null 2>&1 || { line="$line $t:ERR"; l0diff+=("$m $t (kvsnap convert failed)"); continue; }
    read -r ak al av avl <<<"$(layer0 "$nat_f")"
    read -r bk bl bv bvl <<<"$(layer0 "$conv_f")"
    r=""
    if [ "$al" = "$bl" ] && cmp -s -i "$ak:$bk" -n "$al" "$nat_f" "$conv_f"; then r="K="; else r="K!="; fi
    if [ "$avl" = "$bvl" ] && cmp -s -i "$av:$bv" -n "$avl" "$nat_f" "$conv_f"; then r="$r V="; else r="$r V!="; fi
    line="$line  $t $r"
    case "$r" in *!=*) l0diff+=("$m $t ($r)") ;; esac
    rm -f "$conv_f"
  done
  echo "$m:$line"
done
if [ ${#l0_models[@]} -eq 0 ]; then
  :
elif [ ${#l0diff[@]} -eq 0 ]; then
  echo "layer 0: every type byte-identical to llama.cpp's own cache"
else
  for x in "${l0diff[@]}"; do
    if [ "$strict_bytes" = 1 ]; then check "layer 0 equals llama.cpp's own bytes: $x" FAIL; else echo "note  layer 0 differs from llama.cpp's bytes: $x"; fi
  done
fi

# ---------------------------------------------------------------- report
echo
awk -v checks="$checks" -v tail="$tail" -v negfile="$work/negative.txt" -v models="${models[*]}" \
    -v fapairs="$(IFS=,; echo "${fa_pairs[*]}")" '
function fmt_ratio(r) { return r >= 1000 ? sprintf("%.1e", r) : sprintf("%.2f", r) }
function max(a, b) { return a > b ? a : b }
function lab(c,   kv) { split(c, kv, "/"); return kv[1] == kv[2] ? kv[1] : c }
function pad(s, w) { return sprintf("%" w "s", s) }
function lowbit(t) { return t ~ /^(q4_0|q4_1|iq4_nl|q5_0|q5_1)$/ }
# why a pair may exceed the bound: requantizing between two different sub-8-bit grids
function hint(s, t,   a, b, h) {
  split(s, a, "/"); split(t, b, "/"); h = ""
  if (lowbit(a[1]) && lowbit(b[1]) && a[1] != b[1]) h = h " K " a[1] "->" b[1]
  if (lowbit(a[2]) && lowbit(b[2]) && a[2] != b[2]) h = h " V " a[2] "->" b[2]
  if (h != "") return "   [requantization:" h "]"
  # S and T lose precision on different sides: the result carries the error of both
  if (lossy(s) != "" && lossy(t) != "" && lossy(s) != lossy(t)) return "   [errors add: S lossy in " lossy(s) ", T in " lossy(t) "]"
  return ""
}
function lossy(c,   a, r) {
  split(c, a, "/"); r = ""
  if (a[1] != "f32" && a[1] != "f16") r = "K"
  if (a[2] != "f32" && a[2] != "f16") r = r (r == "" ? "" : "+") "V"
  return r
}
FILENAME == ARGV[1] { nat[$1 " " $2 " " $3 " " $4] = $5; if ($4 == $2) cfg[$1 " " $2, ++ncfg[$1 " " $2]] = $3; next }
{ key = $1 " " $2 " " $3 " " $4 " " $5; status[key] = $6; kl[key] = $7; ident[key] = $8 }
END {
  fails = 0; nm = split(models, morder, " "); np = split(fapairs, porder, ",")
  w = 11; lw = 12
  for (mi = 1; mi <= nm; mi++) for (pi = 1; pi <= np; pi++) {
    m = morder[mi]; split(porder[pi], fsd, " "); fs = fsd[1]; fd = fsd[2]
    ns = ncfg[m " " fs]; nd = ncfg[m " " fd]
    title = m " fa " fs (fs == fd ? "" : " -> fa " fd)
    npairs = 0; nfail = 0; worst = 0; worst_at = ""
    printf "== %s: KL / max(KL_native(S), KL_native(T)); rows: source S, columns: target T (K/V types)\n", title
    for (side = 1; side <= (fs == fd ? 1 : 2); side++) {
      f = side == 1 ? fs : fd; n = side == 1 ? ns : nd
      printf "   native KL, fa %s caches vs f16 fa %s:", f, fd
      for (i = 1; i <= n; i++) printf " %s %.2g", lab(cfg[m " " f, i]), nat[m " " f " " cfg[m " " f, i] " " fd]
      printf "\n"
    }
    hdr = sprintf("%-" lw "s", "S \\ T"); for (j = 1; j <= nd; j++) hdr = hdr pad(lab(cfg[m " " fd, j]), w)
    print hdr
    klrows = ""
    for (i = 1; i <= ns; i++) {
      s = cfg[m " " fs, i]
      line = sprintf("%-" lw "s", lab(s)); kline = line
      for (j = 1; j <= nd; j++) {
        t = cfg[m " " fd, j]; key = m " " fs " " fd " " s " " t
        if (!(key in status)) { line = line pad(".", w); kline = kline pad(".", w); continue }
        npairs++
        if (status[key] != "ok") {
          line = line pad("ERR!", w); kline = kline pad("ERR!", w); nfail++
          fl[++fails] = sprintf("%s: %s -> %s: %s", title, s, t, status[key]); continue
        }
        ns_kl = nat[m " " fs " " s " " fd] + 0; nt_kl = nat[m " " fd " " t " " fd] + 0
        k = kl[key] + 0; den = max(ns_kl, nt_kl)
        # Lateral pairs (two different sub-8-bit grids on a side, or S and T lossy on different
        # sides) carry both errors, whatever the requantizer: their errors add, so they are held
        # to 1.5 x (KL_native(S) + KL_native(T)) instead (docs/fidelity.md).
        lat = hint(s, t) != ""
        ok = (k <= 1.5 * den || k <= 1e-6 || (lat && k <= 1.5 * (ns_kl + nt_kl)))
        mark = ok ? (k <= 1.5 * den ? "" : (k <= 1e-6 ? "~" : "+")) : "!"
        if (ok && mark == "+") nlat++
        cell = den > 0 ? fmt_ratio(k / den) : (k > 0 ? "inf" : "-")
        line = line pad(cell mark, w)
        kline = kline pad(sprintf("%.1e", k) (ok ? "" : "!"), w)
        if (den > 0 && k / den > worst && k > 1e-6) { worst = k / den; worst_at = lab(s) "->" lab(t) }
        if (!ok) {
          nfail++
          fl[++fails] = sprintf("%s: %s -> %s: KL %.3g > 1.5 * max(%.3g, %.3g) = %.3g (ratio %.2f)%s%s",
                                title, s, t, k, ns_kl, nt_kl, 1.5 * den, den > 0 ? k / den : 0, hint(s, t),
                                lat ? sprintf(" and > 1.5 * sum = %.3g", 1.5 * (ns_kl + nt_kl)) : "")
        }
        if (ident[key] == "differs") { nfail++; fl[++fails] = sprintf("%s: %s -> %s (identity) is not byte-identical", title, s, t) }
        if (ident[key] == "same") nident++
      }
      print line; klrows = klrows kline "\n"
    }
    printf "   KL vs f16 (fa %s):\n%s\n", fd, klrows
    sum[++nsum] = sprintf("  %-22s %5d pairs  %3d failed  largest ratio %.2f (%s)", title, npairs, nfail, worst, worst_at)
  }
  while ((getline ln < negfile) > 0) {
    split(ln, a, " "); m = a[1]; k = a[2] + 0
    den = max(nat[m " on f16/f16 on"] + 0, nat[m " on q8_0/q8_0 on"] + 0)
    good = m " on on f16/f16 q8_0/q8_0"
    msg = sprintf("%s fa on f16 -> q8_0 --rotation off: KL %.3g, top-1 agrees at %s positions (with the rotation: KL %.3g; native q8_0 %.3g): ratio %.3g",
                  m, k, a[3], kl[good], nat[m " on q8_0/q8_0 on"], den > 0 ? k / den : 0)
    if (k > 10 * 1.5 * den && k > 1e-6) negs = negs sprintf("ok    negative control: %s, the bound catches it\n", msg)
    else {
      negs = negs sprintf("FAIL  negative control: %s: not 10x over the bound (is the tiny model/prompt too insensitive?)\n", msg)
      fl[++fails] = "negative control " m ": KL " k " is not 10x over the bound"
    }
  }
  while ((getline ln < checks) > 0) if (ln ~ /^FAIL/) fl[++fails] = substr(ln, 7)
  printf "%s", negs
  printf "legend: KL = mean next-token KL over the last %d prompt positions (--eval-tail %d)\n", tail, tail
  printf "        cell = KL / max(KL_native(S), KL_native(T)); ! fails (> 1.5); ~ over 1.5 but KL <= 1e-6 (passes);\n"
  printf "        + over 1.5 on a lateral pair (errors of S and T add) but within 1.5 x (KL_native(S) + KL_native(T)): %d;\n", nlat
  printf "        - both natives and the conversion have KL 0; ERR convert or restore failed. Identities byte-identical: %d\n", nident
  printf "summary:\n"; for (i = 1; i <= nsum; i++) print sum[i]
  if (fails) {
    printf "\nFAILURES (%d):\n", fails
    for (i = 1; i <= fails; i++) {
      printf "  %s\n", fl[i]
      if (fl[i] ~ /requantization:/) nreq++; else if (fl[i] ~ /errors add:/) nadd++
    }
    printf "(of %d: %d a 4/5-bit type requantized into another 4/5-bit type, %d source and target lossy on different\n", fails, nreq, nadd
    printf " sides so that both errors add, %d other; see docs/fidelity.md)\n", fails - nreq - nadd
  }
  exit fails > 0
}' "$natives" "$results"
rc=$?
echo "fidelity: $(wc -l <"$results") conversions, $(( $(date +%s) - t_start )) s in all"
if [ $rc -ne 0 ]; then echo "fidelity: FAILED"; exit 1; fi
echo "fidelity: all passed"
