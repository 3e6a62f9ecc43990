#!/usr/bin/env bash
# man_test.sh KVSNAP: `kvsnap man --dir` writes a page per command; each renders with groff -man
# without a warning, names every option its --help lists, and the main page lists every command
# and every exit status of docs/cli.md.
set -uo pipefail
kvsnap="$1"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
fails=0
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
"$kvsnap" man --dir "$work" >/dev/null || { echo "FAIL kvsnap man --dir"; exit 1; }
# Again over the same pages: each replaced whole, no temporary left beside them; a directory that
# is not there is an error naming it, and no page.
inode_before=$(stat -c %i "$work/kvsnap.1")
"$kvsnap" man --dir "$work" >/dev/null || bad "kvsnap man --dir over its own pages"
# A page is replaced by a rename (a new inode), never rewritten in place where a reader sees it cut.
[ "$(stat -c %i "$work/kvsnap.1")" != "$inode_before" ] || bad "man --dir rewrote kvsnap.1 in place"
ls -A "$work" | grep 'kvsnap-tmp' >/dev/null && bad "kvsnap man --dir left a temporary: $(ls -A "$work" | grep kvsnap-tmp)"
err=$("$kvsnap" man --dir "$work/missing" 2>&1 >/dev/null); rc=$?
[ "$rc" -ne 0 ] && grep -q "$work/missing" <<<"$err" || bad "man --dir into a missing directory: rc $rc, '$err'"
[ -e "$work/missing" ] && bad "man --dir created the missing directory"
commands=$("$kvsnap" --help | sed -n '/^Subcommands:/,/^$/p' | awk 'NR > 1 && /^  [a-z]/ { print $1 }')
[ -n "$commands" ] || { echo "FAIL no commands in kvsnap --help"; exit 1; }
render() { groff -man -Tutf8 -ww -z "$1" 2>&1; }
text_of() { groff -man -Tutf8 -rLL=250n "$1" 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g; s/.\x08//g'; }
main=$(text_of "$work/kvsnap.1")
w=$(render "$work/kvsnap.1"); [ -z "$w" ] || bad "kvsnap.1: groff warns: $w"
for code in $(sed -n 's/^| \([0-9][0-9]*\) |.*/\1/p' "$(dirname "$0")/../../docs/cli.md"); do
  grep -qE "^ +$code( |$)" <<<"$main" || bad "kvsnap.1 lacks exit status $code"
done
# The environment: kvsnap.1's ENVIRONMENT and docs/cli.md's "Environment" table name the same
# variables, and every KVSNAP_* variable the sources read is among them (testing knobs aside:
# KVSNAP_TEST_*, and KVSNAP_SERVE_NO_PDEATHSIG of docs/serve.md; the C API's examples are not kvsnap).
root="$(dirname "$0")/../.."
man_env=$(sed -n '/^ENVIRONMENT/,/^SEE ALSO/p' <<<"$main" | grep -oE '^ +KVSNAP_[A-Z0-9_]+' | tr -d ' ' | sort -u)
doc_env=$(sed -n '/^## Environment/,/^## /p' "$root/docs/cli.md" | grep -oE '^\| `KVSNAP_[A-Z0-9_]+`' | tr -d '|` ' | sort -u)
read_env=$(grep -rhoE --exclude-dir=examples 'getenv\("KVSNAP_[A-Z0-9_]+"\)' "$root/src" "$root/format" "$root/migrate" |
           grep -oE 'KVSNAP_[A-Z0-9_]+' |
           grep -vE '^KVSNAP_TEST_|^KVSNAP_SERVE_NO_PDEATHSIG$' | sort -u)
[ -n "$doc_env" ] || bad "docs/cli.md has no Environment table"
[ "$man_env" = "$doc_env" ] || bad "kvsnap.1's ENVIRONMENT ($(echo $man_env)) differs from docs/cli.md's ($(echo $doc_env))"
for v in $read_env KVSNAP_HOME; do
  grep -qx "$v" <<<"$doc_env" || bad "$v is read by kvsnap but not in docs/cli.md's Environment table"
done
for c in $commands; do
  grep -qE "^ +$c( |$)" <<<"$main" || bad "kvsnap.1 does not list $c"
  paths="$c"
  sub=$("$kvsnap" "$c" --help | sed -n '/^Subcommands:/,/^$/p' | awk 'NR > 1 && /^  [a-z]/ { print $1 }')
  for s in $sub; do paths="$paths|$c $s"; done
  IFS='|' read -r -a list <<<"$paths"
  for p in "${list[@]}"; do
    page="$work/kvsnap-${p// /-}.1"
    [ -f "$page" ] || { bad "no page for '$p'"; continue; }
    w=$(render "$page"); [ -z "$w" ] || bad "$page: groff warns: $w"
    text=$(text_of "$page")
    # shellcheck disable=SC2086
    for opt in $("$kvsnap" $p --help | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u); do
      grep -q -- "$opt" <<<"$text" || bad "$page lacks $opt (in '$p --help')"
    done
  done
done
n=$(ls "$work"/*.1 | wc -l)
echo "$n pages checked, $fails failed"
exit $((fails > 0))
