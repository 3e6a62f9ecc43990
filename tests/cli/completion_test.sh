#!/usr/bin/env bash
# completion_test.sh KVSNAP FIXTURES: the generated bash completion completes commands, flags, type
# names, server subcommands and the store's snapshot names (bash's programmable completion, driven
# the way readline drives it: COMP_WORDS/COMP_CWORD, then the function, then COMPREPLY).
set -uo pipefail
kvsnap="$1"; fixtures="$2"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
export KVSNAP_HOME="$work/store" PATH="$(dirname "$kvsnap"):$PATH"
"$kvsnap" save "$fixtures/v0.5.0/hd64-f16-f16-faon.slot" --name chat-42 >/dev/null || { echo "save failed"; exit 1; }
# shellcheck disable=SC1090
source <("$kvsnap" completion bash) || { echo "the script does not load"; exit 1; }
complete -p kvsnap >/dev/null || { echo "no completion registered for kvsnap"; exit 1; }
fails=0
expect() {  # expect "WORDS..." WANTED: completing the last word must offer WANTED
  local line="$1" want="$2"
  read -r -a COMP_WORDS <<<"$line"
  [[ "$line" == *" " ]] && COMP_WORDS+=("")
  COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
  COMPREPLY=()
  _kvsnap
  if printf '%s\n' "${COMPREPLY[@]}" | grep -x -- "$want" >/dev/null; then
    echo "ok   '$line' -> $want"
  else
    echo "FAIL '$line' -> [${COMPREPLY[*]}], wanted $want"; fails=$((fails + 1))
  fi
}
expect "kvsnap con" convert
expect "kvsnap do" doctor
expect "kvsnap convert in.slot --ct" --ctk
expect "kvsnap convert in.slot --ctk q8" q8_0
expect "kvsnap convert in.slot --ctk q8_0 --fa " off
expect "kvsnap restore " chat-42
expect "kvsnap restore chat-42 --target" --target-build
expect "kvsnap convert in.slot --format ggsq-v2-b" ggsq-v2-b5640
expect "kvsnap migrate d --format ggsn-v8" ggsn-v8-b3543
expect "kvsnap restore chat-42 --requant se" search
expect "kvsnap man conv" convert
expect "kvsnap server " add
expect "kvsnap server add x http://h --sl" --slot-dir
echo "$fails failed"
exit $((fails > 0))
