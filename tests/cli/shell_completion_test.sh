#!/usr/bin/env bash
# shell_completion_test.sh zsh|fish KVSNAP FIXTURES: the generated zsh / fish completion completes
# commands, flags, type names, server subcommands and the store's snapshot names in the real shell
# (fish: `complete -C`; zsh: an interactive zsh on a pseudo-terminal (zsh/zpty), TAB pressed, the
# completed line read back).
set -uo pipefail
shell="$1" kvsnap="$2" fx="$3"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
export KVSNAP_HOME="$work/store" PATH="$(dirname "$kvsnap"):$PATH"
"$kvsnap" save "$fx/v0.5.0/hd64-f16-f16-faon.slot" --name chat-42 >/dev/null || { echo "save failed"; exit 1; }
fails=0
check() {  # check LINE WANTED GOT
  if printf '%s\n' "$3" | grep -- "$2" >/dev/null; then echo "ok   '$1' -> $2"; else echo "FAIL '$1' -> [$3], wanted $2"; fails=$((fails + 1)); fi
}
case "$shell" in
  fish)
    "$kvsnap" completion fish >"$work/kvsnap.fish" || exit 1
    fish -n "$work/kvsnap.fish" || { echo "FAIL: fish -n refuses the script"; exit 1; }
    complete_fish() { fish -c "source '$work/kvsnap.fish'; complete -C '$1'" | cut -f1; }
    for t in "kvsnap con|convert" "kvsnap do|doctor" "kvsnap convert in.slot --ct|--ctk" "kvsnap convert in.slot --ctk q8|q8_0" \
             "kvsnap convert in.slot --fa |off" "kvsnap restore |chat-42" "kvsnap restore chat-42 --target|--target-build" \
             "kvsnap server |add" "kvsnap server add x http://h --sl|--slot-dir" "kvsnap save f --qu|--quiet" \
             "kvsnap convert in.slot --format ggsq-v2-b|ggsq-v2-b5640" "kvsnap restore chat-42 --requant se|search" \
             "kvsnap man conv|convert"; do
      check "${t%%|*}" "^${t#*|}\$" "$(complete_fish "${t%%|*}")"
    done ;;
  zsh)
    mkdir -p "$work/fpath" && "$kvsnap" completion zsh >"$work/fpath/_kvsnap" || exit 1
    zsh -n "$work/fpath/_kvsnap" || { echo "FAIL: zsh -n refuses the script"; exit 1; }
    # complete_zsh LINE WANTED: the line after one TAB in an interactive zsh with compinit, read
    # until it shows WANTED (escape sequences and \r \b \a removed, as below) or 15 s have passed
    complete_zsh() {
      cat >"$work/drive.zsh" <<ZSH
setopt extendedglob
zmodload zsh/zpty
zpty z 'zsh -f -i'
zpty -w z 'PS1="PROMPT> "; fpath=($work/fpath \$fpath); autoload -U compinit; compinit -u -D; print READY'
zpty -r z line '*READY*'
zpty -r z line '*PROMPT> '
zpty -w -n z \$'$1\t'
out=
for i in {1..300}; do
  zpty -r -t z chunk && out+=\$chunk
  clean=\${out//\$'\e'\[[0-9;?]#[a-zA-Z]/}
  [[ \${clean//[\$'\r\b\a']/} == *'$2'* ]] && break
  sleep 0.05
done
print -r -- "\$out"
zpty -d z
ZSH
      timeout 30 zsh -f "$work/drive.zsh" 2>/dev/null | sed 's/\x1b\[[0-9;?]*[a-zA-Z]//g' | tr -d '\r\b\a'
    }
    for t in "kvsnap conv|kvsnap convert" "kvsnap doc|kvsnap doctor" "kvsnap convert x --ctk q8|--ctk q8_0" \
             "kvsnap convert x --fa of|--fa off" "kvsnap restore cha|kvsnap restore chat-42" \
             "kvsnap restore chat-42 --target-b|--target-build" "kvsnap server ad|kvsnap server add" \
             "kvsnap server add x http://h --slot-d|--slot-dir" "kvsnap save f --qu|--quiet" \
             "kvsnap convert x --format ggsn-v8|--format ggsn-v8-b3543" "kvsnap restore chat-42 --requant se|--requant search" \
             "kvsnap man conv|kvsnap man convert"; do
      check "${t%%|*}" "${t#*|}" "$(complete_zsh "${t%%|*}" "${t#*|}")"
    done ;;
  *) echo "usage: shell_completion_test.sh zsh|fish KVSNAP FIXTURES"; exit 2 ;;
esac
echo "$fails failed"
exit $((fails > 0))
