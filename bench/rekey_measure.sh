#!/bin/bash
# kvsnap rekey's cost (docs/store.md, "Key rotation"): the real f16 slot and its extension (a
# shared prefix; bench/make_real_slot.sh makes both in ~/.cache/kvsnap-bench) saved encrypted,
# then rotated to a new key, timed beside the saves; a restore with the new key checked byte for
# byte. Usage: bench/rekey_measure.sh build/kvsnap
set -eu
K=$1; S=~/.cache/kvsnap-bench
W=$(mktemp -d /tmp/rekey-measure-XXXX)
printf '%064d\n' 1 | tr 0 a > $W/old.key; printf '%064d\n' 2 | tr 0 b > $W/new.key; chmod 600 $W/*.key
t() { /usr/bin/time -f "%e s wall, %U+%S s CPU, %M KB max RSS" "$@"; }
echo "save real-f16.slot:"; t $K save $S/real-f16.slot --store $W/s --key-file $W/old.key -q >/dev/null
echo "save real-f16-ext.slot:"; t $K save $S/real-f16-ext.slot --store $W/s --key-file $W/old.key -q >/dev/null
du -sh $W/s/packs
echo "rekey (2 snapshots):"; t $K rekey --store $W/s --key-file $W/old.key --new-key-file $W/new.key --json -q
du -sh $W/s/packs
echo "restore with the new key:"; t $K restore 2 -o $W/out.slot --store $W/s --key-file $W/new.key -q >/dev/null
cmp $W/out.slot $S/real-f16-ext.slot && echo byte-identical
rm -rf $W
