"""Loopback ports for the Python tests and benches: the twin of tests/loopback.h's free_port.

A server a script starts a moment later takes its port from free_port(): picked as kvsnap serve
picks its child's (src/base/os.h free_loopback_port), at random outside the kernel's ephemeral
range (where another test's connection or bind to port 0 could be given it in between) and never
under 10000, and checked to bind with no socket option set, so a port still in TIME_WAIT counts
as taken (a server that sets SO_REUSEPORT alone, as kvsnap serve's listener does, may fail to
bind one).
"""
import random
import socket


def ephemeral_port_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            first, last = (int(v) for v in f.read().split())
        return first, last
    except (OSError, ValueError):
        return 49152, 65535


def port_is_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(tries=64):
    first, last = ephemeral_port_range()
    candidates = [*range(10000, first), *range(last + 1, 65536)]
    for port in random.sample(candidates, min(tries, len(candidates))):
        if port_is_free(port):
            return port
    raise RuntimeError(f"no free loopback port outside the ephemeral range {first}-{last}")
