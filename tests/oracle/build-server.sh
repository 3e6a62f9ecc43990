#!/usr/bin/env bash
# build-server.sh: build llama-server from the test bed's source (tests/oracle/fetch.sh V first).
#
#   tests/oracle/build-server.sh [NPM_VERSION]      default: 3.22.1 (llama.cpp v0.5.0)
#
# Result: $KVSNAP_ORACLE_DIR/V/bin/llama-server (default dir ~/.cache/kvsnap-oracle), statically
# linked against its own ggml (CPU backend only, no curl, no OpenSSL, no web UI). The build tree
# is kept in $KVSNAP_ORACLE_DIR/V/server-build so an interrupted build resumes. About 3.5 minutes
# on 2 cores the first time (202 s, 2026-11-30); later calls return at once. Idempotent.
set -euo pipefail
v="${1:-3.22.1}"
DIR="${KVSNAP_ORACLE_DIR:-${HOME:-/root}/.cache/kvsnap-oracle}"
src="$DIR/$v/src"
out="$DIR/$v/bin/llama-server"
log() { printf 'build-server: %s\n' "$*" >&2; }
[ -x "$out" ] && { log "cached: $out"; exit 0; }
[ -f "$src/CMakeLists.txt" ] || { log "error: no source at $src (run tests/oracle/fetch.sh $v)"; exit 1; }
bld="$DIR/$v/server-build"
jobs="${KVSNAP_SERVER_JOBS:-$(nproc)}"
log "building llama-server $(cat "$DIR/$v/tag" 2>/dev/null) in $bld with $jobs jobs"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
# C++ at -O1, C at Release's -O3: the server, common, llama and mtmd sources are template-heavy C++
# whose -O3 compile is ~40% longer (arg.cpp 17.7 -> 10.5 CPU s, clip.cpp 17.6 -> 7.5). ggml-cpu's
# C++ (ops.cpp, vec.cpp, repack.cpp, sgemm.cpp) is at -O1 too; the tests' models are tiny, so what
# llama-server computes is not what they wait on, and each test compares results of one binary.
# A llama-server built before keeps the flags it was built with (a cached binary is not rebuilt).
cmake -S "$src" -B "$bld" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_APP=OFF >"$bld.cmake.log" 2>&1 || { mkdir -p "$bld"; log "cmake failed, see $bld.cmake.log"; tail -30 "$bld.cmake.log" >&2; exit 1; }
cmake --build "$bld" --target llama-server -j "$jobs" >"$bld.build.log" 2>&1 || { log "build failed, see $bld.build.log"; tail -30 "$bld.build.log" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
cp "$bld/bin/llama-server" "$out.tmp" && mv "$out.tmp" "$out"
log "built $out"
