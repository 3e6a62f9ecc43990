#!/usr/bin/env bash
# llama-server's own save of the real slot (the baseline kvsnap save must not be slower than):
# starts the test bed's llama-server (3.22.1) on the bench model, evaluates the prompt of
# real-f16.slot (made by bench/make_real_slot.sh) in slot 0, asks it to save the slot
# (POST /slots/0?action=save) and prints the save time it reports (timings.save_ms) and the
# bytes it wrote. Run it right before kvsnap-store-bench and pass the time on:
#
#   ms=$(bench/server_save_time.sh | awk '/^save_ms/ {print $2}')  # the best of 3 saves
#   build/bench/kvsnap-store-bench $S/real-f16.slot --threads 2 --server-save-ms "$ms" ...
#
# Env: KVSNAP_BENCH_DIR (default ~/.cache/kvsnap-bench), LLAMA_SERVER (default the 3.22.1 bed's),
# PORT (default 18931).
set -euo pipefail
dir=${KVSNAP_BENCH_DIR:-$HOME/.cache/kvsnap-bench}
server=${LLAMA_SERVER:-$HOME/.cache/kvsnap-oracle/3.22.1/bin/llama-server}
port=${PORT:-18931}
for f in "$server" "$dir/model.gguf" "$dir/real-f16.slot.prompt.txt"; do
  [[ -e $f ]] || { echo "server_save_time.sh: $f is missing (bench/make_real_slot.sh makes the slot files)" >&2; exit 2; }
done
slots=$(mktemp -d "$dir/server-slots.XXXXXX")
log=$slots/server.log
"$server" -m "$dir/model.gguf" --port "$port" -c 4096 -np 1 -fa on -ctk f16 -ctv f16 -t 2 \
  --slot-save-path "$slots" >"$log" 2>&1 &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$slots"; }
trap cleanup EXIT
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.5
done
python3 - "$dir/real-f16.slot.prompt.txt" "$port" <<'PY'
import json, sys, urllib.request
prompt = open(sys.argv[1]).read()
url = "http://127.0.0.1:%s" % sys.argv[2]
def post(path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=3600))
r = post("/completion", {"prompt": prompt, "n_predict": 0, "cache_prompt": True, "id_slot": 0})
print("prompt_tokens", r.get("tokens_evaluated"), "prompt_ms", r.get("timings", {}).get("prompt_ms"))
best = None
for i in range(3):
    s = post("/slots/0?action=save", {"filename": "bench-%d.bin" % i})
    ms = s["timings"]["save_ms"]
    best = ms if best is None else min(best, ms)
    print("save", i, "ms", ms, "n_written", s["n_written"], "n_saved", s["n_saved"])
print("save_ms", best)
PY
