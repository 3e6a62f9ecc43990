#!/usr/bin/env bash
# Installs what kvsnap needs to build and test on Debian 12 (apt-get; sudo when not root).
set -euo pipefail
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
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: everything is installed"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
