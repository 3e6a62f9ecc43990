#!/bin/sh
# A conversation that grows, through the built binary: a slot saved, then the same slot grown by
# more tokens saved again. The second save names the first as its parent, continues its cell grid
# (a format-version-4 snapshot, docs/format.md "GRID"), stores only chunks the first lacks, and
# restores byte for byte; export and import carry it to another store; verify finds nothing;
# digest --as tells its content, plain and encrypted.
# Usage: extension_save_test.sh KVSNAP_BINARY FIXTURES_DIR
set -u
kvsnap=$1
slot=$2/v0.5.0/hd64-f16-f16-faoff.slot   # 107 tokens, 4 layers, f16, transposed V
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvsnap-extension.XXXXXX")
trap 'rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
field() {  # field JSON_FILE PATH.TO.FIELD
  python3 -c 'import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."): v = v[k]
print(v)' "$1" "$2"
}
run() {  # run NAME -- command...: fails the test on a non-zero exit
  name=$1; shift 2
  "$@" > "$dir/$name.json" 2> "$dir/$name.err" || fail "$name: exit $?: $(cat "$dir/$name.err")"
}

# The first 70 tokens of the slot, as llama-server would have saved them earlier in the chat.
run full -- "$kvsnap" save "$slot" --name full --store "$dir/scratch" --json -q
run cut -- "$kvsnap" restore full --store "$dir/scratch" --tokens 70 -o "$dir/first70.slot" --json -q

store=$dir/store
run early -- "$kvsnap" save "$dir/first70.slot" --name early --store "$store" --cells-per-chunk 16 --json -q
run later -- "$kvsnap" save "$slot" --name later --store "$store" --cells-per-chunk 16 --json -q
[ "$(field "$dir/later.json" parent_id)" = "$(field "$dir/early.json" id)" ] ||
  fail "the grown slot's parent is not the first save: $(cat "$dir/later.json")"
run show -- "$kvsnap" show later --store "$store" --json
[ "$(field "$dir/show.json" snapshot.format_version)" = 4 ] || fail "not saved on its parent's grid (format version 4)"
# Every chunk of the first save is one of the second's: the second adds n_chunks(later) -
# n_chunks(early) chunks beside its frame (header and cell metadata, which changed).
new=$(field "$dir/later.json" chunks_new)
added=$(( $(field "$dir/later.json" n_chunks) - $(field "$dir/early.json" n_chunks) ))
[ "$new" -ge "$added" ] && [ "$new" -le $((added + 2)) ] ||
  fail "the grown slot stored $new new chunks, expected $added plus its frame's"
run again -- "$kvsnap" save "$slot" --name again --store "$store" --cells-per-chunk 16 --json -q
[ "$(field "$dir/again.json" chunks_new)" = 0 ] || fail "the same slot again stored new chunks"

run restore -- "$kvsnap" restore later --store "$store" -o "$dir/later.slot" --json -q
cmp -s "$slot" "$dir/later.slot" || fail "restore is not byte-identical to the saved slot"
run verify -- "$kvsnap" verify --all --store "$store" --json -q

run export -- "$kvsnap" export later --store "$store" -o "$dir/later.tar.zst" --json -q
run import -- "$kvsnap" import "$dir/later.tar.zst" --store "$dir/other" --json -q
run restore2 -- "$kvsnap" restore later --store "$dir/other" -o "$dir/later2.slot" --json -q
cmp -s "$slot" "$dir/later2.slot" || fail "restore after export and import is not byte-identical"

# digest --as: the restored file is the snapshot's content on its grid (the plain digest, on a
# uniform grid, is not what the version-4 snapshot recorded); the shorter file is not.
out=$("$kvsnap" digest "$dir/later.slot" --as later --store "$store" 2>&1) || fail "digest --as later: $out"
case "$out" in *"later (id "*"): the same content"*) ;; *) fail "digest --as later: $out" ;; esac
recorded=$(field "$dir/show.json" content_digest)
case "$recorded" in *"$("$kvsnap" digest "$dir/later.slot" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["content_digest"])')"*)
  fail "the plain digest equals the version-4 snapshot's" ;; esac
"$kvsnap" digest "$dir/first70.slot" --as later --store "$store" > /dev/null 2>&1
[ $? = 5 ] || fail "digest of another file --as later: not exit 5"
# What only --as reads is refused without it, and another grid than the snapshot's with it
# (exit 2, naming the flags), instead of being ignored.
out=$("$kvsnap" digest "$dir/later.slot" --store "$store" 2>&1)
[ $? = 2 ] && case "$out" in *"without --as"*) true ;; *) false ;; esac || fail "digest --store without --as: $out"
out=$("$kvsnap" digest "$dir/later.slot" --tenant bob 2>&1)
[ $? = 2 ] || fail "digest --tenant without --as: $out"
out=$("$kvsnap" digest "$dir/later.slot" --as later --store "$store" --cells-per-chunk 256 2>&1)
[ $? = 2 ] && case "$out" in *"saved with 16"*) true ;; *) false ;; esac || fail "digest --as with another --cells-per-chunk: $out"
run samecpc -- "$kvsnap" digest "$dir/later.slot" --as later --store "$store" --cells-per-chunk 16 --json

# A b3166 session needs its model to be read (-m at save); its restored file is compared as the
# save parsed it, without -m.
old=$2/b3166/hd64n-f16-f16-faoff.session
run b3save -- "$kvsnap" save "$old" -m "$2/models/tiny-hd64n.gguf" --name era-a --store "$store" --json -q
run b3restore -- "$kvsnap" restore era-a --store "$store" -o "$dir/era-a.session" --json -q
out=$("$kvsnap" digest "$dir/era-a.session" --as era-a --store "$store" 2>&1) || fail "digest --as era-a: $out"

# The same in an encrypted store: the keyed digest, printed as show prints it.
python3 -c 'import os; open(os.sys.argv[1], "w").write(os.urandom(32).hex())' "$dir/key"
chmod 600 "$dir/key"
secret=$dir/secret
run s1 -- "$kvsnap" save "$dir/first70.slot" --name early --store "$secret" --key-file "$dir/key" --cells-per-chunk 16 --json -q
run s2 -- "$kvsnap" save "$slot" --name later --store "$secret" --key-file "$dir/key" --cells-per-chunk 16 --json -q
run sshow -- "$kvsnap" show later --store "$secret" --key-file "$dir/key" --json
[ "$(field "$dir/sshow.json" snapshot.format_version)" = 4 ] || fail "encrypted: not saved on its parent's grid"
run sdigest -- "$kvsnap" digest "$slot" --as later --store "$secret" --key-file "$dir/key" --json
[ "$(field "$dir/sdigest.json" as.matches)" = True ] || fail "encrypted digest --as: $(cat "$dir/sdigest.json")"
[ "$(field "$dir/sshow.json" content_digest)" = "$(field "$dir/sdigest.json" content_digest)" ] &&
  [ "$(field "$dir/sshow.json" content_digest_rule)" = keyed-chunk-tree ] ||
  fail "digest --as prints another digest than show: $(field "$dir/sshow.json" content_digest) vs $(cat "$dir/sdigest.json")"

[ "$failures" = 0 ] && echo "extension save: all checks passed"
exit $([ "$failures" = 0 ] && echo 0 || echo 1)
