#!/usr/bin/env bash
# fetch.sh: set up the real-llama.cpp test bed ("oracle") from the npm packages of node-llama-cpp.
#
#   tests/oracle/fetch.sh [NPM_VERSION... | llama.node | eras-ab]
#       default: 3.22.1;  "all" = 3.22.1 3.21.1 3.20.0 3.19.0 3.18.1 3.17.1 3.16.2 3.10.0 llama.node
#       "eras-ab" = 3.0.0-beta.44 (b3543, era B) 3.0.0-beta.32 (b3166, era A); optional, not in "all"
#
# For each version V this produces, under $KVSNAP_ORACLE_DIR (default ~/.cache/kvsnap-oracle):
#   npm/node-llama-cpp-V.tgz, npm/node-llama-cpp-linux-x64-V.tgz   (npm pack, kept as a download cache)
#   V/lib/       prebuilt CPU shared libraries (libllama*.so, libggml*.so, libggml-cpu-*.so)
#   V/src/       llama.cpp source (git clone of llama/gitRelease.bundle)
#   V/include/   llama.h, llama-cpp.h and ggml/include/*.h of that source
#   V/tag        the llama.cpp release the package was built from (e.g. v0.5.0, b8121, b5640)
# "llama.node": npm install (no install scripts, no optional GPU/other-platform builds) of
#   @fugood/llama.node@1.7.15 (llama.cpp b10257) + @fugood/node-llama-linux-x64 into
#   llama.node-1.7.15/ (a JS API that writes era-G ggsn v9 sessions; tests/oracle/llama_node_session.mjs)
# 3.0.0-beta.NN (eras A/B): no @node-llama-cpp/linux-x64 package exists for the betas; the main
#   package's bins/linux-x64/ is used: libllama.so + libggml.so (beta.44), or llama-addon.node alone
#   (beta.32: llama.cpp linked in; the driver links it with napi_* stubs). Headers come from the
#   source's include/ + ggml/include/ (b3543) or its top directory (b3166).
# Idempotent: every step is skipped when its result is already there. Needs node/npm, git, tar.
set -euo pipefail

ALL_VERSIONS=(3.22.1 3.21.1 3.20.0 3.19.0 3.18.1 3.17.1 3.16.2 3.10.0)
LLAMA_NODE_VERSION=1.7.15
DIR="${KVSNAP_ORACLE_DIR:-${HOME:-/root}/.cache/kvsnap-oracle}"

log() { printf 'oracle-fetch: %s\n' "$*" >&2; }
die() { printf 'oracle-fetch: error: %s\n' "$*" >&2; exit 1; }

usage() {
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

versions=()
llama_node=0
for a in "$@"; do
  case "$a" in
    -h|--help) usage 0 ;;
    all) versions+=("${ALL_VERSIONS[@]}"); llama_node=1 ;;
    llama.node) llama_node=1 ;;
    eras-ab) versions+=(3.0.0-beta.44 3.0.0-beta.32) ;;
    [0-9]*.[0-9]*.[0-9]*) versions+=("$a") ;;
    *) log "unknown argument: $a"; usage 2 ;;
  esac
done
[ ${#versions[@]} -gt 0 ] || [ $llama_node = 1 ] || versions=(3.22.1)

for tool in npm git tar; do
  command -v "$tool" >/dev/null 2>&1 || die "'$tool' is required but not on PATH"
done
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) ;;
  *) die "only linux x86_64 is supported (the bed uses @node-llama-cpp/linux-x64)" ;;
esac

mkdir -p "$DIR/npm"
TMPDIRS=()
cleanup() { local d; for d in "${TMPDIRS[@]}"; do rm -rf "$d"; done; }
trap cleanup EXIT

