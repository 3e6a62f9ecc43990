#!/bin/sh
# libpq, libcurl and libarchive are opened on first use (src/base/lazy_library.h), not at start.
# Checks, through the built binary (glibc's loader):
#  1. a command that needs one opens it and runs as before;
#  2. a command that needs none of them maps none of them (LD_DEBUG=files);
#  3. an unusable library found first through LD_LIBRARY_PATH (not ELF, or an ELF file without
#     the functions kvsnap calls) fails the command with exit 7 and a message that names the
#     library, what needs it and the package, without a crash.
# Usage: lazy_libraries_test.sh KVSNAP_BINARY FIXTURES_DIR LIBPQ_SONAME LIBCURL_SONAME LIBARCHIVE_SONAME
set -u
kvsnap=$1 fixtures=$2 pq=$3 curl=$4 archive=$5
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvsnap-lazy.XXXXXX")
trap 'rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

mapped() {  # which of the three libraries the loader mapped for "$@"
  LD_DEBUG=files "$@" 2>&1 >/dev/null | grep -o -F -e "file=$pq " -e "file=$curl " -e "file=$archive " |
    sort -u | tr '\n' ' '
}

# 1. Opened when used: an import maps libarchive (and reads the tar: not an export, exit 4).
store=$dir/store
python3 - "$dir/one.tar" <<'PY' || fail "could not make a tar"
import io, sys, tarfile
with tarfile.open(sys.argv[1], "w", format=tarfile.PAX_FORMAT) as t:
    data = b"not an index"
    info = tarfile.TarInfo("readme.txt"); info.size = len(data)
    t.addfile(info, io.BytesIO(data))
PY
got=$(mapped "$kvsnap" import "$dir/one.tar" --store "$store")
case "$got" in *"$archive"*) ;; *) fail "import did not open $archive (mapped: '$got')" ;; esac
out=$("$kvsnap" import "$dir/one.tar" --store "$store" 2>&1); rc=$?
[ "$rc" = 4 ] || fail "import of a tar that is no export: exit $rc, not 4: $out"
case "$out" in *"is not a .kvsnap snapshot"*) ;; *) fail "import of a tar that is no export: $out" ;; esac

# 2. Nothing mapped by commands that use none of them.
for args in "--version" "--help" "ls --store $store" "show --help"; do
  got=$(mapped "$kvsnap" $args)
  [ -z "$got" ] || fail "kvsnap $args mapped $got"
done

# 3. An unusable library: every message names it and what needs it; exit 7.
expect_refusal() {  # expect_refusal SONAME NEEDLE -- command...
  soname=$1; needle=$2; shift 3
  out=$(LD_LIBRARY_PATH=$dir/fake "$@" 2>&1); rc=$?
  [ "$rc" = 7 ] || fail "$* with a broken $soname: exit $rc, not 7: $out"
  case "$out" in *"cannot load $soname (for $needle; install "*) ;;
    *) fail "$* with a broken $soname: message does not name it: $out" ;; esac
  case "$out" in *"Abort"*|*"Segmentation"*|*"terminate"*) fail "$*: crashed: $out" ;; esac
}
mkdir -p "$dir/fake"
# Not ELF at all.
for so in "$archive" "$pq" "$curl"; do : > "$dir/fake/$so"; done
expect_refusal "$archive" "kvsnap export and import" -- "$kvsnap" import "$dir/one.tar" --store "$dir/s2"
"$kvsnap" save "$fixtures/v0.5.0/hd64-f16-f16-faoff.slot" --name chat --store "$store" -q > /dev/null || fail "save"
expect_refusal "$archive" "kvsnap export and import" -- "$kvsnap" export chat --store "$store" -o "$dir/out.tar.zst"
[ ! -e "$dir/out.tar.zst" ] || fail "a refused export left $dir/out.tar.zst"
printf '{"catalog": "postgresql://kvsnap@127.0.0.1:1/kvsnap", "local_dir": "%s/pg-local"}\n' "$dir" > "$dir/pg.json"
expect_refusal "$pq" "the PostgreSQL catalog" -- "$kvsnap" ls --store "$dir/pg.json"
# llama-server's API does not use libcurl: a broken one leaves save --server its own error.
mkdir -p "$dir/slots"
out=$(LD_LIBRARY_PATH=$dir/fake "$kvsnap" save --server http://127.0.0.1:1 --slot-dir "$dir/slots" --name x \
  --store "$dir/s3" 2>&1); rc=$?
[ "$rc" = 7 ] || fail "save --server to nothing: exit $rc, not 7: $out"
case "$out" in *"is llama-server running at http://127.0.0.1:1?"*) ;; *) fail "save --server to nothing: $out" ;; esac
printf '{"blobs": "s3://bucket/p?endpoint=http%%3A%%2F%%2F127.0.0.1%%3A1", "local_dir": "%s/s3-local"}\n' "$dir" \
  > "$dir/s3.json"
expect_refusal "$curl" "the S3 blob store" -- \
  env AWS_ACCESS_KEY_ID=key AWS_SECRET_ACCESS_KEY=secret \
  "$kvsnap" save "$fixtures/v0.5.0/hd64-f16-f16-faoff.slot" --name chat --store "$dir/s3.json"
# An ELF library without kvsnap's functions (the C library's math part, under the awaited name).
libm=$(ldd "$kvsnap" | awk '/libm\.so/ {print $3; exit}')
if [ -n "$libm" ]; then
  cp "$libm" "$dir/fake/$archive"
  out=$(LD_LIBRARY_PATH=$dir/fake "$kvsnap" import "$dir/one.tar" --store "$dir/s4" 2>&1); rc=$?
  [ "$rc" = 7 ] || fail "import with a foreign $archive: exit $rc: $out"
  case "$out" in *"it has no archive_"*"different build"*) ;; *) fail "foreign library: $out" ;; esac
else
  fail "ldd shows no libm for $kvsnap"
fi

[ "$failures" = 0 ] && echo "lazy libraries: all checks passed"
exit $([ "$failures" = 0 ] && echo 0 || echo 1)
