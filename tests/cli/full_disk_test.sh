#!/usr/bin/env bash
# full_disk_test.sh KVSNAP FIXTURES: on a full disk `kvsnap rm` and `kvsnap gc` free space. The
# store lives on a 96 MiB tmpfs in a mount namespace of its own (root only: exit 77, which ctest
# reports as skipped, elsewhere), filled to the last byte by another file; rm's catalog write uses
# the room the catalog's reserve gave up (docs/store.md, "A full disk"; before it, rm failed with
# "database or disk is full (COMMIT)", exit 7).
set -uo pipefail
kvsnap=$(realpath "$1") fixtures=$(realpath "$2")
if [ "${KVSNAP_FULL_DISK_INSIDE:-}" != 1 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null; then
    echo "SKIP: needs root and unshare (a tmpfs in a mount namespace of its own)"; exit 77
  fi
  KVSNAP_FULL_DISK_INSIDE=1 exec unshare -m --propagation private bash "$0" "$@"
fi
disk=$(mktemp -d)
trap 'umount "$disk" 2>/dev/null; rmdir "$disk"' EXIT
mount -t tmpfs -o size=96m kvsnap-full "$disk" || { echo "SKIP: cannot mount a tmpfs here"; exit 77; }
export KVSNAP_HOME="$disk/store"
fail() { echo "FAIL: $*"; df -k "$disk"; ls -la "$KVSNAP_HOME"; exit 1; }
"$kvsnap" save "$fixtures/v0.5.0/hd64-f16-f16-faon.slot" --name a >/dev/null || fail "save a"
"$kvsnap" save "$fixtures/v0.5.0/hd128-f16-f16-faoff.slot" --name b >/dev/null || fail "save b"
[ -f "$KVSNAP_HOME/catalog.sqlite-reserve" ] || fail "no room reserve beside the catalog"
dd if=/dev/zero of="$disk/filler" bs=64k 2>/dev/null
dd if=/dev/zero of="$disk/filler2" bs=4k 2>/dev/null
avail=$(df -k --output=avail "$disk" | tail -1 | tr -d ' ')
[ "$avail" -eq 0 ] || fail "the disk is not full ($avail KiB free)"
"$kvsnap" rm b || fail "rm on a full disk (exit $?)"
[ ! -e "$KVSNAP_HOME/catalog.sqlite-reserve" ] || fail "the reserve was not given up"
"$kvsnap" gc >/dev/null || fail "gc on a nearly full disk (exit $?)"
names=$("$kvsnap" ls --json | python3 -c 'import json, sys; print(" ".join(s["name"] for s in json.load(sys.stdin)))')
[ "$names" = a ] || fail "after rm b the store lists '$names'"
"$kvsnap" verify --all >/dev/null || fail "verify after rm and gc"
rm -f "$disk/filler" "$disk/filler2"
"$kvsnap" ls >/dev/null || fail "ls"
[ -f "$KVSNAP_HOME/catalog.sqlite-reserve" ] || fail "the reserve was not made again once there was room"
echo "ok: rm and gc on a full disk, the reserve given up and made again"
