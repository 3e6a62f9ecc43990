#!/usr/bin/env bash
# An S3-compatible server on 127.0.0.1 for the s3 tests: OpenStack Swift (Debian 12 packages, 2.30)
# with its s3api middleware and tempauth, one replica on one device under DIR.
#
#   swift-s3.sh start DIR PORT      proxy (S3 endpoint http://127.0.0.1:PORT) on PORT, account,
#                                   container and object servers on PORT+1..PORT+3, memcached
#                                   (tempauth's tokens) on PORT+4; returns once
#                                   an S3 request is answered; writes DIR/env (S3_* variables)
#   swift-s3.sh stop DIR            stops the daemons started from DIR and deletes DIR
#   swift-s3.sh pause DIR           stops only the proxy (tests of a server that went away)
#   swift-s3.sh resume DIR          starts the proxy again and waits until it answers
#   swift-s3.sh run DIR PORT CMD..  start, run CMD with DIR/env exported, stop (also when CMD fails
#                                   or the script is interrupted: trap); exits with CMD's status,
#                                   77 (skip) when Swift is not installed
# PORT "auto" picks five free consecutive ports below the kernel's ephemeral range, and tries
# other ports when a start fails (up to 3 times). SWIFT_S3_READY_TIMEOUT: seconds one start may
# take (120).
#
# Credentials (tempauth; fixed, test only): S3 access key "test:tester", secret "testing".
# Nothing is written outside DIR: /etc/swift/swift.conf is the package's (its hash prefix and
# suffix only salt the ring placement), rings and configs live in DIR (swift_dir).
# Logs: DIR/log/<server>.log (the daemons run with -v, no syslog needed).
set -euo pipefail

PY=/usr/bin/python3   # Debian's python3-swift, whatever python3 is first on PATH
readonly PY
READY_TIMEOUT=${SWIFT_S3_READY_TIMEOUT:-120}   # seconds for one start-up attempt

die() { echo "swift-s3: $*" >&2; exit 1; }

installed() {
  [ -x /usr/bin/swift-proxy-server ] && [ -x /usr/bin/swift-object-server ] &&
    [ -x /usr/bin/swift-container-server ] && [ -x /usr/bin/swift-account-server ] &&
    [ -x /usr/bin/swift-ring-builder ] && [ -r /etc/swift/swift.conf ] && [ -x /usr/bin/memcached ] &&
    command -v curl >/dev/null && "$PY" -c 'import swift.common.middleware.s3api' 2>/dev/null
}

# Swift keeps object metadata in user xattrs: refuse a DIR whose file system has none (tmpfs
# without user_xattr) with a message instead of failing on the first PUT.
check_xattrs() {
  "$PY" - "$1" <<'PYEOF' || die "$1: the file system does not support user xattrs (Swift needs them); use a directory on ext4/xfs (e.g. under the build tree or /var/tmp)"
import os, sys, xattr
p = os.path.join(sys.argv[1], '.xattr-probe')
open(p, 'w').close()
try:
    xattr.setxattr(p, 'user.swift.probe', b'1')
finally:
    os.unlink(p)
PYEOF
}

# bind_timeout: a server whose port is taken exits after 3 s ("Could not bind"), so that start
# can try other ports, instead of Swift's default 30 s of silent retries while the proxy answers 503.
write_configs() {
  local dir=$1 port=$2 user
  user=$(id -un)
  local common="[DEFAULT]
bind_ip = 127.0.0.1
workers = 0
user = $user
swift_dir = $dir/etc
devices = $dir/srv
mount_check = false
log_level = INFO
bind_timeout = 3
"
  local kind n=1
  for kind in account container object; do
    printf '%s' "$common" >"$dir/etc/$kind-server.conf"
    printf 'bind_port = %s\n[pipeline:main]\npipeline = %s-server\n[app:%s-server]\nuse = egg:swift#%s\n' \
      $((port + n)) "$kind" "$kind" "$kind" >>"$dir/etc/$kind-server.conf"
    n=$((n + 1))
  done
  printf '%s' "$common" >"$dir/etc/proxy-server.conf"
  # tempauth keeps its tokens in memcached (no memcached: 503). slo must follow s3api: it
  # assembles multipart uploads.
  cat >>"$dir/etc/proxy-server.conf" <<CONF
bind_port = $port
[pipeline:main]
pipeline = catch_errors gatekeeper healthcheck proxy-logging cache s3api tempauth copy slo dlo proxy-logging proxy-server
[app:proxy-server]
use = egg:swift#proxy
account_autocreate = true
[filter:s3api]
use = egg:swift#s3api
location = us-east-1
[filter:tempauth]
use = egg:swift#tempauth
user_test_tester = testing .admin
[filter:cache]
use = egg:swift#memcache
memcache_servers = 127.0.0.1:$((port + 4))
[filter:catch_errors]
use = egg:swift#catch_errors
[filter:gatekeeper]
use = egg:swift#gatekeeper
[filter:healthcheck]
use = egg:swift#healthcheck
[filter:proxy-logging]
use = egg:swift#proxy_logging
[filter:copy]
use = egg:swift#copy
[filter:slo]
use = egg:swift#slo
[filter:dlo]
use = egg:swift#dlo
CONF
}

