#!/bin/sh
# libpq, libcurl and libarchive are opened on first use (src/base/lazy_library.h), not at start.
# Checks, through the built binary (glibc's loader):
#  1. a command that needs one opens it and runs as before;
#  2. a command that needs none of them maps none of them (LD_DEBUG=files);
#  3. an unusable library found first through LD_LIBRARY_PATH (not ELF, or an ELF file without
#     the functions kvsnap calls) fails the command with exit 7 and a message that names the
#     library, what needs it and the package, without a crash.
# Usage: lazy_libraries_test.sh KVSNAP_BINARY
set -u
kvsnap=$1
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvsnap-lazy.XXXXXX")
trap 'rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

mapped() {  # which of the three libraries the loader mapped for "$@"
  LD_DEBUG=files "$@" 2>&1 >/dev/null | grep -o 'file=lib\(pq\|curl\|archive\)\.so[.0-9]*' | sort -u | tr '\n' ' '
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
case "$got" in *libarchive*) ;; *) fail "import did not open libarchive (mapped: '$got')" ;; esac
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
  case "$out" in *"cannot load $soname (for $needle; Debian and Ubuntu: "*) ;;
    *) fail "$* with a broken $soname: message does not name it: $out" ;; esac
  case "$out" in *"Abort"*|*"Segmentation"*|*"terminate"*) fail "$*: crashed: $out" ;; esac
}
mkdir -p "$dir/fake"
# Not ELF at all.
for so in libarchive.so.13 libpq.so.5 libcurl.so.4; do : > "$dir/fake/$so"; done
expect_refusal libarchive.so.13 "kvsnap export and import" -- "$kvsnap" import "$dir/one.tar" --store "$dir/s2"
printf '{"catalog": "postgresql://kvsnap@127.0.0.1:1/kvsnap", "local_dir": "%s/pg-local"}\n' "$dir" > "$dir/pg.json"
expect_refusal libpq.so.5 "the PostgreSQL catalog" -- "$kvsnap" ls --store "$dir/pg.json"
mkdir -p "$dir/slots"
expect_refusal libcurl.so.4 "the S3 client and llama-server's API" -- \
  "$kvsnap" save --server http://127.0.0.1:1 --slot-dir "$dir/slots" --name x --store "$dir/s3"
# An ELF library without kvsnap's functions (the C library's math part, under the awaited name).
libm=$(ldd "$kvsnap" | awk '/libm\.so/ {print $3; exit}')
if [ -n "$libm" ]; then
  cp "$libm" "$dir/fake/libarchive.so.13"
  out=$(LD_LIBRARY_PATH=$dir/fake "$kvsnap" import "$dir/one.tar" --store "$dir/s4" 2>&1); rc=$?
  [ "$rc" = 7 ] || fail "import with a foreign libarchive.so.13: exit $rc: $out"
  case "$out" in *"it has no archive_"*"different build"*) ;; *) fail "foreign library: $out" ;; esac
else
  fail "ldd shows no libm for $kvsnap"
fi

[ "$failures" = 0 ] && echo "lazy libraries: all checks passed"
exit $([ "$failures" = 0 ] && echo 0 || echo 1)
