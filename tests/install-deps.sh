#!/usr/bin/env bash
# Installs what kvsnap needs to build and test on Debian 12 (apt-get; sudo when not root).
#   bash tests/install-deps.sh [--cross]
# --cross adds what the aarch64 stage needs (tests/cross/run.sh): the cross compiler, qemu-user
# and the arm64 -dev packages of the libraries the cross-built layers link (dpkg
# --add-architecture arm64). run-all.sh asks for them here, in its first apt transaction: an
# arm64 library is Multi-Arch "same", so installing it later could move its amd64 twin (a newer
# libssl3 after the second apt-get update) under the servers and tests running beside that stage.
set -euo pipefail
cross=0
case "${1:-}" in
  --cross) cross=1 ;;
  "") ;;
  *) echo "usage: install-deps.sh [--cross]" >&2; exit 2 ;;
esac
pkgs=(build-essential cmake ninja-build pkg-config git ca-certificates python3 python3-venv
      libsqlite3-dev libzstd-dev libxxhash-dev libarchive-dev libcli11-dev libssl-dev nlohmann-json3-dev
      libgtest-dev libgmock-dev libbenchmark-dev libcurl4-openssl-dev
      libcpp-httplib-dev        # kvsnap serve's proxy (0.11.4, what llama-server vendors)
      libisal-dev               # bench only: kvsnap-codec-bench --slot measures ISA-L igzip beside zstd
      libpq-dev postgresql-15   # the PostgreSQL catalog: libpq, and the server tests/beds/postgres.sh runs
      clang libclang-rt-14-dev  # the fuzz stage: clang 14, and libFuzzer + sanitizer runtimes (not pulled in by clang)
      clang-16 libc++-16-dev libc++abi-16-dev libclang-rt-16-dev
                                # the clang stage (macOS proxy + sanitizers): clang 16, LLVM's C++ library and its
                                # sanitizer runtimes (docs/portability.md)
      zsh fish                  # the shell-completion tests run in the real shells
      swift swift-proxy swift-object swift-container swift-account python3-swift memcached curl
                                # the s3 tests' server: Swift 2.30 + s3api on loopback (tests/beds/swift-s3.sh)
      ccache)                   # run-all.sh: a machine that built the tree before rebuilds from its cache
command -v npm >/dev/null 2>&1 || pkgs+=(nodejs npm)
[ $cross -eq 0 ] || pkgs+=(g++-aarch64-linux-gnu qemu-user
                           libssl-dev:arm64 libzstd-dev:arm64 libxxhash-dev:arm64 libgtest-dev:arm64)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: everything is installed"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing ${missing[*]}"
if [ $cross -eq 1 ] && ! dpkg --print-foreign-architectures | grep -x arm64 >/dev/null; then
  $sudo dpkg --add-architecture arm64
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