build_rings() {
  local dir=$1 port=$2 kind n=1
  for kind in account container object; do
    ( cd "$dir/etc"
      swift-ring-builder "$kind.builder" create 6 1 1 >/dev/null
      swift-ring-builder "$kind.builder" add "r1z1-127.0.0.1:$((port + n))/d1" 1 >/dev/null
      # exit 1 is a warning (e.g. "balance" on a one-device ring), 2 an error
      rc=0; swift-ring-builder "$kind.builder" rebalance >/dev/null || rc=$?
      [ "$rc" -le 1 ] || die "swift-ring-builder $kind rebalance failed ($rc)" )
    n=$((n + 1))
  done
}

# Ready when the whole chain answers: a tempauth token (proxy), then a container and an object
# written and deleted through Swift's own API (account, container and object servers). Plain curl:
# its --aws-sigv4 cannot sign for an access key holding ':' such as "test:tester".
probe_chain() {
  local port=$1 base="http://127.0.0.1:$1" token hdrs
  hdrs=$(curl -s -f -D - -o /dev/null --noproxy '*' --max-time 5 \
    -H 'X-Auth-User: test:tester' -H 'X-Auth-Key: testing' "$base/auth/v1.0") || return 1
  token=$(printf '%s' "$hdrs" | tr -d '\r' | sed -n 's/^[Xx]-[Aa]uth-[Tt]oken: //p')
  [ -n "$token" ] || return 1
  local c=(curl -s -f -o /dev/null --noproxy '*' --max-time 5 -H "X-Auth-Token: $token")
  "${c[@]}" -X PUT "$base/v1/AUTH_test/bed-probe" &&
    "${c[@]}" -X PUT --data-binary probe "$base/v1/AUTH_test/bed-probe/probe" &&
    "${c[@]}" -X DELETE "$base/v1/AUTH_test/bed-probe/probe" &&
    "${c[@]}" -X DELETE "$base/v1/AUTH_test/bed-probe"
}

