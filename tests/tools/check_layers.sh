#!/usr/bin/env bash
# check_layers.sh SOURCE_DIR: fails when a product file includes a layer above its own.
# Layers, lowest first (CMakeLists.txt): base < format < migrate < store < server < serve < cli;
# the C API (src/capi) stands on base, format and migrate only.
set -euo pipefail
root="${1:-.}"
declare -A rank=([base]=0 [format]=1 [migrate]=2 [store]=3 [server]=4 [serve]=5 [cli]=6)
declare -A dir_of=([base]=src/base [format]=format [migrate]=migrate [store]=src/store [server]=src/server [serve]=src/serve
                   [cli]=src/cli [capi]=src/capi)
bad=0
for layer in base format migrate store server serve cli capi; do
  own=${rank[$layer]:-2}  # capi: as migrate, plus itself
  # A layer's directory that is not there would be scanned for nothing and pass (an audit's finding).
  [ -d "$root/${dir_of[$layer]}" ] || { echo "layers: $root/${dir_of[$layer]} ($layer) is not a directory"; exit 1; }
  while IFS= read -r hit; do
    file=${hit%%:*}
    inc=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$hit")
    [ "$inc" = "$layer" ] && continue
    if [ -z "${rank[$inc]+x}" ] || [ "${rank[$inc]}" -gt "$own" ]; then
      echo "upward include: $hit (layer $layer may include only lower layers)"
      bad=1
    fi
  done < <(find "$root/${dir_of[$layer]}" \( -name '*.h' -o -name '*.cc' \) -print0 |
             xargs -0 grep -Hn '^#include "[a-z_]*/' 2>/dev/null || true)
done
# Below the command line, a message names a flag only as a remedy ("{--model GGUF}", src/base/remedy.h),
# which each front end renders in its own terms: a bare "--flag" in a string would reach C API callers.
while IFS= read -r hit; do
  echo "a command-line flag outside {...} below the CLI: $hit"
  bad=1
done < <(grep -HnE '"([^"]*[^{a-z-])?--[a-z][a-z-]*' "$root"/format/*.cc "$root"/migrate/*.cc "$root"/format/*.h "$root"/migrate/*.h 2>/dev/null |
           grep -vE '^[^:]+:[0-9]+: *//' | grep -v 'llama-server --version' || true)
[ $bad = 0 ] && echo "layers: no upward include in $root; no bare command-line flag below the CLI"
exit $bad
