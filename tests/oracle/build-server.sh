#!/usr/bin/env bash
# build-server.sh: build llama-server from the test bed's source (tests/oracle/fetch.sh V first).
#
#   tests/oracle/build-server.sh [NPM_VERSION]      default: 3.22.1 (llama.cpp v0.5.0)
#
# Result: $KVSNAP_ORACLE_DIR/V/bin/llama-server (default dir ~/.cache/kvsnap-oracle). Where the
# release's prebuilt libraries are in $KVSNAP_ORACLE_DIR/V/lib (fetch.sh: libllama, libllama-common,
# libggml and its CPU variants from @node-llama-cpp/linux-x64), only what they do not hold is
# compiled (the server, mtmd, cpp-httplib, the UI stub, the vendored hashes: 69 objects) and linked
# against them: libllama's state writer is the release's own, and the compile is ~200 CPU s instead
# of ~720 (a fresh run's longest stage before the main build). The binary sits beside the libraries
# (bin/llama-server is a link to it): ggml finds its CPU variants in the executable's directory and
# loads the best for this CPU. Without those libraries (or ninja), llama-server is linked
# statically against its own ggml (CPU backend only, no curl, no OpenSSL, no web UI). The build tree
# is kept in $KVSNAP_ORACLE_DIR/V/server-build so an interrupted build resumes; later calls return
# at once. Idempotent.
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
# C++ at -O1, C at Release's -O3: the server's and mtmd's sources (and, built statically, common's
# and llama's) are template-heavy C++ whose -O3 compile is ~40% longer (arg.cpp 17.7 -> 10.5 CPU s,
# clip.cpp 17.6 -> 7.5). Built statically, ggml-cpu's C++ (ops.cpp, vec.cpp, repack.cpp, sgemm.cpp)
# is at -O1 too; the tests' models are tiny, so what llama-server computes is not what they wait on,
# and each test compares results of one binary. Linked against the prebuilt libraries, what it
# computes is the release's own build (-O3, the best CPU variant).
# A llama-server built before keeps the flags it was built with (a cached binary is not rebuilt).
cmake -S "$src" -B "$bld" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_APP=OFF >"$bld.cmake.log" 2>&1 || { mkdir -p "$bld"; log "cmake failed, see $bld.cmake.log"; tail -30 "$bld.cmake.log" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
lib="$DIR/$v/lib"
libllama=$(cd "$lib" 2>/dev/null && ls libllama.*so 2>/dev/null | head -n 1 || true)
libggml=$(cd "$lib" 2>/dev/null && ls libggml.*so libggml.so 2>/dev/null | head -n 1 || true)
if [ "${#gen[@]}" -gt 0 ] && [ -n "$libllama" ] && [ -n "$libggml" ] && [ -f "$lib/libllama-common.so" ] &&
   [ -f "$lib/libggml-base.so" ]; then
  # The objects of every archive llama-server links that the prebuilt libraries do not replace
  # (libllama-common*, libllama, ggml's): read from the link and archive commands ninja would run.
  link=$(ninja -C "$bld" -t commands bin/llama-server | tail -n 1 || true)
  cxx=$(awk '{ for (i = 1; i < NF; i++) if ($i == "&&") { print $(i + 1); exit } }' <<<"$link")
  [ -n "$cxx" ] || { log "error: no link command for bin/llama-server in $bld"; exit 1; }
  objs=($(tr ' ' '\n' <<<"$link" | grep '\.o$' || true))
  for a in $(tr ' ' '\n' <<<"$link" | grep '\.a$' || true); do
    case "$a" in
      /* | common/libllama-common*.a | src/libllama.a | ggml/*) ;;  # a system library, or the prebuilt ones
      *)
        own=($(ninja -C "$bld" -t commands "$a" | tail -n 1 | tr ' ' '\n' | grep '\.o$' || true))
        [ "${#own[@]}" -gt 0 ] || { log "error: no objects found for $a in $bld"; exit 1; }
        objs+=("${own[@]}")
        ;;
    esac
  done
  log "compiling ${#objs[@]} objects, linking $libllama, libllama-common.so and $libggml from $lib"
  ninja -C "$bld" -j "$jobs" "${objs[@]}" >"$bld.build.log" 2>&1 ||
    { log "build failed, see $bld.build.log"; tail -30 "$bld.build.log" >&2; exit 1; }
  (cd "$bld" && "$cxx" -O1 "${objs[@]}" -o "$lib/llama-server.tmp" -L"$lib" -lllama-common -l:"$libllama" \
     -l:"$libggml" -lggml-base -Wl,-rpath,'$ORIGIN' -ldl -lpthread) >>"$bld.build.log" 2>&1 ||
    { log "link failed, see $bld.build.log"; tail -30 "$bld.build.log" >&2; exit 1; }
  mv "$lib/llama-server.tmp" "$lib/llama-server"
  rm -f "$out.tmp"
  ln -s "../lib/llama-server" "$out.tmp"
  mv -T "$out.tmp" "$out"
else
  log "no prebuilt libllama-common/libllama/libggml in $lib (or no ninja): the whole tree, statically"
  cmake --build "$bld" --target llama-server -j "$jobs" >"$bld.build.log" 2>&1 ||
    { log "build failed, see $bld.build.log"; tail -30 "$bld.build.log" >&2; exit 1; }
  rm -f "$out.tmp"
  cp "$bld/bin/llama-server" "$out.tmp"
  mv "$out.tmp" "$out"
fi
log "built $out"