# The last lines of every server's log, for a start-up that failed.
show_logs() {
  local dir=$1 log
  for log in "$dir"/log/*.log; do
    [ -s "$log" ] || continue
    echo "swift-s3: --- the last lines of $log:" >&2
    tail -n 15 "$log" >&2 || true
  done
}

# Waits for the chain (a wall-clock deadline: a loaded CI host starts Python servers slowly).
wait_ready() {
  local dir=$1 port=$2 pidf deadline=$((SECONDS + READY_TIMEOUT))
  while [ "$SECONDS" -lt "$deadline" ]; do
    for pidf in "$dir"/run/*.pid; do
      kill -0 "$(cat "$pidf")" 2>/dev/null || {
        show_logs "$dir"
        echo "swift-s3: the $(basename "$pidf" .pid) server exited during start-up" >&2
        return 1
      }
    done
    probe_chain "$port" && return 0
    sleep 0.2
  done
  show_logs "$dir"
  echo "swift-s3: no answer from http://127.0.0.1:$port after $READY_TIMEOUT s" >&2
  return 1
}

# Five consecutive ports nobody listens on (bound and released: a small race, which start covers
# by trying again). Below the kernel's ephemeral range, so that no client connection of another
# test (a local port the kernel picked) can hold one of them when the servers bind.
pick_ports() {
  "$PY" - <<'PYEOF'
import random, socket
try:
    low = int(open('/proc/sys/net/ipv4/ip_local_port_range').read().split()[0])
except (OSError, ValueError, IndexError):
    low = 32768
top = max(low, 11000) - 5
for _ in range(200):
    base = random.randrange(10000, top)
    socks = []
    try:
        for p in range(base, base + 5):
            s = socket.socket()
            socks.append(s)
            s.bind(('127.0.0.1', p))
        print(base)
        break
    except OSError:
        pass
    finally:
        for s in socks:
            s.close()
else:
    raise SystemExit('no five free ports')
PYEOF
}

start_server() {
  local dir=$1 s=$2
  setsid "swift-$s-server" "$dir/etc/$s-server.conf" -v </dev/null >>"$dir/log/$s.log" 2>&1 &
  echo $! >"$dir/run/$s.pid"
}

start() {
  local dir=$1 port=$2 attempt
  installed || die "OpenStack Swift is not installed (apt-get install swift swift-proxy swift-object swift-container swift-account python3-swift memcached; tests/install-deps.sh)"
  if [ "$port" != auto ]; then
    [[ $port =~ ^[0-9]+$ ]] && [ "$port" -ge 1024 ] && [ "$port" -le 65530 ] || die "bad port '$port' (a number or auto)"
  fi
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  [ ! -e "$dir/run" ] || die "$dir: already holds a bed (stop it first)"
  check_xattrs "$dir"
  # A port given is used once; with auto, a failed start (most often a port taken between
  # pick_ports and the bind) is retried on other ports.
  local p
  for attempt in 1 2 3; do
    p=$port
    [ "$port" != auto ] || p=$(pick_ports) || die "no five free consecutive ports below the ephemeral range"
    if start_once "$dir" "$p"; then return 0; fi
    stop "$dir"
    [ "$port" = auto ] || break
    echo "swift-s3: start-up attempt $attempt failed; trying other ports" >&2
    mkdir -p "$dir"
  done
  die "start-up failed (the bed in $dir is removed)"
}

start_once() {
  local dir=$1 port=$2
  local t0; t0=$(date +%s%N)
  mkdir -p "$dir/etc" "$dir/srv/d1" "$dir/run" "$dir/log"
  write_configs "$dir" "$port"
  build_rings "$dir" "$port"
  setsid memcached -l 127.0.0.1 -p $((port + 4)) -U 0 -m 16 -u "$(id -un)" </dev/null >"$dir/log/memcached.log" 2>&1 &
  echo $! >"$dir/run/memcached.pid"
  local s
  for s in account container object proxy; do start_server "$dir" "$s"; done
  echo "$port" >"$dir/port"
  wait_ready "$dir" "$port" || return 1
  cat >"$dir/env" <<ENV
S3_ENDPOINT=http://127.0.0.1:$port
S3_REGION=us-east-1
S3_ACCESS_KEY=test:tester
S3_SECRET_KEY=testing
ENV
  local ms=$((($(date +%s%N) - t0) / 1000000))
  echo "swift-s3: ready at http://127.0.0.1:$port in $((ms / 1000)).$(printf '%03d' $((ms % 1000))) s (dir $dir)" >&2
}

pause() {
  local dir=$1 pid
  pid=$(cat "$dir/run/proxy.pid") || die "$dir: no bed"
  kill -TERM -- "-$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL -- "-$pid" 2>/dev/null || true
}

resume() {
  local dir=$1
  [ -r "$dir/port" ] || die "$dir: no bed"
  start_server "$dir" proxy
  wait_ready "$dir" "$(cat "$dir/port")" || die "the proxy did not come back (log: $dir/log/proxy.log)"
}

stop() {
  local dir=$1 pidf pid
  [ -d "$dir/run" ] || { rm -rf "$dir"; return 0; }
  for pidf in "$dir"/run/*.pid; do
    pid=$(cat "$pidf" 2>/dev/null) || continue
    # setsid made each server its own process group: end it and anything it forked
    kill -TERM -- "-$pid" 2>/dev/null || true
  done
  for pidf in "$dir"/run/*.pid; do
    pid=$(cat "$pidf" 2>/dev/null) || continue
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
  rm -rf "$dir"
}

run() {
  local dir=$1 port=$2; shift 2
  if ! installed; then
    echo "swift-s3: SKIP: OpenStack Swift is not installed (tests/install-deps.sh installs it)" >&2
    exit 77
  fi
  mkdir -p "$dir"
  RUN_DIR=$(cd "$dir" && pwd)  # global: the EXIT trap runs after run() has returned
  trap 'stop "$RUN_DIR"' EXIT
  trap 'exit 130' INT TERM
  dir=$RUN_DIR
  start "$dir" "$port"
  # A watchdog for when this script is killed outright (SIGKILL, no trap): it stops the bed once
  # this process is gone, unless the bed is another run's by then (DIR/owner names its owner).
  echo $$ >"$dir/owner"
  setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done
                  [ "$(cat "$3/owner" 2>/dev/null)" = "$1" ] && bash "$2" stop "$3"' \
    watchdog $$ "$(readlink -f "$0")" "$dir" </dev/null >/dev/null 2>&1 &
  set -a; . "$dir/env"; set +a
  export S3_BED_DIR=$dir S3_BED_SCRIPT=$(readlink -f "$0")
  local rc=0
  "$@" || rc=$?
  return $rc
}

case "${1:-}" in
  start) [ $# -eq 3 ] || die "usage: $0 start DIR PORT"; start "$2" "$3" ;;
  stop) [ $# -eq 2 ] || die "usage: $0 stop DIR"; stop "$2" ;;
  pause) [ $# -eq 2 ] || die "usage: $0 pause DIR"; pause "$2" ;;
  resume) [ $# -eq 2 ] || die "usage: $0 resume DIR"; resume "$2" ;;
  run) [ $# -ge 4 ] || die "usage: $0 run DIR PORT CMD [ARGS...]"; run "$2" "$3" "${@:4}" ;;
  *) die "usage: $0 start DIR PORT | stop DIR | pause DIR | resume DIR | run DIR PORT CMD [ARGS...]" ;;
esac
