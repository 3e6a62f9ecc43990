#!/usr/bin/env bash
# A throwaway PostgreSQL 15 server on 127.0.0.1 for the catalog tests and the bench.
#
#   postgres.sh start DIR PORT [OWNER_PID]   initdb DIR/data, start on 127.0.0.1:PORT, create database
#                                            "kvsnap"; prints postgresql://kvsnap@127.0.0.1:PORT/kvsnap
#   postgres.sh stop DIR                     stop the server (immediate) and remove DIR
#
# DIR must not exist or be empty. With OWNER_PID, a watchdog stops the server and removes DIR once
# that process is gone, so a test that crashes or is killed leaves nothing running.
# initdb and postgres refuse to run as root: as root the server runs as the `postgres` system user
# (Debian's package creates it) in DIR, which is handed to it. Trust authentication, on 127.0.0.1
# only; fsync off (the data is thrown away; no test depends on surviving an OS crash) unless
# KVSNAP_PG_FSYNC=on (the bench, for durable commit rates).
# Exit 77 when the PostgreSQL 15 binaries are not installed (tests/install-deps.sh installs them).
set -euo pipefail
bin=${KVSNAP_PG_BIN:-/usr/lib/postgresql/15/bin}
cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start DIR PORT [OWNER_PID] | stop DIR" >&2; exit 2; }

as_owner() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

stop() {
  if [ -f "$dir/data/postmaster.pid" ]; then
    as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate -w -t 20 stop >/dev/null 2>&1 || true
  fi
  rm -rf "$dir"
}

case "$cmd" in
  start)
    port=${3:?PORT}
    owner=${4:-}
    if [ ! -x "$bin/initdb" ] || [ ! -x "$bin/pg_ctl" ]; then
      echo "postgres bed: $bin/initdb not installed (apt-get install postgresql; tests/install-deps.sh)" >&2
      exit 77
    fi
    mkdir -p "$dir"
    if [ "$(id -u)" -eq 0 ]; then chown postgres: "$dir"; fi
    as_owner "$bin/initdb" -D "$dir/data" -U kvsnap --auth=trust --encoding=UTF8 --locale=C -N \
      >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
      -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir \
          -c fsync=${KVSNAP_PG_FSYNC:-off} -c full_page_writes=${KVSNAP_PG_FSYNC:-off} -c max_connections=100 -c shared_buffers=128MB" start >/dev/null \
      || { cat "$dir/server.log" >&2; stop; exit 1; }
    as_owner "$bin/psql" -h 127.0.0.1 -p "$port" -U kvsnap -d postgres -qAt -c "CREATE DATABASE kvsnap" >/dev/null \
      || { cat "$dir/server.log" >&2; stop; exit 1; }
    if [ -n "$owner" ]; then
      # The watchdog: detached from the caller's stdout so $(postgres.sh start ...) returns at once.
      (
        while kill -0 "$owner" 2>/dev/null && [ -d "$dir" ]; do sleep 1; done
        stop
      ) </dev/null >/dev/null 2>&1 &
      disown
    fi
    echo "postgresql://kvsnap@127.0.0.1:$port/kvsnap"
    ;;
  stop)
    stop
    ;;
  *)
    echo "usage: $0 start DIR PORT [OWNER_PID] | stop DIR" >&2
    exit 2
    ;;
esac
