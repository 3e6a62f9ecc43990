#!/usr/bin/env bash
# `cmake --install`, then a program outside the tree finds kvsnap with find_package(kvsnap) and with
# pkg-config, links libkvsnap and converts a fixture.
#   install_test.sh BUILD_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
build=$1 src=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log"
for f in bin/kvsnap include/kvsnap.h lib/libkvsnap.so lib/cmake/kvsnap/kvsnapConfig.cmake lib/pkgconfig/kvsnap.pc; do
  [ -e "$prefix/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
model="$src/fixtures/models/tiny-hd64.gguf" slot="$src/fixtures/v0.5.0/hd64-f16-f16-faon.slot"

cmake -S "$src/tests/capi/consumer" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" >"$work/cmake.log"
cmake --build "$work/cmake" >>"$work/cmake.log"
LD_LIBRARY_PATH="$prefix/lib" "$work/cmake/consumer" "$model" "$slot"

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# shellcheck disable=SC2046
cc -o "$work/pc-consumer" "$src/tests/capi/consumer/main.c" $(pkg-config --cflags --libs kvsnap)
LD_LIBRARY_PATH="$prefix/lib" "$work/pc-consumer" "$model" "$slot"
"$prefix/bin/kvsnap" --version >/dev/null
echo "install test: find_package and pkg-config consumers built and ran"