# fetch_one V
fetch_one() {
  local v="$1"
  local main_tgz="$DIR/npm/node-llama-cpp-$v.tgz"
  local bin_tgz="$DIR/npm/node-llama-cpp-linux-x64-$v.tgz"
  local vdir="$DIR/$v"

  # 1. npm pack (download only, no install scripts run)
  local want=() beta=0
  case "$v" in *-beta.*) beta=1; bin_tgz="$main_tgz" ;; esac
  [ -s "$main_tgz" ] || want+=("node-llama-cpp@$v")
  # the betas have no @node-llama-cpp/linux-x64 package: their libraries are in the main one
  [ $beta = 1 ] || [ -s "$bin_tgz" ] || want+=("@node-llama-cpp/linux-x64@$v")
  if [ ${#want[@]} -gt 0 ]; then
    log "$v: npm pack ${want[*]}"
    (cd "$DIR/npm" && npm pack --silent --pack-destination "$DIR/npm" "${want[@]}" >/dev/null) \
      || die "$v: npm pack failed (network? does version $v exist?)"
  fi
  [ -s "$main_tgz" ] || die "$v: $main_tgz missing after npm pack"
  [ -s "$bin_tgz" ] || die "$v: $bin_tgz missing after npm pack"

  local tmp
  tmp="$(mktemp -d "$DIR/.fetch-$v.XXXXXX")"
  TMPDIRS+=("$tmp")

  # 2. tag: the llama.cpp release recorded in the package
  local tag=""
  if [ -s "$vdir/tag" ]; then
    tag="$(tr -d '[:space:]' < "$vdir/tag")"
  else
    tar -xzf "$main_tgz" -C "$tmp" package/llama/binariesGithubRelease.json 2>/dev/null || true
    if [ -s "$tmp/package/llama/binariesGithubRelease.json" ]; then
      tag="$(sed -n 's/.*"release"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' \
        "$tmp/package/llama/binariesGithubRelease.json" | head -n1)"
    fi
    [ -n "$tag" ] || die "$v: cannot read the llama.cpp release from package/llama/binariesGithubRelease.json"
  fi

  # 3. libraries
  if ls "$vdir"/lib/libllama*.so >/dev/null 2>&1 && ls "$vdir"/lib/libggml-base.so >/dev/null 2>&1; then
    log "$v: lib/ present"
  elif [ $beta = 1 ] && { [ -f "$vdir/lib/libllama.so" ] || [ -f "$vdir/lib/llama-addon.node" ]; }; then
    log "$v: lib/ present"
  elif [ $beta = 1 ]; then
    log "$v: extracting prebuilt libraries from the main package's bins/linux-x64"
    tar -xzf "$main_tgz" -C "$tmp" package/bins/linux-x64 || die "$v: $main_tgz has no package/bins/linux-x64"
    mkdir -p "$vdir/lib.tmp"
    if ls "$tmp"/package/bins/linux-x64/libllama.so >/dev/null 2>&1; then
      cp "$tmp"/package/bins/linux-x64/*.so "$vdir/lib.tmp/"
    else
      cp "$tmp"/package/bins/linux-x64/llama-addon.node "$vdir/lib.tmp/"
    fi
    rm -rf "${vdir:?}/lib"
    mv "$vdir/lib.tmp" "$vdir/lib"
  else
    log "$v: extracting prebuilt libraries"
    tar -xzf "$bin_tgz" -C "$tmp" package/bins/linux-x64 || die "$v: $bin_tgz has no package/bins/linux-x64"
    # the build metadata names the llama.cpp release too; cross-check
    local meta="$tmp/package/bins/linux-x64/_nlcBuildMetadata.json"
    if [ -s "$meta" ] && ! grep -q "\"release\":\"$tag\"" "$meta"; then
      log "$v: warning: binaries metadata does not mention release $tag: $(cat "$meta")"
    fi
    mkdir -p "$vdir/lib.tmp"
    cp "$tmp"/package/bins/linux-x64/*.so "$vdir/lib.tmp/"
    rm -rf "${vdir:?}/lib"
    mv "$vdir/lib.tmp" "$vdir/lib"
  fi

  # 4. source
  if [ -d "$vdir/src/.git" ] && { [ -f "$vdir/src/include/llama.h" ] || [ -f "$vdir/src/llama.h" ]; }; then
    log "$v: src/ present"
  else
    log "$v: cloning llama.cpp source from llama/gitRelease.bundle"
    tar -xzf "$main_tgz" -C "$tmp" package/llama/gitRelease.bundle || die "$v: no llama/gitRelease.bundle in $main_tgz"
    rm -rf "$vdir/src.tmp"
    git -c advice.detachedHead=false clone --quiet "$tmp/package/llama/gitRelease.bundle" "$vdir/src.tmp" \
      || die "$v: git clone of the bundle failed"
    [ -f "$vdir/src.tmp/include/llama.h" ] || [ -f "$vdir/src.tmp/llama.h" ] || die "$v: cloned source has no include/llama.h"
    rm -rf "${vdir:?}/src"
    mv "$vdir/src.tmp" "$vdir/src"
  fi

  # 5. headers
  if [ -f "$vdir/include/llama.h" ] && [ -f "$vdir/include/ggml.h" ] && [ -f "$vdir/include/ggml-backend.h" ]; then
    log "$v: include/ present"
  else
    log "$v: copying headers"
    mkdir -p "$vdir/include.tmp"
    if [ -f "$vdir/src/include/llama.h" ]; then
      cp "$vdir/src/include/"*.h "$vdir/include.tmp/"
      cp "$vdir/src/ggml/include/"*.h "$vdir/include.tmp/"
    else  # b3166: llama.h and ggml*.h in the top directory
      cp "$vdir/src/"*.h "$vdir/include.tmp/"
    fi
    rm -rf "${vdir:?}/include"
    mv "$vdir/include.tmp" "$vdir/include"
  fi

  # 6. tag file last: its presence means the version is complete
  if [ ! -s "$vdir/tag" ]; then
    printf '%s\n' "$tag" > "$vdir/tag"
  fi
  rm -rf "$tmp"
  log "$v: ready: $vdir (llama.cpp $tag, $(ls "$vdir"/lib/ | tr '\n' ' '))"
}

# fetch_llama_node: the @fugood/llama.node package and its linux-x64 CPU addon, nothing else
fetch_llama_node() {
  local p="$DIR/llama.node-$LLAMA_NODE_VERSION"
  if [ -f "$p/node_modules/@fugood/llama.node/package.json" ] && [ -f "$p/node_modules/@fugood/node-llama-linux-x64/index.node" ]; then
    log "llama.node $LLAMA_NODE_VERSION: present"
    return
  fi
  log "llama.node $LLAMA_NODE_VERSION: npm install into $p"
  rm -rf "$p.tmp"
  mkdir -p "$p.tmp"
  npm install --prefix "$p.tmp" --ignore-scripts --omit=optional --no-audit --no-fund --silent \
    "@fugood/llama.node@$LLAMA_NODE_VERSION" "@fugood/node-llama-linux-x64@$LLAMA_NODE_VERSION" >/dev/null \
    || die "llama.node: npm install failed"
  rm -rf "$p"
  mv "$p.tmp" "$p"
  log "llama.node $LLAMA_NODE_VERSION: ready: $p ($(du -sh "$p" | cut -f1))"
}

for v in "${versions[@]}"; do
  fetch_one "$v"
done
[ $llama_node = 0 ] || fetch_llama_node
log "bed directory: $DIR"
