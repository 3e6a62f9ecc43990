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

# A large catalog: one snapshot of 65,536 chunks (32 layers, 16,384 cells, 16 per chunk) makes a
# catalog of ~20 MB, and its rm writes ~19 MB of WAL, more than the least reserve (16 MiB): the
# reserve is 1.25x the catalog as it opens, so rm on a full disk still commits.
big=$(mktemp -d)
trap 'umount "$disk" "$big" 2>/dev/null; rmdir "$disk" "$big"' EXIT
mount -t tmpfs -o size=256m kvsnap-full-big "$big" || fail "cannot mount a second tmpfs"
export KVSNAP_HOME="$big/store"
slot=$(mktemp --suffix=.slot)
python3 - "$slot" <<'PY' || fail "writing the large slot file"
import os, struct, sys
cells, layers, embd = 16384, 32, 16
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<III", 0x67677371, 3, cells))
    f.write(b"".join(struct.pack("<I", 1 + c % 1000) for c in range(cells)))
    f.write(struct.pack("<II", 1, cells))
    f.write(b"".join(struct.pack("<III", c, 1, 0) for c in range(cells)))
    f.write(struct.pack("<II", 0, layers))
    for _ in range(2 * layers):
        f.write(struct.pack("<IQ", 1, embd * 2))
        f.write(bytes(b & 0x3f for b in os.urandom(cells * embd * 2)))
PY
"$kvsnap" save "$slot" --name big --cells-per-chunk 16 --level none >/dev/null || fail "save big"
rm -f "$slot"
"$kvsnap" ls >/dev/null || fail "ls"
catalog=$(stat -c %s "$KVSNAP_HOME/catalog.sqlite") reserve=$(stat -c %s "$KVSNAP_HOME/catalog.sqlite-reserve")
[ "$catalog" -gt $((16 << 20)) ] || fail "the catalog ($catalog bytes) is not larger than the least reserve"
[ "$reserve" -ge "$catalog" ] || fail "the reserve ($reserve bytes) is smaller than the catalog ($catalog bytes)"
dd if=/dev/zero of="$big/filler" bs=64k 2>/dev/null
dd if=/dev/zero of="$big/filler2" bs=4k 2>/dev/null
"$kvsnap" rm big || fail "rm of a snapshot of 65,536 chunks on a full disk (exit $?)"
left=$("$kvsnap" ls --json | python3 -c 'import json, sys; print(len(json.load(sys.stdin)))')
[ "$left" = 0 ] || fail "after rm big the store lists $left snapshots"
"$kvsnap" verify --all >/dev/null || fail "verify after rm"
echo "ok: rm of a snapshot of 65,536 chunks on a full disk (a catalog of $catalog bytes, a reserve of $reserve)"
